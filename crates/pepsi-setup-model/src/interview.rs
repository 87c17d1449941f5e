//! The setup interview: what a new installation needs to know, as one [`Answers`] value,
//! and the tasks it becomes ([`Answers::tasks`]). Every answer is checked with the task it
//! turns into, and an answer that names something the others must agree with (a mailbox's
//! domain) is checked against them; every problem is reported with its field, not only the
//! first.

use serde::{Deserialize, Serialize};

use crate::task::{
    Credential, DkimKey, Empty, Features, Hostname, KeyAlgorithm, LocalDelivery, MailDomains,
    Mailbox, RelaySmarthost, SmarthostTls, Task, TlsAcme, TlsFiles,
};

/// The answers, as the setup pages post them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answers {
    /// The host's name, as the MX records will name it.
    pub hostname: String,
    /// The mail domains; the first is the primary one.
    pub domains: Vec<String>,
    pub certificate: Certificate,
    pub dkim: Dkim,
    pub relay: Relay,
    pub delivery: LocalDelivery,
    #[serde(default)]
    pub mailboxes: Vec<MailboxAnswer>,
    /// Which optional stages run; none leaves the pipeline's stages as they are.
    #[serde(default)]
    pub features: Option<Features>,
}

/// A first mailbox account as the page posts it: the password as typed, which the server
/// hashes ([`Answers::hash_passwords`]) before anything derives tasks from it, or already
/// hashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailboxAnswer {
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_hash: Option<String>,
}

/// Where the ingress's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "lowercase", deny_unknown_fields)]
pub enum Certificate {
    /// Obtained over ACME for the host name.
    Acme {
        email: String,
        directory: String,
        #[serde(default)]
        ca_file: Option<std::path::PathBuf>,
    },
    /// Files already on the host.
    Files {
        certificate: std::path::PathBuf,
        key: std::path::PathBuf,
    },
}

/// One DKIM key per mail domain, under one selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dkim {
    pub selector: String,
    pub algorithm: KeyAlgorithm,
}

/// Where outbound mail goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "lowercase", deny_unknown_fields)]
pub enum Relay {
    Direct,
    Smarthost {
        server: String,
        tls: SmarthostTls,
        username: String,
        credential: Credential,
    },
}

/// One answer that is not acceptable: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct AnswerError {
    /// The field as the page names it: `hostname`, `domains`, `mailboxes[1].address` …
    pub field: String,
    pub reason: String,
}

impl Answers {
    /// Replaces every typed mailbox password by `hash(password)`, so no task ever holds a
    /// password (an Argon2id hash in PHC form is what [`Task::Mailbox`] takes).
    pub fn hash_passwords<E>(&mut self, hash: impl Fn(&str) -> Result<String, E>) -> Result<(), E> {
        for mailbox in &mut self.mailboxes {
            if let Some(password) = mailbox.password.take() {
                mailbox.password_hash = Some(hash(&password)?);
            }
        }
        Ok(())
    }

