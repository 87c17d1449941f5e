//! Connections kept between messages: after a delivery the session stays open for
//! `CONNECTION_IDLE`, so the next message for the same MX host and address (the siblings of
//! a split message, a burst to one provider) skips the connect, greeting, EHLO and TLS
//! handshake. A kept session is proven with RSET before it is used; one idle longer than
//! `CONNECTION_IDLE` is closed with QUIT by a background task, so an idle worker holds no
//! server's resources for long.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pepsi_smtp::{Connection, TlsPolicy};

/// The most sessions one worker keeps open at once.
const MAX_KEPT: usize = 8;

/// What a kept session was opened for: reused only for exactly the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub host: String,
    pub address: IpAddr,
    pub tls: TlsPolicy,
}

struct Kept {
    key: Key,
    conn: Connection,
}

/// The kept sessions of one stage section.
pub struct Keeper {
    idle: Duration,
    slots: Arc<Mutex<Vec<Kept>>>,
    reaping: AtomicBool,
}

impl Keeper {
    /// `idle` zero keeps nothing.
    pub fn new(idle: Duration) -> Keeper {
        Keeper {
            idle,
            slots: Arc::new(Mutex::new(Vec::new())),
            reaping: AtomicBool::new(false),
        }
    }

    /// A kept session for `key` that still answers RSET.
    pub async fn take(&self, key: &Key) -> Option<Connection> {
        let found = {
            let mut slots = self.slots.lock().unwrap();
            let at = slots
                .iter()
                .position(|k| &k.key == key && k.conn.idle() < self.idle)?;
            slots.swap_remove(at).conn
        };
        let mut conn = found;
        match conn.rset().await {
            Ok(()) => Some(conn),
            Err(e) => {
                tracing::debug!(host = key.host, address = %key.address, "kept session gone ({e}); reconnecting");
                conn.quit().await;
                None
            }
        }
    }

    /// Keeps `conn` for the next message to `key`, or closes it when it cannot be reused.
    pub async fn put(&self, key: Key, conn: Connection) {
        if self.idle.is_zero() || !conn.is_usable() {
            conn.quit().await;
            return;
        }
        let evicted = {
            let mut slots = self.slots.lock().unwrap();
            slots.push(Kept { key, conn });
            (slots.len() > MAX_KEPT).then(|| slots.remove(0))
        };
        if let Some(old) = evicted {
            old.conn.quit().await;
        }
        if !self.reaping.swap(true, Ordering::Relaxed) {
            let (slots, idle) = (self.slots.clone(), self.idle);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(idle.min(Duration::from_secs(1))).await;
                    let expired: Vec<Kept> = {
                        let mut slots = slots.lock().unwrap();
                        let (gone, kept) = std::mem::take(&mut *slots)
                            .into_iter()
                            .partition(|k| k.conn.idle() >= idle);
                        *slots = kept;
                        gone
                    };
                    for k in expired {
                        k.conn.quit().await;
                    }
                }
            });
        }
    }
}
