//! The MIME framing both standards share: which header fields travel inside the protected
//! entity (the `Content-*` fields) and which stay outside, the multipart bodies of RFC 1847
//! (`multipart/signed`, `multipart/encrypted`), and reading them back.
//!
//! Pure and bounded: a multipart is read at one level only, and a message is never
//! re-encoded except where a standard says so (line ends are CRLF throughout, as stored).

use mail_builder::headers::content_type::ContentType as BuiltType;
use mail_builder::mime::{BodyPart, MimePart};
use pepsi_contract::message;

use crate::{CryptoError, Protected, Result};

pub use pepsi_contract::mime::{MAX_PARTS, is_content_field, split_content};

/// The MIME entity a message's content is: its content fields, an empty line, the body.
/// A message without a `Content-Type` gets the RFC 2045 default spelled out, so the
/// entity reads the same once it is inside another.
pub fn inner_entity(headers: &[u8], body: &[u8]) -> Vec<u8> {
    let (_, mut content) = split_content(headers);
    if !message::has_field(&content, "Content-Type") {
        let mut with_type = b"Content-Type: text/plain; charset=us-ascii\r\n".to_vec();
        with_type.extend_from_slice(&content);
        content = with_type;
    }
    let mut entity = Vec::with_capacity(content.len() + 2 + body.len());
    entity.extend_from_slice(&content);
    entity.extend_from_slice(b"\r\n");
    entity.extend_from_slice(body);
    entity
}

/// The outer header block of a protected message: the original's outer fields, then
/// `MIME-Version: 1.0` and the given content fields (each `Name: value`, without CRLF).
pub fn outer_headers(headers: &[u8], content_fields: &[String]) -> Vec<u8> {
    let (mut outer, _) = split_content(headers);
    outer.extend_from_slice(b"MIME-Version: 1.0\r\n");
    for f in content_fields {
        outer.extend_from_slice(f.as_bytes());
        outer.extend_from_slice(b"\r\n");
    }
    outer
}

/// The header block after unwrapping: the outer fields (without the protected message's
/// content fields) and the inner entity's content fields, under `MIME-Version: 1.0`.
pub fn restore_headers(outer: &[u8], inner_entity_headers: &[u8]) -> Vec<u8> {
    let (mut headers, _) = split_content(outer);
    let (_, content) = split_content(inner_entity_headers);
    headers.extend_from_slice(b"MIME-Version: 1.0\r\n");
    headers.extend_from_slice(&content);
    headers
}

/// A fresh multipart boundary: 24 random letters and digits after a fixed prefix, which
/// cannot occur in base64 or armored content by chance.
pub fn boundary() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 24];
    openssl::rand::rand_bytes(&mut bytes).expect("the system's random source");
    let tail: String = bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    format!("=_pepsi_{tail}")
}

/// A protected message of RFC 1847, written by mail-builder: the outer header block (the
/// original's outer fields, `MIME-Version`, and `Content-Type: multipart/<subtype>` with
/// `params` and a fresh [`boundary`]) and the body (`preamble`, one line for readers without
/// MIME, then each part between delimiters and the closing one).
///
/// Each part is a whole entity (its fields, an empty line, its body) kept byte for byte.
/// Its last line end, when it has one, becomes the CRLF the next delimiter begins with
/// (RFC 2046 §5.1.1): a part whose own last line end is part of what it carries (a signed
/// entity) comes with one more.
pub fn protected_multipart(
    headers: &[u8],
    subtype: &str,
    params: &[(&str, &str)],
    preamble: &str,
    parts: &[&[u8]],
) -> Protected {
    let mut content_type = BuiltType::new(format!("multipart/{subtype}"));
    for (name, value) in params {
        content_type = content_type.attribute(*name, *value);
    }
    let content_type = content_type.attribute("boundary", boundary());
    let parts = parts
        .iter()
        .map(|p| {
            MimePart::raw(BodyPart::Binary(
                p.strip_suffix(b"\r\n").unwrap_or(p).into(),
            ))
        })
        .collect::<Vec<_>>();
    let mut entity = Vec::new();
    MimePart::new(content_type, parts).write_part(&mut entity);
    // mail-builder writes the multipart's Content-Type, an empty line, then a CRLF before
    // the first delimiter: that CRLF ends the preamble instead.
    let (field, delimited) = message::split(&entity);
    let field = String::from_utf8_lossy(field);
    let mut body = Vec::with_capacity(preamble.len() + delimited.len());
    body.extend_from_slice(preamble.as_bytes());
    body.extend_from_slice(delimited.strip_prefix(b"\r\n").unwrap_or(delimited));
    Protected {
        headers: outer_headers(headers, &[field.trim_end_matches("\r\n").to_owned()]),
        body,
    }
}