    /// The tasks that make the answers true, in the order the applier should carry them
    /// out: the database first (the rest write to it), the configuration next, the
    /// mailboxes last. Every problem found is returned, each with its field.
    pub fn tasks(&self) -> Result<Vec<Task>, Vec<AnswerError>> {
        let mut tasks = Vec::new();
        let mut errors = Vec::new();
        let mut add = |field: String, task: Task| match Task::from_row(task.kind(), &task.params())
        {
            Ok(task) => tasks.push(task),
            Err(e) => errors.push(AnswerError {
                field,
                reason: match e {
                    crate::TaskError::Invalid { reason, .. }
                    | crate::TaskError::Shape { reason, .. } => reason,
                    other => other.to_string(),
                },
            }),
        };
        add("database".into(), Task::Database(Empty {}));
        add(
            "hostname".into(),
            Task::Hostname(Hostname {
                hostname: self.hostname.clone(),
            }),
        );
        add(
            "domains".into(),
            Task::MailDomains(MailDomains {
                domains: self.domains.clone(),
            }),
        );
        match &self.certificate {
            Certificate::Acme {
                email,
                directory,
                ca_file,
            } => add(
                "certificate".into(),
                Task::TlsAcme(TlsAcme {
                    domains: vec![self.hostname.clone()],
                    email: email.clone(),
                    directory: directory.clone(),
                    ca_file: ca_file.clone(),
                }),
            ),
            Certificate::Files { certificate, key } => add(
                "certificate".into(),
                Task::TlsFiles(TlsFiles {
                    certificate: certificate.clone(),
                    key: key.clone(),
                }),
            ),
        }
        for (i, domain) in self.domains.iter().enumerate() {
            add(
                format!("dkim[{i}]"),
                Task::DkimKey(DkimKey {
                    domain: domain.clone(),
                    selector: self.dkim.selector.clone(),
                    algorithm: self.dkim.algorithm,
                }),
            );
        }
        match &self.relay {
            Relay::Direct => add("relay".into(), Task::RelayDirect(Empty {})),
            Relay::Smarthost {
                server,
                tls,
                username,
                credential,
            } => add(
                "relay".into(),
                Task::RelaySmarthost(RelaySmarthost {
                    server: server.clone(),
                    tls: *tls,
                    username: username.clone(),
                    credential: credential.clone(),
                }),
            ),
        }
        add(
            "delivery".into(),
            Task::LocalDelivery(self.delivery.clone()),
        );
        if let Some(features) = &self.features {
            add("features".into(), Task::Features(features.clone()));
        }
        let mut unhashed = Vec::new();
        for (i, mailbox) in self.mailboxes.iter().enumerate() {
            match (&mailbox.password, &mailbox.password_hash) {
                (None, Some(hash)) => add(
                    format!("mailboxes[{i}]"),
                    Task::Mailbox(Mailbox {
                        address: mailbox.address.clone(),
                        password_hash: hash.clone(),
                    }),
                ),
                (Some(_), _) => unhashed.push(AnswerError {
                    field: format!("mailboxes[{i}].password"),
                    reason: "the password is not hashed yet (Answers::hash_passwords)".into(),
                }),
                (None, None) => unhashed.push(AnswerError {
                    field: format!("mailboxes[{i}].password"),
                    reason: "a mailbox needs a password".into(),
                }),
            }
        }
        errors.extend(unhashed);
        if self.mailboxes.len() > crate::task::MAX_NAMES {
            errors.push(AnswerError {
                field: "mailboxes".into(),
                reason: format!("more than {} mailboxes at once", crate::task::MAX_NAMES),
            });
        }
        // Cross-checks, on the validated values.
        let domains: Vec<&str> = tasks
            .iter()
            .find_map(|t| match t {
                Task::MailDomains(d) => Some(d.domains.iter().map(String::as_str).collect()),
                _ => None,
            })
            .unwrap_or_default();
        let mut seen = Vec::new();
        for (index, mailbox) in self.mailboxes.iter().enumerate() {
            // An address that does not parse was reported above.
            let Ok(address) = crate::name::check_address("mailbox", &mailbox.address) else {
                continue;
            };
            let domain = pepsi_conf::address::domain_part(&address).unwrap_or("");
            if !domains.is_empty() && !domains.contains(&domain) {
                errors.push(AnswerError {
                    field: format!("mailboxes[{index}].address"),
                    reason: format!(
                        "{address} is not in one of the mail domains ({})",
                        domains.join(", ")
                    ),
                });
            }
            if seen.contains(&address) {
                errors.push(AnswerError {
                    field: format!("mailboxes[{index}].address"),
                    reason: format!("{address} is named twice"),
                });
            }
            seen.push(address);
        }
        if errors.is_empty() {
            Ok(tasks)
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HASH: &str =
        "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$qh6p1m6ZbK5Xq3g0lJ0oJ4c1nY8z0m3uR3t3s9m2bX8";

    fn answers() -> serde_json::Value {
        json!({
            "hostname": "mx.example.org",
            "domains": ["example.org", "example.net"],
            "certificate": {"source": "acme", "email": "ops@example.org",
                            "directory": "https://acme.example/dir"},
            "dkim": {"selector": "s2026", "algorithm": "rsa"},
            "relay": {"mode": "direct"},
            "delivery": {"method": "maildir", "root": "/var/lib/pepsi/mail"},
            "mailboxes": [{"address": "alice@example.org", "password_hash": HASH}],
            "features": {"vacation": true, "whitelist": false}
        })
    }

    /// The answers with `change` applied → the kinds of the tasks, or the fields refused.
    fn check(change: impl Fn(&mut serde_json::Value), expected: Result<&[&str], &[&str]>) {
        let mut value = answers();
        change(&mut value);
        let answers: Answers = serde_json::from_value(value).expect("answers parse");
        match (answers.tasks(), expected) {
            (Ok(tasks), Ok(kinds)) => {
                let got: Vec<&str> = tasks.iter().map(Task::kind).collect();
                assert_eq!(got, kinds);
            }
            (Err(errors), Err(fields)) => {
                let got: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
                assert_eq!(got, fields, "{errors:?}");
            }
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn answers_to_tasks() {
        check(
            |_| {},
            Ok(&[
                "database",
                "hostname",
                "mail_domains",
                "tls_acme",
                "dkim_key",
                "dkim_key",
                "relay_direct",
                "local_delivery",
                "features",
                "mailbox",
            ]),
        );
        check(
            |a| {
                a["certificate"] =
                    json!({"source": "files", "certificate": "/etc/c.pem", "key": "/etc/k.pem"});
                a["relay"] = json!({"mode": "smarthost", "server": "smtp.example.com:587",
                    "tls": "verify", "username": "u",
                    "credential": {"method": "password", "password": "p"}});
                a["delivery"] = json!({"method": "lmtp", "server": "127.0.0.1:24"});
                a["mailboxes"] = json!([]);
                a["domains"] = json!(["example.org"]);
                a.as_object_mut().unwrap().remove("features");
            },
            Ok(&[
                "database",
                "hostname",
                "mail_domains",
                "tls_files",
                "dkim_key",
                "relay_smarthost",
                "local_delivery",
            ]),
        );
        // Every problem, each with its field.
        check(
            |a| {
                a["hostname"] = json!("mx");
                a["dkim"]["selector"] = json!("bad selector");
                a["mailboxes"] = json!([
                    {"address": "bob@elsewhere.example", "password_hash": HASH},
                    {"address": "not an address", "password_hash": HASH},
                ]);
            },
            Err(&[
                "hostname",
                "certificate",
                "dkim[0]",
                "dkim[1]",
                "mailboxes[1]",
                "mailboxes[0].address",
            ]),
        );
        check(
            |a| {
                a["mailboxes"] = json!([
                    {"address": "alice@example.org", "password_hash": HASH},
                    {"address": "Alice@EXAMPLE.org", "password_hash": HASH},
                ]);
            },
            Err(&["mailboxes[1].address"]),
        );
    }

    #[test]
    fn typed_passwords_are_hashed_before_tasks() {
        let mut value = answers();
        value["mailboxes"] = json!([{"address": "alice@example.org", "password": "typed"}]);
        let mut answers: Answers = serde_json::from_value(value).unwrap();
        let errors = answers.tasks().unwrap_err();
        assert_eq!(errors[0].field, "mailboxes[0].password");
        answers
            .hash_passwords(|p| {
                Ok::<_, ()>(if p == "typed" {
                    HASH.into()
                } else {
                    String::new()
                })
            })
            .unwrap();
        let tasks = answers.tasks().unwrap();
        assert!(!serde_json::to_string(&tasks).unwrap().contains("typed"));
        assert!(matches!(tasks.last(), Some(Task::Mailbox(m)) if m.password_hash == HASH));
    }

    #[test]
    fn unknown_answers_are_refused() {
        let mut value = answers();
        value["admin_password"] = json!("x");
        let err = serde_json::from_value::<Answers>(value).unwrap_err();
        assert!(
            err.to_string().contains("unknown field `admin_password`"),
            "{err}"
        );
    }
}
