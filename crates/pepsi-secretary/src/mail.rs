//! The secretary's two messages: the challenge to a sender and the digest of held mail to
//! the owner. Pure: text in, RFC 5322 bytes out.
//!
//! The challenge follows RFC 3834: it answers the held message (`In-Reply-To`,
//! `References`), says `Auto-Submitted: auto-replied`, goes out with a null envelope sender
//! (the stage queues it so), and quotes nothing of the held message but its subject and
//! date. Its Message-ID carries the token, so a reply confirms as the link does
//! (`token::answered_token`). Where postage is offered, the `taler://pay/` URI is in the
//! text and in `X-Pepsi-Postage` (its amount in `X-Pepsi-Postage-Amount`), where a sender's
//! own server finds it (`pepsi-stage-auto-pay`). Texts are sent as they are (7bit, or 8bit for UTF-8), so that a
//! link stays on one line.

use chrono::{DateTime, Utc};
use mail_builder::MessageBuilder;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use mail_builder::mime::MimePart;
use pepsi_conf::text::one_line;

/// The field a challenge's postage URI travels in.
pub const POSTAGE_FIELD: &str = "X-Pepsi-Postage";
/// The field its amount travels in (`CURRENCY:VALUE`).
pub const POSTAGE_AMOUNT_FIELD: &str = "X-Pepsi-Postage-Amount";
/// The most characters of a held message's subject a challenge or a digest repeats.
pub const MAX_SUBJECT_SHOWN: usize = 80;

/// A text/plain body written as it is.
fn body(text: String) -> MimePart<'static> {
    let encoding = if text.is_ascii() { "7bit" } else { "8bit" };
    MimePart::new("text/plain", text).transfer_encoding(encoding)
}

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// A subject as shown: one line, at most [`MAX_SUBJECT_SHOWN`] characters, `(no subject)`
/// for none.
pub fn shown_subject(subject: &str) -> String {
    let s = one_line(subject);
    let s = s.trim();
    if s.is_empty() {
        return "(no subject)".into();
    }
    let mut out: String = s.chars().take(MAX_SUBJECT_SHOWN).collect();
    if s.chars().count() > MAX_SUBJECT_SHOWN {
        out.push('…');
    }
    out
}

/// What a challenge is made of.
#[derive(Debug, Clone)]
pub struct Challenge<'a> {
    /// The mailbox the held message is for: the challenge's From.
    pub owner: &'a str,
    /// The sender asked (the held message's From address): the challenge's To.
    pub sender: &'a str,
    /// The held message's subject and Message-ID (without angle brackets), when it has one.
    pub subject: &'a str,
    pub original_id: Option<&'a str>,
    /// The confirmation link (`token::confirm_url`).
    pub link: &'a str,
    /// The challenge's Message-ID (`token::message_id`).
    pub message_id: &'a str,
    /// Until when the held mail waits.
    pub expires: DateTime<Utc>,
    /// Postage: the amount and the `taler://pay/` URI, when offered.
    pub postage: Option<(&'a str, &'a str)>,
    pub now: DateTime<Utc>,
}

/// The challenge's text.
pub fn challenge_text(c: &Challenge<'_>) -> String {
    let mut t = format!(
        "You wrote to {owner}, who reads mail from new senders only after they\r\n\
         confirm that a person sent it. Your message is kept until {expires}:\r\n\
         \r\n\
         \x20 Subject: {subject}\r\n\
         \r\n\
         To have it delivered, open this link and answer the question on the page:\r\n\
         \r\n\
         {link}\r\n\
         \r\n\
         or reply to this message (your reply is delivered too).\r\n",
        owner = c.owner,
        expires = when(c.expires),
        subject = shown_subject(c.subject),
        link = c.link,
    );
    if let Some((amount, uri)) = c.postage {
        t.push_str(&format!(
            "\r\nInstead of confirming, you may pay {amount} of postage with a GNU Taler\r\n\
             wallet:\r\n\
             \r\n\
             {uri}\r\n"
        ));
    }
    t.push_str(&format!(
        "\r\nOnce you have confirmed, your messages to {owner} are delivered\r\n\
         directly. If you did not write to {owner}, ignore this message: you\r\n\
         will not be asked again about it.\r\n",
        owner = c.owner
    ));
    t
}

