//! The MIME downgrade machinery of the relay stages: what to do with a message whose next
//! hop lacks an extension it needs. An 8-bit message for a peer without 8BITMIME is
//! re-encoded to 7 bits (RFC 6152 §3); a message that needs SMTPUTF8 (RFC 6531) cannot be
//! downgraded here and is refused with 5.6.7.
//!
//! The downgrade changes only what it must: each leaf part holding 8-bit bytes is encoded
//! as quoted-printable (`text/*`) or base64 (anything else) and its
//! `Content-Transfer-Encoding` rewritten; multiparts and `message/rfc822` parts are entered
//! and only their transfer-encoding label changes; every other byte — headers, boundaries,
//! 7-bit parts — stays as it was. Pure, no I/O.

use std::fmt;

use crate::delivery::Failure;
use pepsi_contract::message;
pub use pepsi_smtp::data::has_utf8_headers;
use pepsi_smtp::data::is_8bit;
use pepsi_smtp::{Capabilities, Envelope};

/// How deep multiparts and attached messages may nest before the message is refused.
const MAX_DEPTH: usize = 64;

/// Why a message cannot be made 7-bit. `part` names the MIME part (`1.2` is the second part
/// of the first part; the top level is `message`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DowngradeError {
    #[error("the header of {part} has 8-bit bytes, which no transfer encoding can carry")]
    EightBitHeader { part: String },
    #[error("{part} is declared {encoding} yet holds 8-bit bytes")]
    EncodedEightBit { part: String, encoding: String },
    #[error("{part} is a multipart without a usable boundary")]
    NoBoundary { part: String },
    #[error("{part} nests more than {MAX_DEPTH} levels deep")]
    TooDeep { part: String },
}

/// A re-encoded entity: its header block and its body.
pub type Entity = (Vec<u8>, Vec<u8>);

/// `downgrade_to_7bit` on a whole message (headers, empty line, body).
pub fn downgrade_message(raw: &[u8]) -> Result<Option<Vec<u8>>, DowngradeError> {
    let (headers, body) = message::split(raw);
    Ok(downgrade_to_7bit(headers, body)?.map(|(h, b)| message::join(&h, &b)))
}

/// The 7-bit form of a message given as its header block (each field with its CRLF) and
/// body, or `None` when it is 7-bit already. A `MIME-Version: 1.0` field is added when the
/// top level gets a transfer encoding and had none.
pub fn downgrade_to_7bit(headers: &[u8], body: &[u8]) -> Result<Option<Entity>, DowngradeError> {
    if !is_8bit(headers) && !is_8bit(body) {
        return Ok(None);
    }
    let Some((mut headers, body)) = entity(headers, body, Default::Text, "message", 0)? else {
        return Ok(None);
    };
    if find_field(&headers, "mime-version").is_none() {
        headers.extend_from_slice(b"MIME-Version: 1.0\r\n");
    }
    Ok(Some((headers, body)))
}

/// What the relay does with a message for a peer with `caps`.
#[derive(Debug, Clone, PartialEq)]
pub enum Prepared<'a> {
    /// Send the message as it is. `eight_bit`: it has 8-bit bytes (`BODY=8BITMIME`);
    /// `smtputf8`: its addresses or header fields are UTF-8 (`SMTPUTF8`).
    Send {
        message: &'a [u8],
        eight_bit: bool,
        smtputf8: bool,
    },
    /// Send this 7-bit form instead.
    Downgraded(Vec<u8>),
    /// The peer cannot take the message: a permanent failure for every recipient.
    Refuse(Failure),
}

