//! The secrets pepsi-httpd hands out and how it recognises them, pure: session cookies, the
//! CSRF token derived from a session, API tokens and generated passwords.
//!
//! Every secret is 32 random bytes from the operating system, written as 64 hex digits. The
//! database keeps only its SHA-256 (`digest`), so a backup holds no usable credential. The
//! CSRF token is derived from the session secret (SHA-256 over a fixed label and the
//! secret), so it needs no storage, and a page that does not know the cookie cannot compute
//! it. Nothing here logs a secret.

use sha2::{Digest as _, Sha256};

/// The session cookie's name.
pub const COOKIE: &str = "pepsi_session";
/// The header a cookie-authenticated mutating request carries the CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How an API token starts: `pepsi_<token id>_<secret>`.
pub const TOKEN_PREFIX: &str = "pepsi_";

/// 32 bytes from the operating system's generator.
pub fn random_bytes() -> [u8; 32] {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf).expect("the operating system's random generator failed");
    buf
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh secret: 64 lower-case hex digits.
pub fn new_secret() -> String {
    hex(&random_bytes())
}

/// What the database stores for `secret`.
pub fn digest(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// True for 64 lower-case hex digits: the shape of every secret handed out. Anything else
/// is refused before the database is asked.
pub fn is_secret(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The CSRF token of the session whose cookie secret is `secret`.
pub fn csrf_token(secret: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"pepsi-httpd csrf\0");
    h.update(secret.as_bytes());
    hex(&h.finalize())
}

/// Compares without an early exit, so the time taken does not tell how much matched.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The session secret in a `Cookie` header value, if it carries a well-formed one.
pub fn session_from_cookie_header(header: &str) -> Option<&str> {
    header
        .split(';')
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.trim())
        .filter(|v| is_secret(v))
}

/// A new API token: its public id (16 hex digits), its secret half, and the text handed to
/// the operator once.
pub fn new_token() -> (String, String, String) {
    let id = hex(&random_bytes()[..8]);
    let secret = new_secret();
    let text = format!("{TOKEN_PREFIX}{id}_{secret}");
    (id, secret, text)
}

/// Splits `pepsi_<id>_<secret>` into its id and secret; `None` for any other shape.
pub fn parse_token(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let id_ok = id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (id_ok && is_secret(secret)).then_some((id, secret))
}

/// A generated password: 24 characters of letters and digits (about 142 bits).
pub fn new_password() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    let mut out = String::with_capacity(24);
    while out.len() < 24 {
        for b in random_bytes() {
            // Rejection sampling keeps every character equally likely.
            let limit = 256 - 256 % ALPHABET.len();
            if (b as usize) < limit && out.len() < 24 {
                out.push(ALPHABET[b as usize % ALPHABET.len()] as char);
            }
        }
    }
    out
}

/// An administrator name: 1 to 64 of lower-case letters, digits, `.`, `_`, `-`, starting
/// with a letter or digit (the CHECK of `pepsi.admin_account.name`).
pub fn valid_admin_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_lowercase() | b[0].is_ascii_digit()
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_tokens_and_cookies_have_one_shape() {
        let s = new_secret();
        assert!(is_secret(&s));
        assert_ne!(s, new_secret());
        assert_eq!(digest(&s).len(), 32);
        assert_ne!(digest(&s), s.as_bytes(), "the digest is not the secret");
        let (id, secret, text) = new_token();
        assert_eq!(parse_token(&text), Some((id.as_str(), secret.as_str())));
        let bad_tokens = [
            "pepsi_0123_abc".to_owned(),
            format!("other_{id}_{secret}"),
            format!("pepsi_{id}_{}", &secret[1..]),
            format!("pepsi_{}_{secret}", id.to_uppercase()),
            format!("pepsi_{id}{secret}"),
        ];
        for t in &bad_tokens {
            assert_eq!(parse_token(t), None, "{t}");
        }
        let cookie = format!("a=b; {COOKIE}={s}; c=d");
        assert_eq!(session_from_cookie_header(&cookie), Some(s.as_str()));
        for h in [
            "a=b".to_owned(),
            format!("{COOKIE}=short"),
            format!("{COOKIE}={}", s.to_uppercase()),
        ] {
            assert_eq!(session_from_cookie_header(&h), None, "{h}");
        }
    }

    #[test]
    fn the_csrf_token_belongs_to_its_session() {
        let (a, b) = (new_secret(), new_secret());
        assert_eq!(csrf_token(&a), csrf_token(&a));
        assert_ne!(csrf_token(&a), csrf_token(&b));
        assert_ne!(csrf_token(&a), a);
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }

    #[test]
    fn passwords_and_names() {
        let p = new_password();
        assert_eq!(p.len(), 24);
        assert!(p.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(p, new_password());
        let cases = [
            ("root", true),
            ("ops.team-1_x", true),
            ("9lives", true),
            ("", false),
            ("Root", false),
            ("-x", false),
            ("a b", false),
            (&"a".repeat(65), false),
        ];
        for (name, want) in cases {
            assert_eq!(valid_admin_name(name), want, "{name}");
        }
    }
}
