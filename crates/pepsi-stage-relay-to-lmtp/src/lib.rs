//! pepsi-stage-relay-to-lmtp: delivers a message to an LMTP server (RFC 2033) — Dovecot's or
//! Cyrus's `lmtp` service — in one transaction for all its recipients, and turns the server's
//! per-recipient replies into the message's fate through `delivery::conclude`.
//!
//! Reads: envelope, `state.dsn` (RET/ENVID/NOTIFY/ORCPT, passed on when the server offers
//! DSN), `state.origin.smtputf8`, `state.attempts`/`delay_sent`, headers and body
//! (`Load::Full`). Writes (through `conclude`): `attempts`, `last_error`, `delay_sent` on a
//! paused row; `bounce` on the notification clones. Terminal helpers: only those `conclude`
//! picks — `advance_or_finish`, `finish_with` (bounces, success notices) or `pause_with`
//! (the recipients the server deferred, with backoff).
//!
//! A failure before the transaction (refused connection, timeout, a 421 or any refusal of
//! the greeting or LHLO) defers every recipient: a misconfigured or overloaded server must
//! never bounce mail. Inside the transaction, 5xx is permanent and 4xx transient, per
//! recipient. The worker keeps its connection between messages while it is younger than
//! `CONNECTION_IDLE`, proving it with RSET before each reuse.

use std::process::ExitCode;
use std::time::Duration;

use pepsi_common::config::{Config, ConfigError};
use pepsi_common::delivery::{self, RcptResult, RetryPolicy};
use pepsi_common::smtp::{
    ClientError, Connection, Envelope, Protocol, RcptOutcome, Target, Timeouts,
};
use pepsi_common::stage::{Load, Stage, StageContext, StageError};
use tokio::sync::Mutex;

pub mod constants {
    use pepsi_common::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-relay-to-lmtp",
        exec: "pepsi-stage-relay-to-lmtp",
    };
    pub const PROGRAM: &str = "pepsi-stage-relay-to-lmtp";
}

/// The `[stage-<name>]` settings of one LMTP stage.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `LMTP`: where the server listens.
    pub target: Target,
    /// `LHLO_NAME`: the name this client gives in LHLO.
    pub lhlo_name: String,
    pub timeouts: Timeouts,
    /// `CONNECTION_IDLE`: a kept connection idle longer than this is closed rather than
    /// reused; zero closes the connection after every message.
    pub connection_idle: Duration,
    pub policy: RetryPolicy,
}

impl Settings {
    /// Reads `[stage-<stage>]`; LHLO_NAME falls back to `[pepsi] HOSTNAME`, then to the
    /// system's host name.
    pub fn from_config(cfg: &Config, stage: &str) -> Result<Settings, ConfigError> {
        let s = cfg.section(&format!("stage-{stage}"));
        s.string("LMTP")?;
        let target = s
            .parse_opt("LMTP", Target::parse)?
            .expect("LMTP is set: checked above");
        let lhlo_name = match s.string_opt("LHLO_NAME")?.filter(|v| !v.is_empty()) {
            Some(name) => name,
            None => cfg
                .section("pepsi")
                .string_opt("HOSTNAME")?
                .filter(|v| !v.is_empty())
                .unwrap_or_else(pepsi_common::config::system_hostname),
        };
        let d = Timeouts::default();
        let positive = |opt: &str, default: Duration| -> Result<Duration, ConfigError> {
            Ok(s.duration_opt(opt)?
                .filter(|v| !v.is_zero())
                .unwrap_or(default))
        };
        Ok(Settings {
            target,
            lhlo_name,
            timeouts: Timeouts {
                connect: positive("CONNECT_TIMEOUT", d.connect)?,
                greeting: positive("GREETING_TIMEOUT", d.greeting)?,
                command: positive("COMMAND_TIMEOUT", d.command)?,
                data: positive("DATA_TIMEOUT", d.data)?,
            },
            connection_idle: s
                .duration_opt("CONNECTION_IDLE")?
                .unwrap_or(Duration::from_secs(30)),
            policy: RetryPolicy::from_config(cfg, stage)?,
        })
    }

    /// The peer's name when no greeting named it: the host, or the socket path.
    fn target_name(&self) -> String {
        match &self.target {
            Target::Tcp { host, .. } => host.clone(),
            Target::Unix(path) => path.display().to_string(),
        }
    }
}

/// A connection kept for the next message, and what it was opened for.
struct Kept {
    target: Target,
    lhlo_name: String,
    conn: Connection,
}

/// The stage: the worker's one kept connection.
#[derive(Default)]
pub struct RelayToLmtp {
    kept: Mutex<Option<Kept>>,
}

impl RelayToLmtp {
    /// A usable connection for `settings`: the kept one, if it is for the same server, not
    /// idle too long and answers RSET; else a new one.
    async fn connection(
        &self,
        kept: Option<Kept>,
        settings: &Settings,
    ) -> Result<Connection, ClientError> {
        if let Some(k) = kept {
            let same = k.target == settings.target && k.lhlo_name == settings.lhlo_name;
            if same && k.conn.is_usable() && k.conn.idle() < settings.connection_idle {
                let mut conn = k.conn;
                match conn.rset().await {
                    Ok(()) => return Ok(conn),
                    Err(e) => tracing::debug!(
                        target = %settings.target,
                        "kept connection no longer usable ({e}); reconnecting"
                    ),
                }
            } else {
                k.conn.quit().await;
            }
        }
        Connection::open(
            &settings.target,
            Protocol::Lmtp,
            &settings.lhlo_name,
            settings.timeouts,
        )
        .await
    }

