//! Group admission: the accepted messages of concurrent sessions stored together.
//!
//! A session hands its message to [`Admitter::admit`] and waits for the row's id. Up to
//! `LANES` statements store what is queued: a lane finding one message stores it at once,
//! alone, with `pepsi.workqueue_add`; a lane finding several (they arrived while every lane
//! was busy committing) takes up to `BATCH` of them and `BATCH_SIZE` octets and stores them
//! with one `pepsi.workqueue_add_batch`, one statement and one commit. A quiet server thus stores each
//! message the moment its DATA ends, and a busy one shares statements, commits and WAL
//! flushes among the sessions that finished meanwhile, without ever waiting to fill a batch.
//!
//! Every session's 250 still waits for its own row's commit: a batch answers all its
//! sessions after it commits, or none. Each stored row is announced to the dispatcher
//! (`wake`): by the wake-up task after the commit, or, for a message stored alone while no
//! other lane is busy and the wake-up task is quiet, by the admission's own statement. A
//! batch the database refuses is stored again one message at a time, so a message the
//! database rejects fails its own session only.
//! Must never: reply before commit, hold a message back while a lane is free.

use std::net::IpAddr;
use std::sync::Arc;

use pepsi_contract::db::{ADMISSION_STAGE, Admission, admit, admit_batch};
use sqlx::PgPool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::wake::Waker;

/// How messages are grouped (`[pepsi-ingress] ADMISSION_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// At most this many messages per statement (1: every message alone).
    pub batch: usize,
    /// At most this many octets of message per statement; a larger message goes alone.
    pub batch_size: u64,
    /// Statements in flight at once.
    pub lanes: usize,
    /// The longest a session waits for its message to be stored before it answers 451: a
    /// primary that accepts no writes (a failover, a synchronous standby gone) must not
    /// hold the client until its own timeout, nor ever get a 250.
    pub timeout: std::time::Duration,
}

impl Limits {
    /// Whether a message of `len` octets joins a group of `count` messages and `octets`
    /// octets (a group's first message always does).
    pub fn admits(&self, count: usize, octets: u64, len: u64) -> bool {
        count == 0 || (count < self.batch && octets.saturating_add(len) <= self.batch_size)
    }
}

/// An accepted message, owned while it waits for a lane.
#[derive(Debug)]
pub struct Accepted {
    /// Empty for the null reverse path.
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    /// The stored header block (trace fields prepended).
    pub headers: Vec<u8>,
    /// The message as received; the body is `message[body_at..]`.
    pub message: Vec<u8>,
    pub body_at: usize,
    pub state: serde_json::Value,
    pub auth_user: Option<String>,
    pub client_addr: IpAddr,
}

impl Accepted {
    fn admission(&self) -> Admission<'_> {
        Admission {
            mail_from: &self.mail_from,
            rcpt_to: &self.rcpt_to,
            headers: &self.headers,
            body: &self.message[self.body_at.min(self.message.len())..],
            state: &self.state,
            auth_user: self.auth_user.as_deref(),
            client_addr: self.client_addr,
        }
    }

    fn octets(&self) -> u64 {
        (self.headers.len() + self.message.len() - self.body_at.min(self.message.len())) as u64
    }
}

/// Why a message was not stored; shared by the sessions of a batch that failed together.
pub type AdmitError = Arc<sqlx::Error>;

struct Job {
    message: Accepted,
    reply: oneshot::Sender<Result<i64, AdmitError>>,
}

/// The sessions' handle; cheap to clone.
#[derive(Clone, Debug)]
pub struct Admitter {
    queue: mpsc::Sender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").finish_non_exhaustive()
    }
}

impl Admitter {
    /// Stores `message`; the id comes once its row has committed.
    pub async fn admit(&self, message: Accepted) -> Result<i64, AdmitError> {
        let (reply, answer) = oneshot::channel();
        if self.queue.send(Job { message, reply }).await.is_err() {
            return Err(Arc::new(sqlx::Error::PoolClosed));
        }
        tracing::debug!("message queued for admission");
        answer
            .await
            .unwrap_or_else(|_| Err(Arc::new(sqlx::Error::PoolClosed)))
    }
}

/// Starts the collector. `waiting` bounds the messages queued for a lane (a session sending
/// beyond it waits for room); every session has at most one message waiting, so the
/// server's MAX_CONNECTIONS is the natural value.
pub fn spawn(pool: PgPool, limits: Limits, waiting: usize, waker: Waker) -> Admitter {
    let (queue, rx) = mpsc::channel(waiting.max(1));
    tokio::spawn(collect(pool, limits, rx, waker));
    Admitter { queue }
}

