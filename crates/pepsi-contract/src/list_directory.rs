//! Which mailing lists exist, kept in memory by a long-running process (the list stage), so
//! that mail to addresses that are no list costs no query.
//!
//! The directory holds every `pepsi.mailing_list.address` and a task that LISTENs on
//! [`LIST_CHANGED_CHANNEL`], which the `mailing_list_notify` trigger (procedures.sql)
//! notifies after every change of the table. A notification, or a lost connection, makes
//! the next caller read the addresses again; while the task is not listening (before its
//! first connection, after a loss, when the LISTEN fails) the directory vouches for nothing
//! and its caller asks the database as it would without it.
//!
//! PostgreSQL sends the notification when the change commits, before the ingress can accept
//! mail for a new list and long before such mail reaches a stage, so a worker has seen it
//! when that mail arrives: [`ListDirectory::addresses`] yields to the runtime first, which
//! lets the listening task read what is waiting on its connection.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;

/// The channel the `mailing_list_notify` trigger notifies after a change of
/// `pepsi.mailing_list`.
pub const LIST_CHANGED_CHANNEL: &str = "list_changed";

/// The most list addresses the directory holds; a server with more asks the database for
/// every message, as without a directory.
pub const MAX_LISTS: usize = 200_000;

/// The pause before the listening task connects again after a failure.
const RETRY: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Shared {
    /// Moves on every notification and every change of `listening`.
    generation: AtomicU64,
    listening: AtomicBool,
}

struct Snapshot {
    generation: u64,
    addresses: Arc<HashSet<String>>,
}

/// Every list address, as of the last notification (module documentation).
#[derive(Default)]
pub struct ListDirectory {
    shared: Arc<Shared>,
    started: AtomicBool,
    cache: Mutex<Option<Snapshot>>,
}

impl ListDirectory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every list's address (lower-case), when the directory can vouch that the set is
    /// current; `None` while it cannot (the caller then asks the database). The first call
    /// starts the listening task on the current tokio runtime.
    pub async fn addresses(&self, pool: &PgPool) -> sqlx::Result<Option<Arc<HashSet<String>>>> {
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(listen(pool.clone(), Arc::clone(&self.shared)));
        }
        // Lets the listening task take a notification waiting on its connection.
        tokio::task::yield_now().await;
        if !self.shared.listening.load(Ordering::Acquire) {
            return Ok(None);
        }
        let generation = self.shared.generation.load(Ordering::Acquire);
        if let Some(s) = self.cache.lock().expect("directory lock").as_ref()
            && s.generation == generation
        {
            return Ok(Some(Arc::clone(&s.addresses)));
        }
        let rows: Vec<String> =
            sqlx::query_scalar("SELECT address FROM pepsi.mailing_list LIMIT $1")
                .bind(MAX_LISTS as i64 + 1)
                .fetch_all(pool)
                .await?;
        if rows.len() > MAX_LISTS {
            return Ok(None);
        }
        let addresses = Arc::new(rows.into_iter().collect::<HashSet<_>>());
        // Stored under the generation read before the query: a change during it leaves the
        // snapshot stale, and the next caller reads again.
        *self.cache.lock().expect("directory lock") = Some(Snapshot {
            generation,
            addresses: Arc::clone(&addresses),
        });
        Ok(Some(addresses))
    }

    /// Whether the listening task is connected and listening (for tests and status).
    pub fn listening(&self) -> bool {
        self.shared.listening.load(Ordering::Acquire)
    }
}

/// The listening task: connects, listens, and moves the generation on every notification
/// and every connection and loss, for the life of the process.
async fn listen(pool: PgPool, shared: Arc<Shared>) {
    loop {
        match connect(&pool).await {
            Ok(mut listener) => {
                shared.listening.store(true, Ordering::Release);
                shared.generation.fetch_add(1, Ordering::AcqRel);
                // Ok(None) is a lost connection, Err a failed one: either ends the loop.
                while let Ok(Some(_)) = listener.try_recv().await {
                    shared.generation.fetch_add(1, Ordering::AcqRel);
                }
                shared.listening.store(false, Ordering::Release);
                shared.generation.fetch_add(1, Ordering::AcqRel);
                tracing::warn!("the list directory's LISTEN connection was lost; reconnecting");
            }
            Err(e) => {
                if pool.is_closed() {
                    return;
                }
                tracing::warn!("the list directory cannot LISTEN: {e}; retrying in {RETRY:?}");
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = crate::db::listener(pool).await?;
    listener.listen(LIST_CHANGED_CHANNEL).await?;
    Ok(listener)
}
