//! Automatic replies (vacation, out of office): whether a message may be answered at all,
//! after RFC 3834's rules (`pepsi_contract::autoreply`, shared with the secretary), and the
//! reply itself. Pure: no I/O. The once-per-sender-per-period
//! rule needs the database and lives in the stage around it; everything that can be decided
//! from one message and the owner's `vacation` setting is here, tested as tables.
//!
//! The reply (`compose`) goes from the owner to the envelope sender, carries
//! `Auto-Submitted: auto-replied`, `In-Reply-To` and `References` from the original's
//! Message-ID (RFC 3834 §3.1.5), the owner's subject (or `Auto: ` and the original's) and
//! text as UTF-8, written by mail-builder (7bit when the text allows, else encoded). It is sent with a null envelope sender (RFC 3834 §3.3), so
//! a failure to deliver it is never answered in turn.

use chrono::{DateTime, NaiveDate, Utc};
use mail_builder::MessageBuilder;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use pepsi_conf::text::one_line;
use pepsi_contract::message::field_values;
use pepsi_contract::settings::vacation::{MAX_SUBJECT_CHARS, Vacation};

pub use pepsi_contract::autoreply::{
    AUTOMATED_LOCAL_PARTS, AUTOMATED_PREFIXES, AUTOMATED_SUFFIXES, Incoming, Skip, decide,
    is_automated,
};

/// What a reply is made of.
#[derive(Debug, Clone)]
pub struct Reply<'a> {
    /// The owner's address: the reply's From.
    pub from: &'a str,
    /// The envelope sender of the original: the reply's To.
    pub to: &'a str,
    /// The owner's subject; `None` gives `Auto: ` and the original's subject.
    pub subject: Option<&'a str>,
    /// The owner's text (UTF-8; any line ends).
    pub text: &'a str,
    pub now: DateTime<Utc>,
    /// The reply's Message-ID, without angle brackets.
    pub message_id: &'a str,
}

/// The raw reply to a message with header block `original`: header block, empty line, body.
pub fn compose(reply: &Reply<'_>, original: &[u8]) -> Vec<u8> {
    let original_subject = field_values(original, "Subject")
        .into_iter()
        .next()
        .unwrap_or_default();
    let subject = match reply.subject {
        Some(s) if !s.trim().is_empty() => one_line(s),
        _ => format!(
            "Auto: {}",
            one_line(&original_subject)
                .chars()
                .take(MAX_SUBJECT_CHARS)
                .collect::<String>()
        ),
    };
    let original_id = single_id(original, "Message-ID");
    let mut text = reply.text.replace("\r\n", "\n");
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let mut message = MessageBuilder::new()
        .from(reply.from)
        .to(reply.to)
        .subject(subject)
        .date(Date::new(reply.now.timestamp()))
        .message_id(reply.message_id);
    if let Some(id) = &original_id {
        message = message
            .in_reply_to(bare_id(id))
            .references(references(original, id));
    }
    // mail-builder picks the body's encoding (7bit when it can, else quoted-printable or
    // base64), encodes a subject beyond ASCII as RFC 2047 words and folds every field.
    message
        .header("Auto-Submitted", Raw::new("auto-replied"))
        .text_body(text.replace('\n', "\r\n"))
        .write_to_vec()
        .expect("writing to memory")
}

/// The reply's References (ids without angle brackets): of the original's References, the
/// well-formed ids of at most 250 characters, of a long thread the first and the latest
/// (RFC 5322 §3.6.4 lets a responder shorten the list so), then the original's own `id`.
fn references(original: &[u8], id: &str) -> Vec<String> {
    let ids: Vec<String> = field_values(original, "References")
        .into_iter()
        .next()
        .map(|r| {
            r.split_whitespace()
                .filter(|t| {
                    t.len() <= 250 && t.starts_with('<') && t.ends_with('>') && t.is_ascii()
                })
                .map(|t| bare_id(t).to_owned())
                .collect()
        })
        .unwrap_or_default();
    let mut references: Vec<String> = if ids.len() > MAX_REFERENCES {
        let mut kept = vec![ids[0].clone()];
        kept.extend_from_slice(&ids[ids.len() - (MAX_REFERENCES - 1)..]);
        kept
    } else {
        ids
    };
    if references.is_empty() {
        // RFC 5322 §3.6.4: without References, the parent's In-Reply-To (one id) leads.
        if let Some(parent) = single_id(original, "In-Reply-To") {
            references.push(bare_id(&parent).to_owned());
        }
    }
    references.push(bare_id(id).to_owned());
    references
}