/// The challenge, whole.
pub fn challenge(c: &Challenge<'_>) -> std::io::Result<Vec<u8>> {
    let mut m = MessageBuilder::new()
        .from(c.owner)
        .to(c.sender)
        .subject(format!(
            "Please confirm your message to {}: {}",
            c.owner,
            shown_subject(c.subject)
        ))
        .date(Date::new(c.now.timestamp()))
        .message_id(c.message_id)
        .header("Auto-Submitted", Raw::new("auto-replied"));
    if let Some(id) = c.original_id {
        m = m.in_reply_to(id).references(id);
    }
    if let Some((amount, uri)) = c.postage {
        m = m
            .header(POSTAGE_FIELD, Raw::new(uri))
            .header(POSTAGE_AMOUNT_FIELD, Raw::new(amount));
    }
    m.body(body(challenge_text(c))).write_to_vec()
}

/// One held message in a digest.
#[derive(Debug, Clone)]
pub struct DigestEntry<'a> {
    pub held_id: i64,
    pub sender: &'a str,
    pub subject: &'a str,
    pub held_at: DateTime<Utc>,
    pub expires: DateTime<Utc>,
    /// `secretary_held.reason`.
    pub reason: &'a str,
}

/// What a digest is made of.
#[derive(Debug, Clone)]
pub struct Digest<'a> {
    pub owner: &'a str,
    /// The digest's From (the owner's domain's postmaster).
    pub from: &'a str,
    pub entries: &'a [DigestEntry<'a>],
    /// The owner's page (`{base}/secretary/held`), when pepsi-httpd's origin is configured.
    pub page: Option<&'a str>,
    pub message_id: &'a str,
    pub now: DateTime<Utc>,
}

/// Why a message is held, in words.
pub fn reason_words(reason: &str) -> &'static str {
    match reason {
        "challenged" => "the sender was asked to confirm",
        "unauthenticated" => "the sender's domain did not vouch for it; nobody was asked",
        "automated" => "automatic or list mail; nobody was asked",
        "limited" => "too many open requests; nobody was asked",
        _ => "held",
    }
}

/// The digest's text.
pub fn digest_text(d: &Digest<'_>) -> String {
    let mut t = format!(
        "Your secretary holds {n} message{s} for {owner} from senders you have\r\n\
         not confirmed:\r\n",
        n = d.entries.len(),
        s = if d.entries.len() == 1 { "" } else { "s" },
        owner = d.owner,
    );
    for e in d.entries {
        t.push_str(&format!(
            "\r\n[{id}] {at}  {sender}\r\n      {subject}\r\n      {why}; kept until {until}\r\n",
            id = e.held_id,
            at = when(e.held_at),
            sender = e.sender,
            subject = shown_subject(e.subject),
            why = reason_words(e.reason),
            until = when(e.expires),
        ));
    }
    t.push_str("\r\nTo deliver or discard one:\r\n\r\n");
    if let Some(page) = d.page {
        t.push_str(&format!("  {page}\r\n  or "));
    } else {
        t.push_str("  ");
    }
    t.push_str("pepsi-whitelist held release ID   (or: held discard ID)\r\n");
    t
}

