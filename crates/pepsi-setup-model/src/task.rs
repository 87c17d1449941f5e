//! The eleven kinds of `pepsi.setup_task` row, each with its parameters, and their
//! validation. A row's `kind` column names the variant and its `params` column holds the
//! fields, exactly those (an unknown field is refused, so a typo cannot slip through
//! unnoticed). [`Task::from_row`] is the one way from a row to a task; the applier calls it
//! on every row before it acts, pepsi-httpd before it writes one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::name::{check_address, check_host_port, check_name, check_selector};

/// Why a row is not a task of its kind: refused, never carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    #[error("unknown task kind {0:?} (one of {kinds})", kinds = KINDS.join(", "))]
    UnknownKind(String),
    #[error("the parameters of a {kind} task do not parse: {reason}")]
    Shape { kind: &'static str, reason: String },
    #[error("the parameters of a {kind} task are refused: {reason}")]
    Invalid { kind: &'static str, reason: String },
}

/// Every kind, as the `kind` column spells it (pepsi-0026.sql's CHECK lists the same).
pub const KINDS: [&str; 11] = [
    "database",
    "hostname",
    "mail_domains",
    "tls_files",
    "tls_acme",
    "dkim_key",
    "relay_direct",
    "relay_smarthost",
    "local_delivery",
    "mailbox",
    "features",
];

/// The most mail domains, ACME names or mailboxes one task may name.
pub const MAX_NAMES: usize = 100;

/// One setup task: what should be true once it is carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "params", rename_all = "snake_case")]
pub enum Task {
    /// The database, its procedures, roles and grants are current (`pepsi-setup db`).
    Database(Empty),
    /// The host's name in the greeting, the Received fields and the DSNs ([pepsi] HOSTNAME).
    Hostname(Hostname),
    /// The domains whose mail is delivered here ([pepsi] LOCAL_DOMAINS).
    MailDomains(MailDomains),
    /// The ingress's certificate and key, from files already on the host.
    TlsFiles(TlsFiles),
    /// A certificate obtained (or renewed) over ACME, then used by the ingress.
    TlsAcme(TlsAcme),
    /// A DKIM key for a domain and selector, made once, and the signing stage using it.
    DkimKey(DkimKey),
    /// Outbound mail goes straight to each recipient domain's MX hosts.
    RelayDirect(Empty),
    /// Outbound mail goes through a smarthost, logged in to with a password or OAuth 2.0.
    RelaySmarthost(RelaySmarthost),
    /// How local mail is delivered: into Maildirs, or by LMTP to a mailbox server.
    LocalDelivery(LocalDelivery),
    /// A mailbox account that may log in to submit mail.
    Mailbox(Mailbox),
    /// Which optional stages the pipeline runs.
    Features(Features),
}

/// The parameters of a kind that takes none: `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hostname {
    pub hostname: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailDomains {
    pub domains: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The certificate chain, PEM, leaf first.
    pub certificate: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsAcme {
    /// The names the certificate covers; the first is its name.
    pub domains: Vec<String>,
    /// The account's contact address at the ACME server.
    pub email: String,
    /// The ACME server's directory URL (https).
    pub directory: String,
    /// A CA bundle to trust for the ACME server itself, for a private ACME server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyAlgorithm {
    Rsa,
    Ed25519,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DkimKey {
    pub domain: String,
    pub selector: String,
    pub algorithm: KeyAlgorithm,
}

/// How the connection to the smarthost is protected: STARTTLS always, required before
/// the password is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmarthostTls {
    /// The smarthost's certificate must be valid for its name (the stage's `TLS = verify`).
    Verify,
    /// Encrypted, the certificate not checked (`TLS = encrypt`), for a smarthost with a
    /// self-signed certificate on a network the operator trusts.
    Encrypt,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySmarthost {
    /// `host:port`.
    pub server: String,
    pub tls: SmarthostTls,
    pub username: String,
    pub credential: Credential,
}

/// How the smarthost is logged in to. Secret fields are replaced by [`REDACTED`] in the row
/// once the task is carried out ([`Task::redacted`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "lowercase", deny_unknown_fields)]
pub enum Credential {
    Password {
        password: String,
    },
    /// RFC 6749 refresh grant against the provider's token endpoint, by
    /// pepsi-helper-token-refresh.
    Oauth2 {
        token_endpoint: String,
        client_id: String,
        client_secret: String,
        refresh_token: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "method", rename_all = "lowercase", deny_unknown_fields)]
pub enum LocalDelivery {
    /// Into `<root>/<user>/Maildir` through the set-uid writer.
    Maildir { root: PathBuf },
    /// By LMTP to a mailbox server (Dovecot) at `host:port`.
    Lmtp { server: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mailbox {
    pub address: String,
    /// The password's Argon2id hash in PHC form: the page hashes it before it writes the
    /// row, so no password is ever stored in a task.
    pub password_hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Features {
    /// Out-of-office replies (the vacation stage).
    pub vacation: bool,
    /// Sender whitelists (the whitelist stage).
    pub whitelist: bool,
    /// Language blocks for local mail (language detection and blocking after the lists).
    #[serde(default)]
    pub language: bool,
    /// A content filter for inbound mail (spam, viruses) over the milter protocol, at this
    /// address (`inet:HOST:PORT` or `unix:/path`): in front of alias expansion. None: off.
    #[serde(default)]
    pub milter: Option<String>,
    /// Opportunistic end-to-end encryption of outgoing mail to recipients with published
    /// keys (the encrypt stage, before DKIM signing).
    #[serde(default)]
    pub encryption: bool,
}

/// What a secret parameter reads once its task is carried out.
pub const REDACTED: &str = "(redacted)";

impl Task {
    /// The task of a row: `kind` and `params` as the columns hold them, parsed and validated.
    pub fn from_row(kind: &str, params: &Value) -> Result<Task, TaskError> {
        let Some(kind) = KINDS.iter().copied().find(|k| *k == kind) else {
            return Err(TaskError::UnknownKind(kind.to_owned()));
        };
        let tagged = serde_json::json!({"kind": kind, "params": params});
        let task: Task = serde_json::from_value(tagged).map_err(|e| TaskError::Shape {
            kind,
            reason: e.to_string(),
        })?;
        task.validated()
            .map_err(|reason| TaskError::Invalid { kind, reason })
    }

    /// The `kind` column's value.
    pub fn kind(&self) -> &'static str {
        match self {
            Task::Database(_) => "database",
            Task::Hostname(_) => "hostname",
            Task::MailDomains(_) => "mail_domains",
            Task::TlsFiles(_) => "tls_files",
            Task::TlsAcme(_) => "tls_acme",
            Task::DkimKey(_) => "dkim_key",
            Task::RelayDirect(_) => "relay_direct",
            Task::RelaySmarthost(_) => "relay_smarthost",
            Task::LocalDelivery(_) => "local_delivery",
            Task::Mailbox(_) => "mailbox",
            Task::Features(_) => "features",
        }
    }

    /// The `params` column's value.
    pub fn params(&self) -> Value {
        let mut tagged = serde_json::to_value(self).expect("a task serialises");
        tagged
            .get_mut("params")
            .map(Value::take)
            .unwrap_or_else(|| serde_json::json!({}))
    }

    /// The parameters with every secret replaced by [`REDACTED`]: what the row keeps once
    /// the secret has gone where it belongs.
    pub fn redacted(&self) -> Value {
        let mut task = self.clone();
        match &mut task {
            Task::RelaySmarthost(r) => match &mut r.credential {
                Credential::Password { password } => *password = REDACTED.into(),
                Credential::Oauth2 {
                    client_secret,
                    refresh_token,
                    ..
                } => {
                    *client_secret = REDACTED.into();
                    *refresh_token = REDACTED.into();
                }
            },
            Task::Mailbox(m) => m.password_hash = REDACTED.into(),
            _ => {}
        }
        task.params()
    }

    /// Whether the row's secrets are already [`Task::redacted`]: a carried-out task whose
    /// secret is gone, which cannot be carried out again from the row.
    pub fn is_redacted(&self) -> bool {
        match self {
            Task::RelaySmarthost(r) => match &r.credential {
                Credential::Password { password } => password == REDACTED,
                Credential::Oauth2 { refresh_token, .. } => refresh_token == REDACTED,
            },
            Task::Mailbox(m) => m.password_hash == REDACTED,
            _ => false,
        }
    }

    /// Checks every field and brings names to the form the configuration keeps (lower-case
    /// domains, normalised addresses).
    fn validated(self) -> Result<Task, String> {
        Ok(match self {
            Task::Database(e) => Task::Database(e),
            Task::RelayDirect(e) => Task::RelayDirect(e),
            Task::Hostname(Hostname { hostname }) => Task::Hostname(Hostname {
                hostname: check_name("hostname", &hostname)?,
            }),
            Task::MailDomains(MailDomains { domains }) => Task::MailDomains(MailDomains {
                domains: check_names("mail domain", &domains)?,
            }),
            Task::TlsFiles(TlsFiles { certificate, key }) => Task::TlsFiles(TlsFiles {
                certificate: check_path("certificate", &certificate)?,
                key: check_path("key", &key)?,
            }),
            Task::TlsAcme(TlsAcme {
                domains,
                email,
                directory,
                ca_file,
            }) => Task::TlsAcme(TlsAcme {
                domains: check_names("certificate name", &domains)?,
                email: check_address("ACME contact", &email)?,
                directory: check_https("ACME directory", &directory)?,
                ca_file: ca_file
                    .map(|p| check_path("ACME CA file", &p))
                    .transpose()?,
            }),
            Task::DkimKey(DkimKey {
                domain,
                selector,
                algorithm,
            }) => Task::DkimKey(DkimKey {
                domain: check_name("DKIM domain", &domain)?,
                selector: check_selector(&selector)?,
                algorithm,
            }),
            Task::RelaySmarthost(RelaySmarthost {
                server,
                tls,
                username,
                credential,
            }) => {
                let (host, port) = check_host_port("smarthost", &server)?;
                Task::RelaySmarthost(RelaySmarthost {
                    server: format!("{host}:{port}"),
                    tls,
                    username: check_text("smarthost user name", &username, 1, 256)?,
                    credential: match credential {
                        Credential::Password { password } => Credential::Password {
                            password: check_text("smarthost password", &password, 1, 1024)?,
                        },
                        Credential::Oauth2 {
                            token_endpoint,
                            client_id,
                            client_secret,
                            refresh_token,
                        } => Credential::Oauth2 {
                            token_endpoint: check_https("token endpoint", &token_endpoint)?,
                            client_id: check_text("OAuth client id", &client_id, 1, 1024)?,
                            client_secret: check_text(
                                "OAuth client secret",
                                &client_secret,
                                0,
                                1024,
                            )?,
                            refresh_token: check_text(
                                "OAuth refresh token",
                                &refresh_token,
                                1,
                                4096,
                            )?,
                        },
                    },
                })
            }
            Task::LocalDelivery(LocalDelivery::Maildir { root }) => {
                Task::LocalDelivery(LocalDelivery::Maildir {
                    root: check_path("Maildir root", &root)?,
                })
            }
            Task::LocalDelivery(LocalDelivery::Lmtp { server }) => {
                let (host, port) = check_host_port("LMTP server", &server)?;
                Task::LocalDelivery(LocalDelivery::Lmtp {
                    server: format!("{host}:{port}"),
                })
            }
            Task::Mailbox(Mailbox {
                address,
                password_hash,
            }) => Task::Mailbox(Mailbox {
                address: check_address("mailbox", &address)?,
                password_hash: check_phc(&password_hash)?,
            }),
            Task::Features(f) => Task::Features(Features {
                milter: f.milter.as_deref().map(check_milter).transpose()?,
                ..f
            }),
        })
    }
}

/// A milter's address as `pepsi-stage-milter` takes it: `inet:HOST:PORT` or `unix:` and an
/// absolute path.
pub fn check_milter(text: &str) -> Result<String, String> {
    if let Some(path) = text.strip_prefix("unix:") {
        let path = check_path("milter socket", Path::new(path))?;
        return Ok(format!("unix:{}", path.display()));
    }
    if let Some(rest) = text.strip_prefix("inet:") {
        let (host, port) = check_host_port("milter", rest)?;
        // The milter stage names an IPv6 address's family apart.
        let family = if host.starts_with('[') {
            "inet6"
        } else {
            "inet"
        };
        return Ok(format!("{family}:{host}:{port}"));
    }
    Err(format!(
        "milter {text:?} is not inet:HOST:PORT or unix:/path/to/socket"
    ))
}

fn check_names(what: &str, names: &[String]) -> Result<Vec<String>, String> {
    if names.is_empty() {
        return Err(format!("no {what} given"));
    }
    if names.len() > MAX_NAMES {
        return Err(format!("{} {what}s, more than {MAX_NAMES}", names.len()));
    }
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let name = check_name(what, name)?;
        if out.contains(&name) {
            return Err(format!("{what} {name} is named twice"));
        }
        out.push(name);
    }
    Ok(out)
}

/// An absolute path of plain characters: letters, digits and `/ . _ - + @`, no `..`, at
/// most 1024 bytes. Anything else (a `$`, a quote, a newline) could mean something else in
/// the configuration file it is written to.
pub fn check_path(what: &str, path: &Path) -> Result<PathBuf, String> {
    let text = path.to_str().unwrap_or("");
    let plain = text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+@".contains(&b));
    if !text.starts_with('/') || text.len() > 1024 || !plain || text.split('/').any(|c| c == "..") {
        return Err(format!(
            "{what} {path:?} is not an absolute path of letters, digits and / . _ - + @"
        ));
    }
    Ok(path.to_owned())
}

/// An https URL without spaces or control characters, at most 2000 bytes.
fn check_https(what: &str, url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("https://").unwrap_or("");
    let host = rest.split(['/', ':', '?']).next().unwrap_or("");
    if host.is_empty()
        || url.len() > 2000
        || url
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"')
    {
        return Err(format!("{what} {url:?} is not an https:// URL"));
    }
    Ok(url.to_owned())
}

/// One line of text from `min` to `max` bytes, without control characters.
fn check_text(what: &str, text: &str, min: usize, max: usize) -> Result<String, String> {
    if text.len() < min || text.len() > max || text.chars().any(char::is_control) {
        return Err(format!(
            "{what} must be {min} to {max} bytes on one line, without control characters"
        ));
    }
    Ok(text.to_owned())
}

/// An Argon2id hash in PHC string form (`$argon2id$v=19$m=…,t=…,p=…$salt$hash`).
fn check_phc(hash: &str) -> Result<String, String> {
    if hash == REDACTED {
        return Ok(hash.to_owned());
    }
    let parts: Vec<&str> = hash.split('$').collect();
    let ok = parts.len() == 6
        && parts[0].is_empty()
        && parts[1] == "argon2id"
        && parts[2].starts_with("v=")
        && parts[3].contains("m=")
        && hash.len() <= 512
        && parts[4..].iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
        });
    if ok {
        Ok(hash.to_owned())
    } else {
        Err("the password hash is not an Argon2id hash in PHC form ($argon2id$v=19$...)".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HASH: &str =
        "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$qh6p1m6ZbK5Xq3g0lJ0oJ4c1nY8z0m3uR3t3s9m2bX8";

    /// `kind` and `params` as a row holds them → the task's params after validation, or
    /// the start of the error.
    fn check(kind: &str, params: Value, expected: Result<Value, &str>) {
        let got = Task::from_row(kind, &params);
        match (got, expected) {
            (Ok(task), Ok(want)) => {
                assert_eq!(task.kind(), kind);
                assert_eq!(task.params(), want, "{kind} {params}");
            }
            (Err(e), Err(want)) => assert!(
                e.to_string().contains(want),
                "{kind} {params}: {e} does not say {want:?}"
            ),
            (got, want) => panic!("{kind} {params}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn a_milter_address_is_one_the_milter_stage_takes() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("inet:127.0.0.1:11332", Ok("inet:127.0.0.1:11332")),
            ("inet:Filter.Example:11332", Ok("inet:filter.example:11332")),
            ("inet:[::1]:11332", Ok("inet6:[::1]:11332")),
            (
                "unix:/run/rspamd/milter.sock",
                Ok("unix:/run/rspamd/milter.sock"),
            ),
            ("unix:relative.sock", Err("is not an absolute path")),
            ("unix:/run/../etc/x", Err("is not an absolute path")),
            ("inet:127.0.0.1", Err("is not HOST:PORT")),
            ("127.0.0.1:11332", Err("is not inet:HOST:PORT or unix:")),
            ("inet:host;rm:1", Err("is not a domain name")),
        ];
        for (text, want) in cases {
            match (check_milter(text), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want),
                (Err(got), Err(want)) => assert!(got.contains(want), "{text}: {got}"),
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
        let task = Task::from_row(
            "features",
            &serde_json::json!({"vacation": true, "whitelist": true, "milter": "tcp:1"}),
        );
        assert!(task.is_err(), "{task:?}");
    }

    #[test]
    fn rows_to_tasks() {
        check("database", json!({}), Ok(json!({})));
        check("database", json!({"x": 1}), Err("unknown field `x`"));
        check("nonsense", json!({}), Err("unknown task kind \"nonsense\""));
        check(
            "hostname",
            json!({"hostname": "MX.Example.ORG"}),
            Ok(json!({"hostname": "mx.example.org"})),
        );
        check(
            "hostname",
            json!({"hostname": "mx"}),
            Err("is not a domain name"),
        );
        check("hostname", json!({}), Err("missing field `hostname`"));
        check(
            "hostname",
            json!({"hostname": "mx.example.org", "admin": true}),
            Err("unknown field `admin`"),
        );
        check(
            "mail_domains",
            json!({"domains": ["Example.org", "example.net"]}),
            Ok(json!({"domains": ["example.org", "example.net"]})),
        );
        check(
            "mail_domains",
            json!({"domains": []}),
            Err("no mail domain given"),
        );
        check(
            "mail_domains",
            json!({"domains": ["example.org", "EXAMPLE.org"]}),
            Err("named twice"),
        );
        check(
            "mail_domains",
            json!({"domains": vec!["a.example"; 101]}),
            Err("more than 100"),
        );
        check(
            "tls_files",
            json!({"certificate": "/etc/ssl/mx.pem", "key": "/etc/ssl/private/mx.key"}),
            Ok(json!({"certificate": "/etc/ssl/mx.pem", "key": "/etc/ssl/private/mx.key"})),
        );
        check(
            "tls_files",
            json!({"certificate": "relative.pem", "key": "/k"}),
            Err("not an absolute path"),
        );
        check(
            "tls_files",
            json!({"certificate": "/etc/$HOME/c.pem", "key": "/k"}),
            Err("not an absolute path"),
        );
        check(
            "tls_files",
            json!({"certificate": "/etc/../shadow", "key": "/k"}),
            Err("not an absolute path"),
        );
        check(
            "tls_acme",
            json!({"domains": ["mx.example.org"], "email": "Ops@Example.org",
                   "directory": "https://acme.example/dir"}),
            Ok(
                json!({"domains": ["mx.example.org"], "email": "ops@example.org",
                      "directory": "https://acme.example/dir"}),
            ),
        );
        check(
            "tls_acme",
            json!({"domains": ["mx.example.org"], "email": "ops@example.org",
                   "directory": "http://acme.example/dir"}),
            Err("not an https:// URL"),
        );
        check(
            "dkim_key",
            json!({"domain": "example.org", "selector": "S2026", "algorithm": "ed25519"}),
            Ok(json!({"domain": "example.org", "selector": "s2026", "algorithm": "ed25519"})),
        );
        check(
            "dkim_key",
            json!({"domain": "example.org", "selector": "s", "algorithm": "dsa"}),
            Err("unknown variant `dsa`"),
        );
        check(
            "relay_smarthost",
            json!({"server": "SMTP.example.com:587", "tls": "verify", "username": "me",
                   "credential": {"method": "password", "password": "pw"}}),
            Ok(
                json!({"server": "smtp.example.com:587", "tls": "verify", "username": "me",
                      "credential": {"method": "password", "password": "pw"}}),
            ),
        );
        check(
            "relay_smarthost",
            json!({"server": "smtp.example.com:587", "tls": "none", "username": "me",
                   "credential": {"method": "password", "password": "pw"}}),
            Err("unknown variant `none`"),
        );
        check(
            "relay_smarthost",
            json!({"server": "smtp.example.com:587", "tls": "encrypt", "username": "me",
                   "credential": {"method": "password", "password": "p\nw"}}),
            Err("smarthost password must be"),
        );
        check(
            "relay_smarthost",
            json!({"server": "smtp.example.com:465", "tls": "encrypt", "username": "me",
                   "credential": {"method": "oauth2", "token_endpoint": "https://t.example/token",
                                  "client_id": "c", "client_secret": "", "refresh_token": "r"}}),
            Ok(
                json!({"server": "smtp.example.com:465", "tls": "encrypt", "username": "me",
                      "credential": {"method": "oauth2", "token_endpoint": "https://t.example/token",
                                     "client_id": "c", "client_secret": "", "refresh_token": "r"}}),
            ),
        );
        check(
            "local_delivery",
            json!({"method": "lmtp", "server": "127.0.0.1:24"}),
            Ok(json!({"method": "lmtp", "server": "127.0.0.1:24"})),
        );
        check(
            "local_delivery",
            json!({"method": "maildir", "root": "/var/mail/vhosts"}),
            Ok(json!({"method": "maildir", "root": "/var/mail/vhosts"})),
        );
        check(
            "local_delivery",
            json!({"method": "mbox", "root": "/var/mail"}),
            Err("unknown variant `mbox`"),
        );
        check(
            "mailbox",
            json!({"address": "Alice@Example.ORG", "password_hash": HASH}),
            Ok(json!({"address": "alice@example.org", "password_hash": HASH})),
        );
        check(
            "mailbox",
            json!({"address": "alice@example.org", "password_hash": "hunter2"}),
            Err("not an Argon2id hash"),
        );
        check(
            "features",
            json!({"vacation": true, "whitelist": false}),
            Ok(
                json!({"vacation": true, "whitelist": false, "language": false,
                      "milter": null, "encryption": false}),
            ),
        );
        check(
            "features",
            json!({"vacation": true, "whitelist": true, "language": true,
                   "milter": "inet:[::1]:11332", "encryption": true}),
            Ok(
                json!({"vacation": true, "whitelist": true, "language": true,
                      "milter": "inet6:[::1]:11332", "encryption": true}),
            ),
        );
        check(
            "features",
            json!({"vacation": "yes", "whitelist": false}),
            Err("invalid type"),
        );
    }

    #[test]
    fn every_kind_is_in_the_schema_check() {
        let sql = include_str!("../../pepsi-setup/db/pepsi-0026.sql");
        for kind in KINDS {
            assert!(
                sql.contains(&format!("'{kind}'")),
                "{kind} missing from the CHECK"
            );
        }
    }

    #[test]
    fn secrets_are_redacted_and_nothing_else() {
        let smarthost = Task::from_row(
            "relay_smarthost",
            &json!({"server": "smtp.example.com:587", "tls": "verify", "username": "me",
                    "credential": {"method": "password", "password": "pw"}}),
        )
        .unwrap();
        assert_eq!(smarthost.redacted()["credential"]["password"], REDACTED);
        assert_eq!(smarthost.redacted()["username"], "me");
        assert!(!smarthost.is_redacted());
        let again = Task::from_row("relay_smarthost", &smarthost.redacted()).unwrap();
        assert!(again.is_redacted());
        let mailbox = Task::from_row(
            "mailbox",
            &json!({"address": "a@example.org", "password_hash": HASH}),
        )
        .unwrap();
        assert_eq!(mailbox.redacted()["password_hash"], REDACTED);
        let host = Task::from_row("hostname", &json!({"hostname": "mx.example.org"})).unwrap();
        assert_eq!(host.redacted(), host.params());
        assert!(!host.is_redacted());
    }
}
