//! One-time codes, pure: making them, the form they are stored in, comparing a typed code
//! with the stored one in constant time, and what a try leaves. No I/O but the random
//! generator.
//!
//! A code is 8 decimal digits from the operating system's generator, mailed to the
//! recipient. The database keeps sha256 of the link id and the code only. Eight digits are
//! few enough to hash back from that digest, which is why only the portal's role may read
//! the table (docs/setup.md); what stops guessing is [`ATTEMPTS`] and the code's lifetime.
//! Session tokens, which a person never types, are 32 random bytes.

use sha2::{Digest as _, Sha256};

use crate::RandomUnavailable;

/// Digits in a code.
pub const DIGITS: usize = 8;
/// Tries a code allows; the last wrong one locks it.
pub const ATTEMPTS: i16 = 5;
/// How long a code is good for.
pub const LIFETIME: chrono::TimeDelta = chrono::TimeDelta::minutes(10);
/// The longest input accepted as a typed code (spaces and dashes allowed between digits).
pub const MAX_INPUT: usize = 32;

/// A fresh code, to be mailed and then forgotten. `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct Code(String);

impl std::fmt::Debug for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Code(..)")
    }
}

impl Code {
    /// The 8 digits, for the mail.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A new code: uniform over 00000000..=99999999 (rejection sampling, so no value is more
/// likely than another).
pub fn new_code() -> Result<Code, RandomUnavailable> {
    const SPAN: u32 = 100_000_000;
    // The largest multiple of SPAN that fits in a u32: values at or above it are redrawn.
    const LIMIT: u32 = (u32::MAX / SPAN) * SPAN;
    loop {
        let v = u32::from_be_bytes(crate::random::<4>()?);
        if v < LIMIT {
            return Ok(Code(format!("{:0width$}", v % SPAN, width = DIGITS)));
        }
    }
}

/// The digits of a typed code, without the spaces and dashes a person may add; `None` for
/// anything that is not 8 digits.
pub fn normalise(input: &str) -> Option<String> {
    if input.len() > MAX_INPUT {
        return None;
    }
    let digits: String = input
        .chars()
        .filter(|c| !matches!(c, ' ' | '-' | '\t'))
        .collect();
    (digits.len() == DIGITS && digits.bytes().all(|b| b.is_ascii_digit())).then_some(digits)
}

/// What the database stores for `code` of `link_id`: the link id is in it, so one digest
/// does not serve for every link.
pub fn code_hash(link_id: &str, code: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"pepsi secure-link code v1\0");
    h.update(link_id.as_bytes());
    h.update(b"\0");
    h.update(code.as_bytes());
    h.finalize().into()
}

/// True when `typed` is the code whose digest is `stored`; the digests are compared in
/// constant time.
pub fn matches(stored: &[u8], link_id: &str, typed: &str) -> bool {
    let Some(digits) = normalise(typed) else {
        return false;
    };
    aws_lc_rs::constant_time::verify_slices_are_equal(stored, &code_hash(link_id, &digits)).is_ok()
}

/// What one try at a code decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// The right code, with tries left: a session opens, the code is spent.
    Accepted,
    /// A wrong code; this many tries remain.
    Wrong { left: i16 },
    /// No tries were left, or this wrong one was the last: the code is dead, right or not.
    Locked,
}

/// The outcome of a try at a code with `attempts_left` tries left; the new count to store
/// is [`Attempt::left`].
pub fn attempt(attempts_left: i16, right: bool) -> Attempt {
    match (attempts_left, right) {
        (..=0, _) => Attempt::Locked,
        (_, true) => Attempt::Accepted,
        (1, false) => Attempt::Locked,
        (n, false) => Attempt::Wrong { left: n - 1 },
    }
}

impl Attempt {
    /// The tries left after this one.
    pub fn left(self, before: i16) -> i16 {
        match self {
            Attempt::Accepted => before,
            Attempt::Wrong { left } => left,
            Attempt::Locked => 0,
        }
    }
}

/// A session token: 32 random bytes as base64url, handed to the browser; the database keeps
/// [`token_hash`] of it.
pub fn new_token() -> Result<String, RandomUnavailable> {
    Ok(crate::b64(&crate::random::<32>()?))
}

/// What the database stores for a session token.
pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_eight_digits_and_differ() {
        let codes: Vec<Code> = (0..50).map(|_| new_code().unwrap()).collect();
        for c in &codes {
            assert_eq!(c.as_str().len(), DIGITS);
            assert!(
                c.as_str().bytes().all(|b| b.is_ascii_digit()),
                "{}",
                c.as_str()
            );
            assert_eq!(format!("{c:?}"), "Code(..)");
        }
        let distinct: std::collections::BTreeSet<&str> = codes.iter().map(Code::as_str).collect();
        // 50 draws from 10^8: a repeat would mean the generator is not random.
        assert_eq!(distinct.len(), codes.len());
    }

    #[test]
    fn typed_codes_are_normalised() {
        let cases: &[(&str, Option<&str>)] = &[
            ("12345678", Some("12345678")),
            ("1234 5678", Some("12345678")),
            ("1234-5678", Some("12345678")),
            (" 12 34 56 78 ", Some("12345678")),
            ("1234567", None),
            ("123456789", None),
            ("1234567a", None),
            ("１２３４５６７８", None),
            ("", None),
            (&"1 ".repeat(20), None),
        ];
        for (input, expected) in cases {
            assert_eq!(normalise(input).as_deref(), *expected, "{input:?}");
        }
    }

    #[test]
    fn a_code_matches_only_its_own_link() {
        let stored = code_hash("link-a", "01234567");
        assert!(matches(&stored, "link-a", "01234567"));
        assert!(matches(&stored, "link-a", "0123 4567"));
        assert!(!matches(&stored, "link-b", "01234567"));
        assert!(!matches(&stored, "link-a", "01234568"));
        assert!(!matches(&stored, "link-a", "1234567"));
        assert!(!matches(&stored[..31], "link-a", "01234567"));
        assert_ne!(
            code_hash("link-a", "01234567"),
            code_hash("link-b", "01234567")
        );
    }

    #[test]
    fn tries_count_down_and_the_fifth_wrong_one_locks() {
        let cases = [
            (5, true, Attempt::Accepted, 5),
            (5, false, Attempt::Wrong { left: 4 }, 4),
            (2, false, Attempt::Wrong { left: 1 }, 1),
            (1, false, Attempt::Locked, 0),
            (1, true, Attempt::Accepted, 1),
            (0, true, Attempt::Locked, 0),
            (0, false, Attempt::Locked, 0),
            (-1, true, Attempt::Locked, 0),
        ];
        for (before, right, expected, left) in cases {
            let got = attempt(before, right);
            assert_eq!(got, expected, "{before} left, right: {right}");
            assert_eq!(got.left(before), left, "{before} left, right: {right}");
        }
        let mut left = ATTEMPTS;
        for _ in 0..ATTEMPTS {
            left = attempt(left, false).left(left);
        }
        assert_eq!(attempt(left, true), Attempt::Locked);
    }

    #[test]
    fn tokens_are_random_and_stored_as_digests() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
        assert_ne!(token_hash(&a), token_hash(&b));
        assert_eq!(token_hash(&a), token_hash(&a.clone()));
    }
}