pub use pepsi_contract::mime::{ContentType, content_type, parse_content_type};

/// The parts of a multipart body at this level (`pepsi_contract::mime::multipart_parts`),
/// a malformed one refused as this crate's error.
pub fn multipart_parts<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<&'a [u8]>> {
    pepsi_contract::mime::multipart_parts(body, boundary).map_err(|e| CryptoError::Malformed {
        what: "multipart",
        why: e.to_string(),
    })
}

/// The two parts of an RFC 1847 multipart (`multipart/signed`, `multipart/encrypted`), by
/// the `boundary` of `ct`: the first part as it is, and the second's body decoded.
/// `what` names the form in errors.
pub fn two_parts<'a>(
    ct: &ContentType,
    body: &'a [u8],
    what: &'static str,
) -> Result<(&'a [u8], Vec<u8>)> {
    let malformed = |why: String| CryptoError::Malformed { what, why };
    let boundary = ct
        .param("boundary")
        .ok_or_else(|| malformed("no boundary parameter".into()))?;
    let parts = multipart_parts(body, boundary)?;
    if parts.len() != 2 {
        return Err(malformed(format!(
            "{} parts where RFC 1847 has 2",
            parts.len()
        )));
    }
    let (headers, second) = message::split(parts[1]);
    let decoded = decode_body(headers, second)?;
    Ok((parts[0], decoded))
}

/// A body under its `Content-Transfer-Encoding`, decoded: base64 and quoted-printable are
/// undone, 7bit, 8bit and binary (or none) returned as they are.
pub fn decode_body(headers: &[u8], body: &[u8]) -> Result<Vec<u8>> {
    let encoding = message::field_values(headers, "Content-Transfer-Encoding")
        .into_iter()
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match encoding.as_str() {
        "base64" => {
            let text: String = body
                .iter()
                .filter(|b| !b.is_ascii_whitespace())
                .map(|&b| b as char)
                .collect();
            pepsi_smtp::encoding::base64_decode(&text).ok_or_else(|| CryptoError::Malformed {
                what: "base64 content",
                why: "does not decode".into(),
            })
        }
        "quoted-printable" => Ok(decode_quoted_printable(body)),
        _ => Ok(body.to_vec()),
    }
}

