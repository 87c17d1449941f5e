//! Inflow control: while the queue holds more messages than the pipeline is working through,
//! a new message waits a little before it is stored, so the ingress accepts at the rate the
//! stages deliver instead of building a backlog whose wait every message then pays.
//!
//! One task counts the queue's backlog (rows pending or running at any stage, paused ones
//! not: they wait for their retry, not for a worker) at most every `INFLOW_POLL`, counting no
//! further than `INFLOW_BACKLOG` + 1, and only while messages arrive: an idle server sends
//! nothing. A session whose message is ready to store asks [`Inflow::wait`]: at once when
//! the last count is within `INFLOW_BACKLOG`, else as soon as a later count is, and never
//! longer than `INFLOW_DELAY` (the message is then stored all the same: control slows
//! clients down, it never refuses them). A count that fails lets every session through.
//! Must never: hold a message past `INFLOW_DELAY`, poll while no message arrives.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How much backlog the ingress lets build before new messages wait
/// (`[pepsi-ingress] INFLOW_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Rows pending or running beyond which a message waits; 0 turns control off.
    pub backlog: u32,
    /// The longest one message waits.
    pub delay: Duration,
    /// The least time between two counts.
    pub poll: Duration,
}

/// The sessions' handle; cheap to clone.
#[derive(Clone, Debug)]
pub struct Inflow {
    limits: Limits,
    /// The last count (`None`: none yet, or the last one failed).
    count: watch::Receiver<Option<u32>>,
    /// A message arrived: the counting task wakes if it slept.
    arrived: Arc<Notify>,
    /// Sessions waiting now: the task counts again while there are any.
    waiting: Arc<AtomicUsize>,
}

/// One session's share of [`Inflow::waiting`], while it waits.
struct Waiting(Arc<AtomicUsize>);

