//! pepsi-stage-relay-to-smarthost: relays every message that reaches it through one
//! configured SMTP server (a provider's submission service, an outbound relay), with
//! STARTTLS and SMTP AUTH, in one transaction for all the message's recipients, and turns
//! the server's replies into the message's fate through `delivery::conclude`.
//!
//! Reads: envelope, `state.dsn` (RET/ENVID/NOTIFY/ORCPT, passed on when the server offers
//! DSN), `state.origin.smtputf8`, `state.attempts`/`delay_sent`, headers and body
//! (`Load::Full`). Writes (through `conclude`): `attempts`, `last_error`, `delay_sent` on a
//! paused row; `bounce` on the notification clones. Terminal helpers: only those `conclude`
//! picks — `advance_or_finish`, `finish_with` (bounces, success notices) or `pause_with`
//! (the recipients the server deferred, with backoff).
//!
//! Everything before the transaction — connecting, the greeting, EHLO, STARTTLS and the
//! certificate check, AUTH — is about the smarthost, not a recipient: a failure there defers
//! every recipient whatever the reply code, so a wrong password (535) or an expired
//! certificate pauses the mail with a clear `last_error` instead of bouncing all of it. Inside
//! the transaction 5xx is permanent and 4xx transient, per recipient. The connection is kept
//! for the next message as the LMTP stage keeps its own: both are `pepsi_outbound::relay`'s
//! `RelayStage`, over a peer kind of their own.

use std::process::ExitCode;

use pepsi_conf::config::{Config, ConfigError, Section};
use pepsi_outbound::relay::{self, Peer, PeerKind, RelayOptions, RelayStage};
use pepsi_smtp::{Credentials, OpenOptions, Protocol, Target, TlsOptions, TlsPolicy};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-relay-to-smarthost",
        exec: "pepsi-stage-relay-to-smarthost",
    };
    pub const PROGRAM: &str = "pepsi-stage-relay-to-smarthost";
}

/// The submission port (RFC 6409): what a smarthost normally listens on.
pub const DEFAULT_PORT: u16 = 587;

/// The names `TLS` takes.
const TLS_POLICIES: [&str; 4] = ["none", "may", "encrypt", "verify"];

/// `HOST`: a host name or an IP address, an IPv6 address with or without brackets.
fn parse_host(text: &str) -> Result<String, String> {
    let text = text.trim();
    let host = text
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(text);
    // A colon only belongs to an IPv6 address: `smtp.example.net:25` is a port in HOST.
    let ok = if host.contains(':') {
        host.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-_".contains(&b))
    };
    if ok {
        Ok(host.to_owned())
    } else {
        Err(format!(
            "a host name or IP address (without a port: PORT gives it), not {text:?}"
        ))
    }
}

fn missing(cfg: &Config, stage: &str, option: &str) -> ConfigError {
    ConfigError::Missing {
        file: cfg.file().to_owned(),
        section: pepsi_conf::config::stage_section_name(stage),
        option: option.to_owned(),
    }
}

/// The peer of a smarthost stage: `HOST`, `PORT`, `HELO_NAME`, the timeouts,
/// `CONNECTION_IDLE`, and in `options` the TLS settings (`TLS`, `TLS_CA_FILE`,
/// `TLS_SERVER_NAME`) and the credentials (`AUTH_USERNAME`, `AUTH_PASSWORD`). HELO_NAME falls
/// back to `[pepsi] HOSTNAME`, then to the system's host name. AUTH_USERNAME and
/// AUTH_PASSWORD come together or not at all.
pub struct Smarthost;

impl PeerKind for Smarthost {
    const PROGRAM: &'static str = constants::PROGRAM;

