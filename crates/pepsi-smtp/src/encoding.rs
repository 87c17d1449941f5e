//! The small wire encodings both directions of SMTP use, defined once: base64 (RFC 4648,
//! SASL and MIME), xtext (RFC 3461, ENVID and ORCPT) and the shape of an enhanced status
//! code (RFC 3463). Pure.

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, on one line.
pub fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64 (RFC 4648 §4) with padding, as SASL uses it; None when malformed.
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (n, quad) in bytes.chunks(4).enumerate() {
        let last = n + 1 == bytes.len() / 4;
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut v = 0u32;
        for &c in &quad[..4 - pad] {
            v = (v << 6) | sextet(c)?;
        }
        v <<= 6 * pad as u32;
        let three = [(v >> 16) as u8, (v >> 8) as u8, v as u8];
        out.extend_from_slice(&three[..3 - pad]);
    }
    Some(out)
}

/// RFC 3461 xtext: `+`, `=`, controls, space and non-ASCII bytes become `+XX`.
pub fn xtext_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if (33..=126).contains(&b) && b != b'+' && b != b'=' {
            out.push(b as char);
        } else {
            out.push_str(&format!("+{b:02X}"));
        }
    }
    out
}

/// Decodes RFC 3461 xtext (`+XX` hex escapes); None when malformed, or when an escape
/// stands for a control character (a CR or LF would later end a command line we write).
/// Non-ASCII is allowed because RFC 6533 extends these values to UTF-8.
pub fn xtext_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                let hex = s.get(i + 1..i + 3)?;
                if !hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
                {
                    return None;
                }
                let byte = u8::from_str_radix(hex, 16).ok()?;
                if byte < 0x20 || byte == 0x7f {
                    return None;
                }
                out.push(byte);
                i += 3;
            }
            b'=' => return None,
            b if b < 0x21 || b == 0x7f => return None,
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The class (2, 4 or 5) of an RFC 3463 enhanced status code `class.subject.detail`,
/// subject and detail of one to three digits each; None for anything else.
pub fn enhanced_status_class(s: &str) -> Option<u8> {
    let mut parts = s.split('.');
    let (class, subject, detail) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let num = |p: &str| (1..=3).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
    let class = match class {
        "2" => 2,
        "4" => 4,
        "5" => 5,
        _ => return None,
    };
    (num(subject) && num(detail)).then_some(class)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_table() {
        let cases: [(&[u8], &str); 5] = [
            (b"", ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (
                b"\0alice@example.test\0pw",
                "AGFsaWNlQGV4YW1wbGUudGVzdABwdw==",
            ),
        ];
        for (raw, encoded) in cases {
            assert_eq!(base64_encode(raw), encoded);
            assert_eq!(base64_decode(encoded).as_deref(), Some(raw));
        }
        for bad in ["Zg=", "Z===", "Zg==Zg==", "Zm9v!", "Zm 9"] {
            assert_eq!(base64_decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn xtext_table() {
        assert_eq!(xtext_encode("a+b=c d"), "a+2Bb+3Dc+20d");
        assert_eq!(xtext_decode("a+2Bb+3Dc").as_deref(), Some("a+b=c"));
        for bad in ["a+2b", "a+2", "a b", "a=b", "a+0Ab", "a+0Db", "a+00b"] {
            assert_eq!(xtext_decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn enhanced_status_table() {
        let cases = [
            ("5.1.1", Some(5)),
            ("4.7.0", Some(4)),
            ("2.0.0", Some(2)),
            ("5.100.999", Some(5)),
            ("3.0.0", None),
            ("5.1", None),
            ("5.1.1.1", None),
            ("5.1000.1", None),
            ("5..1", None),
            ("5.a.1", None),
            ("55.1.1", None),
        ];
        for (s, want) in cases {
            assert_eq!(enhanced_status_class(s), want, "{s}");
        }
    }
}
