//! The stable id of an archived post: the lower-case hex of the first 16 bytes of sha256 of
//! its normalised Message-ID. It names the post's page and is the key a reply's References
//! find it by, so it must never change for the same Message-ID. Pure.

use sha2::{Digest as _, Sha256};

/// The longest Message-ID kept (RFC 5322's line limit); a longer one is not an id.
pub const MAX_ID_LEN: usize = 998;

/// A Message-ID as the archive compares it: blanks and the angle brackets around it
/// removed, the part after the last `@` lower-cased (the left part is case-sensitive).
/// `None` for an empty id or one longer than [`MAX_ID_LEN`] bytes.
pub fn normalise(message_id: &str) -> Option<String> {
    let t = message_id.trim();
    let t = t.strip_prefix('<').unwrap_or(t);
    let t = t.strip_suffix('>').unwrap_or(t).trim();
    if t.is_empty() || t.len() > MAX_ID_LEN {
        return None;
    }
    // Not an address: a Message-ID's id-left@id-right, whose right part is a domain.
    Some(match t.rsplit_once('@') {
        Some((left, right)) => format!("{left}@{}", right.to_ascii_lowercase()),
        None => t.to_owned(),
    })
}

/// The url id of a Message-ID (see the module), or `None` when it is no id.
pub fn url_id(message_id: &str) -> Option<String> {
    normalise(message_id).map(|n| hex16(&Sha256::digest(n.as_bytes())))
}

/// Whether `text` has the shape of a url id (32 lower-case hex digits), so that a page
/// asked for anything else is refused before any query.
pub fn is_url_id(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The first 16 bytes of `bytes` in lower-case hex.
pub(crate) fn hex16(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .take(16)
        .fold(String::with_capacity(32), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalise_strips_brackets_and_lowers_the_domain_only() {
        let cases: &[(&str, Option<&str>)] = &[
            ("<abc@Example.ORG>", Some("abc@example.org")),
            ("  <AbC@EXAMPLE.org>  ", Some("AbC@example.org")),
            ("abc@example.org", Some("abc@example.org")),
            ("<a@b@Host.Test>", Some("a@b@host.test")),
            ("<no-at-sign>", Some("no-at-sign")),
            ("<>", None),
            ("", None),
            ("   ", None),
        ];
        for (given, want) in cases {
            assert_eq!(normalise(given).as_deref(), *want, "{given:?}");
        }
        let long = format!("<{}@x>", "a".repeat(MAX_ID_LEN));
        assert_eq!(normalise(&long), None);
        let edge = format!("{}@x", "a".repeat(MAX_ID_LEN - 2));
        assert_eq!(normalise(&edge).map(|n| n.len()), Some(MAX_ID_LEN));
    }

    #[test]
    fn the_url_id_is_stable_across_spellings_and_distinct_across_ids() {
        let a = url_id("<abc@Example.ORG>").unwrap();
        assert_eq!(a, url_id("abc@example.org").unwrap());
        assert_eq!(a, url_id(" <abc@EXAMPLE.org>").unwrap());
        assert_ne!(
            a,
            url_id("<ABC@example.org>").unwrap(),
            "the left part keeps its case"
        );
        assert_ne!(a, url_id("<abd@example.org>").unwrap());
        assert!(is_url_id(&a), "{a}");
        // sha256("abc@example.org"), first 16 bytes: fixed forever, pages link to it.
        assert_eq!(a, "1f9d985c0d8d9ef960eded8464879c86");
        assert_eq!(url_id("<>"), None);
    }

    #[test]
    fn url_id_shapes() {
        assert!(is_url_id("0123456789abcdef0123456789abcdef"));
        assert!(!is_url_id("0123456789ABCDEF0123456789abcdef"));
        assert!(!is_url_id("0123456789abcdef0123456789abcde"));
        assert!(!is_url_id("../../etc/passwd"));
        assert!(!is_url_id(""));
    }
}
