//! The digest messages, written by mail-builder. Pure: the list, the issue and the list
//! copies in, the message's bytes out.
//!
//! Both digests come from the list's `-request` address to the list, with Reply-To the
//! list, the subject "<display name or list> Digest, Vol V, Issue N", the list's RFC 2369
//! and RFC 2919 fields (`List-Unsubscribe` is each member's own, [`unsubscribe_fields`]),
//! `Precedence: list` and `X-Loop` (so a digest mailed back to the list stops there). Their text opens with how to reach the list and its contents, one
//! line per post.
//!
//! - MIME: multipart/mixed of that text and a multipart/digest (RFC 2046 §5.1.5) whose
//!   parts are the list copies, byte for byte, as message/rfc822 (7bit, 8bit or binary as
//!   their bytes need; never re-encoded).
//! - Plain (RFC 1153): one text/plain part: the contents, a line of 70 hyphens, then each
//!   post's fields RFC 1153 keeps and its text, the posts separated by a line of 30
//!   hyphens, and the trailer "End of ..." over a line of asterisks. Parts that are no text
//!   are left out, each with a note saying what it was.

use mail_builder::MessageBuilder;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use mail_builder::mime::{BodyPart, MimePart};
use mail_parser::{HeaderValue, MessageParser, MimeHeaders};
use pepsi_conf::text::one_line;

/// RFC 1153's separator after the contents.
pub const CONTENTS_SEPARATOR: &str =
    "----------------------------------------------------------------------";
/// RFC 1153's separator between two posts.
pub const MESSAGE_SEPARATOR: &str = "------------------------------";

/// The fields of a post a plain digest keeps, in RFC 1153's order.
pub const PLAIN_FIELDS: &[&str] = &[
    "Date",
    "From",
    "To",
    "Cc",
    "Subject",
    "Message-ID",
    "Keywords",
    "Summary",
];

/// The most characters of a subject or sender a line of the contents shows.
pub const MAX_CONTENTS_TEXT: usize = 200;

/// Which digest.
#[derive(Debug, Clone, Copy)]
pub struct Issue<'a> {
    /// The list's address, `local@domain`, lower-case.
    pub list: &'a str,
    pub display_name: &'a str,
    pub volume: i32,
    pub number: i32,
    /// When it is sent, seconds since the epoch (its `Date`).
    pub date: i64,
    /// Its Message-ID, without the angle brackets.
    pub message_id: &'a str,
}

/// A list copy as the members got it: its header block (ending in CRLF) and its body.
#[derive(Debug, Clone, Copy)]
pub struct Post<'a> {
    pub headers: &'a [u8],
    pub body: &'a [u8],
}

impl Post<'_> {
    /// The whole message: the header block, the empty line, the body.
    pub fn raw(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity(self.headers.len() + 4 + self.body.len());
        raw.extend_from_slice(self.headers);
        if !raw.is_empty() && !raw.ends_with(b"\n") {
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"\r\n");
        raw.extend_from_slice(self.body);
        raw
    }
}

/// The list's name as its digests show it: the display name (on one line), else the
/// address.
pub fn list_name(list: &str, display_name: &str) -> String {
    let name = one_line(display_name);
    if name.is_empty() {
        list.to_owned()
    } else {
        name
    }
}

/// "<name> Digest, Vol V, Issue N".
pub fn subject(issue: &Issue<'_>) -> String {
    format!(
        "{} Digest, Vol {}, Issue {}",
        list_name(issue.list, issue.display_name),
        issue.volume,
        issue.number
    )
}

/// The MIME digest.
pub fn mime(issue: &Issue<'_>, posts: &[Post<'_>]) -> Vec<u8> {
    let raws: Vec<Vec<u8>> = posts.iter().map(Post::raw).collect();
    let entries: Vec<Entry> = raws.iter().map(|r| entry(r)).collect();
    let contents = MimePart::new("text/plain", contents(issue, &entries));
    let parts: Vec<MimePart<'_>> = raws
        .iter()
        .map(|raw| {
            MimePart::new("message/rfc822", BodyPart::Binary(raw.as_slice().into()))
                .transfer_encoding(rfc822_encoding(raw))
        })
        .collect();
    let body = MimePart::new(
        "multipart/mixed",
        vec![contents, MimePart::new("multipart/digest", parts)],
    );
    write(envelope(issue).body(body))
}

