//! A mail address as Pepsi handles it: where it splits into local part and domain, and the
//! one normalisation every module compares addresses in.
//!
//! The rules, in one place:
//! - an address splits at its **last** `@` (a quoted local part may hold one:
//!   `"a@b"@example.org`);
//! - the local part keeps its case for delivery and compares without it;
//! - the domain is compared in its ASCII form: lower-case, IDN labels as punycode, no
//!   trailing dot; an address literal (`[192.0.2.1]`) is lower-cased and kept as written.
//!
//! `Address::parse` applies all of them; `parts` is the split rule alone, for text that is
//! already in stored form or is compared as written (a database key, a counter's name).
//!
//! This module is the bottom of the crate: it depends on no other module of it, so
//! `local`, `settings` and every stage can use it without an import circle. It never does
//! I/O.

use std::fmt;
use std::str::FromStr;

/// An address split at its last `@`: the local part as written (case kept) and the
/// normalized domain.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address {
    local: String,
    domain: String,
}

/// Why text is not an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("{0:?} is not an address: no @")]
    NoAt(String),
    #[error("{0:?} is not an address: empty local part")]
    EmptyLocalPart(String),
    #[error("{0:?} is not an address: the domain is not a domain name")]
    BadDomain(String),
}

impl Address {
    /// The address in `text` (white space around it ignored): local part before the last
    /// `@`, not empty; the domain after it, normalized (`normalize_domain`).
    pub fn parse(text: &str) -> Result<Self, AddressError> {
        let t = text.trim();
        let (local, domain) = parts(t).ok_or_else(|| AddressError::NoAt(t.to_owned()))?;
        if local.is_empty() {
            return Err(AddressError::EmptyLocalPart(t.to_owned()));
        }
        let domain =
            normalize_domain(domain).ok_or_else(|| AddressError::BadDomain(t.to_owned()))?;
        Ok(Self {
            local: local.to_owned(),
            domain,
        })
    }

    /// The local part, case as written.
    pub fn local(&self) -> &str {
        &self.local
    }

    /// The domain, normalized.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The local part and the domain, owned.
    pub fn into_parts(self) -> (String, String) {
        (self.local, self.domain)
    }

    /// The form addresses are compared and stored in: local part lower-case, `@`, domain.
    pub fn key(&self) -> String {
        format!("{}@{}", self.local.to_lowercase(), self.domain)
    }

    /// The settings layer's key for the whole domain: `@domain`.
    pub fn domain_key(&self) -> String {
        format!("@{}", self.domain)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.local, self.domain)
    }
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The split rule alone: `text` at its last `@` into what is before and after it, neither
/// trimmed nor checked nor normalized; `None` without an `@`.
pub fn parts(text: &str) -> Option<(&str, &str)> {
    text.rsplit_once('@')
}

/// The local part of `text` as written: before its last `@`, or all of it without one.
pub fn local_part(text: &str) -> &str {
    parts(text).map_or(text, |(local, _)| local)
}

/// The domain of `text` as written: after its last `@`; `None` without one.
pub fn domain_part(text: &str) -> Option<&str> {
    parts(text).map(|(_, domain)| domain)
}

/// A domain in the form domains are compared in: ASCII lower-case, IDN labels as punycode,
/// without a trailing dot. An address literal (`[192.0.2.1]`) is kept as written. `None`
/// for text that is not a domain name.
pub fn normalize_domain(domain: &str) -> Option<String> {
    let d = domain.trim().trim_end_matches('.');
    if d.is_empty() {
        return None;
    }
    if d.starts_with('[') && d.ends_with(']') {
        return Some(d.to_ascii_lowercase());
    }
    if d.is_ascii() {
        return Some(d.to_ascii_lowercase());
    }
    idna::domain_to_ascii(d).ok().filter(|a| !a.is_empty())
}