/// `<id>` without its angle brackets.
fn bare_id(id: &str) -> &str {
    id.trim_start_matches('<').trim_end_matches('>')
}

/// The first `name` field of `headers` when it holds exactly one `<id>`, on one line.
fn single_id(headers: &[u8], name: &str) -> Option<String> {
    field_values(headers, name)
        .into_iter()
        .next()
        .map(|v| one_line(&v))
        .filter(|v| v.starts_with('<') && v.ends_with('>') && !v.contains(' '))
}

/// The most ids a reply's References carries over from the original (with its own
/// Message-ID, one more): the thread's first and the latest.
pub const MAX_REFERENCES: usize = 20;
/// The most owners one message is answered for (a message to many recipients with replies
/// set): the others are logged and skipped.
pub const MAX_REPLIES_PER_MESSAGE: usize = 32;

/// Whether `vacation` sends replies on `day` (UTC): from `start` through `end`, each when set.
pub fn active_on(vacation: &Vacation, day: NaiveDate) -> bool {
    vacation.start.is_none_or(|s| s <= day) && vacation.end.is_none_or(|e| day <= e)
}

/// The addresses answered for: `owner` and the setting's own.
pub fn owner_addresses(vacation: &Vacation, owner: &str) -> Vec<String> {
    let mut all = vec![owner.to_ascii_lowercase()];
    for a in &vacation.addresses {
        let a = a.to_ascii_lowercase();
        if !all.contains(&a) {
            all.push(a);
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "alice@example.test";

    #[test]
    fn vacation_days_and_owner_addresses() {
        use serde_json::json;
        let day = |s: &str| s.parse::<NaiveDate>().unwrap();
        let v = Vacation::from_value(&json!({"text": "Away."})).unwrap();
        assert!(active_on(&v, day("2026-12-02")));
        let v = Vacation::from_value(&json!({
            "text": "Away.", "subject": "Out", "start": "2026-12-20", "end": "2026-12-31",
            "days": 1, "addresses": ["A.Smith@Example.test"]
        }))
        .unwrap();
        for (d, active) in [
            ("2026-12-19", false),
            ("2026-12-20", true),
            ("2026-12-31", true),
            ("2027-01-01", false),
        ] {
            assert_eq!(active_on(&v, day(d)), active, "{d}");
        }
        assert_eq!(
            owner_addresses(&v, "Alice@example.test"),
            ["alice@example.test", "a.smith@example.test"]
        );
    }

    fn headers(extra: &str) -> Vec<u8> {
        format!(
            "From: Bob <bob@remote.test>\r\nTo: Alice <Alice@Example.test>\r\nSubject: lunch\r\n\
             Message-ID: <m1@remote.test>\r\n{extra}"
        )
        .into_bytes()
    }

    #[test]
    fn what_is_answered_and_what_is_not() {
        let owner = vec![OWNER.to_owned(), "a.smith@example.test".to_owned()];
        // (what, envelope sender, header block, the decision)
        type Case = (&'static str, &'static str, Vec<u8>, Result<(), Skip>);
        let cases: Vec<Case> = vec![
            ("a person to the owner", "bob@remote.test", headers(""), Ok(())),
            ("null sender", "", headers(""), Err(Skip::NullSender)),
            (
                "mailer daemon",
                "MAILER-DAEMON@remote.test",
                headers(""),
                Err(Skip::AutomatedSender("MAILER-DAEMON@remote.test".into())),
            ),
            (
                "list request address",
                "dev-request@lists.test",
                headers(""),
                Err(Skip::AutomatedSender("dev-request@lists.test".into())),
            ),
            (
                "list owner",
                "owner-dev@lists.test",
                headers(""),
                Err(Skip::AutomatedSender("owner-dev@lists.test".into())),
            ),
            (
                "no-reply",
                "No-Reply@shop.test",
                headers(""),
                Err(Skip::AutomatedSender("No-Reply@shop.test".into())),
            ),
            (
                "the owner writing to themself",
                "Alice@example.test",
                headers(""),
                Err(Skip::OwnAddress),
            ),
            (
                "auto-generated",
                "bob@remote.test",
                headers("Auto-Submitted: auto-generated\r\n"),
                Err(Skip::AutoSubmitted("auto-generated".into())),
            ),
            (
                "auto-replied with a comment",
                "bob@remote.test",
                headers("Auto-Submitted: Auto-Replied (vacation)\r\n"),
                Err(Skip::AutoSubmitted("Auto-Replied".into())),
            ),
            (
                "Auto-Submitted: no is a person",
                "bob@remote.test",
                headers("Auto-Submitted: no\r\n"),
                Ok(()),
            ),
            (
                "bulk",
                "bob@remote.test",
                headers("Precedence: Bulk\r\n"),
                Err(Skip::Precedence("bulk".into())),
            ),
            (
                "junk",
                "bob@remote.test",
                headers("Precedence: junk\r\n"),
                Err(Skip::Precedence("junk".into())),
            ),
            (
                "Precedence: first-class is answered",
                "bob@remote.test",
                headers("Precedence: first-class\r\n"),
                Ok(()),
            ),
            (
                "List-Id",
                "bob@remote.test",
                headers("List-Id: Dev <dev.lists.test>\r\n"),
                Err(Skip::ListMessage("List-Id".into())),
            ),
            (
                "List-Unsubscribe alone",
                "bob@remote.test",
                headers("list-unsubscribe: <mailto:u@lists.test>\r\n"),
                Err(Skip::ListMessage("list-unsubscribe".into())),
            ),
            (
                "suppressed",
                "bob@remote.test",
                headers("X-Auto-Response-Suppress: DR, OOF\r\n"),
                Err(Skip::Suppressed("DR, OOF".into())),
            ),
            (
                "suppression of other kinds only",
                "bob@remote.test",
                headers("X-Auto-Response-Suppress: DR, RN\r\n"),
                Ok(()),
            ),
            (
                "owner as a Bcc",
                "bob@remote.test",
                b"From: bob@remote.test\r\nTo: carol@remote.test\r\nSubject: s\r\n".to_vec(),
                Err(Skip::NotAddressed),
            ),
            (
                "owner's other address in Cc",
                "bob@remote.test",
                b"From: bob@remote.test\r\nTo: carol@remote.test\r\nCc: A <a.smith@example.test>\r\n"
                    .to_vec(),
                Ok(()),
            ),
            (
                "owner in Resent-To of a forward",
                "bob@remote.test",
                b"Resent-To: alice@example.test\r\nTo: carol@remote.test\r\n".to_vec(),
                Ok(()),
            ),
            (
                "owner in a group",
                "bob@remote.test",
                b"To: team: alice@example.test, carol@remote.test;\r\n".to_vec(),
                Ok(()),
            ),
        ];
        for (label, sender, h, want) in cases {
            let got = decide(
                &Incoming {
                    mail_from: sender,
                    headers: &h,
                },
                &owner,
            );
            assert_eq!(got, want, "{label}");
        }
    }

    fn reply_to(original: &[u8], subject: Option<&str>, text: &str) -> String {
        let now = DateTime::parse_from_rfc3339("2026-12-02T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let raw = compose(
            &Reply {
                from: OWNER,
                to: "bob@remote.test",
                subject,
                text,
                now,
                message_id: "r1@mx.example.test",
            },
            original,
        );
        String::from_utf8(raw).unwrap()
    }

    #[test]
    fn a_long_thread_and_a_long_subject_stay_within_bounds() {
        let ids: Vec<String> = (0..30).map(|i| format!("<t{i}@remote.test>")).collect();
        let original = format!(
            "From: bob@remote.test\r\nTo: alice@example.test\r\nSubject: {}\r\n\
             Message-ID: <m1@remote.test>\r\nReferences: {} not-an-id <{}@x>\r\n",
            "s".repeat(3000),
            ids.join(" "),
            "y".repeat(300)
        );
        let r = reply_to(original.as_bytes(), None, "Away.");
        let (h, _) = r.split_once("\r\n\r\n").unwrap();
        assert!(h.split("\r\n").all(|l| l.len() <= 998), "{h}");
        let parsed = mail_parser::MessageParser::default()
            .parse(r.as_bytes())
            .unwrap();
        assert_eq!(
            parsed.subject(),
            Some(format!("Auto: {}", "s".repeat(MAX_SUBJECT_CHARS)).as_str())
        );
        let refs: Vec<String> = parsed
            .references()
            .as_text_list()
            .unwrap()
            .iter()
            .map(|id| format!("<{id}>"))
            .collect();
        // The thread's first id, its latest 19, then the original's own.
        let mut want: Vec<String> = vec![ids[0].clone()];
        want.extend(ids[11..].iter().cloned());
        want.push("<m1@remote.test>".into());
        assert_eq!(refs, want);
    }

    #[test]
    fn the_reply_threads_and_says_it_is_automatic() {
        let original = headers("References: <m0@remote.test>\r\n");
        let r = reply_to(
            &original,
            Some("Away until Monday"),
            "I am away.\nBack soon.",
        );
        let (h, body) = r.split_once("\r\n\r\n").unwrap();
        let fields: Vec<&str> = h.split("\r\n").collect();
        for want in [
            "From: <alice@example.test>",
            "To: <bob@remote.test>",
            "Subject: Away until Monday",
            "Message-ID: <r1@mx.example.test>",
            "In-Reply-To: <m1@remote.test>",
            "References: <m0@remote.test> <m1@remote.test>",
            "Auto-Submitted: auto-replied",
            "MIME-Version: 1.0",
            "Content-Transfer-Encoding: 7bit",
        ] {
            assert!(fields.contains(&want), "{want:?} in {h}");
        }
        // Plain ASCII text in short lines goes as it is.
        assert_eq!(body, "I am away.\r\nBack soon.\r\n");
        // Parsed back by a real parser, the fields mean what they say.
        let parsed = mail_parser::MessageParser::default()
            .parse(r.as_bytes())
            .unwrap();
        assert_eq!(parsed.subject(), Some("Away until Monday"));
        assert_eq!(parsed.in_reply_to().as_text(), Some("m1@remote.test"));
        assert_eq!(
            parsed.date().map(|d| d.to_timestamp()),
            Some(
                DateTime::parse_from_rfc3339("2026-12-02T10:00:00Z")
                    .unwrap()
                    .timestamp()
            )
        );
        use mail_parser::MimeHeaders;
        assert_eq!(parsed.content_type().unwrap().ctype(), "text");
        assert_eq!(
            parsed.content_type().unwrap().attribute("charset"),
            Some("utf-8")
        );
        assert_eq!(
            parsed.body_text(0).as_deref(),
            Some("I am away.\r\nBack soon.\r\n")
        );
        // The reply itself is never answered.
        assert_eq!(
            decide(
                &Incoming {
                    mail_from: "alice@example.test",
                    headers: h.as_bytes()
                },
                &["bob@remote.test".to_owned()]
            ),
            Err(Skip::AutoSubmitted("auto-replied".into()))
        );
    }

    #[test]
    fn subjects_and_text_beyond_ascii() {
        let r = reply_to(&headers(""), None, "Grüße,\r\nAlice = A.");
        assert!(r.contains("Subject: Auto: lunch\r\n"), "{r}");
        assert!(r.contains("References: <m1@remote.test>\r\n"), "{r}");
        let subject = "Abwesend bis Montag — Grüße aus dem Urlaub, mit einem langen Betreff";
        let r = reply_to(&headers(""), Some(subject), "x");
        let (h, _) = r.split_once("\r\n\r\n").unwrap();
        assert!(h.is_ascii());
        for line in h.split("\r\n") {
            assert!(line.len() <= 76, "{line:?}");
        }
        let parsed = mail_parser::MessageParser::default()
            .parse(r.as_bytes())
            .unwrap();
        assert_eq!(parsed.subject(), Some(subject));
        let r = reply_to(&headers(""), None, "Grüße,\r\nAlice = A.");
        let parsed = mail_parser::MessageParser::default()
            .parse(r.as_bytes())
            .unwrap();
        assert_eq!(
            parsed.body_text(0).as_deref(),
            Some("Grüße,\r\nAlice = A.\r\n")
        );
        // A subject with a line break cannot add a field.
        let r = reply_to(&headers(""), Some("away\r\nBcc: eve@evil.test"), "x");
        assert!(!r.contains("\r\nBcc:"), "{r}");
        assert!(r.contains("Subject: away Bcc: eve@evil.test\r\n"), "{r}");
        // Without a Message-ID in the original, no threading fields.
        let r = reply_to(b"From: bob@remote.test\r\nSubject: s\r\n", None, "x");
        assert!(
            !r.contains("In-Reply-To") && !r.contains("References"),
            "{r}"
        );
    }
}
