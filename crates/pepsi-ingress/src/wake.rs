//! The coalescing dispatcher wake-up. Admission never notifies inside its transaction (a
//! queued NOTIFY takes a database-wide lock until commit, which would serialise every
//! session's commit); instead each committed message asks this task for a wake-up, and
//! the task sends at most one `pg_notify` per `DISPATCH_WAKE_INTERVAL`, always after the
//! rows it announces have committed.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Notify, watch};

/// The handle sessions use; cheap to clone.
#[derive(Clone, Debug)]
pub struct Waker {
    pending: Arc<Notify>,
}

impl Waker {
    /// Asks for a wake-up; call after the message's row has committed.
    pub fn request(&self) {
        // notify_one keeps a single permit, so a burst of requests while the task sleeps
        // collapses into one wake-up at the end of the interval.
        self.pending.notify_one();
    }
}

/// Starts the task. It ends when `shutdown` turns true, after sending the wake-up a last
/// request asked for.
pub fn spawn(
    pool: PgPool,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> (Waker, tokio::task::JoinHandle<()>) {
    let pending = Arc::new(Notify::new());
    let waker = Waker {
        pending: pending.clone(),
    };
    let task = tokio::spawn(async move {
        loop {
            let stopping = tokio::select! {
                _ = pending.notified() => false,
                _ = stopped(&mut shutdown) => true,
            };
            if stopping {
                // A request that raced with the shutdown still gets its wake-up.
                let late = tokio::time::timeout(Duration::ZERO, pending.notified()).await;
                if late.is_ok() {
                    notify(&pool).await;
                }
                return;
            }
            notify(&pool).await;
            tokio::time::sleep(interval).await;
        }
    });
    (waker, task)
}

async fn notify(pool: &PgPool) {
    if let Err(e) = pepsi_common::db::notify_workqueue(pool).await {
        // The dispatcher's POLL_INTERVAL heartbeat still finds the rows.
        tracing::warn!("cannot wake the dispatcher: {e}");
    }
}

/// Resolves once `shutdown` turns true (or its sender is gone). The guard `wait_for`
/// returns is dropped here, so callers' futures stay `Send`.
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
