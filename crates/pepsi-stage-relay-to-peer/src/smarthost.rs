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

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use pepsi_conf::config::{Config, ConfigError, Origin, Section};
use pepsi_helper_token_refresh::token_file;
use pepsi_outbound::relay::{
    self, FreshAuth, FreshCredentials, Peer, PeerKind, RelayOptions, RelayStage,
};
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

/// The smarthost's OAuth 2.0 access token: `AUTH_TOKEN_FILE`, which
/// `pepsi-helper-token-refresh` keeps fresh, read (`token_file`) each time a connection is
/// opened, so a refreshed token is used from the next connection on. This stage reads it
/// through its set-group-id bit (group `pepsi-token`).
#[derive(Debug)]
pub struct TokenFile {
    pub username: String,
    pub path: PathBuf,
}

impl FreshCredentials for TokenFile {
    fn read(&self) -> Result<Credentials, String> {
        let token = token_file::read_now(&self.path).map_err(|e| e.to_string())?;
        Ok(Credentials::Bearer {
            username: self.username.clone(),
            token: token.access_token,
        })
    }

    fn source(&self) -> String {
        format!("the access token in {}", self.path.display())
    }
}

/// The peer of a smarthost stage: `HOST`, `PORT`, `HELO_NAME`, the timeouts,
/// `CONNECTION_IDLE`, and in `options` the TLS settings (`TLS`, `TLS_CA_FILE`,
/// `TLS_SERVER_NAME`) and the credentials: `AUTH_USERNAME` with either `AUTH_PASSWORD` or
/// `AUTH_TOKEN_FILE` (a [`TokenFile`], in `fresh_auth`). HELO_NAME falls back to `[pepsi]
/// HOSTNAME`, then to the system's host name. A user name without a secret, a secret
/// without a user name, or both secrets are configuration errors.
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
            audit: false,
            dane: Vec::new(),
        };
        let username = s.string_opt("AUTH_USERNAME")?.filter(|v| !v.is_empty());
        let password = s.string_opt("AUTH_PASSWORD")?.filter(|v| !v.is_empty());
        // A database override naming a file is refused, as for every option that names
        // one (FILE_ONLY_OPTIONS): the file is read through this stage's group.
        let overridden = matches!(s.origin("AUTH_TOKEN_FILE"), Some(Origin::Override { .. }));
        let token_file = s.parse_opt("AUTH_TOKEN_FILE", |v| {
            if overridden {
                return Err(
                    "a path from the configuration file: a database override may not name \
                     a file this stage reads through its group"
                        .to_owned(),
                );
            }
            if password.is_some() {
                return Err(
                    "no AUTH_PASSWORD beside it: a smarthost is logged in to with a password \
                     or with an access token, not both"
                        .to_owned(),
                );
            }
            let path = PathBuf::from(v.trim());
            if path.is_absolute() {
                Ok(path)
            } else {
                Err("an absolute path to the file pepsi-helper-token-refresh writes".to_owned())
            }
        })?;
        let (auth, fresh_auth) = match (username, password, token_file) {
            (Some(username), Some(password), None) => {
                (Some(Credentials::Password { username, password }), None)
            }
            (Some(username), None, Some(path)) => (
                None,
                Some(FreshAuth(Arc::new(TokenFile { username, path }))),
            ),
            (None, None, None) => (None, None),
            // "required but missing": one without the other is a configuration mistake.
            (Some(_), None, None) => {
                return Err(missing(cfg, stage, "AUTH_PASSWORD (or AUTH_TOKEN_FILE)"));
            }
            (None, _, _) => return Err(missing(cfg, stage, "AUTH_USERNAME")),
            (Some(_), Some(_), Some(_)) => unreachable!("AUTH_TOKEN_FILE refuses AUTH_PASSWORD"),
        };
        Ok(Peer {
            target: Target::Tcp { host, port },
            protocol: Protocol::Smtp,
            hello_name: relay::hello_name(cfg, s, "HELO_NAME")?,
            timeouts: relay::timeouts(s)?,
            connection_idle: relay::connection_idle(s)?,
            options: OpenOptions { tls, auth },
            fresh_auth,
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
does not verify, AUTH refused even with 535, an access token that has expired or cannot be \
read) defers every recipient: the message is paused with exponential backoff and a last_error \
naming the cause, never bounced, and expires after MAX_LIFETIME.

With AUTH_TOKEN_FILE the stage logs in with an OAuth 2.0 access token (SASL OAUTHBEARER, \
RFC 7628, else XOAUTH2) instead of a password, for providers that require it (Microsoft 365, \
Google). pepsi-helper-token-refresh keeps the file fresh; the stage reads it each time it \
opens a connection, through its set-group-id bit (group pepsi-token). A missing, unreadable \
or expired token defers the mail with 4.7.0 and a last_error naming the file; a token the \
smarthost refuses defers it with the smarthost's reply and its error challenge (the JSON \
status of RFC 7628) and names the file.

Options of [stage-<name>]:
  HOST              host name or IP address of the smarthost (required)
  PORT              587
  TLS               verify   none | may | encrypt | verify
                    (may: STARTTLS if offered, unchecked; encrypt: STARTTLS required,
                    certificate unchecked; verify: STARTTLS required, certificate checked)
  TLS_CA_FILE       PEM file of the CAs to trust (default: the system's roots)
  TLS_SERVER_NAME   name the certificate must carry (default: HOST)
  AUTH_USERNAME     log in with SMTP AUTH as this user; needs AUTH_PASSWORD or AUTH_TOKEN_FILE
  AUTH_PASSWORD     its password (AUTH PLAIN, else LOGIN); keep it in a secrets fragment
                    (secrets.d/*.conf, mode 0600)
  AUTH_TOKEN_FILE   instead of a password: the file of its OAuth 2.0 access token (AUTH
                    OAUTHBEARER, else XOAUTH2), kept fresh by pepsi-helper-token-refresh and
                    read at each new connection; an absolute path, from the configuration
                    file only
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
    fn an_access_token_file_is_read_at_each_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m365.json");
        let s = options(&format!(
            "[stage-smarthost]\nHOST = smtp.office365.com\nAUTH_USERNAME = relay@example.org\n\
             AUTH_TOKEN_FILE = {}\n",
            path.display()
        ))
        .unwrap();
        assert_eq!(s.peer.options.auth, None, "nothing is read at start");
        let fresh = s.peer.fresh_auth.clone().expect("a token file");
        assert_eq!(fresh, s.peer.fresh_auth.clone().unwrap(), "the same peer");
        assert_eq!(
            fresh.0.source(),
            format!("the access token in {}", path.display())
        );
        let err = fresh.0.read().unwrap_err();
        assert!(
            err.contains("m365.json") && err.contains("cannot read"),
            "{err}"
        );

        let write = |token: &str, expires_at: &str| {
            std::fs::write(
                &path,
                format!(r#"{{"access_token":"{token}","expires_at":"{expires_at}"}}"#),
            )
            .unwrap()
        };
        write("old", "2001-01-01T00:00:00Z");
        let err = fresh.0.read().unwrap_err();
        assert!(
            err.contains("m365.json") && err.contains("expired at 2001-01-01T00:00:00Z"),
            "{err}"
        );
        // A database override may not name the file: it is read through the stage's group.
        let cfg = Config::from_str_named(
            "[stage-smarthost]\nHOST = h\nAUTH_USERNAME = relay@example.org\n",
            "t.conf",
        )
        .unwrap()
        .with_overrides(
            &[pepsi_conf::config::OverrideRow {
                scope: "global".into(),
                section: "stage-smarthost".into(),
                option: "AUTH_TOKEN_FILE".into(),
                value: path.display().to_string(),
            }],
            &pepsi_conf::config::Scope::Global,
        );
        let err = Options::from_config::<Smarthost>(&cfg, "smarthost")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("AUTH_TOKEN_FILE") && err.contains("a database override may not"),
            "{err}"
        );

        // The helper replaces the file: the next connection logs in with the new token.
        write("ya29.new", "2999-01-01T00:00:00Z");
        assert_eq!(
            fresh.0.read().unwrap(),
            Credentials::Bearer {
                username: "relay@example.org".into(),
                token: "ya29.new".into()
            }
        );
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
        assert_eq!(
            s.peer.options.auth,
            Some(Credentials::Password {
                username: "pepsi".into(),
                password: "s3cret".into()
            })
        );
        assert_eq!(s.peer.fresh_auth, None);
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
            &["[stage-smarthost] AUTH_PASSWORD (or AUTH_TOKEN_FILE) is required"],
        );
        check(
            "[stage-smarthost]\nHOST = h\nAUTH_TOKEN_FILE = /var/lib/pepsi/tokens/m365.json\n",
            &["[stage-smarthost] AUTH_USERNAME is required"],
        );
        check(
            "[stage-smarthost]\nHOST = h\nAUTH_USERNAME = pepsi\nAUTH_PASSWORD = s3cret\n\
             AUTH_TOKEN_FILE = /t/m365.json\n",
            &["t.conf:5", "AUTH_TOKEN_FILE", "no AUTH_PASSWORD beside it"],
        );
        check(
            "[stage-smarthost]\nHOST = h\nAUTH_USERNAME = pepsi\nAUTH_TOKEN_FILE = m365.json\n",
            &["t.conf:4", "AUTH_TOKEN_FILE", "an absolute path"],
        );
        check(
            "[stage-smarthost]\nHOST = h\nAUTH_PASSWORD = s3cret\n",
            &["[stage-smarthost] AUTH_USERNAME is required"],
        );
    }
}