/// The plain digest (RFC 1153).
pub fn plain(issue: &Issue<'_>, posts: &[Post<'_>]) -> Vec<u8> {
    let raws: Vec<Vec<u8>> = posts.iter().map(Post::raw).collect();
    let entries: Vec<Entry> = raws.iter().map(|r| entry(r)).collect();
    let mut text = contents(issue, &entries);
    text.push_str("\r\n");
    text.push_str(CONTENTS_SEPARATOR);
    text.push_str("\r\n\r\n");
    for (i, raw) in raws.iter().enumerate() {
        text.push_str(&format!("Message: {}\r\n", i + 1));
        text.push_str(&plain_post(raw));
        text.push_str("\r\n");
        text.push_str(MESSAGE_SEPARATOR);
        text.push_str("\r\n\r\n");
    }
    let end = format!("End of {}", subject(issue));
    text.push_str(&end);
    text.push_str("\r\n");
    text.push_str(&"*".repeat(end.chars().count()));
    text.push_str("\r\n");
    write(envelope(issue).text_body(text))
}

/// `pepsi.list_fanout`'s place for a member's one-click unsubscribe token.
pub const TOKEN: &str = "{token}";

/// The unsubscribe fields of each member's list copy and digest (`pepsi.list_fanout`'s
/// `p_member_fields`), with [`TOKEN`] for the member's token: with the list pages' base
/// (`[pepsi] LIST_WEB_URL`) the member's one-click link (RFC 8058) before the `-leave`
/// address and `List-Unsubscribe-Post`; without it the `-leave` address alone, and no
/// `List-Unsubscribe-Post`, which would promise a POST nobody answers.
pub fn unsubscribe_fields(list: &str, web_url: Option<&str>) -> String {
    let (local, domain) = pepsi_conf::address::parts(list).unwrap_or((list, ""));
    let mailto = format!("<mailto:{local}-leave@{domain}>");
    match web_url {
        Some(web) => format!(
            "List-Unsubscribe: <{web}/lists/unsubscribe/{TOKEN}>, {mailto}\r\n\
             List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n"
        ),
        None => format!("List-Unsubscribe: {mailto}\r\n"),
    }
}

/// A written message split into its header block (ending in CRLF) and its body, as the
/// queue keeps them.
pub fn split(raw: &[u8]) -> (&[u8], &[u8]) {
    match raw.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => (&raw[..at + 2], &raw[at + 4..]),
        None => (raw, &[]),
    }
}

/// The Content-Transfer-Encoding a message/rfc822 part declares for `raw` (RFC 2046
/// §5.2.1 allows no other than these): `7bit` for ASCII in lines of at most 998 octets,
/// `8bit` when it also holds 8-bit octets but no NUL, else `binary`.
pub fn rfc822_encoding(raw: &[u8]) -> &'static str {
    let short_lines = raw.split(|b| *b == b'\n').all(|l| l.len() <= 999);
    if !short_lines || raw.contains(&0) {
        "binary"
    } else if raw.is_ascii() {
        "7bit"
    } else {
        "8bit"
    }
}

