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

use pepsi_conf::config::{Config, ConfigError, Section};
use pepsi_outbound::relay::{self, Peer, PeerKind, RelayOptions, RelayStage};
use pepsi_smtp::{OpenOptions, Protocol, Target};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-relay-to-lmtp",
        exec: "pepsi-stage-relay-to-lmtp",
    };
    pub const PROGRAM: &str = "pepsi-stage-relay-to-lmtp";
}

/// The peer of an LMTP stage: `LMTP` (where the server listens), `LHLO_NAME`, the timeouts
/// and `CONNECTION_IDLE`; LHLO_NAME falls back to `[pepsi] HOSTNAME`, then to the system's
/// host name.
pub struct Lmtp;

impl PeerKind for Lmtp {
    const PROGRAM: &'static str = constants::PROGRAM;

    fn peer(cfg: &Config, s: &Section<'_>, _stage: &str) -> Result<Peer, ConfigError> {
        Ok(Peer {
            target: s.parse("LMTP", Target::parse)?,
            protocol: Protocol::Lmtp,
            hello_name: relay::hello_name(cfg, s, "LHLO_NAME")?,
            timeouts: relay::timeouts(s)?,
            connection_idle: relay::connection_idle(s)?,
            options: OpenOptions::default(),
            fresh_auth: None,
        })
    }
}

/// The `[stage-<name>]` settings of one LMTP stage.
pub type Options = RelayOptions;

/// The stage: the relay stage over an LMTP peer, with the worker's one kept connection.
pub type RelayToLmtp = RelayStage<Lmtp>;

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
  ATTEMPT_TIMEOUT   4m     one whole attempt; must be shorter than MAX_RUNTIME (checked at
                           start). Recipients answered before it keep their answers; the rest
                           wait for their retry (4.4.2)
  RETRY_INITIAL 5m, RETRY_FACTOR 2, RETRY_MAX_INTERVAL 1h, DELAY_WARNING 4h (0 = off),
  MAX_LIFETIME 5d          retry policy; each falls back to [pepsi], then to the default
  BOUNCE_STAGE, NEXT_STAGE, ORIGINATE_SUCCESS_DSN   as for every stage

See docs/lmtp.md.";

/// The command line of `pepsi-stage-relay-to-lmtp`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-relay-to-lmtp` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<RelayToLmtp>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use pepsi_smtp::Timeouts;

    use super::*;

    fn options(text: &str) -> Result<Options, String> {
        let cfg = Config::from_str_named(text, "t.conf").unwrap();
        Options::from_config::<Lmtp>(&cfg, "lmtp").map_err(|e| e.to_string())
    }

    #[test]
    fn settings_table() {
        let s = options(
            "[pepsi]\nHOSTNAME = mx.example.test\n[stage-lmtp]\nLMTP = unix:/run/dovecot/lmtp\n",
        )
        .unwrap();
        assert_eq!(s.peer.target, Target::Unix("/run/dovecot/lmtp".into()));
        assert_eq!(s.peer.hello_name, "mx.example.test");
        assert_eq!(s.peer.timeouts, Timeouts::default());
        assert_eq!(s.peer.connection_idle, Duration::from_secs(30));

        let s = options(
            "[stage-lmtp]\nLMTP = 127.0.0.1:24\nLHLO_NAME = relay.test\nDATA_TIMEOUT = 2m\n\
             CONNECTION_IDLE = 0\nRETRY_INITIAL = 10s\n",
        )
        .unwrap();
        assert_eq!(
            s.peer.target,
            Target::Tcp {
                host: "127.0.0.1".into(),
                port: 24
            }
        );
        assert_eq!(s.peer.hello_name, "relay.test");
        assert_eq!(s.peer.timeouts.data, Duration::from_secs(120));
        assert!(s.peer.connection_idle.is_zero());
        assert_eq!(s.policy.initial, Duration::from_secs(10));
        assert!(
            !options("[stage-lmtp]\nLMTP = /x\n")
                .unwrap()
                .peer
                .hello_name
                .is_empty()
        );

        let missing = options("[stage-lmtp]\nPROGRAM = x\n").unwrap_err();
        assert!(
            missing.contains("LMTP") && missing.contains("t.conf"),
            "{missing}"
        );
        let bad = options("[stage-lmtp]\nLMTP = lmtp.example\n").unwrap_err();
        assert!(
            bad.contains("t.conf:2") && bad.contains("host:port"),
            "{bad}"
        );
    }
}