/// The form addresses are compared in (`Address::key`); text that is not an address is
/// lower-cased as a whole.
pub fn address_key(text: &str) -> String {
    match Address::parse(text) {
        Ok(a) => a.key(),
        Err(_) => text.trim().to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_normalize() {
        let cases = [
            ("Example.ORG", Some("example.org")),
            ("example.org.", Some("example.org")),
            (" example.org ", Some("example.org")),
            ("bücher.example", Some("xn--bcher-kva.example")),
            ("[192.0.2.1]", Some("[192.0.2.1]")),
            ("[IPv6:2001:DB8::1]", Some("[ipv6:2001:db8::1]")),
            ("", None),
            (".", None),
        ];
        for (input, expected) in cases {
            assert_eq!(normalize_domain(input).as_deref(), expected, "{input:?}");
        }
    }

    /// What `Address::parse` gives: the local part and the domain, or the error.
    type Parsed<'a> = Result<(&'a str, &'a str), AddressError>;

    #[test]
    fn addresses_parse() {
        let cases: [(&str, Parsed); 9] = [
            ("Alice@Example.ORG", Ok(("Alice", "example.org"))),
            (" bob@example.org. ", Ok(("bob", "example.org"))),
            ("\"a@b\"@example.org", Ok(("\"a@b\"", "example.org"))),
            (
                "a+tag@bücher.example",
                Ok(("a+tag", "xn--bcher-kva.example")),
            ),
            ("x@[192.0.2.1]", Ok(("x", "[192.0.2.1]"))),
            ("postmaster", Err(AddressError::NoAt("postmaster".into()))),
            (
                "@example.org",
                Err(AddressError::EmptyLocalPart("@example.org".into())),
            ),
            ("alice@", Err(AddressError::BadDomain("alice@".into()))),
            ("alice@.", Err(AddressError::BadDomain("alice@.".into()))),
        ];
        for (input, expected) in cases {
            let got = Address::parse(input);
            let got = got.as_ref().map(|a| (a.local(), a.domain()));
            assert_eq!(got, expected.as_ref().map(|&(l, d)| (l, d)), "{input:?}");
        }
    }

    #[test]
    fn keys_and_display() {
        let cases = [
            (
                "Alice@Example.ORG",
                "Alice@example.org",
                "alice@example.org",
                "@example.org",
            ),
            ("ÉVE@X.test", "ÉVE@x.test", "éve@x.test", "@x.test"),
        ];
        for (input, shown, key, domain_key) in cases {
            let a: Address = input.parse().unwrap();
            assert_eq!(a.to_string(), shown, "{input:?}");
            assert_eq!(a.key(), key, "{input:?}");
            assert_eq!(a.domain_key(), domain_key, "{input:?}");
        }
        let cases = [
            ("Alice@Example.ORG", "alice@example.org"),
            (" Postmaster ", "postmaster"),
            ("@Example.org", "@example.org"),
        ];
        for (input, expected) in cases {
            assert_eq!(address_key(input), expected, "{input:?}");
        }
    }

    #[test]
    fn errors_name_the_text_and_the_fault() {
        let cases = [
            ("postmaster", "\"postmaster\" is not an address: no @"),
            ("@x.test", "\"@x.test\" is not an address: empty local part"),
            (
                "a@",
                "\"a@\" is not an address: the domain is not a domain name",
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(Address::parse(input).unwrap_err().to_string(), expected);
        }
    }

    #[test]
    fn parts_split_at_the_last_at_as_written() {
        let cases = [
            ("Alice@Example.ORG", Some(("Alice", "Example.ORG")), "Alice"),
            ("\"a@b\"@x", Some(("\"a@b\"", "x")), "\"a@b\""),
            ("@x", Some(("", "x")), ""),
            ("a@", Some(("a", "")), "a"),
            ("postmaster", None, "postmaster"),
        ];
        for (input, split, local) in cases {
            assert_eq!(parts(input), split, "{input:?}");
            assert_eq!(local_part(input), local, "{input:?}");
            assert_eq!(domain_part(input), split.map(|(_, d)| d), "{input:?}");
        }
    }
}
