//! What carrying out a task means, decided without I/O: the steps before the configuration
//! changes (a key stored, a secret written, a certificate obtained or checked), the edits to
//! `pepsi.conf`, the steps against the edited candidate (a first OAuth 2.0 access token),
//! and the steps after. Which section is the signing, relay or local delivery stage, where
//! certbot keeps what it obtains and where the OAuth 2.0 tokens live, comes from the
//! configuration as it stands ([`Layout::of`]).

use std::path::PathBuf;

use pepsi_conf::config::Config;
use pepsi_conf::config::edit::Edit;
use pepsi_setup_model::task::{
    Credential, KeyAlgorithm, LocalDelivery, RelaySmarthost, SmarthostTls, Task,
};

use super::features::{self, StageLinks};
use super::programs::{
    DKIM_PROGRAM, INTERNET_PROGRAM, LMTP_PROGRAM, MAILDIR_PROGRAM, SMARTHOST_PROGRAM,
};

/// The secrets fragment that holds the smarthost password the setup wrote.
pub const RELAY_SECRET_FILE: &str = "50-setup-relay.conf";

/// The secrets fragment that holds the OAuth 2.0 client secret the setup wrote.
pub const TOKEN_SECRET_FILE: &str = "50-setup-token.conf";

/// The pepsi-helper-token-refresh account of the smarthost's OAuth 2.0 credential the setup
/// writes: its section `[token-setup]`, its files `setup.refresh` and `setup.json` in
/// `[pepsi-setup] TOKEN_DIR`.
pub const TOKEN_ACCOUNT: &str = "setup";
const TOKEN_SECTION: &str = "token-setup";

/// Where the tokens live by default: the directory the package makes for pepsi-token.
pub const DEFAULT_TOKEN_DIR: &str = "/var/lib/pepsi/tokens";

/// Every option of a `[token-<name>]` section. All of them go when the setup's credential
/// does: a section left with a few (a hand-set `TLS_CA_FILE`) would stop the helper.
const TOKEN_OPTIONS: [&str; 10] = [
    "TOKEN_ENDPOINT",
    "CLIENT_ID",
    "CLIENT_SECRET",
    "CLIENT_AUTH",
    "SCOPE",
    "REFRESH_TOKEN_FILE",
    "TOKEN_FILE",
    "REFRESH_BEFORE",
    "TIMEOUT",
    "TLS_CA_FILE",
];

/// certbot's name for the certificate a `tls_acme` task obtains (`--cert-name`): one
/// lineage, `<ACME_CONFIG_DIR>/live/pepsi/`, whatever names it covers.
pub const ACME_CERT_NAME: &str = "pepsi";

/// certbot's own configuration directory, where Debian's certbot timer renews from.
pub const DEFAULT_ACME_CONFIG_DIR: &str = "/etc/letsencrypt";

/// The options of the relay stage that only a smarthost reads.
const SMARTHOST_OPTIONS: [&str; 8] = [
    "HOST",
    "PORT",
    "TLS",
    "TLS_CA_FILE",
    "TLS_SERVER_NAME",
    "AUTH_USERNAME",
    "AUTH_PASSWORD",
    "AUTH_TOKEN_FILE",
];

/// The stage sections a task may change, found by their PROGRAM: each is the one section
/// running one of the programs, or why there is not exactly one. And certbot's
/// configuration directory (`[pepsi-setup] ACME_CONFIG_DIR`), whose paths a `tls_acme` task
/// writes to `pepsi.conf`, and the OAuth 2.0 tokens' (`TOKEN_DIR`), whose paths a
/// `relay_smarthost` task writes, or why the option is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub dkim: Result<String, String>,
    pub relay: Result<String, String>,
    pub local: Result<String, String>,
    pub acme_dir: Result<PathBuf, String>,
    pub token_dir: Result<PathBuf, String>,
    /// Every stage section, as the file writes it: what switching an optional feature's
    /// stage into or out of the path reads.
    pub stages: Vec<StageLinks>,
    /// Every `[listener-<name>]` section, as written: where a certificate is served.
    pub listeners: Vec<String>,
}