/// The relay stages' decision before MAIL FROM:
///
/// - addresses or header fields in UTF-8 (RFC 6532) for a peer without SMTPUTF8: refused,
///   5.6.7 (this server does not downgrade internationalized mail, RFC 6857) when an address
///   is UTF-8 or the sender declared SMTPUTF8; undeclared UTF-8 header fields are legacy
///   8-bit data;
/// - 8-bit bytes for a peer with neither 8BITMIME nor SMTPUTF8: the 7-bit form
///   ([`downgrade_message`]), or 5.6.3 when none can be made;
/// - otherwise the message as it is.
///
/// What counts is the message itself: a client that declared `SMTPUTF8` or
/// `BODY=8BITMIME` at ingress (`state.origin`) for plain ASCII mail does not make it need
/// either.
pub fn prepare_for_peer<'a>(
    env: &Envelope,
    message: &'a [u8],
    caps: &Capabilities,
    peer: &str,
) -> Prepared<'a> {
    let utf8_headers = has_utf8_headers(message);
    let smtputf8 = env.has_utf8_address() || utf8_headers;
    // Only an SMTPUTF8 peer can take a UTF-8 address, or UTF-8 header fields of mail the
    // sender declared SMTPUTF8 (RFC 6531). UTF-8 header fields in mail nobody declared are
    // legacy 8-bit headers: sent as 8-bit data, as other MTAs do, not refused.
    let required = env.has_utf8_address() || (env.utf8_message && utf8_headers);
    let refuse = |status: &str, diagnostic: String| {
        Prepared::Refuse(Failure {
            diagnostic,
            enhanced_status: Some(status.to_owned()),
            smtp_code: None,
            remote_mta: Some(peer.to_owned()),
            reply_text: None,
            phase: Some("MAIL".to_owned()),
        })
    };
    if required && !caps.smtputf8 {
        let why = if env.has_utf8_address() {
            "non-ASCII addresses"
        } else {
            "UTF-8 header fields"
        };
        return refuse(
            "5.6.7",
            format!("SMTPUTF8 required but not supported by {peer} (the message has {why})"),
        );
    }
    let eight_bit = is_8bit(message);
    // RFC 6531 §3.1: an SMTPUTF8 server takes 8BITMIME content as well.
    if !eight_bit || caps.eight_bit_mime || caps.smtputf8 {
        return Prepared::Send {
            message,
            eight_bit,
            smtputf8,
        };
    }
    match downgrade_message(message) {
        Ok(Some(bytes)) => Prepared::Downgraded(bytes),
        Ok(None) => Prepared::Send {
            message,
            eight_bit: false,
            smtputf8,
        },
        Err(e) => refuse(
            "5.6.3",
            format!(
                "{peer} does not offer 8BITMIME and the message cannot be converted to 7 bits: {e}"
            ),
        ),
    }
}

/// The content type a part has when it names none (RFC 2046 §5.1.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Default {
    Text,
    Message,
}

/// One entity (a message or a part): `None` when it has no 8-bit byte, else its new header
/// block and body.
fn entity(
    headers: &[u8],
    body: &[u8],
    default: Default,
    part: &str,
    depth: usize,
) -> Result<Option<Entity>, DowngradeError> {
    if is_8bit(headers) {
        return Err(DowngradeError::EightBitHeader {
            part: part.to_owned(),
        });
    }
    if !is_8bit(body) {
        return Ok(None);
    }
    if depth > MAX_DEPTH {
        return Err(DowngradeError::TooDeep {
            part: part.to_owned(),
        });
    }
    let content_type = find_field(headers, "content-type").map(|v| ContentType::parse(&v));
    let (kind, boundary) = match &content_type {
        Some(ct) if !ct.kind.is_empty() => (ct.kind.clone(), ct.boundary.clone()),
        _ if default == Default::Message => ("message/rfc822".to_owned(), None),
        _ => ("text/plain".to_owned(), None),
    };
    let encoding = find_field(headers, "content-transfer-encoding")
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_else(|| "7bit".to_owned());
    let identity = matches!(encoding.as_str(), "7bit" | "8bit" | "binary");

    if let Some(sub) = kind.strip_prefix("multipart/") {
        let boundary = boundary.ok_or_else(|| DowngradeError::NoBoundary {
            part: part.to_owned(),
        })?;
        let inner = if sub == "digest" {
            Default::Message
        } else {
            Default::Text
        };
        let body = multipart(body, &boundary, inner, part, depth)?.ok_or_else(|| {
            DowngradeError::NoBoundary {
                part: part.to_owned(),
            }
        })?;
        return Ok(Some((relabel(headers, &encoding, "7bit"), body)));
    }
    if kind == "message/rfc822" && identity {
        let (inner_headers, inner_body) = split_entity(body);
        let inner_part = if part == "message" {
            "the attached message".to_owned()
        } else {
            format!("the message in part {part}")
        };
        let Some((h, b)) = entity(
            inner_headers,
            inner_body,
            Default::Text,
            &inner_part,
            depth + 1,
        )?
        else {
            return Ok(None);
        };
        let mut inner = h;
        inner.extend_from_slice(b"\r\n");
        inner.extend_from_slice(&b);
        return Ok(Some((relabel(headers, &encoding, "7bit"), inner)));
    }
    if !identity {
        return Err(DowngradeError::EncodedEightBit {
            part: part.to_owned(),
            encoding,
        });
    }
    let (encoded, label) = if kind.starts_with("text/") {
        (quoted_printable(body), "quoted-printable")
    } else {
        (base64_lines(body), "base64")
    };
    Ok(Some((relabel(headers, &encoding, label), encoded)))
}