fn decode_quoted_printable(body: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'=' if body[i + 1..].starts_with(b"\r\n") => i += 3,
            b'=' if body[i + 1..].starts_with(b"\n") => i += 2,
            b'=' if i + 2 < body.len() => match (hex(body[i + 1]), hex(body[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                }
                _ => {
                    out.push(b'=');
                    i += 1;
                }
            },
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Converts bare LF line ends to CRLF (content a library handed back with Unix line ends);
/// CRLF stays as it is.
pub fn to_crlf(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + data.len() / 32);
    let mut prev = 0u8;
    for &b in data {
        if b == b'\n' && prev != b'\r' {
            out.push(b'\r');
        }
        out.push(b);
        prev = b;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_fields_go_inside_and_the_rest_stays_out() {
        let h = b"From: a@x.test\r\nContent-Type: text/plain;\r\n charset=utf-8\r\nMIME-Version: 1.0\r\n\
                  Subject: s\r\nContent-Transfer-Encoding: 8bit\r\n";
        let (outer, content) = split_content(h);
        assert_eq!(outer, b"From: a@x.test\r\nSubject: s\r\n");
        // A field name that is not ASCII is an outer field, not a panic.
        let odd = "Conten\u{e9}t-X: 1\r\nContent\u{e9}: 2\r\n".as_bytes();
        assert_eq!(split_content(odd).0, odd);
        assert_eq!(
            content,
            b"Content-Type: text/plain;\r\n charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n"
        );
        assert_eq!(
            inner_entity(b"From: a@x.test\r\n", b"hi\r\n"),
            b"Content-Type: text/plain; charset=us-ascii\r\n\r\nhi\r\n"
        );
        let outer = outer_headers(h, &["Content-Type: multipart/encrypted".into()]);
        assert_eq!(
            outer,
            b"From: a@x.test\r\nSubject: s\r\nMIME-Version: 1.0\r\nContent-Type: multipart/encrypted\r\n"
        );
        assert_eq!(
            restore_headers(&outer, b"Content-Type: text/html\r\n"),
            b"From: a@x.test\r\nSubject: s\r\nMIME-Version: 1.0\r\nContent-Type: text/html\r\n"
        );
    }

    #[test]
    fn content_types_parse() {
        let check = |v: &str, mime: &str, params: &[(&str, &str)]| {
            let ct = parse_content_type(v).unwrap_or_else(|| panic!("{v:?} does not parse"));
            assert_eq!(ct.mime, mime, "{v}");
            let want: Vec<(String, String)> = params
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            assert_eq!(ct.params, want, "{v}");
        };
        check("text/plain", "text/plain", &[]);
        check(
            "Multipart/Encrypted; protocol=\"application/pgp-encrypted\"; boundary=\"a;b\"",
            "multipart/encrypted",
            &[
                ("protocol", "application/pgp-encrypted"),
                ("boundary", "a;b"),
            ],
        );
        check(
            "application/pkcs7-mime; smime-type=enveloped-data; name=smime.p7m",
            "application/pkcs7-mime",
            &[("smime-type", "enveloped-data"), ("name", "smime.p7m")],
        );
        check("x/y; q=\"a \\\"b\\\"\"", "x/y", &[("q", "a \"b\"")]);
        assert_eq!(parse_content_type("text"), None);
        assert_eq!(parse_content_type(""), None);
    }

    #[test]
    fn multiparts_round_trip_and_bad_ones_are_refused() {
        assert!(boundary().len() < 70);
        let p = protected_multipart(
            b"From: a@example.test\r\nContent-Type: text/plain\r\n",
            "mixed",
            &[("protocol", "x/y")],
            "For MIME readers.\r\n",
            &[b"A: 1\r\n\r\none", b"\r\ntwo\r\n"],
        );
        let outer = content_type(&p.headers).unwrap();
        assert_eq!(outer.mime, "multipart/mixed");
        assert_eq!(outer.param("protocol"), Some("x/y"));
        assert!(message::has_field(&p.headers, "From"));
        assert_eq!(message::field_values(&p.headers, "Content-Type").len(), 1);
        let b = outer.param("boundary").unwrap();
        assert!(
            p.body
                .starts_with(format!("For MIME readers.\r\n--{b}\r\n").as_bytes())
        );
        let parts = multipart_parts(&p.body, b).unwrap();
        assert_eq!(parts, [&b"A: 1\r\n\r\none"[..], &b"\r\ntwo"[..]]);
        let with_preamble = "pre\r\n--x\r\n\r\np1\r\n--x \r\n\r\np2\r\n--x--\r\nepilogue";
        assert_eq!(
            multipart_parts(with_preamble.as_bytes(), "x").unwrap(),
            [&b"\r\np1"[..], &b"\r\np2"[..]]
        );
        let open = b"--x\r\n\r\np1\r\n";
        assert!(matches!(
            multipart_parts(open, "x"),
            Err(CryptoError::Malformed { .. })
        ));
        assert!(multipart_parts(b"--\r\n", "").is_err());
    }

    #[test]
    fn transfer_encodings_decode() {
        let h = b"Content-Transfer-Encoding: BASE64\r\n";
        assert_eq!(decode_body(h, b"aGVs\r\nbG8=\r\n").unwrap(), b"hello");
        let q = b"Content-Transfer-Encoding: quoted-printable\r\n";
        assert_eq!(decode_body(q, b"a=3Db=\r\nc\r\n").unwrap(), b"a=bc\r\n");
        assert_eq!(decode_body(b"", b"as is").unwrap(), b"as is");
        assert!(decode_body(h, b"!!!").is_err());
        assert_eq!(to_crlf(b"a\nb\r\nc\n"), b"a\r\nb\r\nc\r\n");
    }
}
