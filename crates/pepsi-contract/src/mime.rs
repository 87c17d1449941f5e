//! The MIME structure the stages read: a `Content-Type` and its parameters, a part's file
//! name, and the parts of a multipart body at one level. Shared by the crypto stages (RFC
//! 1847 bodies) and the list stage (its content filters). Pure and bounded: a multipart is
//! read at one level only and has at most [`MAX_PARTS`] parts.

use crate::message;

/// The most parts a multipart read here may have before it is refused.
pub const MAX_PARTS: usize = 1000;

/// Why a multipart body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultipartError {
    #[error("boundary {0:?} is not 1-70 characters")]
    Boundary(String),
    #[error("no closing delimiter --{0}--")]
    Unclosed(String),
    #[error("more than {MAX_PARTS} parts")]
    TooManyParts,
}

/// Whether a field name belongs to the MIME entity rather than to the message that
/// carries it: every `Content-*` field.
pub fn is_content_field(name: &str) -> bool {
    // Bytes, not characters: a name that is not ASCII must not split a character.
    name.len() > 8 && name.as_bytes()[..8].eq_ignore_ascii_case(b"content-")
}

/// Splits a header block into the fields that stay outside (everything but the content
/// fields and `MIME-Version`) and the content fields, each as whole fields with their
/// continuation lines and CRLF.
pub fn split_content(headers: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut outer = Vec::with_capacity(headers.len());
    let mut content = Vec::new();
    for field in message::fields(headers) {
        match message::field_name(field).map(|n| String::from_utf8_lossy(n).into_owned()) {
            Some(name) if is_content_field(&name) => content.extend_from_slice(field),
            Some(name) if name.eq_ignore_ascii_case("mime-version") => {}
            _ => outer.extend_from_slice(field),
        }
    }
    (outer, content)
}

/// A parsed `Content-Type`: the lower-case `type/subtype` and the parameters (names
/// lower-case, values unquoted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentType {
    pub mime: String,
    pub params: Vec<(String, String)>,
}

impl ContentType {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The top-level media type (`image` of `image/png`).
    pub fn main_type(&self) -> &str {
        self.mime.split_once('/').map_or("", |(main, _)| main)
    }
}

/// The `Content-Type` of a header block, when it has one that parses.
pub fn content_type(headers: &[u8]) -> Option<ContentType> {
    let value = message::field_values(headers, "Content-Type")
        .into_iter()
        .next()?;
    parse_content_type(&value)
}

/// Parses a `Content-Type` value (`type/subtype; name=value; name="quoted"`); comments are
/// not supported and end the parse of the parameter they are in.
pub fn parse_content_type(value: &str) -> Option<ContentType> {
    let mut pieces = split_params(value).into_iter();
    let mime = pieces.next()?.trim().to_ascii_lowercase();
    let (kind, sub) = mime.split_once('/')?;
    if kind.is_empty() || sub.is_empty() || mime.contains(char::is_whitespace) {
        return None;
    }
    Some(ContentType {
        params: params(pieces),
        mime,
    })
}

/// The `name=value` pieces of a parameter list, names lower-case, quoted values unquoted.
fn params(pieces: impl Iterator<Item = String>) -> Vec<(String, String)> {
    let mut params = Vec::new();
    for p in pieces {
        let Some((name, v)) = p.split_once('=') else {
            continue;
        };
        let v = v.trim();
        let v = match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
            None => v.to_owned(),
        };
        params.push((name.trim().to_ascii_lowercase(), v));
    }
    params
}