    fn peer(cfg: &Config, s: &Section<'_>, stage: &str) -> Result<Peer, ConfigError> {
        let host = s.parse("HOST", parse_host)?;
        let port = match s.parse_opt("PORT", |v| {
            v.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| "a port number from 1 to 65535".to_owned())
        })? {
            Some(p) => p,
            None => DEFAULT_PORT,
        };
        let tls = TlsOptions {
            policy: match s.choice_opt("TLS", &TLS_POLICIES)? {
                Some(name) => name.parse().expect("one of TLS_POLICIES"),
                None => TlsPolicy::Verify,
            },
            ca_file: s.path_opt("TLS_CA_FILE")?,
            server_name: s.string_opt("TLS_SERVER_NAME")?.filter(|v| !v.is_empty()),
        };
        let username = s.string_opt("AUTH_USERNAME")?.filter(|v| !v.is_empty());
        let password = s.string_opt("AUTH_PASSWORD")?.filter(|v| !v.is_empty());
        let auth = match (username, password) {
            (Some(username), Some(password)) => Some(Credentials { username, password }),
            (None, None) => None,
            // "required but missing": one without the other is a configuration mistake.
            (Some(_), None) => return Err(missing(cfg, stage, "AUTH_PASSWORD")),
            (None, Some(_)) => return Err(missing(cfg, stage, "AUTH_USERNAME")),
        };
        Ok(Peer {
            target: Target::Tcp { host, port },
            protocol: Protocol::Smtp,
            hello_name: relay::hello_name(cfg, s, "HELO_NAME")?,
            timeouts: relay::timeouts(s)?,
            connection_idle: relay::connection_idle(s)?,
            options: OpenOptions { tls, auth },
        })
    }
}

/// The `[stage-<name>]` settings of one smarthost stage.
pub type Options = RelayOptions;

/// The stage: the relay stage over a smarthost, with the worker's one kept connection.
pub type RelayToSmarthost = RelayStage<Smarthost>;

const ABOUT: &str = "\
Pepsi delivery stage that relays every message through one configured SMTP server (a smarthost)

Each message goes to the smarthost in one transaction for all its recipients: EHLO, STARTTLS \
(per TLS), AUTH (when AUTH_USERNAME is set), MAIL FROM, RCPT TO per recipient, DATA. The \
smarthost's 250 after the data delivers every recipient it accepted; a recipient refused with \
5xx is bounced (a clone at BOUNCE_STAGE whose state.bounce quotes the reply); one refused \
with 4xx waits. Any failure before MAIL FROM (no connection, no STARTTLS, a certificate that \
does not verify, AUTH refused even with 535) defers every recipient: the message is paused \
with exponential backoff and a last_error naming the cause, never bounced, and expires after \
MAX_LIFETIME.

