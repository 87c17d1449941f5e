//! The header/body split every stored message obeys: raw = headers || CRLF || body, where
//! `headers` is the header block including each field's CRLF and `body` follows the first
//! empty line.
//!
//! Pure functions, no I/O.

/// Splits a raw message at its first empty line. A message without an empty line is all
/// headers with an empty body; `join` then restores it with the empty line added.
pub fn split(raw: &[u8]) -> (&[u8], &[u8]) {
    if raw.starts_with(b"\r\n") {
        return (&raw[..0], &raw[2..]);
    }
    match raw.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => (&raw[..at + 2], &raw[at + 4..]),
        None => (raw, &raw[raw.len()..]),
    }
}

/// Reassembles a raw message: headers || CRLF || body.
pub fn join(headers: &[u8], body: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(headers.len() + 2 + body.len());
    raw.extend_from_slice(headers);
    raw.extend_from_slice(b"\r\n");
    raw.extend_from_slice(body);
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: &str, headers: &str, body: &str) {
        let (h, b) = split(raw.as_bytes());
        assert_eq!(
            (h, b),
            (headers.as_bytes(), body.as_bytes()),
            "split of {raw:?}"
        );
        if raw.contains("\r\n\r\n") || raw.starts_with("\r\n") {
            assert_eq!(join(h, b), raw.as_bytes(), "join must restore {raw:?}");
        }
    }

    #[test]
    fn split_table() {
        check(
            "A: 1\r\nB: 2\r\n\r\nbody\r\n",
            "A: 1\r\nB: 2\r\n",
            "body\r\n",
        );
        check("A: 1\r\n\r\n", "A: 1\r\n", "");
        check(
            "A: 1\r\n\r\n\r\nsecond blank stays in body",
            "A: 1\r\n",
            "\r\nsecond blank stays in body",
        );
        check("\r\nno headers", "", "no headers");
        check("A: 1\r\n", "A: 1\r\n", "");
        check("", "", "");
    }
}
