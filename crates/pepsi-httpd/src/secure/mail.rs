//! The mail the secure-link portal sends: a one-time code to the recipient, a new link after
//! the sender's resend, and the recipient's reply to the sender. Written with mail-builder
//! and queued with `pepsi.secure_link_queue_mail`, which sends each only between the link's
//! two parties, in the caller's transaction.
//!
//! Where the mail starts is the secure-link stage's configuration (`Route`): `NOTICE_STAGE`
//! (else its `NEXT_STAGE`) for what goes to the recipient, `RECEIPT_STAGE` for a reply,
//! and `HOSTNAME` for the Message-IDs.

use chrono::{DateTime, Utc};
use mail_builder::MessageBuilder;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use mail_builder::mime::MimePart;
use mail_parser::MessageParser;
use pepsi_conf::config::Config;
use pepsi_contract::stage::StageOptions;
use pepsi_secure_link::admin::Link;
use sqlx::PgConnection;

use pepsi_secure_link::{DEFAULT_RECEIPT_STAGE, STAGE_PROGRAM};

/// Where the portal's mail starts, and the domain of its Message-IDs.
#[derive(Debug, Clone)]
pub struct Route {
    pub notice_stage: String,
    pub receipt_stage: String,
    pub hostname: String,
}

impl Route {
    /// Read from the one stage of `cfg` that runs pepsi-stage-secure-link.
    pub fn from_config(cfg: &Config) -> Result<Route, String> {
        let stages = StageOptions::stages_of(cfg, STAGE_PROGRAM);
        let stage = match stages.as_slice() {
            [one] => one.to_string(),
            [] => return Err(format!("no [stage-*] section runs {STAGE_PROGRAM}")),
            _ => {
                return Err(format!(
                    "{} stages run {STAGE_PROGRAM}: the portal needs exactly one",
                    stages.len()
                ));
            }
        };
        let s = cfg.stage_section_named(&stage);
        let named = |opt: &str| -> Result<Option<String>, String> {
            Ok(s.string_opt(opt)
                .map_err(|e| e.to_string())?
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty()))
        };
        let exists = |opt: &str, name: String| -> Result<String, String> {
            if cfg.stage(&name).is_none() {
                return Err(format!(
                    "[stage-{stage}] {opt} = {name}: there is no [stage-{name}]"
                ));
            }
            Ok(name)
        };
        let notice_stage = match (named("NOTICE_STAGE")?, named("NEXT_STAGE")?) {
            (Some(n), _) => exists("NOTICE_STAGE", n)?,
            (None, Some(n)) => exists("NEXT_STAGE", n)?,
            (None, None) => {
                return Err(format!(
                    "[stage-{stage}] sets neither NOTICE_STAGE nor NEXT_STAGE"
                ));
            }
        };
        let receipt_stage = exists(
            "RECEIPT_STAGE",
            named("RECEIPT_STAGE")?.unwrap_or_else(|| DEFAULT_RECEIPT_STAGE.to_owned()),
        )?;
        let hostname = cfg.name_option(&s, "HOSTNAME").map_err(|e| e.to_string())?;
        Ok(Route {
            notice_stage,
            receipt_stage,
            hostname,
        })
    }
}

/// What `pepsi.secure_link_queue_mail` is asked to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Code,
    Notice,
    Reply,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Code => "code",
            Kind::Notice => "notice",
            Kind::Reply => "reply",
        }
    }
}

/// What the portal shows and answers of a message's header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    pub from: String,
    pub to: String,
    pub subject: String,
    pub date: Option<DateTime<Utc>>,
    pub message_id: Option<String>,
}

