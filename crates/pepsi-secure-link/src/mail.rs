//! The mails of a secure link, one definition for the stage and the portal: the notice to a
//! recipient (who sent the message, the link, until when it works, that a code will be
//! mailed), written by the stage and again by the portal when the sender asks for a new
//! link, and the receipt to the sender (each secured recipient with its manage link).
//! Pure: text in, RFC 5322 bytes out. The text is sent as it is (7bit, or 8bit for UTF-8):
//! a link must stay one line a person can copy, never cut by quoted-printable's soft breaks.
//!
//! Neither ever carries anything of the sealed message: not its body, not its subject. The
//! notice names the sender as the message's From field gives it and is sent in the
//! sender's name (its From), so a reply reaches the sender.

use chrono::{DateTime, Utc};
use mail_builder::MessageBuilder;
use mail_builder::headers::address::Address;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use mail_builder::mime::MimePart;

/// The author of the message, from its From field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Author {
    pub name: Option<String>,
    pub address: String,
}

impl Author {
    /// The first address of the From field of `headers` with its display name; the
    /// envelope sender `fallback` when the field has none.
    pub fn of(headers: &[u8], fallback: &str) -> Author {
        let mut block = headers.to_vec();
        block.extend_from_slice(b"\r\n");
        let first = mail_parser::MessageParser::default()
            .parse_headers(&block)
            .and_then(|m| {
                let a = m.from()?.first()?;
                Some(Author {
                    name: a
                        .name()
                        .map(|n| n.trim().to_owned())
                        .filter(|n| !n.is_empty()),
                    address: a.address()?.to_owned(),
                })
            });
        first.unwrap_or_else(|| Author {
            name: None,
            address: fallback.to_owned(),
        })
    }

    /// `Name <address>`, or the address alone.
    pub fn display(&self) -> String {
        match &self.name {
            Some(n) => format!("{n} <{}>", self.address),
            None => self.address.clone(),
        }
    }

    fn header(&self) -> Address<'_> {
        match &self.name {
            Some(n) => Address::new_address(Some(n.as_str()), self.address.as_str()),
            None => Address::new_address(None::<&str>, self.address.as_str()),
        }
    }
}

/// A text/plain body written as it is.
fn body(text: String) -> MimePart<'static> {
    let encoding = if text.is_ascii() { "7bit" } else { "8bit" };
    MimePart::new("text/plain", text).transfer_encoding(encoding)
}

/// How an expiry is written in the mails.
fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// The notice for one recipient.
#[derive(Debug, Clone)]
pub struct Notice<'a> {
    pub author: &'a Author,
    pub recipient: &'a str,
    /// The recipient's link (`pepsi_secure_link::url::link_url`).
    pub link: &'a str,
    pub expires: DateTime<Utc>,
    pub now: DateTime<Utc>,
    pub message_id: &'a str,
}

/// The subject of a notice.
pub fn notice_subject(author: &Author) -> String {
    format!("Secure message from {}", author.display())
}

/// The notice's text.
pub fn notice_text(n: &Notice<'_>) -> String {
    format!(
        "{sender} sent you a message that is kept for you on a secure page\r\n\
         instead of being sent by mail.\r\n\
         \r\n\
         Read it here:\r\n\
         \r\n\
         {link}\r\n\
         \r\n\
         The link works until {expires}. When you open it, a one-time code\r\n\
         is mailed to {recipient}; enter it on the page to read the message.\r\n\
         The link is for you alone: do not pass it on.\r\n\
         \r\n\
         A reply to this notice goes to {address}.\r\n",
        sender = n.author.display(),
        link = n.link,
        expires = when(n.expires),
        recipient = n.recipient,
        address = n.author.address,
    )
}

/// The notice, whole.
pub fn notice(n: &Notice<'_>) -> std::io::Result<Vec<u8>> {
    MessageBuilder::new()
        .from(n.author.header())
        .to(n.recipient)
        .subject(notice_subject(n.author))
        .date(Date::new(n.now.timestamp()))
        .message_id(n.message_id)
        .header("Auto-Submitted", Raw::new("auto-generated"))
        .body(body(notice_text(n)))
        .write_to_vec()
}

/// One secured recipient in the receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secured {
    pub recipient: String,
    /// The sender's link to this recipient's copy (`pepsi_secure_link::url::manage_url`).
    pub manage: String,
    pub expires: DateTime<Utc>,
}

