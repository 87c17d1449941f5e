//! The dispatcher wake-up. Admission never notifies inside its transaction while other
//! admissions may be committing (a queued NOTIFY takes a database-wide lock until commit, which
//! would serialise every notifying session's commit and WAL flush); instead each committed
//! message asks this task for a wake-up, and the task sends it out of band, always after the
//! rows it announces have committed.
//!
//! At most one wake-up is in flight. A request finding none in flight is sent at once; the
//! requests that arrive while one is in flight collapse into a single follow-up, sent as soon
//! as it completes. So a message reaching a quiet server wakes the dispatcher within one
//! round trip, and a busy server sends at most one NOTIFY per round trip, however many
//! sessions commit meanwhile. `DISPATCH_WAKE_INTERVAL` (default 0) can add a least spacing
//! between two wake-ups on top of that. The task must never wait on a timer while a request
//! is outstanding beyond that spacing, and never drop one: a lost wake-up leaves a message
//! waiting for the dispatcher's POLL_INTERVAL heartbeat.
//!
//! On a quiet server the wake-up would be a statement and a commit of its own for every
//! message. When nothing is outstanding here ([`Waker::quiet`]) and the message is the only
//! one being stored, the admission notifies in its own statement instead (`admission`): with
//! no other admission committing, there is nobody for its lock to hold up.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// What the sessions and the task share.
#[derive(Debug, Default)]
struct Requests {
    pending: Notify,
    /// Requests made so far.
    made: AtomicU64,
    /// Requests answered by a wake-up that has completed.
    answered: AtomicU64,
}

/// The handle sessions use; cheap to clone.
#[derive(Clone, Debug)]
pub struct Waker {
    requests: Arc<Requests>,
    spacing: Duration,
}

impl Waker {
    /// Asks for a wake-up; call after the message's row has committed.
    pub fn request(&self) {
        self.requests.made.fetch_add(1, Ordering::SeqCst);
        // notify_one keeps a single permit when the task is not waiting (a wake-up is in
        // flight): every request made meanwhile collapses into that one permit, which the
        // task takes as soon as the wake-up in flight completes.
        self.requests.pending.notify_one();
    }

    /// True when no wake-up is asked for or in flight and none is being spaced out: a
    /// message stored alone now may wake the dispatcher in its own statement.
    pub fn quiet(&self) -> bool {
        self.spacing.is_zero()
            && self.requests.answered.load(Ordering::SeqCst)
                == self.requests.made.load(Ordering::SeqCst)
    }
}

/// Starts the task. It ends when `shutdown` turns true, after sending the wake-up a last
/// request asked for.
pub fn spawn(
    pool: PgPool,
    spacing: Duration,
    shutdown: watch::Receiver<bool>,
) -> (Waker, tokio::task::JoinHandle<()>) {
    let waker = Waker {
        requests: Arc::default(),
        spacing,
    };
    let task = tokio::spawn(run(waker.requests.clone(), spacing, shutdown, move || {
        let pool = pool.clone();
        async move { notify(&pool).await }
    }));
    (waker, task)
}

/// The loop, apart from the database: `send` performs one wake-up and resolves when it has
/// completed.
async fn run<F, Fut>(
    requests: Arc<Requests>,
    spacing: Duration,
    mut shutdown: watch::Receiver<bool>,
    mut send: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut last_sent: Option<Instant> = None;
    loop {
        let stopping = tokio::select! {
            _ = requests.pending.notified() => false,
            _ = stopped(&mut shutdown) => true,
        };
        if stopping {
            // A request that raced with the shutdown still gets its wake-up.
            let late = tokio::time::timeout(Duration::ZERO, requests.pending.notified()).await;
            if late.is_ok() {
                send().await;
            }
            return;
        }
        let mut stopping = false;
        if let Some(at) = last_sent.map(|t| t + spacing)
            && at > Instant::now()
        {
            // The requested spacing: the wake-up waits, it is not dropped; a shutdown
            // arriving meanwhile sends it at once.
            stopping = tokio::select! {
                _ = tokio::time::sleep_until(at) => false,
                _ = stopped(&mut shutdown) => true,
            };
        }
        last_sent = Some(Instant::now());
        // Every request made before the wake-up starts is answered once it completes; one
        // made meanwhile left its permit for the follow-up.
        let covers = requests.made.load(Ordering::SeqCst);
        send().await;
        requests.answered.store(covers, Ordering::SeqCst);
        if stopping {
            return;
        }
    }
}