/// The digest, whole.
pub fn digest(d: &Digest<'_>) -> std::io::Result<Vec<u8>> {
    MessageBuilder::new()
        .from(d.from)
        .to(d.owner)
        .subject(format!(
            "{} held message{} for {}",
            d.entries.len(),
            if d.entries.len() == 1 { "" } else { "s" },
            d.owner
        ))
        .date(Date::new(d.now.timestamp()))
        .message_id(d.message_id)
        .header("Auto-Submitted", Raw::new("auto-generated"))
        .body(body(digest_text(d)))
        .write_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn text(raw: &[u8]) -> String {
        String::from_utf8(raw.to_vec()).unwrap()
    }

    #[test]
    fn a_challenge_answers_the_message_and_quotes_no_body() {
        let link = "https://mx.example/secretary/AAAAAAAAAAAAAAAAAAAAAA";
        let c = Challenge {
            owner: "alice@example.test",
            sender: "bob@remote.test",
            subject: "Lunch\r\n on Friday?",
            original_id: Some("m1@remote.test"),
            link,
            message_id: "secretary.AAAAAAAAAAAAAAAAAAAAAA@mx.example",
            expires: at("2026-12-20T10:00:00Z"),
            postage: None,
            now: at("2026-12-06T10:00:00Z"),
        };
        let raw = text(&challenge(&c).unwrap());
        for want in [
            "From: <alice@example.test>",
            "To: <bob@remote.test>",
            "Auto-Submitted: auto-replied",
            "In-Reply-To: <m1@remote.test>",
            "References: <m1@remote.test>",
            "Message-ID: <secretary.AAAAAAAAAAAAAAAAAAAAAA@mx.example>",
            "Content-Transfer-Encoding: 7bit",
            "Subject: Lunch on Friday?",
            "kept until 2026-12-20 10:00 UTC",
        ] {
            assert!(raw.contains(want), "{want}\n{raw}");
        }
        // The link is one line of its own.
        assert!(raw.contains(&format!("\r\n{link}\r\n")), "{raw}");
        assert!(!raw.contains(POSTAGE_FIELD), "{raw}");
        let paid = Challenge {
            postage: Some(("KUDOS:0.5", "taler://pay/merchant.test/o-1/?c=X")),
            original_id: None,
            ..c
        };
        let raw = text(&challenge(&paid).unwrap());
        assert!(raw.contains("X-Pepsi-Postage-Amount: KUDOS:0.5"), "{raw}");
        assert!(
            raw.contains("X-Pepsi-Postage: taler://pay/merchant.test/o-1/?c=X"),
            "{raw}"
        );
        assert!(raw.contains("pay KUDOS:0.5 of postage"), "{raw}");
        assert!(
            raw.contains("\r\ntaler://pay/merchant.test/o-1/?c=X\r\n"),
            "{raw}"
        );
        assert!(!raw.contains("In-Reply-To"), "{raw}");
    }

    #[test]
    fn subjects_are_shown_on_one_short_line() {
        for (subject, shown) in [
            ("", "(no subject)"),
            ("  \r\n ", "(no subject)"),
            ("Hi", "Hi"),
            ("a\r\n\tb", "a b"),
        ] {
            assert_eq!(shown_subject(subject), shown, "{subject:?}");
        }
        let long = "x".repeat(200);
        assert_eq!(shown_subject(&long).chars().count(), MAX_SUBJECT_SHOWN + 1);
    }

    #[test]
    fn a_digest_lists_each_held_message() {
        let entries = [
            DigestEntry {
                held_id: 7,
                sender: "bob@remote.test",
                subject: "Hello",
                held_at: at("2026-12-05T09:00:00Z"),
                expires: at("2026-12-19T09:00:00Z"),
                reason: "challenged",
            },
            DigestEntry {
                held_id: 9,
                sender: "spam@forged.test",
                subject: "",
                held_at: at("2026-12-05T10:00:00Z"),
                expires: at("2026-12-19T10:00:00Z"),
                reason: "unauthenticated",
            },
        ];
        let d = Digest {
            owner: "alice@example.test",
            from: "postmaster@example.test",
            entries: &entries,
            page: Some("https://mx.example/secretary/held"),
            message_id: "digest.1@mx.example",
            now: at("2026-12-06T10:00:00Z"),
        };
        let raw = text(&digest(&d).unwrap());
        for want in [
            "Subject: 2 held messages for alice@example.test",
            "Auto-Submitted: auto-generated",
            "[7] 2026-12-05 09:00 UTC  bob@remote.test",
            "[9] 2026-12-05 10:00 UTC  spam@forged.test",
            "(no subject)",
            "did not vouch for it",
            "https://mx.example/secretary/held",
            "pepsi-whitelist held release ID",
        ] {
            assert!(raw.contains(want), "{want}\n{raw}");
        }
    }
}