/// The receipt for the sender.
#[derive(Debug, Clone)]
pub struct Receipt<'a> {
    /// `MAILER-DAEMON@<hostname>` writes it.
    pub hostname: &'a str,
    pub sender: &'a str,
    /// The message's own Message-ID and Date fields, to name it (never its subject).
    pub original_id: Option<&'a str>,
    pub original_date: Option<&'a str>,
    pub secured: &'a [Secured],
    pub now: DateTime<Utc>,
    pub message_id: &'a str,
}

/// The receipt's subject.
pub fn receipt_subject(r: &Receipt<'_>) -> String {
    match r.secured.len() {
        1 => format!(
            "Your message to {} was sent by secure link",
            r.secured[0].recipient
        ),
        n => format!("Your message to {n} recipients was sent by secure link"),
    }
}

/// The receipt's text.
pub fn receipt_text(r: &Receipt<'_>) -> String {
    let mut named = String::new();
    if let Some(date) = r.original_date {
        named.push_str(&format!(" of {date}"));
    }
    if let Some(id) = r.original_id {
        named.push_str(&format!(",\r\nMessage-ID {id},"));
    }
    let mut text = format!(
        "Your message{named} was not sent by mail to the recipients below.\r\n\
         Each received a notice with a link instead: the message is kept sealed\r\n\
         on this server and read on a secure page, after a one-time code mailed\r\n\
         to the recipient.\r\n\
         \r\n\
         For each recipient, the page behind its link shows when the message was\r\n\
         opened, and lets you revoke the link or send the recipient a new one.\r\n\
         Keep these links to yourself: whoever has one can do the same.\r\n"
    );
    for s in r.secured {
        text.push_str(&format!(
            "\r\n{} (until {})\r\n{}\r\n",
            s.recipient,
            when(s.expires),
            s.manage
        ));
    }
    text
}