impl Waiting {
    fn new(n: &Arc<AtomicUsize>) -> Waiting {
        n.fetch_add(1, Ordering::SeqCst);
        Waiting(n.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

const COUNT: &str = "SELECT count(*)::int4 FROM (SELECT 1 FROM pepsi.workqueue \
     WHERE status IN ('pending', 'running') LIMIT $1) AS waiting";

impl Inflow {
    /// A handle that never makes anyone wait.
    pub fn off() -> Inflow {
        let (_, count) = watch::channel(None);
        Inflow {
            limits: Limits {
                backlog: 0,
                delay: Duration::ZERO,
                poll: Duration::from_secs(1),
            },
            count,
            arrived: Arc::new(Notify::new()),
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Starts counting on `pool`; control off (`backlog` 0): [`Inflow::off`].
    pub fn spawn(pool: PgPool, limits: Limits, shutdown: watch::Receiver<bool>) -> Inflow {
        if limits.backlog == 0 {
            return Inflow::off();
        }
        let (tx, count) = watch::channel(None);
        let arrived = Arc::new(Notify::new());
        let waiting = Arc::new(AtomicUsize::new(0));
        let cap = i64::from(limits.backlog) + 1;
        tokio::spawn(run(
            limits.poll,
            arrived.clone(),
            waiting.clone(),
            tx,
            shutdown,
            move || {
                let pool = pool.clone();
                async move {
                    sqlx::query_scalar::<_, i32>(COUNT)
                        .bind(cap)
                        .fetch_one(&pool)
                        .await
                        .map(|n| n.max(0) as u32)
                }
            },
        ));
        Inflow {
            limits,
            count,
            arrived,
            waiting,
        }
    }

    /// Waits, before a message is stored, while the backlog is over the limit: at most
    /// `INFLOW_DELAY`. Returns how long it waited.
    pub async fn wait(&self) -> Duration {
        if self.limits.backlog == 0 {
            return Duration::ZERO;
        }
        self.arrived.notify_one();
        let start = Instant::now();
        let deadline = start + self.limits.delay;
        let mut count = self.count.clone();
        let mut _waiting = None;
        loop {
            let over = count
                .borrow_and_update()
                .is_some_and(|n| n > self.limits.backlog);
            if !over {
                return start.elapsed();
            }
            _waiting.get_or_insert_with(|| Waiting::new(&self.waiting));
            tokio::select! {
                changed = count.changed() => {
                    if changed.is_err() {
                        return start.elapsed();
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return start.elapsed(),
            }
        }
    }
}

/// The counting loop, apart from the database: `count` runs one count. It counts when a
/// message arrived since the last count or a session is waiting, no sooner than `poll`
/// after the last count; the result (or `None` when it failed) goes to every session.
async fn run<F, Fut>(
    poll: Duration,
    arrived: Arc<Notify>,
    waiting: Arc<AtomicUsize>,
    tx: watch::Sender<Option<u32>>,
    mut shutdown: watch::Receiver<bool>,
    count: F,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<u32, sqlx::Error>>,
{
    let mut failing = false;
    loop {
        if waiting.load(Ordering::SeqCst) == 0 {
            tokio::select! {
                _ = arrived.notified() => {}
                _ = shutdown.changed() => return,
            }
        }
        if *shutdown.borrow() {
            return;
        }
        let next = Instant::now() + poll;
        let n = match count().await {
            Ok(n) => {
                failing = false;
                Some(n)
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("cannot count the queue's backlog ({e}): inflow control paused");
                }
                failing = true;
                None
            }
        };
        tx.send_replace(n);
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn limits(backlog: u32, delay_ms: u64) -> Limits {
        Limits {
            backlog,
            delay: Duration::from_millis(delay_ms),
            poll: Duration::from_millis(10),
        }
    }

    /// A handle on a counter the test sets, and how many counts ran.
    fn counted(
        l: Limits,
    ) -> (
        Inflow,
        Arc<AtomicU32>,
        Arc<AtomicUsize>,
        watch::Sender<bool>,
    ) {
        let backlog = Arc::new(AtomicU32::new(0));
        let counts = Arc::new(AtomicUsize::new(0));
        let (tx, count) = watch::channel(None);
        let arrived = Arc::new(Notify::new());
        let waiting = Arc::new(AtomicUsize::new(0));
        let (stop, shutdown) = watch::channel(false);
        let (b, c) = (backlog.clone(), counts.clone());
        tokio::spawn(run(
            l.poll,
            arrived.clone(),
            waiting.clone(),
            tx,
            shutdown,
            move || {
                let (b, c) = (b.clone(), c.clone());
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    Ok(b.load(Ordering::SeqCst))
                }
            },
        ));
        (
            Inflow {
                limits: l,
                count,
                arrived,
                waiting,
            },
            backlog,
            counts,
            stop,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_waits_while_the_backlog_is_over_the_limit_and_never_past_the_delay() {
        let (inflow, backlog, _, _stop) = counted(limits(100, 1000));
        // No count yet: through at once (and the first count starts).
        assert_eq!(inflow.wait().await, Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(inflow.wait().await, Duration::ZERO, "0 waiting");
        // Over the limit: waits the whole delay while it stays over.
        backlog.store(101, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        inflow.wait().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(inflow.wait().await, Duration::from_millis(1000));
        // ...and goes as soon as a count finds it within the limit.
        let waiting = tokio::spawn({
            let inflow = inflow.clone();
            async move { inflow.wait().await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        backlog.store(100, Ordering::SeqCst);
        let waited = waiting.await.unwrap();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_millis(400),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_counted_while_no_message_arrives() {
        let (inflow, _, counts, _stop) = counted(limits(100, 1000));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(counts.load(Ordering::SeqCst), 0);
        for _ in 0..50 {
            inflow.wait().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let n = counts.load(Ordering::SeqCst);
        // 50 messages over 50 ms, counted at most every 10 ms.
        assert!((1..=6).contains(&n), "{n} counts");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(counts.load(Ordering::SeqCst) <= n + 1);
    }

    #[tokio::test]
    async fn switched_off_nobody_waits() {
        let inflow = Inflow::off();
        assert_eq!(inflow.wait().await, Duration::ZERO);
    }
}