Options of [stage-<name>]:
  HOST              host name or IP address of the smarthost (required)
  PORT              587
  TLS               verify   none | may | encrypt | verify
                    (may: STARTTLS if offered, unchecked; encrypt: STARTTLS required,
                    certificate unchecked; verify: STARTTLS required, certificate checked)
  TLS_CA_FILE       PEM file of the CAs to trust (default: the system's roots)
  TLS_SERVER_NAME   name the certificate must carry (default: HOST)
  AUTH_USERNAME     log in with SMTP AUTH (PLAIN or LOGIN) as this user; needs AUTH_PASSWORD
  AUTH_PASSWORD     its password; keep it in a secrets fragment (secrets.d/*.conf, mode 0600)
  HELO_NAME         name given in EHLO (default: [pepsi] HOSTNAME, else the system host name)
  CONNECT_TIMEOUT   30s    GREETING_TIMEOUT 60s    COMMAND_TIMEOUT 60s    DATA_TIMEOUT 10m
  CONNECTION_IDLE   30s    reuse the worker's connection (after RSET) if idle less; 0 = never
  RETRY_INITIAL 5m, RETRY_FACTOR 2, RETRY_MAX_INTERVAL 1h, DELAY_WARNING 4h (0 = off),
  MAX_LIFETIME 5d          retry policy; each falls back to [pepsi], then to the default
  BOUNCE_STAGE, NEXT_STAGE, ORIGINATE_SUCCESS_DSN   as for every stage

See docs/relay-smarthost.md.";

/// The command line of `pepsi-stage-relay-to-smarthost`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-relay-to-smarthost` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<RelayToSmarthost>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use pepsi_smtp::Timeouts;

    use super::*;

    fn options(text: &str) -> Result<Options, String> {
        let cfg = Config::from_str_named(text, "t.conf").unwrap();
        Options::from_config::<Smarthost>(&cfg, "smarthost").map_err(|e| e.to_string())
    }

    #[test]
    fn settings_table() {
        let s = options(
            "[pepsi]\nHOSTNAME = mx.example.test\n[stage-smarthost]\nHOST = smtp.example.net\n",
        )
        .unwrap();
        assert_eq!(
            s.peer.target,
            Target::Tcp {
                host: "smtp.example.net".into(),
                port: 587
            }
        );
        assert_eq!(s.peer.protocol, Protocol::Smtp);
        assert_eq!(s.peer.hello_name, "mx.example.test");
        assert_eq!(s.peer.timeouts, Timeouts::default());
        assert_eq!(s.peer.connection_idle, Duration::from_secs(30));
        assert_eq!(
            s.peer.options.tls.policy,
            TlsPolicy::Verify,
            "verify by default"
        );
        assert_eq!(
            (
                s.peer.options.tls.ca_file.clone(),
                s.peer.options.tls.server_name.clone()
            ),
            (None, None)
        );
        assert_eq!(s.peer.options.auth, None);

        let s = options(
            "[stage-smarthost]\nHOST = [::1]\nPORT = 2525\nTLS = May\nTLS_CA_FILE = /etc/ca.pem\n\
             TLS_SERVER_NAME = relay.example.net\nAUTH_USERNAME = pepsi\nAUTH_PASSWORD = s3cret\n\
             HELO_NAME = out.example.test\nCONNECTION_IDLE = 0\nDATA_TIMEOUT = 2m\nRETRY_INITIAL = 10s\n",
        )
        .unwrap();
        assert_eq!(s.peer.target.to_string(), "[::1]:2525");
        assert_eq!(s.peer.options.tls.policy, TlsPolicy::May);
        assert_eq!(
            s.peer.options.tls.ca_file.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        assert_eq!(
            s.peer.options.tls.server_name.as_deref(),
            Some("relay.example.net")
        );
        let auth = s.peer.options.auth.clone().unwrap();
        assert_eq!(
            (auth.username.as_str(), auth.password.as_str()),
            ("pepsi", "s3cret")
        );
        assert!(
            !format!("{s:?}").contains("s3cret"),
            "Debug never shows the password"
        );
        assert_eq!(s.peer.hello_name, "out.example.test");
        assert!(s.peer.connection_idle.is_zero());
        assert_eq!(s.peer.timeouts.data, Duration::from_secs(120));
        assert_eq!(s.policy.initial, Duration::from_secs(10));
        for policy in ["none", "encrypt", "verify"] {
            let s = options(&format!("[stage-smarthost]\nHOST = h\nTLS = {policy}\n")).unwrap();
            assert_eq!(
                s.peer.options.tls.policy,
                policy.parse::<TlsPolicy>().unwrap()
            );
        }

        // Errors name the file, the option and what was expected.
        let check = |text: &str, wanted: &[&str]| {
            let err = options(text).unwrap_err();
            for w in wanted {
                assert!(err.contains(w), "{text:?}: {err}");
            }
        };
        check(
            "[stage-smarthost]\nPORT = 25\n",
            &["t.conf", "HOST", "required"],
        );
        check(
            "[stage-smarthost]\nHOST = smtp.example.net:25\n",
            &["t.conf:2", "PORT gives it"],
        );
        check(
            "[stage-smarthost]\nHOST = h\nPORT = 70000\n",
            &["t.conf:3", "PORT", "1 to 65535"],
        );
        check(
            "[stage-smarthost]\nHOST = h\nTLS = yes\n",
            &["t.conf:3", "TLS", "verify"],
        );
        check(
            "[stage-smarthost]\nHOST = h\nAUTH_USERNAME = pepsi\n",
            &["[stage-smarthost] AUTH_PASSWORD is required"],
        );
        check(
            "[stage-smarthost]\nHOST = h\nAUTH_PASSWORD = s3cret\n",
            &["[stage-smarthost] AUTH_USERNAME is required"],
        );
    }
}