async fn notify(pool: &PgPool) {
    // Admitted rows all wait at the admission stage: the dispatcher claims for it alone.
    let stage = Some(pepsi_contract::db::ADMISSION_STAGE);
    if let Err(e) = pepsi_contract::db::wake_dispatcher(pool, stage).await {
        // The dispatcher's POLL_INTERVAL heartbeat still finds the rows.
        tracing::warn!("cannot wake the dispatcher: {e}");
    }
}

/// Resolves once `shutdown` turns true (or its sender is gone). The guard `wait_for`
/// returns is dropped here, so callers' futures stay `Send`.
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::{Semaphore, mpsc};

    /// The loop with a `send` that reports each wake-up on a channel and completes only when
    /// the test adds a permit to `release`: the test decides how long a wake-up is in flight.
    struct Harness {
        waker: Waker,
        sent: mpsc::UnboundedReceiver<()>,
        release: Arc<Semaphore>,
        stop: watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
    }

    fn harness(spacing: Duration) -> Harness {
        let requests = Arc::new(Requests::default());
        let (tx, sent) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let (stop, shutdown) = watch::channel(false);
        let gate = release.clone();
        let task = tokio::spawn(run(requests.clone(), spacing, shutdown, move || {
            let tx = tx.clone();
            let gate = gate.clone();
            async move {
                tx.send(()).unwrap();
                gate.acquire().await.unwrap().forget();
            }
        }));
        Harness {
            waker: Waker { requests, spacing },
            sent,
            release,
            stop,
            task,
        }
    }

    impl Harness {
        async fn next_wake_up(&mut self) {
            tokio::time::timeout(Duration::from_secs(10), self.sent.recv())
                .await
                .expect("a wake-up is sent")
                .unwrap();
        }

        /// No wake-up is sent while the task runs freely for a while.
        async fn no_wake_up(&mut self) {
            for _ in 0..50 {
                tokio::task::yield_now().await;
            }
            assert!(self.sent.try_recv().is_err(), "an unrequested wake-up");
        }
    }

    #[tokio::test]
    async fn a_request_to_an_idle_task_is_sent_at_once() {
        let mut h = harness(Duration::ZERO);
        h.no_wake_up().await;
        h.waker.request();
        h.next_wake_up().await;
        h.release.add_permits(1);
        h.no_wake_up().await;
    }

    #[tokio::test]
    async fn requests_during_a_wake_up_in_flight_collapse_into_one_follow_up() {
        let mut h = harness(Duration::ZERO);
        h.waker.request();
        h.next_wake_up().await;
        // In flight: these must neither start a second one nor be lost.
        for _ in 0..100 {
            h.waker.request();
        }
        h.no_wake_up().await;
        h.release.add_permits(1);
        h.next_wake_up().await;
        h.release.add_permits(1);
        h.no_wake_up().await;
        // And the task is idle again: the next request goes out at once.
        h.waker.request();
        h.next_wake_up().await;
    }

    /// `quiet` (a lone admission may notify itself) only while every request has been
    /// answered by a completed wake-up, and never under a spacing.
    #[tokio::test]
    async fn quiet_only_when_every_request_has_been_answered() {
        let mut h = harness(Duration::ZERO);
        assert!(h.waker.quiet());
        h.waker.request();
        assert!(!h.waker.quiet(), "asked for");
        h.next_wake_up().await;
        h.waker.request();
        assert!(!h.waker.quiet(), "in flight");
        h.release.add_permits(1);
        h.next_wake_up().await;
        assert!(!h.waker.quiet(), "the follow-up is in flight");
        h.release.add_permits(1);
        h.no_wake_up().await;
        assert!(h.waker.quiet(), "both answered");
        assert!(
            !harness(Duration::from_millis(1)).waker.quiet(),
            "a spacing is never skipped"
        );
    }

    #[tokio::test]
    async fn a_request_within_the_spacing_waits_for_it_and_is_not_lost() {
        let mut h = harness(Duration::from_millis(200));
        h.release.add_permits(10);
        h.waker.request();
        h.next_wake_up().await;
        h.waker.request();
        h.next_wake_up().await;
    }

    #[tokio::test]
    async fn a_request_racing_with_the_shutdown_still_gets_its_wake_up() {
        let mut h = harness(Duration::from_secs(3600));
        h.release.add_permits(10);
        h.waker.request();
        h.next_wake_up().await;
        h.waker.request();
        h.stop.send(true).unwrap();
        h.next_wake_up().await;
        tokio::time::timeout(Duration::from_secs(10), h.task)
            .await
            .expect("the task ends")
            .unwrap();
    }
}