/// A part's header block and body: split at the first empty line; a part that starts with
/// one has no header.
fn split_entity(raw: &[u8]) -> (&[u8], &[u8]) {
    if let Some(rest) = raw.strip_prefix(b"\r\n") {
        return (&raw[..0], rest);
    }
    if let Some(rest) = raw.strip_prefix(b"\n") {
        return (&raw[..0], rest);
    }
    let mut at = 0;
    while at < raw.len() {
        let end = raw[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(raw.len(), |p| at + p + 1);
        let line = &raw[at..end];
        if line == b"\r\n" || line == b"\n" {
            return (&raw[..at], &raw[end..]);
        }
        at = end;
    }
    (raw, &raw[raw.len()..])
}

/// The lines of `raw` as (start, end of content, end with the line end).
fn lines(raw: &[u8]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= raw.len() {
            return None;
        }
        let start = at;
        let (content_end, end) = match raw[at..].iter().position(|&b| b == b'\n') {
            Some(p) => {
                let nl = at + p;
                let content_end = if nl > start && raw[nl - 1] == b'\r' {
                    nl - 1
                } else {
                    nl
                };
                (content_end, nl + 1)
            }
            None => (raw.len(), raw.len()),
        };
        at = end;
        Some((start, content_end, end))
    })
}

/// A multipart body with its 8-bit parts re-encoded: `None` when no delimiter line is found.
/// The preamble and epilogue are not content (RFC 2046 §5.1.1); an 8-bit byte there becomes
/// `?`.
fn multipart(
    body: &[u8],
    boundary: &str,
    inner: Default,
    part: &str,
    depth: usize,
) -> Result<Option<Vec<u8>>, DowngradeError> {
    let dash = format!("--{boundary}");
    // (line start, line end with its line end, closing)
    let mut delimiters = Vec::new();
    for (start, content_end, end) in lines(body) {
        let line = &body[start..content_end];
        let Some(rest) = line.strip_prefix(dash.as_bytes()) else {
            continue;
        };
        let (closing, rest) = match rest.strip_prefix(b"--") {
            Some(r) => (true, r),
            None => (false, rest),
        };
        if rest.iter().all(|b| *b == b' ' || *b == b'\t') {
            delimiters.push((start, end, closing));
            if closing {
                break;
            }
        }
    }
    if delimiters.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(body.len() + body.len() / 3);
    out.extend(sanitize(&body[..delimiters[0].1]));
    for (n, pair) in delimiters.windows(2).enumerate() {
        let ((_, content_start, _), (next_start, next_end, _)) = (pair[0], pair[1]);
        // The line end before a delimiter belongs to the delimiter (RFC 2046 §5.1.1).
        let mut content_end = next_start;
        if body[..content_end].ends_with(b"\r\n") {
            content_end -= 2;
        } else if body[..content_end].ends_with(b"\n") {
            content_end -= 1;
        }
        let content_end = content_end.max(content_start);
        let raw = &body[content_start..content_end];
        let name = part_name(part, n + 1);
        let (h, b) = split_entity(raw);
        match entity(h, b, inner, &name, depth + 1)? {
            None => out.extend_from_slice(raw),
            Some((h, b)) => {
                out.extend_from_slice(&h);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&b);
            }
        }
        out.extend_from_slice(&body[content_end..next_end]);
    }
    let last = delimiters.last().expect("one delimiter at least");
    if !last.2 {
        // no closing delimiter: what follows the last delimiter is its part
        let (h, b) = split_entity(&body[last.1..]);
        let name = part_name(part, delimiters.len());
        match entity(h, b, inner, &name, depth + 1)? {
            None => out.extend_from_slice(&body[last.1..]),
            Some((h, b)) => {
                out.extend_from_slice(&h);
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&b);
            }
        }
    } else {
        out.extend(sanitize(&body[last.1..]));
    }
    Ok(Some(out))
}