    /// One delivery attempt of `message` to every recipient of `env`: one result each.
    pub async fn deliver(
        &self,
        settings: &Settings,
        env: &Envelope,
        message: &[u8],
    ) -> Vec<RcptResult> {
        let mut slot = self.kept.lock().await;
        let mut conn = match self.connection(slot.take(), settings).await {
            Ok(conn) => conn,
            Err(e) => {
                // Before the transaction nothing is about a recipient: defer them all.
                let failure = e.failure(&settings.target_name());
                tracing::warn!(target = %settings.target, "LMTP session failed: {e}");
                return vec![RcptResult::Transient(failure); env.recipients.len()];
            }
        };
        let outcomes = conn.send(env, message).await;
        let remote = conn.remote_mta().to_owned();
        for (rcpt, outcome) in env.recipients.iter().zip(&outcomes) {
            match outcome {
                RcptOutcome::Accepted(reply) => {
                    tracing::info!(rcpt = %rcpt.address, %remote, "delivered: {reply}")
                }
                RcptOutcome::Refused { phase, reply } => {
                    tracing::info!(rcpt = %rcpt.address, %remote, "refused at {}: {reply}", phase.as_str())
                }
                RcptOutcome::Failed(e) => {
                    tracing::warn!(rcpt = %rcpt.address, %remote, "not delivered: {e}")
                }
            }
        }
        if conn.is_usable() && !settings.connection_idle.is_zero() {
            *slot = Some(Kept {
                target: settings.target.clone(),
                lhlo_name: settings.lhlo_name.clone(),
                conn,
            });
        } else {
            conn.quit().await;
        }
        outcomes.iter().map(|o| o.to_result(&remote)).collect()
    }
}

impl Stage for RelayToLmtp {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Full;

    async fn process(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let settings = Settings::from_config(ctx.config(), ctx.stage())?;
        let message = ctx.raw_message()?;
        let env = Envelope::from_state(ctx.mail_from(), ctx.rcpt_to(), ctx.state());
        let results = self.deliver(&settings, &env, &message).await;
        delivery::conclude(ctx, &settings.policy, &results)
    }
}

const ABOUT: &str = "\
Pepsi delivery stage that hands each message to an LMTP server (RFC 2033)

Each message goes to the server in one transaction for all its recipients: LHLO, MAIL FROM, \
RCPT TO per recipient, DATA, and one reply per accepted recipient after the final dot. A \
recipient the server accepts is delivered; one refused with 5xx is bounced (a clone at \
BOUNCE_STAGE whose state.bounce quotes the server's reply); one refused with 4xx, and every \
recipient when the server cannot be reached or refuses the session, waits: the message is \
paused with exponential backoff and retried, and expires after MAX_LIFETIME.

Options of [stage-<name>]:
  LMTP = unix:/path | /path | host:port | [IPv6]:port   where the server listens (required)
  LHLO_NAME         name given in LHLO (default: [pepsi] HOSTNAME, else the system host name)
  CONNECT_TIMEOUT   30s    GREETING_TIMEOUT 60s    COMMAND_TIMEOUT 60s    DATA_TIMEOUT 10m
  CONNECTION_IDLE   30s    reuse the worker's connection (after RSET) if idle less; 0 = never
  RETRY_INITIAL 5m, RETRY_FACTOR 2, RETRY_MAX_INTERVAL 1h, DELAY_WARNING 4h (0 = off),
  MAX_LIFETIME 5d          retry policy; each falls back to [pepsi], then to the default
  BOUNCE_STAGE, NEXT_STAGE, ORIGINATE_SUCCESS_DSN   as for every stage

See docs/lmtp.md.";

/// Entry point of the `pepsi-stage-relay-to-lmtp` binary.
pub fn run() -> ExitCode {
    pepsi_common::stage::main(&constants::CONFIG_SOURCE, ABOUT, RelayToLmtp::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Result<Settings, String> {
        let cfg = Config::from_str_named(text, "t.conf").unwrap();
        Settings::from_config(&cfg, "lmtp").map_err(|e| e.to_string())
    }

    #[test]
    fn settings_table() {
        let s = settings(
            "[pepsi]\nHOSTNAME = mx.example.test\n[stage-lmtp]\nLMTP = unix:/run/dovecot/lmtp\n",
        )
        .unwrap();
        assert_eq!(s.target, Target::Unix("/run/dovecot/lmtp".into()));
        assert_eq!(s.lhlo_name, "mx.example.test");
        assert_eq!(s.timeouts, Timeouts::default());
        assert_eq!(s.connection_idle, Duration::from_secs(30));

        let s = settings(
            "[stage-lmtp]\nLMTP = 127.0.0.1:24\nLHLO_NAME = relay.test\nDATA_TIMEOUT = 2m\n\
             CONNECTION_IDLE = 0\nRETRY_INITIAL = 10s\n",
        )
        .unwrap();
        assert_eq!(
            s.target,
            Target::Tcp {
                host: "127.0.0.1".into(),
                port: 24
            }
        );
        assert_eq!(s.lhlo_name, "relay.test");
        assert_eq!(s.timeouts.data, Duration::from_secs(120));
        assert!(s.connection_idle.is_zero());
        assert_eq!(s.policy.initial, Duration::from_secs(10));
        assert!(
            !settings("[stage-lmtp]\nLMTP = /x\n")
                .unwrap()
                .lhlo_name
                .is_empty()
        );

        let missing = settings("[stage-lmtp]\nPROGRAM = x\n").unwrap_err();
        assert!(
            missing.contains("LMTP") && missing.contains("t.conf"),
            "{missing}"
        );
        let bad = settings("[stage-lmtp]\nLMTP = lmtp.example\n").unwrap_err();
        assert!(
            bad.contains("t.conf:2") && bad.contains("host:port"),
            "{bad}"
        );
    }
}