/// The receipt, whole: from MAILER-DAEMON, answering the message (In-Reply-To) so the
/// sender's client shows it beside what was sent.
pub fn receipt(r: &Receipt<'_>) -> std::io::Result<Vec<u8>> {
    let daemon = format!("MAILER-DAEMON@{}", r.hostname);
    let mut m = MessageBuilder::new()
        .from(Address::new_address(Some("Secure links"), daemon.as_str()))
        .to(r.sender)
        .subject(receipt_subject(r))
        .date(Date::new(r.now.timestamp()))
        .message_id(r.message_id)
        .header("Auto-Submitted", Raw::new("auto-generated"));
    if let Some(id) = r.original_id.map(|i| i.trim_matches(['<', '>'])) {
        m = m.in_reply_to(id).references(id);
    }
    m.body(body(receipt_text(r))).write_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;

    fn read(raw: &[u8]) -> mail_parser::Message<'_> {
        mail_parser::MessageParser::default().parse(raw).unwrap()
    }

    #[test]
    fn the_author_is_the_from_field_else_the_envelope_sender() {
        let cases: &[(&str, Option<&str>, &str)] = &[
            (
                "From: Alice Example <alice@example.test>\r\n",
                Some("Alice Example"),
                "alice@example.test",
            ),
            ("From: alice@example.test\r\n", None, "alice@example.test"),
            (
                "From: =?UTF-8?Q?J=C3=BCrgen?= <j@example.test>\r\n",
                Some("Jürgen"),
                "j@example.test",
            ),
            ("Subject: no from\r\n", None, "env@example.test"),
            ("From: nonsense\r\n", None, "env@example.test"),
        ];
        for (headers, name, address) in cases {
            let a = Author::of(headers.as_bytes(), "env@example.test");
            assert_eq!(
                (a.name.as_deref(), a.address.as_str()),
                (*name, *address),
                "{headers}"
            );
        }
        let a = Author::of(b"From: Alice <alice@example.test>\r\n", "");
        assert_eq!(a.display(), "Alice <alice@example.test>");
    }

    #[test]
    fn a_notice_names_the_sender_the_link_and_the_code_and_nothing_sealed() {
        let author = Author {
            name: Some("Alice Example".into()),
            address: "alice@example.test".into(),
        };
        let link = "https://mail.example.test/secure/AAAAAAAAAAAAAAAAAAAAAA/1/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
        let now = Utc.with_ymd_and_hms(2027, 1, 5, 10, 0, 0).unwrap();
        let raw = notice(&Notice {
            author: &author,
            recipient: "bob@remote.example",
            link,
            expires: Utc.with_ymd_and_hms(2027, 2, 4, 10, 0, 0).unwrap(),
            now,
            message_id: "1.2.secure-link@mx.example.test",
        })
        .unwrap();
        let m = read(&raw);
        assert_eq!(
            m.subject(),
            Some("Secure message from Alice Example <alice@example.test>")
        );
        let from = m.from().unwrap().first().unwrap();
        assert_eq!(
            (from.name(), from.address()),
            (Some("Alice Example"), Some("alice@example.test"))
        );
        assert_eq!(
            m.to().unwrap().first().unwrap().address(),
            Some("bob@remote.example")
        );
        assert_eq!(m.message_id(), Some("1.2.secure-link@mx.example.test"));
        assert_eq!(m.date().unwrap().to_timestamp(), now.timestamp());
        assert_eq!(
            m.header_raw("Auto-Submitted").map(str::trim),
            Some("auto-generated")
        );
        let whole = String::from_utf8_lossy(&raw);
        assert!(
            whole.contains(&format!("\r\n{link}\r\n")),
            "one line: {whole}"
        );
        let text = m.body_text(0).unwrap();
        for needle in [
            "Alice Example <alice@example.test> sent you a message",
            link,
            "until 2027-02-04 10:00 UTC",
            "one-time code\r\nis mailed to bob@remote.example",
        ] {
            assert!(text.contains(needle), "{needle:?} in {text}");
        }
    }

    #[test]
    fn a_receipt_lists_each_recipient_with_its_manage_link() {
        let secured = vec![
            Secured {
                recipient: "bob@remote.example".into(),
                manage: "https://mail.example.test/secure/manage/AAAAAAAAAAAAAAAAAAAAAA/t1".into(),
                expires: Utc.with_ymd_and_hms(2027, 2, 4, 10, 0, 0).unwrap(),
            },
            Secured {
                recipient: "carol@other.example".into(),
                manage: "https://mail.example.test/secure/manage/BBBBBBBBBBBBBBBBBBBBBB/t2".into(),
                expires: Utc.with_ymd_and_hms(2027, 1, 12, 10, 0, 0).unwrap(),
            },
        ];
        let r = Receipt {
            hostname: "mx.example.test",
            sender: "alice@example.test",
            original_id: Some("<m1@example.test>"),
            original_date: Some("Tue, 05 Jan 2027 10:00:00 +0000"),
            secured: &secured,
            now: Utc.with_ymd_and_hms(2027, 1, 5, 10, 0, 1).unwrap(),
            message_id: "2.3.secure-link@mx.example.test",
        };
        let raw = receipt(&r).unwrap();
        let m = read(&raw);
        assert_eq!(
            m.subject(),
            Some("Your message to 2 recipients was sent by secure link")
        );
        assert_eq!(
            m.from().unwrap().first().unwrap().address(),
            Some("MAILER-DAEMON@mx.example.test")
        );
        assert_eq!(
            m.to().unwrap().first().unwrap().address(),
            Some("alice@example.test")
        );
        assert_eq!(m.in_reply_to().as_text(), Some("m1@example.test"));
        let text = m.body_text(0).unwrap();
        for needle in [
            "Your message of Tue, 05 Jan 2027 10:00:00 +0000,\r\nMessage-ID <m1@example.test>,",
            "bob@remote.example (until 2027-02-04 10:00 UTC)\r\nhttps://mail.example.test/secure/manage/AAAAAAAAAAAAAAAAAAAAAA/t1",
            "carol@other.example (until 2027-01-12 10:00 UTC)\r\nhttps://mail.example.test/secure/manage/BBBBBBBBBBBBBBBBBBBBBB/t2",
            "revoke the link",
        ] {
            assert!(text.contains(needle), "{needle:?} in {text}");
        }
        let one = Receipt {
            secured: &secured[..1],
            original_id: None,
            original_date: None,
            ..r
        };
        assert_eq!(
            receipt_subject(&one),
            "Your message to bob@remote.example was sent by secure link"
        );
        assert!(receipt_text(&one).starts_with("Your message was not sent by mail"));
    }
}