/// Splits at semicolons outside double quotes.
fn split_params(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in value.chars() {
        match c {
            _ if escaped => {
                cur.push(c);
                escaped = false;
            }
            '\\' if quoted => {
                cur.push(c);
                escaped = true;
            }
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ';' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// The file name a part gives itself: `Content-Disposition`'s `filename`, else
/// `Content-Type`'s `name`. An RFC 2231 form (`filename*=utf-8''a%20b.pdf`, or split into
/// `filename*0*`, `filename*1*`...) is joined and its percent escapes undone; an RFC 2047
/// encoded word is left as it is (its extension still shows).
pub fn file_name(headers: &[u8]) -> Option<String> {
    let disposition = message::field_values(headers, "Content-Disposition")
        .into_iter()
        .next()
        .map(|v| params(split_params(&v).into_iter().skip(1)))
        .unwrap_or_default();
    named(&disposition, "filename")
        .or_else(|| content_type(headers).and_then(|ct| named(&ct.params, "name")))
}

/// Parameter `name` of `params`, in its plain or its RFC 2231 form.
fn named(params: &[(String, String)], name: &str) -> Option<String> {
    if let Some((_, v)) = params.iter().find(|(n, _)| n == name) {
        return Some(v.clone());
    }
    let extended = format!("{name}*");
    if let Some((_, v)) = params.iter().find(|(n, _)| *n == extended) {
        return Some(rfc2231_value(v, true));
    }
    // Continuations: name*0, name*0*, name*1*, ... in order; only the encoded pieces
    // (a `*` after the number) hold escapes, and only the first a charset prefix.
    let mut out = String::new();
    for n in 0..MAX_PARTS {
        let plain = format!("{name}*{n}");
        let encoded = format!("{plain}*");
        match params.iter().find(|(p, _)| *p == plain || *p == encoded) {
            Some((p, v)) if p.ends_with('*') => out.push_str(&rfc2231_value(v, n == 0)),
            Some((_, v)) => out.push_str(v),
            None if n == 0 => return None,
            None => break,
        }
    }
    Some(out)
}

/// An RFC 2231 value: `charset'language'escaped`, the charset and language dropped (only
/// UTF-8 and ASCII names are read as text; other bytes become U+FFFD).
fn rfc2231_value(v: &str, first: bool) -> String {
    let rest = if first {
        v.splitn(3, '\'').nth(2).unwrap_or(v)
    } else {
        v
    };
    percent_decode(rest)
}

fn percent_decode(text: &str) -> String {
    let b = text.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A multipart body read at one level: the text before the first delimiter line (with the
/// line end that belongs to that delimiter), each part (a whole entity, without the line
/// end before the next delimiter) and what follows the closing delimiter line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Multipart<'a> {
    pub preamble: &'a [u8],
    pub parts: Vec<&'a [u8]>,
    pub epilogue: &'a [u8],
}

impl Multipart<'_> {
    /// The body again with only `parts` between the delimiters of `boundary` (CRLF line
    /// ends): the preamble and the epilogue kept as they were.
    pub fn rebuild(&self, boundary: &str, parts: &[&[u8]]) -> Vec<u8> {
        let size = parts
            .iter()
            .map(|p| p.len() + boundary.len() + 6)
            .sum::<usize>();
        let mut out = Vec::with_capacity(self.preamble.len() + size + self.epilogue.len() + 8);
        out.extend_from_slice(self.preamble);
        for part in parts {
            out.extend_from_slice(b"--");
            out.extend_from_slice(boundary.as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(part);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"--");
        out.extend_from_slice(boundary.as_bytes());
        out.extend_from_slice(b"--\r\n");
        out.extend_from_slice(self.epilogue);
        out
    }
}

/// The parts of a multipart body at this level (see [`Multipart`]).
pub fn multipart<'a>(body: &'a [u8], boundary: &str) -> Result<Multipart<'a>, MultipartError> {
    if boundary.is_empty() || boundary.len() > 70 {
        return Err(MultipartError::Boundary(boundary.to_owned()));
    }
    let delimiter = format!("--{boundary}");
    let d = delimiter.as_bytes();
    // The offsets of every line that is a delimiter (`--b` or `--b--`, blanks after it
    // allowed), with whether it closes.
    let mut marks: Vec<(usize, usize, bool)> = Vec::new();
    let mut start = 0;
    while start < body.len() {
        let end = body[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(body.len(), |p| start + p + 1);
        let line = &body[start..end];
        if let Some(rest) = line.strip_prefix(d) {
            let rest = rest.trim_ascii_end();
            if rest.is_empty() {
                marks.push((start, end, false));
                if marks.len() > MAX_PARTS + 1 {
                    return Err(MultipartError::TooManyParts);
                }
            } else if rest == b"--" {
                marks.push((start, end, true));
                break;
            }
        }
        start = end;
    }
    let Some(&(_, closing_end, true)) = marks.last() else {
        return Err(MultipartError::Unclosed(boundary.to_owned()));
    };
    let mut parts = Vec::with_capacity(marks.len() - 1);
    for pair in marks.windows(2) {
        let (from, to) = (pair[0].1, pair[1].0);
        parts.push(without_line_end(&body[from..to]));
    }
    Ok(Multipart {
        preamble: &body[..marks[0].0],
        parts,
        epilogue: &body[closing_end..],
    })
}

/// The parts of a multipart body (each a whole entity, without the CRLF that precedes the
/// next delimiter), read at this level only. The preamble and epilogue are dropped.
pub fn multipart_parts<'a>(
    body: &'a [u8],
    boundary: &str,
) -> Result<Vec<&'a [u8]>, MultipartError> {
    multipart(body, boundary).map(|m| m.parts)
}

/// The line end before a delimiter belongs to the delimiter (RFC 2046 §5.1.1).
fn without_line_end(part: &[u8]) -> &[u8] {
    part.strip_suffix(b"\r\n")
        .or_else(|| part.strip_suffix(b"\n"))
        .unwrap_or(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_keeps_preamble_and_epilogue_and_rebuilds_as_it_was() {
        let body = b"preamble\r\n--b\r\nA: 1\r\n\r\none\r\n--b\r\n\r\ntwo\r\n--b--\r\nepilogue\r\n";
        let m = multipart(body, "b").unwrap();
        assert_eq!(m.preamble, b"preamble\r\n");
        assert_eq!(m.parts, vec![&b"A: 1\r\n\r\none"[..], &b"\r\ntwo"[..]]);
        assert_eq!(m.epilogue, b"epilogue\r\n");
        assert_eq!(m.rebuild("b", &m.parts), body.to_vec());
        assert_eq!(
            m.rebuild("b", &m.parts[1..]),
            b"preamble\r\n--b\r\n\r\ntwo\r\n--b--\r\nepilogue\r\n".to_vec()
        );
    }

    #[test]
    fn multipart_refusals() {
        assert_eq!(
            multipart(b"--b\r\nx\r\n", "b"),
            Err(MultipartError::Unclosed("b".into()))
        );
        assert_eq!(
            multipart(b"", ""),
            Err(MultipartError::Boundary(String::new()))
        );
        let many: Vec<u8> = (0..=MAX_PARTS + 1)
            .flat_map(|_| b"--b\r\n\r\nx\r\n".iter().copied())
            .chain(b"--b--\r\n".iter().copied())
            .collect();
        assert_eq!(multipart(&many, "b"), Err(MultipartError::TooManyParts));
    }

    #[test]
    fn file_names_table() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "Content-Disposition: attachment; filename=\"report.PDF\"\r\n",
                Some("report.PDF"),
            ),
            (
                "Content-Type: application/octet-stream; name=run.exe\r\n",
                Some("run.exe"),
            ),
            (
                "Content-Type: application/octet-stream; name=a.txt\r\n\
                 Content-Disposition: attachment; filename=b.zip\r\n",
                Some("b.zip"),
            ),
            (
                "Content-Disposition: attachment; filename*=utf-8''na%C3%AFve%20plan.docx\r\n",
                Some("na\u{ef}ve plan.docx"),
            ),
            (
                "Content-Disposition: attachment;\r\n filename*0*=utf-8''long%20;\r\n filename*1=name.js\r\n",
                Some("long name.js"),
            ),
            ("Content-Type: text/plain\r\n", None),
            ("", None),
        ];
        for (headers, want) in cases {
            assert_eq!(
                file_name(headers.as_bytes()).as_deref(),
                *want,
                "{headers:?}"
            );
        }
    }

    #[test]
    fn content_type_main_type() {
        let ct = parse_content_type("Image/PNG; Name=\"a b.png\"").unwrap();
        assert_eq!(ct.mime, "image/png");
        assert_eq!(ct.main_type(), "image");
        assert_eq!(ct.param("name"), Some("a b.png"));
        assert_eq!(parse_content_type("text"), None);
    }
}