/// The one reader of the queue: waits for a free lane, then for a message, takes what else
/// is queued and fits, and hands the group to the lane. While every lane is busy, messages
/// accumulate in the queue; that, and nothing else, is what makes a group larger than one.
/// A message taken that does not fit the group opens the next one (it is held here, never
/// behind a wait for another message).
async fn collect(pool: PgPool, limits: Limits, mut rx: mpsc::Receiver<Job>, waker: Waker) {
    let lanes = Arc::new(Semaphore::new(limits.lanes.max(1)));
    let mut carried: Option<Job> = None;
    loop {
        let Ok(lane) = lanes.clone().acquire_owned().await else {
            return;
        };
        let first = match carried.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let mut octets = first.message.octets();
        let mut group = vec![first];
        while group.len() < limits.batch {
            let Ok(job) = rx.try_recv() else {
                break;
            };
            let len = job.message.octets();
            if !limits.admits(group.len(), octets, len) {
                carried = Some(job);
                break;
            }
            octets += len;
            group.push(job);
        }
        let pool = pool.clone();
        let waker = waker.clone();
        // Alone: this lane holds the only permit taken.
        let alone = group.len() == 1 && lanes.available_permits() + 1 >= limits.lanes.max(1);
        tokio::spawn(async move {
            let wake = if alone && waker.quiet() {
                Wake::Inline
            } else {
                Wake::After
            };
            if store(&pool, group, wake).await {
                waker.request();
            }
            drop(lane);
        });
    }
}

/// How a stored group's rows reach the dispatcher's notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// The admission's own statement notifies (one message, nothing else committing).
    Inline,
    /// The wake-up task notifies once the rows have committed.
    After,
}

/// Stores a group and answers each of its sessions. True when a row was stored that the
/// wake-up task must still announce.
async fn store(pool: &PgPool, group: Vec<Job>, wake: Wake) -> bool {
    if group.len() == 1 {
        let job = group.into_iter().next().expect("one");
        let inline = (wake == Wake::Inline).then_some(ADMISSION_STAGE);
        let result = admit(pool, &job.message.admission(), inline)
            .await
            .map_err(Arc::new);
        let announce = result.is_ok() && inline.is_none();
        let _ = job.reply.send(result);
        return announce;
    }
    let admissions: Vec<Admission<'_>> = group.iter().map(|j| j.message.admission()).collect();
    let result = admit_batch(pool, &admissions).await;
    drop(admissions);
    match result {
        Ok(ids) if ids.len() == group.len() => {
            tracing::debug!(messages = ids.len(), "stored together");
            for (job, id) in group.into_iter().zip(ids) {
                let _ = job.reply.send(Ok(id));
            }
            true
        }
        Ok(ids) => {
            // Cannot happen (the function returns one id per message); nothing is known
            // to be stored under the right id, so every session hears a temporary failure.
            let e = Arc::new(sqlx::Error::Protocol(format!(
                "workqueue_add_batch returned {} ids for {} messages",
                ids.len(),
                group.len()
            )));
            for job in group {
                let _ = job.reply.send(Err(e.clone()));
            }
            false
        }
        Err(e @ sqlx::Error::Database(_)) => {
            // The database refused the statement (a row it will not take): nothing of the
            // batch committed, so each message is stored again alone and only the one the
            // database refuses fails.
            tracing::info!(
                "a batch of {} messages was refused ({e}); storing each alone",
                group.len()
            );
            let mut stored = false;
            for job in group {
                let result = admit(pool, &job.message.admission(), None)
                    .await
                    .map_err(Arc::new);
                stored |= result.is_ok();
                let _ = job.reply.send(result);
            }
            stored
        }
        Err(e) => {
            let e = Arc::new(e);
            for job in group {
                let _ = job.reply.send(Err(e.clone()));
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grouping rule as a table: count, octets so far, the next message's octets.
    #[test]
    fn a_group_takes_messages_up_to_its_count_and_size() {
        let limits = Limits {
            batch: 3,
            batch_size: 100,
            lanes: 1,
            timeout: std::time::Duration::from_secs(60),
        };
        for (count, octets, len, joins) in [
            (0, 0, 10, true),
            (0, 0, 1_000, true), // a group's first message always goes, however large
            (1, 10, 90, true),
            (1, 10, 91, false),
            (2, 20, 10, true),
            (3, 30, 10, false), // BATCH reached
            (1, 1_000, 1, false),
        ] {
            assert_eq!(
                limits.admits(count, octets, len),
                joins,
                "count {count}, octets {octets}, next {len}"
            );
        }
        let alone = Limits { batch: 1, ..limits };
        assert!(alone.admits(0, 0, 1));
        assert!(!alone.admits(1, 1, 1));
    }
}