/// `part 2` at the top, `part 1.2` below it, `the message in part 3, part 1` inside an
/// attached message.
fn part_name(parent: &str, n: usize) -> String {
    match parent {
        "message" => format!("part {n}"),
        p if p.starts_with("part ") => format!("{p}.{n}"),
        p => format!("{p}, part {n}"),
    }
}

fn sanitize(bytes: &[u8]) -> impl Iterator<Item = u8> + '_ {
    bytes.iter().map(|&b| if b >= 0x80 { b'?' } else { b })
}

/// The header block with its transfer-encoding field saying `label`: the field replaced
/// where it was (continuation lines included), or added last. Unchanged when it already
/// says so (a 7-bit `multipart` keeps its field).
fn relabel(headers: &[u8], current: &str, label: &str) -> Vec<u8> {
    if current == label && find_field(headers, "content-transfer-encoding").is_some() {
        return headers.to_vec();
    }
    let new_field = format!("Content-Transfer-Encoding: {label}\r\n");
    if label == "7bit" && find_field(headers, "content-transfer-encoding").is_none() {
        // 7bit is the default: nothing to say
        return headers.to_vec();
    }
    let mut out = Vec::with_capacity(headers.len() + new_field.len());
    let mut replaced = false;
    let mut skipping = false;
    for (start, _, end) in lines(headers) {
        let line = &headers[start..end];
        let continuation = line.first().is_some_and(|b| *b == b' ' || *b == b'\t');
        if continuation && skipping {
            continue;
        }
        skipping = false;
        if !continuation && !replaced && field_name_is(line, "content-transfer-encoding") {
            out.extend_from_slice(new_field.as_bytes());
            replaced = true;
            skipping = true;
            continue;
        }
        out.extend_from_slice(line);
    }
    if !replaced {
        if !out.is_empty() && !out.ends_with(b"\n") {
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(new_field.as_bytes());
    }
    out
}

fn field_name_is(line: &[u8], name: &str) -> bool {
    let Some(colon) = line.iter().position(|b| *b == b':') else {
        return false;
    };
    line[..colon]
        .trim_ascii_end()
        .eq_ignore_ascii_case(name.as_bytes())
}

/// The unfolded value of the first field called `name`.
fn find_field(headers: &[u8], name: &str) -> Option<String> {
    pepsi_contract::message::field_values(headers, name)
        .into_iter()
        .next()
}

/// The parts of a Content-Type value this module needs.
#[derive(Debug, Default, PartialEq, Eq)]
struct ContentType {
    /// `type/subtype`, lower case; empty when the value has none.
    kind: String,
    boundary: Option<String>,
}

impl ContentType {
    fn parse(value: &str) -> ContentType {
        let value = strip_comments(value);
        let mut params = split_params(&value).into_iter();
        let kind = params
            .next()
            .map(|k| k.trim().to_ascii_lowercase())
            .filter(|k| k.contains('/'))
            .unwrap_or_default();
        let boundary = params.find_map(|p| {
            let (name, v) = p.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("boundary") {
                return None;
            }
            let v = v.trim();
            let v = match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
                Some(quoted) => quoted.replace("\\\"", "\"").replace("\\\\", "\\"),
                None => v.to_owned(),
            };
            (!v.is_empty()).then_some(v)
        });
        ContentType { kind, boundary }
    }
}