impl Head {
    pub fn of(raw: &[u8]) -> Head {
        let Some(m) = MessageParser::default().parse(raw) else {
            return Head::default();
        };
        let list = |a: Option<&mail_parser::Address<'_>>| -> String {
            a.map(|a| {
                a.iter()
                    .map(|x| match (x.name(), x.address()) {
                        (Some(n), Some(ad)) => format!("{n} <{ad}>"),
                        (None, Some(ad)) => ad.to_owned(),
                        (Some(n), None) => n.to_owned(),
                        (None, None) => String::new(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
        };
        Head {
            from: list(m.from()),
            to: list(m.to()),
            subject: m.subject().unwrap_or_default().to_owned(),
            date: m
                .date()
                .and_then(|d| DateTime::<Utc>::from_timestamp(d.to_timestamp(), 0)),
            message_id: m.message_id().map(str::to_owned),
        }
    }
}

fn message_id(route: &Route, what: &str) -> Result<String, String> {
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|e| format!("random bytes: {e}"))?;
    Ok(format!(
        "{}.{}.{what}@{}",
        Utc::now().timestamp_micros(),
        crate::credentials::hex(&random),
        route.hostname
    ))
}

/// A text/plain body written as it is (7bit, or 8bit for UTF-8), so that a link stays one
/// line a person can copy.
fn body(text: &str) -> MimePart<'_> {
    MimePart::new("text/plain", text).transfer_encoding(if text.is_ascii() {
        "7bit"
    } else {
        "8bit"
    })
}

/// The mail carrying a one-time code to `to`.
pub fn code(route: &Route, to: &str, code: &str) -> Result<Vec<u8>, String> {
    let text = format!(
        "Your code to open a secure message:\r\n\r\n    {code}\r\n\r\n\
         Type it on the page where you asked for it. It works for 10 minutes, once.\r\n\
         If you did not ask for it, ignore this message: nobody can read the message \
         without the code.\r\n"
    );
    let from = format!("no-reply@{}", route.hostname);
    MessageBuilder::new()
        .from(("Secure messages", from.as_str()))
        .to(to)
        .subject("Your code for a secure message")
        .date(Date::new(Utc::now().timestamp()))
        .message_id(message_id(route, "secure-code")?)
        .header("Auto-Submitted", Raw::new("auto-generated"))
        .body(body(&text))
        .write_to_vec()
        .map_err(|e| format!("writing a message: {e}"))
}

/// The notice carrying a new link (`url`) to the recipient of `link`, in its sender's name:
/// the stage's notice (`pepsi_secure_link::mail`), the author named by the envelope sender.
pub fn notice(route: &Route, link: &Link, url: &str) -> Result<Vec<u8>, String> {
    let author = pepsi_secure_link::mail::Author {
        name: None,
        address: link.sender.clone(),
    };
    pepsi_secure_link::mail::notice(&pepsi_secure_link::mail::Notice {
        author: &author,
        recipient: &link.recipient,
        link: url,
        expires: link.expires,
        now: Utc::now(),
        message_id: &message_id(route, "secure-notice")?,
    })
    .map_err(|e| format!("writing a message: {e}"))
}

/// The recipient's reply `text` (CRLF lines) to the sender of `link`, answering `head`.
pub fn reply(route: &Route, link: &Link, head: &Head, text: &str) -> Result<Vec<u8>, String> {
    let subject = if head.subject.to_ascii_lowercase().starts_with("re:") {
        head.subject.clone()
    } else {
        format!("Re: {}", head.subject)
    };
    let mut m = MessageBuilder::new()
        .from(link.recipient.as_str())
        .to(link.sender.as_str())
        .subject(subject)
        .date(Date::new(Utc::now().timestamp()))
        .message_id(message_id(route, "secure-reply")?)
        .header("X-Pepsi-Secure-Link-Reply", Raw::new(link.link_id.as_str()));
    if let Some(id) = &head.message_id {
        m = m.in_reply_to(id.as_str()).references(id.as_str());
    }
    m.body(body(text))
        .write_to_vec()
        .map_err(|e| format!("writing a message: {e}"))
}

/// Queues `raw` for the link `link_id` as `kind` (at the route's stage for it) in `tx`;
/// the caller wakes the dispatcher after its commit. A reply carries the digest of the
/// session that sends it.
pub async fn queue(
    tx: &mut PgConnection,
    link_id: &str,
    kind: Kind,
    route: &Route,
    raw: &[u8],
    session_hash: Option<&[u8; 32]>,
) -> Result<i64, sqlx::Error> {
    let stage = match kind {
        Kind::Code | Kind::Notice => &route.notice_stage,
        Kind::Reply => &route.receipt_stage,
    };
    let (headers, body) = pepsi_smtp::message::split(raw);
    let id: Option<i64> =
        sqlx::query_scalar("SELECT pepsi.secure_link_queue_mail($1, $2, $3, $4, $5, $6)")
            .bind(link_id)
            .bind(kind.as_str())
            .bind(stage)
            .bind(headers)
            .bind(body)
            .bind(session_hash.map(|h| h.to_vec()))
            .fetch_one(tx)
            .await?;
    Ok(id.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Route {
        Route {
            notice_stage: "dkim-sign".into(),
            receipt_stage: "aliases".into(),
            hostname: "mx.example.test".into(),
        }
    }

    fn link() -> Link {
        Link {
            link_id: "AAAAAAAAAAAAAAAAAAAAAA".into(),
            sender: "alice@example.test".into(),
            recipient: "bob@example.net".into(),
            created: Utc::now(),
            expires: Utc::now(),
            generation: 2,
            state: pepsi_secure_link::admin::LinkState::Active,
            revoked_by: None,
            size: 10,
            last_access: None,
        }
    }

    fn text(raw: &[u8]) -> String {
        String::from_utf8_lossy(raw).into_owned()
    }

    #[test]
    fn the_portals_mail_says_what_it_must_and_no_more() {
        let c = text(&code(&route(), "bob@example.net", "12345678").unwrap());
        assert!(c.contains("To: <bob@example.net>") && c.contains("    12345678\r\n"));
        assert!(c.contains("Auto-Submitted: auto-generated"));
        assert!(c.contains("@mx.example.test>"));

        let url = "https://m.example/secure/AAAAAAAAAAAAAAAAAAAAAA/2/half";
        let n = text(&notice(&route(), &link(), url).unwrap());
        assert!(n.contains(&format!("\r\n{url}\r\n")), "{n}");
        assert!(
            n.contains("Subject: Secure message from alice@example.test"),
            "{n}"
        );

        let head = Head {
            subject: "Contract".into(),
            message_id: Some("orig@example.test".into()),
            ..Head::default()
        };
        let r = text(&reply(&route(), &link(), &head, "Thanks\r\n").unwrap());
        assert!(r.contains("From: <bob@example.net>") && r.contains("To: <alice@example.test>"));
        assert!(
            r.contains("Subject: Re: Contract") && r.contains("In-Reply-To: <orig@example.test>")
        );
        assert!(r.ends_with("Thanks\r\n"), "{r}");
    }

    #[test]
    fn the_head_of_a_message_is_read() {
        let raw = b"From: Alice <alice@example.test>\r\nTo: bob@example.net\r\n\
                    Subject: Hello\r\nMessage-ID: <m1@example.test>\r\n\
                    Date: Thu, 03 Dec 2026 10:00:00 +0000\r\n\r\nbody\r\n";
        let h = Head::of(raw);
        assert_eq!(h.from, "Alice <alice@example.test>");
        assert_eq!(h.to, "bob@example.net");
        assert_eq!(h.subject, "Hello");
        assert_eq!(h.message_id.as_deref(), Some("m1@example.test"));
        assert!(h.date.is_some());
    }
}
