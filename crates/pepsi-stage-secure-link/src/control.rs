//! The sender's request inside the message: the control header (`X-Pepsi-Secure-Link: yes`)
//! and the subject tag (`[secure]`). Pure: reads and rewrites a header block, nothing else.
//!
//! The header never leaves this stage: it is removed from every copy. The tag is cut from
//! the Subject of the copy that is sealed, so the recipient reads the subject as the sender
//! meant it; the copies that go on as they are keep it.

use mail_builder::headers::Header as _;
use mail_builder::headers::text::Text;
use pepsi_contract::message::{field_name, fields};

/// What the header block asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Request {
    /// The control header is present (whatever it says): it is removed.
    pub header: bool,
    /// It says yes (`yes`, `true` or `1`, any case).
    pub header_yes: bool,
    /// The Subject carries the tag.
    pub tagged: bool,
}

impl Request {
    /// The sender asked for a secure link.
    pub fn asked(&self) -> bool {
        self.header_yes || self.tagged
    }
}

/// Reads the request from `headers`: the field `header` and the tag `tag` anywhere in the
/// Subject (letters compared without case; an empty tag is never found).
pub fn read(headers: &[u8], header: &str, tag: &str) -> Request {
    let values = pepsi_contract::message::field_values(headers, header);
    Request {
        header: !values.is_empty(),
        header_yes: values
            .iter()
            .any(|v| matches!(v.to_ascii_lowercase().as_str(), "yes" | "true" | "1")),
        tagged: fields(headers)
            .filter(|f| is_named(f, "Subject"))
            .any(|f| find(f, tag).is_some() || decoded(f).is_some_and(|d| contains(&d, tag))),
    }
}

/// `headers` without the control header.
pub fn without_header(headers: &[u8], header: &str) -> Vec<u8> {
    pepsi_contract::message::remove_fields(headers, header)
}

/// The header block to seal: without the control header, the tag cut from the Subject.
pub fn sealed(headers: &[u8], header: &str, tag: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(headers.len());
    for f in fields(headers) {
        if is_named(f, header) {
            continue;
        }
        if is_named(f, "Subject") {
            out.extend_from_slice(&cut_subject(f, tag));
        } else {
            out.extend_from_slice(f);
        }
    }
    out
}

fn is_named(field: &[u8], name: &str) -> bool {
    field_name(field).is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes()))
}

/// Where `tag` starts in `hay`, letters compared without case.
fn find(hay: &[u8], tag: &str) -> Option<usize> {
    let tag = tag.as_bytes();
    if tag.is_empty() || tag.len() > hay.len() {
        return None;
    }
    hay.windows(tag.len())
        .position(|w| w.eq_ignore_ascii_case(tag))
}

fn contains(text: &str, tag: &str) -> bool {
    find(text.as_bytes(), tag).is_some()
}

/// The Subject's text with RFC 2047 encoded words decoded (None when it has none, or the
/// field does not parse).
fn decoded(field: &[u8]) -> Option<String> {
    let colon = field.iter().position(|&b| b == b':')?;
    // Only a field with an encoded word needs decoding.
    find(&field[colon..], "=?")?;
    let mut block = b"Subject:".to_vec();
    block.extend_from_slice(&field[colon + 1..]);
    block.extend_from_slice(b"\r\n");
    let parsed = mail_parser::MessageParser::default().parse_headers(&block)?;
    parsed.subject().map(str::to_owned)
}

/// The Subject field with every `tag` cut: from the raw bytes where it is written as such
/// (everything else kept byte for byte), else from the decoded text, written anew.
fn cut_subject(field: &[u8], tag: &str) -> Vec<u8> {
    let colon = field.iter().position(|&b| b == b':').unwrap_or(0);
    if find(&field[colon..], tag).is_some() {
        let mut out = field[..colon + 1].to_vec();
        out.extend_from_slice(&cut(&field[colon + 1..], tag));
        return out;
    }
    match decoded(field) {
        Some(text) if contains(&text, tag) => {
            let kept = cut(text.as_bytes(), tag);
            let kept = String::from_utf8_lossy(&kept);
            let mut out = b"Subject: ".to_vec();
            Text::new(kept.trim().to_owned()).write_header(&mut out, "Subject: ".len());
            out
        }
        _ => field.to_vec(),
    }
}