/// Removes `(comments)` outside quoted strings.
fn strip_comments(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let (mut depth, mut quoted, mut escaped) = (0usize, false, false);
    for c in value.chars() {
        if escaped {
            escaped = false;
            if depth == 0 {
                out.push(c);
            }
            continue;
        }
        match c {
            '\\' => {
                escaped = true;
                if depth == 0 {
                    out.push(c);
                }
            }
            '"' if depth == 0 => {
                quoted = !quoted;
                out.push(c);
            }
            '(' if !quoted => depth += 1,
            ')' if !quoted && depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// Splits at `;` outside quoted strings.
fn split_params(value: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let (mut quoted, mut escaped) = (false, false);
    for c in value.chars() {
        let last = parts.last_mut().expect("one part at least");
        if escaped {
            escaped = false;
            last.push(c);
            continue;
        }
        match c {
            '\\' if quoted => {
                escaped = true;
                last.push(c);
            }
            '"' => {
                quoted = !quoted;
                last.push(c);
            }
            ';' if !quoted => parts.push(String::new()),
            _ => last.push(c),
        }
    }
    parts
}

/// Quoted-printable (RFC 2045 §6.7) keeping the line structure: each line end becomes a
/// CRLF hard break; `=`, controls, 8-bit bytes and white space before a line end are
/// `=XX`; lines are broken with a soft `=` so none exceeds 76 characters.
fn quoted_printable(body: &[u8]) -> Vec<u8> {
    const MAX: usize = 76;
    let mut out = Vec::with_capacity(body.len() + body.len() / 4);
    for (start, content_end, end) in lines(body) {
        let line = &body[start..content_end];
        let mut width = 0;
        for (i, &b) in line.iter().enumerate() {
            let at_end = i + 1 == line.len();
            let literal = match b {
                b' ' | b'\t' => !at_end,
                b'=' => false,
                33..=126 => true,
                _ => false,
            };
            let piece_len = if literal { 1 } else { 3 };
            // room for the piece, plus a soft break unless it is the line's last
            let room = if at_end { MAX } else { MAX - 1 };
            if width + piece_len > room {
                out.extend_from_slice(b"=\r\n");
                width = 0;
            }
            if literal {
                out.push(b);
            } else {
                out.extend_from_slice(format!("={b:02X}").as_bytes());
            }
            width += piece_len;
        }
        if end > content_end {
            out.extend_from_slice(b"\r\n");
        }
    }
    out
}

/// Base64 in lines of 76 characters, CRLF between them, and a CRLF at the end when the
/// content ended with a line end (white space a decoder skips; it keeps the part's shape).
pub fn base64_lines(body: &[u8]) -> Vec<u8> {
    let encoded = pepsi_smtp::encoding::base64_encode(body);
    let mut out = Vec::with_capacity(encoded.len() + encoded.len() / 38 + 2);
    for (i, chunk) in encoded.as_bytes().chunks(76).enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(chunk);
    }
    if body.ends_with(b"\n") {
        out.extend_from_slice(b"\r\n");
    }
    out
}

impl fmt::Display for Prepared<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Prepared::Send { eight_bit, .. } => {
                write!(
                    f,
                    "send as is ({})",
                    if *eight_bit { "8-bit" } else { "7-bit" }
                )
            }
            Prepared::Downgraded(_) => f.write_str("send the 7-bit form"),
            Prepared::Refuse(failure) => write!(f, "refuse: {}", failure.diagnostic),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mail_parser::{MessageParser, PartType};

    /// Every leaf of a message as mail-parser decodes it: (kind, decoded bytes), attached
    /// messages entered. mail-parser is the independent reader that proves the new encoding
    /// carries the same content.
    fn leaves(raw: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
        fn walk(m: &mail_parser::Message<'_>, out: &mut Vec<(&'static str, Vec<u8>)>) {
            for part in &m.parts {
                match &part.body {
                    PartType::Text(t) => out.push(("text", t.as_bytes().to_vec())),
                    PartType::Html(t) => out.push(("html", t.as_bytes().to_vec())),
                    PartType::Binary(b) | PartType::InlineBinary(b) => {
                        out.push(("binary", b.to_vec()))
                    }
                    PartType::Message(inner) => walk(inner, out),
                    PartType::Multipart(_) => {}
                }
            }
        }
        let message = MessageParser::default().parse(raw).expect("a message");
        let mut out = Vec::new();
        walk(&message, &mut out);
        out
    }

    /// Downgrades `input` and checks what every downgrade must give: 7-bit, lines of at most
    /// 998 octets, the same decoded content, every original header line kept in order except
    /// Content-Transfer-Encoding; `expect` lists substrings the result must contain.
    fn check(input: &[u8], expect: &[&str]) -> Vec<u8> {
        let out = downgrade_message(input)
            .unwrap()
            .expect("an 8-bit message changes");
        let text = String::from_utf8(out.clone()).expect("7-bit output is ASCII");
        assert!(!is_8bit(&out), "{text}");
        assert!(text.split("\r\n").all(|l| l.len() <= 998), "{text}");
        assert_eq!(
            leaves(input),
            leaves(&out),
            "decoded content differs:\n{text}"
        );
        let kept = |raw: &[u8]| -> Vec<String> {
            let (h, _) = message::split(raw);
            String::from_utf8_lossy(h)
                .split("\r\n")
                .filter(|l| {
                    !l.to_ascii_lowercase()
                        .starts_with("content-transfer-encoding")
                        && !l.to_ascii_lowercase().starts_with("mime-version")
                })
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(kept(input), kept(&out), "top-level header changed");
        for e in expect {
            assert!(text.contains(e), "{e:?} missing from:\n{text}");
        }
        out
    }

    #[test]
    fn seven_bit_messages_are_left_alone() {
        for raw in [
            &b"Subject: hi\r\n\r\nplain\r\n"[..],
            b"Content-Type: text/plain\r\nContent-Transfer-Encoding: 8bit\r\n\r\nascii only\r\n",
            b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\n\r\nx\r\n--b--\r\n",
            b"no body at all\r\n",
        ] {
            assert_eq!(downgrade_message(raw), Ok(None), "{raw:?}");
        }
    }

    #[test]
    fn eight_bit_text_becomes_quoted_printable() {
        let input =
            "From: a@example.org\r\nSubject: caf\r\nContent-Type: text/plain; charset=utf-8\r\n\
                     Content-Transfer-Encoding: 8bit\r\nMIME-Version: 1.0\r\n\r\n\
                     Grüße aus Köln = schön\r\ntrailing space \r\n.dot line\r\n"
                .as_bytes();
        let out = check(
            input,
            &[
                "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\nMIME-Version: 1.0\r\n\r\n",
                "Gr=C3=BC=C3=9Fe aus K=C3=B6ln =3D sch=C3=B6n\r\n",
                "trailing space=20\r\n",
                ".dot line\r\n",
            ],
        );
        // the field stays where it was; nothing is added
        assert_eq!(
            String::from_utf8(out)
                .unwrap()
                .matches("MIME-Version")
                .count(),
            1
        );
        // no Content-Transfer-Encoding and no MIME-Version: both added
        check(
            "Subject: x\r\n\r\nnaïve\r\n".as_bytes(),
            &[
                "Subject: x\r\nContent-Transfer-Encoding: quoted-printable\r\nMIME-Version: 1.0\r\n\r\nna=C3=AFve\r\n",
            ],
        );
    }

    #[test]
    fn long_lines_get_soft_breaks() {
        let long = "é".repeat(100) + " end";
        let input = format!("Content-Type: text/plain; charset=utf-8\r\n\r\n{long}\r\n{long}");
        let out = check(input.as_bytes(), &["=\r\n"]);
        let text = String::from_utf8(out).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(body.split("\r\n").all(|l| l.len() <= 76), "{body}");
    }

    #[test]
    fn binary_attachment_becomes_base64_and_text_parts_stay() {
        let binary: Vec<u8> = (0..=255u8).cycle().take(600).collect();
        let mut input = b"From: a@example.org\r\nContent-Type: multipart/mixed; boundary=\"=_b 1\"\r\nMIME-Version: 1.0\r\n\r\n\
                          preamble\r\n--=_b 1\r\nContent-Type: text/plain\r\n\r\nseven bit stays\r\n\
                          --=_b 1\r\nContent-Type: application/octet-stream\r\nContent-Transfer-Encoding: binary\r\n\
                          Content-Disposition: attachment; filename=\"x.bin\"\r\n\r\n"
            .to_vec();
        input.extend_from_slice(&binary);
        input.extend_from_slice(b"\r\n--=_b 1--\r\nepilogue\r\n");
        let out = check(
            &input,
            &[
                "preamble\r\n--=_b 1\r\nContent-Type: text/plain\r\n\r\nseven bit stays\r\n--=_b 1\r\n",
                "Content-Type: application/octet-stream\r\nContent-Transfer-Encoding: base64\r\nContent-Disposition: attachment; filename=\"x.bin\"\r\n\r\nAAECAwQF",
                "\r\n--=_b 1--\r\nepilogue\r\n",
            ],
        );
        let text = String::from_utf8(out).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(body.split("\r\n").all(|l| l.len() <= 76), "{body}");
    }

    #[test]
    fn nested_multiparts_and_attached_messages_are_entered() {
        let input = "Content-Type: multipart/mixed; boundary=outer\r\n\r\n\
                     --outer\r\nContent-Type: multipart/alternative; boundary=inner\r\nContent-Transfer-Encoding: 8bit\r\n\r\n\
                     --inner\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nü plain\r\n\
                     --inner\r\nContent-Type: text/html; charset=utf-8\r\n\r\n<p>ü html</p>\r\n\
                     --inner--\r\n\
                     --outer\r\nContent-Type: message/rfc822\r\nContent-Transfer-Encoding: 8bit\r\n\r\n\
                     Subject: attached\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nañejo\r\n\
                     --outer\r\nContent-Type: text/plain\r\n\r\nlast, 7-bit\r\n\
                     --outer--\r\n"
            .as_bytes();
        check(
            input,
            &[
                "Content-Type: multipart/alternative; boundary=inner\r\nContent-Transfer-Encoding: 7bit\r\n\r\n--inner\r\n",
                "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n=C3=BC plain\r\n--inner\r\n",
                "<p>=C3=BC html</p>\r\n--inner--\r\n",
                "Content-Type: message/rfc822\r\nContent-Transfer-Encoding: 7bit\r\n\r\nSubject: attached\r\n",
                "a=C3=B1ejo\r\n--outer\r\n",
                "Content-Type: text/plain\r\n\r\nlast, 7-bit\r\n--outer--\r\n",
            ],
        );
    }

    #[test]
    fn what_cannot_be_downgraded_is_named() {
        let err = |raw: &str| downgrade_message(raw.as_bytes()).unwrap_err().to_string();
        assert_eq!(
            err("Subject: Grüße\r\n\r\nbody ü\r\n"),
            "the header of message has 8-bit bytes, which no transfer encoding can carry"
        );
        assert_eq!(
            err(
                "Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: image/png\r\nContent-Transfer-Encoding: base64\r\n\r\nü\r\n--b--\r\n"
            ),
            "part 1 is declared base64 yet holds 8-bit bytes"
        );
        assert_eq!(
            err("Content-Type: multipart/mixed\r\n\r\nü\r\n"),
            "message is a multipart without a usable boundary"
        );
        assert_eq!(
            err("Content-Type: multipart/mixed; boundary=x\r\n\r\nno delimiter ü\r\n"),
            "message is a multipart without a usable boundary"
        );
        assert_eq!(
            err(
                "Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: multipart/mixed; boundary=c\r\n\r\n--c\r\nX-Ü: 1\r\n\r\nü\r\n--c--\r\n--b--\r\n"
            ),
            "the header of part 1.1 has 8-bit bytes, which no transfer encoding can carry"
        );
    }

    #[test]
    fn content_type_table() {
        let check = |value: &str, kind: &str, boundary: Option<&str>| {
            assert_eq!(
                ContentType::parse(value),
                ContentType {
                    kind: kind.into(),
                    boundary: boundary.map(str::to_owned)
                },
                "{value}"
            );
        };
        check("text/plain", "text/plain", None);
        check(
            "Multipart/Mixed; Boundary=abc",
            "multipart/mixed",
            Some("abc"),
        );
        check(
            "multipart/mixed; charset=x; boundary=\"a;b \\\"c\"",
            "multipart/mixed",
            Some("a;b \"c"),
        );
        check(
            "multipart/mixed (comment; boundary=no); boundary=yes",
            "multipart/mixed",
            Some("yes"),
        );
        check("garbage", "", None);
    }

    fn caps(eight_bit_mime: bool, smtputf8: bool) -> Capabilities {
        Capabilities {
            eight_bit_mime,
            smtputf8,
            ..Capabilities::default()
        }
    }

    /// (sender, message, 8BITMIME, SMTPUTF8) → the decision, by name and status.
    #[test]
    fn prepare_for_peer_table() {
        let ascii = b"Subject: a\r\n\r\nascii\r\n".as_slice();
        let eight = "Subject: a\r\n\r\nä\r\n".as_bytes();
        let utf8_header = "Subject: ä\r\n\r\nä\r\n".as_bytes();
        let broken =
            "Content-Type: image/png\r\nContent-Transfer-Encoding: base64\r\n\r\nä\r\n".as_bytes();
        let cases: &[(&str, &[u8], bool, bool, &str)] = &[
            ("a@x", ascii, false, false, "send 7-bit"),
            ("a@x", eight, true, false, "send 8-bit"),
            ("a@x", eight, false, true, "send 8-bit"),
            ("a@x", eight, false, false, "downgrade"),
            // Undeclared UTF-8 header fields: legacy 8-bit data, no 7-bit form.
            ("a@x", utf8_header, false, false, "5.6.3"),
            ("a@x", utf8_header, true, false, "send 8-bit utf8"),
            ("a@x", utf8_header, true, true, "send 8-bit utf8"),
            ("jörg@x", ascii, true, false, "5.6.7"),
            ("jörg@x", ascii, true, true, "send 7-bit utf8"),
            ("a@x", broken, false, false, "5.6.3"),
            ("a@x", broken, true, false, "send 8-bit"),
        ];
        for (from, message, eight_bit_mime, smtputf8, want) in cases {
            let env = Envelope {
                mail_from: from.to_string(),
                ..Envelope::default()
            };
            let got =
                match prepare_for_peer(&env, message, &caps(*eight_bit_mime, *smtputf8), "mx.test")
                {
                    Prepared::Send {
                        message: sent,
                        eight_bit,
                        smtputf8,
                    } => {
                        assert!(std::ptr::eq(sent, *message), "sent as is");
                        format!(
                            "send {}{}",
                            if eight_bit { "8-bit" } else { "7-bit" },
                            if smtputf8 { " utf8" } else { "" }
                        )
                    }
                    Prepared::Downgraded(bytes) => {
                        assert!(!is_8bit(&bytes));
                        "downgrade".to_owned()
                    }
                    Prepared::Refuse(f) => {
                        assert_eq!(f.remote_mta.as_deref(), Some("mx.test"));
                        assert!(f.diagnostic.contains("mx.test"), "{}", f.diagnostic);
                        f.enhanced_status.unwrap()
                    }
                };
            assert_eq!(
                &got,
                want,
                "{from} {:?} 8bitmime={eight_bit_mime} smtputf8={smtputf8}",
                String::from_utf8_lossy(message)
            );
        }
        // Declared SMTPUTF8 at submission (state.origin.smtputf8): refused by a peer without it,
        // unless the message turned out to be ASCII.
        let env = Envelope {
            utf8_message: true,
            ..Envelope::default()
        };
        assert!(matches!(
            prepare_for_peer(&env, ascii, &caps(false, false), "mx.test"),
            Prepared::Send { .. }
        ));
        let Prepared::Refuse(f) =
            prepare_for_peer(&env, utf8_header, &caps(true, false), "mx.test")
        else {
            panic!("refused");
        };
        assert_eq!(
            f.diagnostic,
            "SMTPUTF8 required but not supported by mx.test (the message has UTF-8 header fields)"
        );
    }
}
