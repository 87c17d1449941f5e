//! The LISTEN side: a task that holds a connection listening on `workqueue` and
//! `config_changed`, reconnecting with decorrelated-jitter backoff, and turns notifications
//! into events. Every (re)connection also sends a wake-up, since notifications sent while
//! disconnected are lost.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::mpsc::UnboundedSender;

use crate::Event;
use pepsi_conf::config::StageName;
use pepsi_contract::db::WORKQUEUE_CHANNEL;
use pepsi_contract::overlay::CONFIG_CHANGED_CHANNEL;

const BACKOFF_BASE: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// Decorrelated jitter: the next pause is uniform in [base, 3 × previous], capped.
pub fn next_backoff(previous: Duration, random: f64) -> Duration {
    let low = BACKOFF_BASE.as_secs_f64();
    let high = (previous.as_secs_f64() * 3.0).max(low);
    Duration::from_secs_f64(
        (low + (high - low) * random.clamp(0.0, 1.0)).min(BACKOFF_CAP.as_secs_f64()),
    )
}

/// A small xorshift generator; jitter needs spread, not cryptographic quality.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ u64::from(std::process::id());
        Jitter(seed | 1)
    }

    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub async fn run(pool: PgPool, events: UnboundedSender<Event>) {
    let mut backoff = BACKOFF_BASE;
    let mut jitter = Jitter::new();
    loop {
        match connect(&pool).await {
            Ok(mut listener) => {
                backoff = BACKOFF_BASE;
                if events.send(Event::Wake(None)).is_err() {
                    return;
                }
                loop {
                    match listener.try_recv().await {
                        Ok(Some(n)) => {
                            let event = if n.channel() == CONFIG_CHANGED_CHANNEL {
                                Event::ConfigChanged
                            } else {
                                Event::Wake(wake_scope(n.payload()))
                            };
                            if events.send(event).is_err() {
                                return;
                            }
                        }
                        Ok(None) => {
                            tracing::warn!("the LISTEN connection was lost; reconnecting");
                            break;
                        }
                        Err(e) => {
                            tracing::warn!("the LISTEN connection failed: {e}; reconnecting");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::warn!("cannot LISTEN on the database: {e}; retrying in {backoff:?}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = next_backoff(backoff, jitter.next());
    }
}

/// The stage a `workqueue` notification names: its payload, trimmed; none when empty (the
/// rows may wait at any stage) or when it cannot be a stage name, which is answered as a
/// wake-up of every stage.
pub fn wake_scope(payload: &str) -> Option<StageName> {
    StageName::new(payload.trim()).ok()
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = pepsi_contract::db::listener(pool).await?;
    listener
        .listen_all([WORKQUEUE_CHANNEL, CONFIG_CHANGED_CHANNEL])
        .await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_names_the_stage_of_its_payload_or_every_stage() {
        let table: &[(&str, Option<&str>)] = &[
            ("init", Some("init")),
            (" Relay-To-Maildir ", Some("Relay-To-Maildir")),
            ("", None),
            ("  ", None),
            ("a\nb", None),
            ("[stage-init]", None),
        ];
        for (payload, want) in table {
            assert_eq!(wake_scope(payload).as_deref(), *want, "{payload:?}");
        }
    }

    #[test]
    fn backoff_stays_between_base_and_three_times_the_previous_and_is_capped() {
        let p = Duration::from_secs(1);
        assert_eq!(next_backoff(p, 0.0), BACKOFF_BASE);
        assert_eq!(next_backoff(p, 1.0), Duration::from_secs(3));
        assert_eq!(next_backoff(Duration::from_secs(60), 1.0), BACKOFF_CAP);
        let mut j = Jitter::new();
        for _ in 0..1000 {
            let r = j.next();
            assert!((0.0..1.0).contains(&r));
        }
    }
}