/// `text` without any `tag`, each with one blank beside it (the one after it, else the one
/// before it at the end of a line), so `[secure] Hello` and `Hello [secure]` both become
/// `Hello`.
fn cut(text: &[u8], tag: &str) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = find(rest, tag) {
        out.extend_from_slice(&rest[..at]);
        rest = &rest[at + tag.len()..];
        if rest.first() == Some(&b' ') {
            rest = &rest[1..];
        } else if (rest.is_empty() || rest.starts_with(b"\r"))
            && out.len() > 1
            && out.ends_with(b" ")
        {
            out.pop();
        }
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "X-Pepsi-Secure-Link";
    const TAG: &str = "[secure]";

    fn block(fields: &str) -> Vec<u8> {
        format!("From: a@example.test\r\n{fields}To: b@remote.example\r\n").into_bytes()
    }

    /// (fields, the request read, the sealed header block's fields).
    #[test]
    fn requests_and_sealed_headers_as_a_table() {
        let cases: &[(&str, (bool, bool, bool), &str)] = &[
            (
                "Subject: Hello\r\n",
                (false, false, false),
                "Subject: Hello\r\n",
            ),
            (
                "Subject: [secure] Hello\r\n",
                (false, false, true),
                "Subject: Hello\r\n",
            ),
            (
                "Subject: Hello [SECURE]\r\n",
                (false, false, true),
                "Subject: Hello\r\n",
            ),
            (
                "Subject: Re: [Secure]report [secure] now\r\n",
                (false, false, true),
                "Subject: Re: report now\r\n",
            ),
            (
                "Subject: [secure]\r\n",
                (false, false, true),
                "Subject: \r\n",
            ),
            // a folded subject keeps its folding
            (
                "Subject: a long\r\n subject [secure]\r\n",
                (false, false, true),
                "Subject: a long\r\n subject\r\n",
            ),
            (
                "X-Pepsi-Secure-Link: yes\r\nSubject: Hi\r\n",
                (true, true, false),
                "Subject: Hi\r\n",
            ),
            (
                "x-pepsi-secure-link:  TRUE \r\nSubject: Hi\r\n",
                (true, true, false),
                "Subject: Hi\r\n",
            ),
            (
                "X-Pepsi-Secure-Link: 1\r\nSubject: Hi\r\n",
                (true, true, false),
                "Subject: Hi\r\n",
            ),
            (
                "X-Pepsi-Secure-Link: no\r\nSubject: Hi\r\n",
                (true, false, false),
                "Subject: Hi\r\n",
            ),
            (
                "X-Pepsi-Secure-Link: yes\r\nSubject: [secure] Hi\r\n",
                (true, true, true),
                "Subject: Hi\r\n",
            ),
            // the tag inside an encoded word: found, and the subject written anew
            (
                "Subject: =?UTF-8?Q?=5Bsecure=5D_Gr=C3=BC=C3=9Fe?=\r\n",
                (false, false, true),
                "Subject: =?utf-8?B?R3LDvMOfZQ==?=\r\n",
            ),
            // an encoded subject without the tag is kept as it was
            (
                "Subject: =?UTF-8?Q?Gr=C3=BC=C3=9Fe?=\r\n",
                (false, false, false),
                "Subject: =?UTF-8?Q?Gr=C3=BC=C3=9Fe?=\r\n",
            ),
            (
                "Subject: secure\r\n",
                (false, false, false),
                "Subject: secure\r\n",
            ),
        ];
        for (fields, (header, yes, tagged), sealed_fields) in cases {
            let h = block(fields);
            let r = read(&h, H, TAG);
            assert_eq!(
                (r.header, r.header_yes, r.tagged),
                (*header, *yes, *tagged),
                "{fields:?}"
            );
            assert_eq!(r.asked(), *yes || *tagged);
            let got = String::from_utf8(sealed(&h, H, TAG)).unwrap();
            assert_eq!(
                got,
                format!("From: a@example.test\r\n{sealed_fields}To: b@remote.example\r\n"),
                "{fields:?}"
            );
        }
    }

    #[test]
    fn the_copy_that_goes_on_loses_the_header_and_keeps_the_tag() {
        let h = block("X-Pepsi-Secure-Link: yes\r\nSubject: [secure] Hi\r\n");
        assert_eq!(
            String::from_utf8(without_header(&h, H)).unwrap(),
            "From: a@example.test\r\nSubject: [secure] Hi\r\nTo: b@remote.example\r\n"
        );
        // An empty tag is never found.
        assert!(!read(&block("Subject: Hi\r\n"), H, "").tagged);
    }
}
