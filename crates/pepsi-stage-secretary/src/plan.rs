//! The secretary's decisions, apart from the database: for each recipient whose mailbox
//! has a secretary, whether the message goes on, goes to the Junk folder, is held without a
//! word, or is held and its sender asked. Pure; tested as a table.
//!
//! In order, first answer wins:
//! 1. mail a logged-in user submitted goes on (it is ours);
//! 2. a sender the mailbox trusts (its whitelist holds the From address or its domain) goes
//!    on, and so does a sender who just confirmed by replying to the challenge;
//! 3. a delivery report (a null envelope sender and `multipart/report`) goes on: it speaks
//!    of the owner's own mail;
//! 4. a list's, bulk or automatic message (RFC 3834: `Auto-Submitted`, `Precedence`,
//!    `List-*`, a program's address) is never challenged: the setting's `automated` says
//!    hold, junk or deliver;
//! 5. mail whose From domain neither SPF nor DKIM vouched for (aligned, or DMARC pass) is
//!    never challenged either, so that a forged sender draws no mail: `unauthenticated`
//!    says hold, junk or deliver;
//! 6. anything else is held and its sender asked.

use pepsi_contract::autoreply::{self, Incoming, Skip};
use pepsi_contract::settings::secretary::{Secretary, Unasked};

/// Why a message is held or filed as junk (`secretary_held.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Challenged,
    Unauthenticated,
    Automated,
    Limited,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Challenged => "challenged",
            Reason::Unauthenticated => "unauthenticated",
            Reason::Automated => "automated",
            Reason::Limited => "limited",
        }
    }
}

/// What becomes of the message for one recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// On to NEXT_STAGE.
    Pass,
    /// To the Junk folder (JUNK_STAGE).
    Junk(Reason),
    /// Held; nobody is asked.
    Hold(Reason),
    /// Held, and the sender asked (once per period).
    Challenge,
}

/// What the decision for one recipient reads.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub setting: &'a Secretary,
    /// A logged-in user submitted the message.
    pub submitted: bool,
    /// The mailbox trusts the sender, or the sender just confirmed.
    pub trusted: bool,
    /// A null envelope sender with a `multipart/report` body.
    pub report: bool,
    /// Why the message is automatic, when it is.
    pub automated: Option<&'a Skip>,
    /// SPF or DKIM passed aligned with the From domain (or DMARC passed).
    pub aligned: bool,
    /// The message has a usable From address.
    pub has_from: bool,
}

fn unasked(what: Unasked, reason: Reason) -> Decision {
    match what {
        Unasked::Hold => Decision::Hold(reason),
        Unasked::Junk => Decision::Junk(reason),
        Unasked::Deliver => Decision::Pass,
    }
}

pub fn decide(i: &Input<'_>) -> Decision {
    if i.submitted || i.trusted || i.report {
        return Decision::Pass;
    }
    if i.automated.is_some() {
        return unasked(i.setting.automated, Reason::Automated);
    }
    if !i.aligned || !i.has_from {
        return unasked(i.setting.unauthenticated, Reason::Unauthenticated);
    }
    Decision::Challenge
}

/// Why a message is automatic (RFC 3834's rules, whoever the owner), when it is.
pub fn automated(mail_from: &str, headers: &[u8]) -> Option<Skip> {
    match autoreply::decide(&Incoming { mail_from, headers }, &[]) {
        Ok(()) | Err(Skip::NotAddressed) | Err(Skip::OwnAddress) => None,
        Err(skip) => Some(skip),
    }
}

/// Whether the message is a delivery or disposition report: a null envelope sender and a
/// top-level `multipart/report`.
pub fn is_report(mail_from: &str, headers: &[u8]) -> bool {
    mail_from.is_empty()
        && pepsi_contract::message::field_values(headers, "Content-Type")
            .first()
            .is_some_and(|v| {
                v.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("multipart/report")
            })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn decisions_table() {
        let hold = Secretary::from_value(&serde_json::json!({})).unwrap();
        let lenient = Secretary::from_value(
            &serde_json::json!({"automated": "deliver", "unauthenticated": "junk"}),
        )
        .unwrap();
        let list = Skip::ListMessage("List-Id".into());
        let base = Input {
            setting: &hold,
            submitted: false,
            trusted: false,
            report: false,
            automated: None,
            aligned: true,
            has_from: true,
        };
        let cases: Vec<(&str, Input<'_>, Decision)> = vec![
            ("a stranger whose domain vouched", base, Decision::Challenge),
            (
                "submitted",
                Input {
                    submitted: true,
                    aligned: false,
                    ..base
                },
                Decision::Pass,
            ),
            (
                "trusted",
                Input {
                    trusted: true,
                    ..base
                },
                Decision::Pass,
            ),
            (
                "a report, even unauthenticated",
                Input {
                    report: true,
                    aligned: false,
                    ..base
                },
                Decision::Pass,
            ),
            (
                "a list message is never challenged",
                Input {
                    automated: Some(&list),
                    ..base
                },
                Decision::Hold(Reason::Automated),
            ),
            (
                "a forged sender is never challenged",
                Input {
                    aligned: false,
                    ..base
                },
                Decision::Hold(Reason::Unauthenticated),
            ),
            (
                "no From address",
                Input {
                    has_from: false,
                    ..base
                },
                Decision::Hold(Reason::Unauthenticated),
            ),
            (
                "automated, delivered by setting",
                Input {
                    setting: &lenient,
                    automated: Some(&list),
                    aligned: false,
                    ..base
                },
                Decision::Pass,
            ),
            (
                "unauthenticated, junk by setting",
                Input {
                    setting: &lenient,
                    aligned: false,
                    ..base
                },
                Decision::Junk(Reason::Unauthenticated),
            ),
            (
                "trusted wins over automated",
                Input {
                    trusted: true,
                    automated: Some(&list),
                    ..base
                },
                Decision::Pass,
            ),
        ];
        for (what, input, want) in cases {
            assert_eq!(decide(&input), want, "{what}");
        }
    }

    #[test]
    fn automated_mail_table() {
        for (mail_from, headers, want) in [
            ("bob@remote.test", "Subject: hi\r\n", false),
            (
                "bob@remote.test",
                "Auto-Submitted: auto-generated\r\n",
                true,
            ),
            ("bob@remote.test", "Auto-Submitted: no\r\n", false),
            ("bob@remote.test", "List-Id: <team.remote.test>\r\n", true),
            ("bob@remote.test", "Precedence: bulk\r\n", true),
            ("noreply@remote.test", "Subject: hi\r\n", true),
            ("", "Subject: hi\r\n", true),
        ] {
            assert_eq!(
                automated(mail_from, headers.as_bytes()).is_some(),
                want,
                "{mail_from} {headers}"
            );
        }
        assert!(is_report(
            "",
            b"Content-Type: multipart/report; report-type=delivery-status\r\n"
        ));
        assert!(!is_report(
            "a@b.test",
            b"Content-Type: multipart/report\r\n"
        ));
        assert!(!is_report("", b"Content-Type: text/plain\r\n"));
    }
}