/// A line of a post's text that could be read as one of RFC 1153's separators gets a space
/// before it.
pub fn escape_separators(text: &str) -> String {
    text.lines()
        .map(|l| {
            if l.starts_with(MESSAGE_SEPARATOR) {
                format!(" {l}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// A post's line in the contents.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    subject: String,
    from: String,
}

fn entry(raw: &[u8]) -> Entry {
    let parsed = MessageParser::default().parse_headers(raw);
    let subject = parsed
        .as_ref()
        .and_then(|m| m.subject())
        .map(one_line)
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "(no subject)".to_owned());
    let from = parsed
        .as_ref()
        .and_then(|m| m.from())
        .and_then(|a| a.first())
        .and_then(|a| a.name().or(a.address()).map(one_line))
        .unwrap_or_default();
    Entry {
        subject: shorten(&subject),
        from: shorten(&from),
    }
}

/// The text before the posts: how to reach the list, and one line per post.
fn contents(issue: &Issue<'_>, entries: &[Entry]) -> String {
    let name = list_name(issue.list, issue.display_name);
    let command = |suffix: &str| {
        let (local, domain) = pepsi_conf::address::parts(issue.list).unwrap_or((issue.list, ""));
        format!("{local}{suffix}@{domain}")
    };
    let mut t = format!(
        "To post to {name}, write to\r\n\
         \t{list}\r\n\
         \r\n\
         To leave the list, write to\r\n\
         \t{leave}\r\n\
         For help, write \"help\" to\r\n\
         \t{request}\r\n\
         The people who run the list are at\r\n\
         \t{owner}\r\n\
         \r\n\
         When you reply, please give your message a subject of its own rather than\r\n\
         \"Re: {subject}\".\r\n\
         \r\n\
         Today's Topics:\r\n\
         \r\n",
        list = issue.list,
        leave = command("-leave"),
        request = command("-request"),
        owner = command("-owner"),
        subject = subject(issue),
    );
    for (i, e) in entries.iter().enumerate() {
        if e.from.is_empty() {
            t.push_str(&format!("  {:>3}. {}\r\n", i + 1, e.subject));
        } else {
            t.push_str(&format!("  {:>3}. {} ({})\r\n", i + 1, e.subject, e.from));
        }
    }
    t
}

/// One post in a plain digest: the fields RFC 1153 keeps, decoded and on one line each, an
/// empty line, its text, and a note per part that is no text.
fn plain_post(raw: &[u8]) -> String {
    let Some(m) = MessageParser::default().parse(raw) else {
        return "\r\n(this post could not be read)\r\n".to_owned();
    };
    let mut out = String::new();
    for name in PLAIN_FIELDS {
        let value = match m.header(*name) {
            None => continue,
            Some(HeaderValue::Address(a)) => a
                .iter()
                .map(|a| match (a.name(), a.address()) {
                    (Some(n), Some(x)) => format!("{} <{x}>", one_line(n)),
                    (None, Some(x)) => x.to_owned(),
                    (Some(n), None) => one_line(n),
                    (None, None) => String::new(),
                })
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(", "),
            Some(HeaderValue::Text(t)) if name.eq_ignore_ascii_case("Message-ID") => {
                format!("<{t}>")
            }
            Some(HeaderValue::Text(t)) => one_line(t),
            Some(HeaderValue::TextList(l)) => {
                l.iter().map(|t| one_line(t)).collect::<Vec<_>>().join(", ")
            }
            Some(HeaderValue::DateTime(d)) => d.to_rfc822(),
            Some(_) => m.header_raw(*name).map(one_line).unwrap_or_default(),
        };
        if !value.is_empty() {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    out.push_str("\r\n");
    let mut texts: Vec<String> = (0..m.text_body_count())
        .filter_map(|i| m.body_text(i))
        .map(|t| escape_separators(&t))
        .collect();
    let mut notes = Vec::new();
    for part in m.attachments() {
        let ctype = part
            .content_type()
            .map(|c| match c.subtype() {
                Some(sub) => format!("{}/{}", c.ctype(), sub),
                None => c.ctype().to_owned(),
            })
            .unwrap_or_else(|| "text/plain".to_owned())
            .to_ascii_lowercase();
        if ctype == "text/plain"
            && let Some(t) = part.text_contents()
        {
            texts.push(escape_separators(t));
            continue;
        }
        let named = part
            .attachment_name()
            .map(|n| format!(" \"{}\"", shorten(&one_line(n))))
            .unwrap_or_default();
        notes.push(format!(
            "[A part of type {ctype}{named} ({} bytes) is not in the plain digest.]",
            part.len()
        ));
    }
    let mut body = texts.join("\r\n\r\n");
    if !notes.is_empty() {
        if !body.is_empty() {
            body.push_str("\r\n\r\n");
        }
        body.push_str(&notes.join("\r\n"));
    }
    out.push_str(body.trim_end());
    out.push_str("\r\n");
    out
}

/// The fields both digests carry; the body is the caller's.
fn envelope<'x>(issue: &Issue<'_>) -> MessageBuilder<'x> {
    let (local, domain) = pepsi_conf::address::parts(issue.list).unwrap_or((issue.list, ""));
    let command = |suffix: &str| format!("{local}{suffix}@{domain}");
    let list_id = format!("{local}.{domain}");
    let name = one_line(issue.display_name);
    let list_id = if name.is_empty() || !name.is_ascii() {
        format!("<{list_id}>")
    } else {
        format!(
            "\"{}\" <{list_id}>",
            name.replace('\\', "\\\\").replace('"', "\\\"")
        )
    };
    MessageBuilder::new()
        .from(command("-request"))
        .to(issue.list.to_owned())
        .reply_to(issue.list.to_owned())
        .subject(subject(issue))
        .date(Date::new(issue.date))
        .message_id(issue.message_id.to_owned())
        .header("List-Id", Raw::new(list_id))
        .header("List-Post", Raw::new(format!("<mailto:{}>", issue.list)))
        .header(
            "List-Help",
            Raw::new(format!("<mailto:{}?subject=help>", command("-request"))),
        )
        .header(
            "List-Subscribe",
            Raw::new(format!("<mailto:{}>", command("-join"))),
        )
        .header(
            "List-Owner",
            Raw::new(format!("<mailto:{}>", command("-owner"))),
        )
        .header("Precedence", Raw::new("list"))
        .header("X-Loop", Raw::new(issue.list.to_owned()))
}

fn write(message: MessageBuilder<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    message.serialize(&mut out);
    out
}

/// At most [`MAX_CONTENTS_TEXT`] characters, "..." marking a cut.
fn shorten(value: &str) -> String {
    if value.chars().count() <= MAX_CONTENTS_TEXT {
        return value.to_owned();
    }
    let mut s: String = value.chars().take(MAX_CONTENTS_TEXT - 3).collect();
    s.push_str("...");
    s
}

#[cfg(test)]
mod tests;