impl Layout {
    pub fn of(cfg: &Config) -> Layout {
        let find = |what: &str, programs: &[&str]| -> Result<String, String> {
            let found: Vec<String> = cfg
                .sections()
                .filter(|s| s.to_ascii_lowercase().starts_with("stage-"))
                .filter(|s| {
                    cfg.raw_value(s, "PROGRAM")
                        .is_some_and(|p| programs.contains(&p.trim()))
                })
                .map(str::to_owned)
                .collect();
            match found.as_slice() {
                [one] => Ok(one.clone()),
                [] => Err(format!(
                    "no stage section runs {} to be the {what} stage",
                    programs.join(" or ")
                )),
                many => Err(format!(
                    "more than one stage section could be the {what} stage ({}): change them by hand, or with pepsi-config",
                    many.iter()
                        .map(|s| format!("[{s}]"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        };
        Layout {
            dkim: find("signing", &[DKIM_PROGRAM]),
            relay: find("relay", &[INTERNET_PROGRAM, SMARTHOST_PROGRAM]),
            local: find("local delivery", &[MAILDIR_PROGRAM, LMTP_PROGRAM]),
            acme_dir: absolute_dir(cfg, "ACME_CONFIG_DIR", DEFAULT_ACME_CONFIG_DIR),
            token_dir: absolute_dir(cfg, "TOKEN_DIR", DEFAULT_TOKEN_DIR),
            stages: StageLinks::of(cfg),
            listeners: cfg
                .sections()
                .filter(|s| {
                    s.get(..9)
                        .is_some_and(|p| p.eq_ignore_ascii_case("listener-"))
                })
                .map(str::to_owned)
                .collect(),
        }
    }
}

/// A directory option of `[pepsi-setup]`, absolute: its paths go into `pepsi.conf`, read by
/// programs that run elsewhere.
fn absolute_dir(cfg: &Config, option: &str, default: &str) -> Result<PathBuf, String> {
    let dir = cfg
        .section("pepsi-setup")
        .path_opt(option)
        .map_err(|e| e.to_string())?
        .unwrap_or_else(|| PathBuf::from(default));
    if !dir.is_absolute() {
        return Err(format!(
            "[pepsi-setup] {option} {} is not an absolute path",
            dir.display()
        ));
    }
    Ok(dir)
}

/// The certificate a `tls_acme` task asks certbot for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcmeRequest {
    /// The names it covers, the first its subject.
    pub domains: Vec<String>,
    /// The account's contact address at the ACME server.
    pub email: String,
    /// The ACME server's directory URL.
    pub directory: String,
    /// The CA bundle certbot trusts the ACME server with (`REQUESTS_CA_BUNDLE`).
    pub ca_file: Option<PathBuf>,
    /// certbot's configuration directory (`--config-dir`).
    pub config_dir: PathBuf,
}

impl AcmeRequest {
    /// Where certbot keeps the current certificate (`fullchain.pem`) and key
    /// (`privkey.pem`): links it moves to each renewed pair.
    pub fn live(&self) -> PathBuf {
        self.config_dir.join("live").join(ACME_CERT_NAME)
    }
}

/// A step that is not an edit of `pepsi.conf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `pepsi-setup db`: patches, procedures, roles, grants.
    Database,
    /// certbot run: the certificate obtained from the ACME server, or the one it holds kept
    /// while it is not due for renewal.
    Acme(AcmeRequest),
    /// Both files exist and hold a PEM certificate chain and a private key.
    CheckTls {
        certificate: std::path::PathBuf,
        key: std::path::PathBuf,
    },
    /// A row of `pepsi.signing_key` for the domain and selector: made unless one is there.
    DkimKey {
        domain: String,
        selector: String,
        algorithm: KeyAlgorithm,
    },
    /// A `secrets.d/` fragment setting one option, written whole (0640, the secrets group).
    Secret {
        file: &'static str,
        section: String,
        option: &'static str,
        value: String,
    },
    /// A `secrets.d/` fragment the setup wrote, removed.
    RemoveSecret { file: &'static str },
    /// The refresh token of an OAuth 2.0 credential, one line, written whole to `path` (0600,
    /// owned by `[pepsi-setup] TOKEN_USER`, the group of its directory), where
    /// pepsi-helper-token-refresh reads it and stores the ones the provider rotates to.
    RefreshToken { path: PathBuf, value: String },
    /// The first access token of the pepsi-helper-token-refresh account, obtained with the
    /// configuration about to be in force: `TOKEN_REFRESH_PROGRAM -c <candidate> once
    /// --force <account>` as `TOKEN_USER`.
    FirstToken { account: &'static str },
    /// A mailbox account with this password hash: made, or its password set.
    Mailbox {
        address: String,
        password_hash: String,
    },
}

/// What carrying out one task takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Before the configuration changes; each may be run again.
    pub before: Vec<Step>,
    /// The edits to `pepsi.conf`, written in one atomic replacement.
    pub edits: Vec<Edit>,
    /// Run against the edited candidate once every program's parser took it, before it
    /// replaces the file (against the file itself when the edits change nothing): a failure
    /// leaves the configuration as it was.
    pub candidate: Vec<Step>,
    /// After the new configuration is in place.
    pub after: Vec<Step>,
}

/// The edits that make every listener serve `certificate` and `key`: the ingress reads
/// them per listener (`[listener-<name>] TLS_CERT`, `TLS_KEY`), and the certificate is the
/// host name's, the same on each.
fn serve_certificate(
    plan: &mut Plan,
    layout: &Layout,
    certificate: &std::path::Path,
    key: &std::path::Path,
) -> Result<(), String> {
    if layout.listeners.is_empty() {
        return Err(
            "no [listener-<name>] section to serve the certificate: add the ingress's \
             listeners to pepsi.conf first (docs/ingress.md)"
                .into(),
        );
    }
    for listener in &layout.listeners {
        plan.edits.push(Edit::set(
            listener,
            "TLS_CERT",
            certificate.display().to_string(),
        ));
        plan.edits
            .push(Edit::set(listener, "TLS_KEY", key.display().to_string()));
    }
    Ok(())
}

/// The plan of `task`, or why this applier cannot carry it out.
pub fn plan(task: &Task, layout: &Layout) -> Result<Plan, String> {
    let mut plan = Plan::default();
    match task {
        Task::Database(_) => plan.before.push(Step::Database),
        Task::Hostname(h) => plan.edits.push(Edit::set("pepsi", "HOSTNAME", &h.hostname)),
        Task::MailDomains(d) => {
            plan.edits
                .push(Edit::set("pepsi", "LOCAL_DOMAINS", d.domains.join(" ")));
        }
        Task::TlsFiles(t) => {
            plan.before.push(Step::CheckTls {
                certificate: t.certificate.clone(),
                key: t.key.clone(),
            });
            serve_certificate(&mut plan, layout, &t.certificate, &t.key)?;
        }
        Task::DkimKey(k) => {
            let stage = layout.dkim.clone()?;
            plan.before.push(Step::DkimKey {
                domain: k.domain.clone(),
                selector: k.selector.clone(),
                algorithm: k.algorithm,
            });
            plan.edits.push(Edit::set(&stage, "DATABASE_KEYS", "yes"));
        }
        Task::RelayDirect(_) => {
            let stage = layout.relay.clone()?;
            plan.edits
                .push(Edit::set(&stage, "PROGRAM", INTERNET_PROGRAM));
            for option in SMARTHOST_OPTIONS {
                plan.edits.push(Edit::unset(&stage, option));
            }
            plan.after.push(Step::RemoveSecret {
                file: RELAY_SECRET_FILE,
            });
            // The setup's OAuth 2.0 credential goes with the smarthost: every option of its
            // section and its client secret's fragment. The token files stay (the helper's
            // account alone may read them).
            for option in TOKEN_OPTIONS {
                plan.edits.push(Edit::unset(TOKEN_SECTION, option));
            }
            plan.after.push(Step::RemoveSecret {
                file: TOKEN_SECRET_FILE,
            });
        }
        Task::RelaySmarthost(RelaySmarthost {
            server,
            tls,
            username,
            credential,
        }) => {
            let stage = layout.relay.clone()?;
            let (host, port) = server.rsplit_once(':').expect("validated host:port");
            plan.edits
                .push(Edit::set(&stage, "PROGRAM", SMARTHOST_PROGRAM));
            plan.edits.push(Edit::set(&stage, "HOST", host));
            plan.edits.push(Edit::set(&stage, "PORT", port));
            let tls = match tls {
                SmarthostTls::Verify => "verify",
                SmarthostTls::Encrypt => "encrypt",
            };
            plan.edits.push(Edit::set(&stage, "TLS", tls));
            plan.edits
                .push(Edit::set(&stage, "AUTH_USERNAME", username));
            match credential {
                Credential::Password { password } => {
                    plan.before.push(Step::Secret {
                        file: RELAY_SECRET_FILE,
                        section: stage.clone(),
                        option: "AUTH_PASSWORD",
                        value: password.clone(),
                    });
                    // The password is the fragment's; one in the file would be a second
                    // source.
                    plan.edits.push(Edit::unset(&stage, "AUTH_PASSWORD"));
                    plan.edits.push(Edit::unset(&stage, "AUTH_TOKEN_FILE"));
                }
                Credential::Oauth2 {
                    token_endpoint,
                    client_id,
                    client_secret,
                    refresh_token,
                } => {
                    let dir = layout.token_dir.clone()?;
                    let refresh_file = dir.join(format!("{TOKEN_ACCOUNT}.refresh"));
                    let token_file = dir
                        .join(format!("{TOKEN_ACCOUNT}.json"))
                        .display()
                        .to_string();
                    // First: it finds out whether TOKEN_USER exists.
                    plan.before.push(Step::RefreshToken {
                        path: refresh_file.clone(),
                        value: refresh_token.clone(),
                    });
                    // A password fragment would be a second secret for the stage, which
                    // refuses both; it goes before the candidate is checked.
                    plan.before.push(Step::RemoveSecret {
                        file: RELAY_SECRET_FILE,
                    });
                    plan.before.push(if client_secret.is_empty() {
                        Step::RemoveSecret {
                            file: TOKEN_SECRET_FILE,
                        }
                    } else {
                        Step::Secret {
                            file: TOKEN_SECRET_FILE,
                            section: TOKEN_SECTION.into(),
                            option: "CLIENT_SECRET",
                            value: client_secret.clone(),
                        }
                    });
                    plan.edits
                        .push(Edit::set(&stage, "AUTH_TOKEN_FILE", &token_file));
                    plan.edits.push(Edit::unset(&stage, "AUTH_PASSWORD"));
                    let t = TOKEN_SECTION;
                    plan.edits
                        .push(Edit::set(t, "TOKEN_ENDPOINT", token_endpoint));
                    plan.edits.push(Edit::set(t, "CLIENT_ID", client_id));
                    // The secret is the fragment's, as the password is.
                    plan.edits.push(Edit::unset(t, "CLIENT_SECRET"));
                    plan.edits.push(Edit::set(
                        t,
                        "REFRESH_TOKEN_FILE",
                        refresh_file.display().to_string(),
                    ));
                    plan.edits.push(Edit::set(t, "TOKEN_FILE", token_file));
                    plan.candidate.push(Step::FirstToken {
                        account: TOKEN_ACCOUNT,
                    });
                }
            }
        }
        Task::LocalDelivery(delivery) => {
            let stage = layout.local.clone()?;
            match delivery {
                LocalDelivery::Maildir { root } => {
                    let root = root.display().to_string();
                    plan.edits
                        .push(Edit::set(&stage, "PROGRAM", MAILDIR_PROGRAM));
                    plan.edits.push(Edit::set(&stage, "MAILDIR_ROOT", &root));
                    plan.edits.push(Edit::unset(&stage, "LMTP"));
                    // The set-uid writer refuses a Maildir outside its own ROOT.
                    plan.edits
                        .push(Edit::set("helper-maildir-writer", "ROOT", root));
                }
                LocalDelivery::Lmtp { server } => {
                    plan.edits.push(Edit::set(&stage, "PROGRAM", LMTP_PROGRAM));
                    plan.edits.push(Edit::set(&stage, "LMTP", server));
                }
            }
        }
        Task::Mailbox(m) => plan.after.push(Step::Mailbox {
            address: m.address.clone(),
            password_hash: m.password_hash.clone(),
        }),
        Task::TlsAcme(acme) => {
            let request = AcmeRequest {
                domains: acme.domains.clone(),
                email: acme.email.clone(),
                directory: acme.directory.clone(),
                ca_file: acme.ca_file.clone(),
                config_dir: layout.acme_dir.clone()?,
            };
            let certificate = request.live().join("fullchain.pem");
            let key = request.live().join("privkey.pem");
            plan.before.push(Step::Acme(request));
            plan.before.push(Step::CheckTls {
                certificate: certificate.clone(),
                key: key.clone(),
            });
            serve_certificate(&mut plan, layout, &certificate, &key)?;
        }
        Task::Features(f) => plan.edits.extend(features::edits(&layout.stages, f)?),
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CONF: &str = "[pepsi]\nHOSTNAME = a.example\n\
        [listener-mx]\nROLE = mx\nADDRESS = 127.0.0.1:25\n\
        [listener-sub]\nROLE = submission\nADDRESS = 127.0.0.1:587\n[stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\n\
        [stage-relay]\nPROGRAM = pepsi-stage-relay-to-internet\n\
        [stage-local]\nPROGRAM = pepsi-stage-relay-to-maildir\n";

    fn layout(text: &str) -> Layout {
        Layout::of(&Config::from_str_named(text, "t.conf").unwrap())
    }

    /// A task as a row holds it → the edits (as text) and the other steps' count, or the
    /// start of the reason it cannot be carried out.
    fn check(conf: &str, kind: &str, params: serde_json::Value, expected: Result<&[&str], &str>) {
        let task = Task::from_row(kind, &params).unwrap();
        match (plan(&task, &layout(conf)), expected) {
            (Ok(plan), Ok(edits)) => {
                let got: Vec<String> = plan.edits.iter().map(|e| e.to_string()).collect();
                assert_eq!(got, edits, "{kind}");
            }
            (Err(reason), Err(want)) => assert!(reason.contains(want), "{reason}"),
            (got, want) => panic!("{kind}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn plans() {
        check(CONF, "database", json!({}), Ok(&[]));
        check(
            CONF,
            "hostname",
            json!({"hostname": "MX.example.org"}),
            Ok(&["[pepsi] HOSTNAME = mx.example.org"]),
        );
        check(
            CONF,
            "mail_domains",
            json!({"domains": ["example.org", "example.net"]}),
            Ok(&["[pepsi] LOCAL_DOMAINS = example.org example.net"]),
        );
        check(
            CONF,
            "dkim_key",
            json!({"domain": "example.org", "selector": "s1", "algorithm": "rsa"}),
            Ok(&["[stage-dkim] DATABASE_KEYS = yes"]),
        );
        check(
            "[pepsi]\n",
            "dkim_key",
            json!({"domain": "example.org", "selector": "s1", "algorithm": "rsa"}),
            Err("no stage section runs pepsi-stage-dkim-sign"),
        );
        check(
            &format!("{CONF}[stage-relay2]\nPROGRAM = pepsi-stage-relay-to-smarthost\n"),
            "relay_direct",
            json!({}),
            Err(
                "more than one stage section could be the relay stage ([stage-relay], [stage-relay2])",
            ),
        );
        check(
            CONF,
            "relay_smarthost",
            json!({"server": "smtp.example.com:587", "tls": "verify", "username": "u$er",
                   "credential": {"method": "password", "password": "secret"}}),
            Ok(&[
                "[stage-relay] PROGRAM = pepsi-stage-relay-to-smarthost",
                "[stage-relay] HOST = smtp.example.com",
                "[stage-relay] PORT = 587",
                "[stage-relay] TLS = verify",
                "[stage-relay] AUTH_USERNAME = u$$er",
                "[stage-relay] AUTH_PASSWORD removed",
                "[stage-relay] AUTH_TOKEN_FILE removed",
            ]),
        );
        let oauth2 = json!({"server": "smtp.office365.com:587", "tls": "verify",
            "username": "relay@example.org",
            "credential": {"method": "oauth2",
                           "token_endpoint": "https://login.example/tenant/oauth2/v2.0/token",
                           "client_id": "c$1", "client_secret": "s", "refresh_token": "r"}});
        check(
            CONF,
            "relay_smarthost",
            oauth2.clone(),
            Ok(&[
                "[stage-relay] PROGRAM = pepsi-stage-relay-to-smarthost",
                "[stage-relay] HOST = smtp.office365.com",
                "[stage-relay] PORT = 587",
                "[stage-relay] TLS = verify",
                "[stage-relay] AUTH_USERNAME = relay@example.org",
                "[stage-relay] AUTH_TOKEN_FILE = /var/lib/pepsi/tokens/setup.json",
                "[stage-relay] AUTH_PASSWORD removed",
                "[token-setup] TOKEN_ENDPOINT = https://login.example/tenant/oauth2/v2.0/token",
                "[token-setup] CLIENT_ID = c$$1",
                "[token-setup] CLIENT_SECRET removed",
                "[token-setup] REFRESH_TOKEN_FILE = /var/lib/pepsi/tokens/setup.refresh",
                "[token-setup] TOKEN_FILE = /var/lib/pepsi/tokens/setup.json",
            ]),
        );
        check(
            &format!("{CONF}[pepsi-setup]\nTOKEN_DIR = /srv/tokens\n"),
            "relay_smarthost",
            oauth2.clone(),
            Ok(&[
                "[stage-relay] PROGRAM = pepsi-stage-relay-to-smarthost",
                "[stage-relay] HOST = smtp.office365.com",
                "[stage-relay] PORT = 587",
                "[stage-relay] TLS = verify",
                "[stage-relay] AUTH_USERNAME = relay@example.org",
                "[stage-relay] AUTH_TOKEN_FILE = /srv/tokens/setup.json",
                "[stage-relay] AUTH_PASSWORD removed",
                "[token-setup] TOKEN_ENDPOINT = https://login.example/tenant/oauth2/v2.0/token",
                "[token-setup] CLIENT_ID = c$$1",
                "[token-setup] CLIENT_SECRET removed",
                "[token-setup] REFRESH_TOKEN_FILE = /srv/tokens/setup.refresh",
                "[token-setup] TOKEN_FILE = /srv/tokens/setup.json",
            ]),
        );
        check(
            &format!("{CONF}[pepsi-setup]\nTOKEN_DIR = tokens\n"),
            "relay_smarthost",
            oauth2,
            Err("[pepsi-setup] TOKEN_DIR tokens is not an absolute path"),
        );
        // A password needs no TOKEN_DIR.
        check(
            &format!("{CONF}[pepsi-setup]\nTOKEN_DIR = tokens\n"),
            "relay_smarthost",
            json!({"server": "smtp.example.com:587", "tls": "verify", "username": "u",
                   "credential": {"method": "password", "password": "secret"}}),
            Ok(&[
                "[stage-relay] PROGRAM = pepsi-stage-relay-to-smarthost",
                "[stage-relay] HOST = smtp.example.com",
                "[stage-relay] PORT = 587",
                "[stage-relay] TLS = verify",
                "[stage-relay] AUTH_USERNAME = u",
                "[stage-relay] AUTH_PASSWORD removed",
                "[stage-relay] AUTH_TOKEN_FILE removed",
            ]),
        );
        check(
            CONF,
            "relay_direct",
            json!({}),
            Ok(&[
                "[stage-relay] PROGRAM = pepsi-stage-relay-to-internet",
                "[stage-relay] HOST removed",
                "[stage-relay] PORT removed",
                "[stage-relay] TLS removed",
                "[stage-relay] TLS_CA_FILE removed",
                "[stage-relay] TLS_SERVER_NAME removed",
                "[stage-relay] AUTH_USERNAME removed",
                "[stage-relay] AUTH_PASSWORD removed",
                "[stage-relay] AUTH_TOKEN_FILE removed",
                "[token-setup] TOKEN_ENDPOINT removed",
                "[token-setup] CLIENT_ID removed",
                "[token-setup] CLIENT_SECRET removed",
                "[token-setup] CLIENT_AUTH removed",
                "[token-setup] SCOPE removed",
                "[token-setup] REFRESH_TOKEN_FILE removed",
                "[token-setup] TOKEN_FILE removed",
                "[token-setup] REFRESH_BEFORE removed",
                "[token-setup] TIMEOUT removed",
                "[token-setup] TLS_CA_FILE removed",
            ]),
        );
        check(
            CONF,
            "local_delivery",
            json!({"method": "lmtp", "server": "127.0.0.1:24"}),
            Ok(&[
                "[stage-local] PROGRAM = pepsi-stage-relay-to-lmtp",
                "[stage-local] LMTP = 127.0.0.1:24",
            ]),
        );
        check(
            CONF,
            "local_delivery",
            json!({"method": "maildir", "root": "/srv/mail"}),
            Ok(&[
                "[stage-local] PROGRAM = pepsi-stage-relay-to-maildir",
                "[stage-local] MAILDIR_ROOT = /srv/mail",
                "[stage-local] LMTP removed",
                "[helper-maildir-writer] ROOT = /srv/mail",
            ]),
        );
        check(
            CONF,
            "tls_acme",
            json!({"domains": ["mx.example.org"], "email": "a@example.org",
                   "directory": "https://acme.example/dir"}),
            Ok(&[
                "[listener-mx] TLS_CERT = /etc/letsencrypt/live/pepsi/fullchain.pem",
                "[listener-mx] TLS_KEY = /etc/letsencrypt/live/pepsi/privkey.pem",
                "[listener-sub] TLS_CERT = /etc/letsencrypt/live/pepsi/fullchain.pem",
                "[listener-sub] TLS_KEY = /etc/letsencrypt/live/pepsi/privkey.pem",
            ]),
        );
        check(
            &format!("{CONF}[pepsi-setup]\nACME_CONFIG_DIR = /srv/acme\n"),
            "tls_acme",
            json!({"domains": ["mx.example.org"], "email": "a@example.org",
                   "directory": "https://acme.example/dir"}),
            Ok(&[
                "[listener-mx] TLS_CERT = /srv/acme/live/pepsi/fullchain.pem",
                "[listener-mx] TLS_KEY = /srv/acme/live/pepsi/privkey.pem",
                "[listener-sub] TLS_CERT = /srv/acme/live/pepsi/fullchain.pem",
                "[listener-sub] TLS_KEY = /srv/acme/live/pepsi/privkey.pem",
            ]),
        );
        check(
            &format!("{CONF}[pepsi-setup]\nACME_CONFIG_DIR = acme\n"),
            "tls_acme",
            json!({"domains": ["mx.example.org"], "email": "a@example.org",
                   "directory": "https://acme.example/dir"}),
            Err("[pepsi-setup] ACME_CONFIG_DIR acme is not an absolute path"),
        );
        // The ingress reads a certificate per listener: none, nothing would serve it.
        check(
            &CONF.replace("[listener-", "[other-"),
            "tls_files",
            json!({"certificate": "/etc/ssl/mx.pem", "key": "/etc/ssl/mx.key"}),
            Err("no [listener-<name>] section to serve the certificate"),
        );
        check(
            CONF,
            "tls_files",
            json!({"certificate": "/etc/ssl/mx.pem", "key": "/etc/ssl/mx.key"}),
            Ok(&[
                "[listener-mx] TLS_CERT = /etc/ssl/mx.pem",
                "[listener-mx] TLS_KEY = /etc/ssl/mx.key",
                "[listener-sub] TLS_CERT = /etc/ssl/mx.pem",
                "[listener-sub] TLS_KEY = /etc/ssl/mx.key",
            ]),
        );
    }

    #[test]
    fn a_certificate_over_acme_is_obtained_then_checked_before_the_configuration_names_it() {
        let task = Task::from_row(
            "tls_acme",
            &json!({"domains": ["mx.example.org", "example.org"], "email": "a@example.org",
                    "directory": "https://acme.example/dir", "ca_file": "/etc/acme-ca.pem"}),
        )
        .unwrap();
        let plan = plan(&task, &layout(CONF)).unwrap();
        assert_eq!(
            plan.before,
            vec![
                Step::Acme(AcmeRequest {
                    domains: vec!["mx.example.org".into(), "example.org".into()],
                    email: "a@example.org".into(),
                    directory: "https://acme.example/dir".into(),
                    ca_file: Some("/etc/acme-ca.pem".into()),
                    config_dir: "/etc/letsencrypt".into(),
                }),
                Step::CheckTls {
                    certificate: "/etc/letsencrypt/live/pepsi/fullchain.pem".into(),
                    key: "/etc/letsencrypt/live/pepsi/privkey.pem".into(),
                },
            ]
        );
        assert!(plan.after.is_empty());
    }

    #[test]
    fn the_smarthost_password_goes_to_a_secrets_fragment_only() {
        let task = Task::from_row(
            "relay_smarthost",
            &json!({"server": "smtp.example.com:587", "tls": "encrypt", "username": "u",
                    "credential": {"method": "password", "password": "secret"}}),
        )
        .unwrap();
        let plan = plan(&task, &layout(CONF)).unwrap();
        assert_eq!(
            plan.before,
            vec![Step::Secret {
                file: RELAY_SECRET_FILE,
                section: "stage-relay".into(),
                option: "AUTH_PASSWORD",
                value: "secret".into(),
            }]
        );
        assert!(!plan.edits.iter().any(|e| e.to_string().contains("secret")));
    }

    /// A task's OAuth 2.0 credential → the steps before the configuration changes, those
    /// against the candidate, and those after.
    fn check_oauth2(credential: serde_json::Value, before: &[Step], after: &[Step]) {
        let task = Task::from_row(
            "relay_smarthost",
            &json!({"server": "smtp.example.com:587", "tls": "encrypt", "username": "u",
                    "credential": credential}),
        )
        .unwrap();
        let plan = plan(&task, &layout(CONF)).unwrap();
        assert_eq!(plan.before, before);
        assert_eq!(
            plan.candidate,
            [Step::FirstToken {
                account: TOKEN_ACCOUNT
            }]
        );
        assert_eq!(plan.after, after);
        let edits: String = plan.edits.iter().map(|e| e.to_string()).collect();
        assert!(
            !edits.contains("s3cret") && !edits.contains("rt-1"),
            "{edits}"
        );
    }

    #[test]
    fn an_oauth2_credential_stores_its_secrets_beside_the_configuration_and_asks_a_first_token() {
        let remove_password = Step::RemoveSecret {
            file: RELAY_SECRET_FILE,
        };
        let refresh_token = Step::RefreshToken {
            path: "/var/lib/pepsi/tokens/setup.refresh".into(),
            value: "rt-1".into(),
        };
        check_oauth2(
            json!({"method": "oauth2", "token_endpoint": "https://t.example/token",
                   "client_id": "c", "client_secret": "s3cret", "refresh_token": "rt-1"}),
            &[
                refresh_token.clone(),
                remove_password.clone(),
                Step::Secret {
                    file: TOKEN_SECRET_FILE,
                    section: "token-setup".into(),
                    option: "CLIENT_SECRET",
                    value: "s3cret".into(),
                },
            ],
            &[],
        );
        // A public client has no secret: a fragment from an earlier task goes.
        check_oauth2(
            json!({"method": "oauth2", "token_endpoint": "https://t.example/token",
                   "client_id": "c", "client_secret": "", "refresh_token": "rt-1"}),
            &[
                refresh_token,
                remove_password,
                Step::RemoveSecret {
                    file: TOKEN_SECRET_FILE,
                },
            ],
            &[],
        );
    }
}
