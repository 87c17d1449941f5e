//! What a whitelist entry is, and what a message is checked against: the rules the
//! whitelist stage and the owners' tool (`pepsi-whitelist`) share, so the tool links no
//! stage crate. Pure.

use pepsi_conf::address;

/// What a message is checked against: its `From:` address and that address's domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The address, lower case.
    pub address: String,
    /// `@domain`.
    pub domain: String,
}

impl Check {
    /// The `sender` values of `pepsi.whitelist` that match.
    pub fn keys(&self) -> Vec<String> {
        vec![self.address.clone(), self.domain.clone()]
    }
}

/// The check for a message whose first `From:` address is `from`; `None` when it has none
/// usable (no `From:`, or no `@domain` in it).
pub fn check(from: Option<&str>) -> Option<Check> {
    let address = from?.trim().to_ascii_lowercase();
    let (local, domain) = address::parts(&address)?;
    if local.is_empty() || domain.is_empty() || address.chars().any(char::is_whitespace) {
        return None;
    }
    Some(Check {
        domain: format!("@{domain}"),
        address,
    })
}

/// The longest entry accepted (the longest address, RFC 5321 4.5.3.1.3).
pub const MAX_ENTRY: usize = 254;

/// A list entry as an owner writes it: an address (`bob@example.org`) or a whole domain
/// (`@example.org`), in the lower case it is stored in. The error says what is wrong.
pub fn entry(text: &str) -> Result<String, String> {
    let t = text.trim().to_lowercase();
    let shape = "an address (bob@example.org) or a domain (@example.org)";
    if t.len() > MAX_ENTRY {
        return Err(format!("{text:?}: longer than {MAX_ENTRY} bytes"));
    }
    if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{text:?}: a space or control character; give {shape}"
        ));
    }
    match address::parts(&t) {
        Some((local, domain)) if !domain.is_empty() && !local.contains('@') => Ok(t),
        _ => Err(format!("{text:?}: not {shape}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries() {
        for (text, expected) in [
            ("Bob@Example.ORG", Ok("bob@example.org")),
            (" @Example.org ", Ok("@example.org")),
            ("@localhost", Ok("@localhost")),
            ("bob", Err("not an address")),
            ("bob@", Err("not an address")),
            ("@", Err("not an address")),
            ("a@b@c", Err("not an address")),
            ("b ob@example.org", Err("a space")),
            ("bob@exa\u{7}mple.org", Err("control")),
        ] {
            match (entry(text), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text}"),
                (Err(e), Err(why)) => assert!(e.contains(why), "{text}: {e}"),
                (got, want) => panic!("{text}: {got:?}, wanted {want:?}"),
            }
        }
        let long = format!("{}@example.org", "a".repeat(250));
        assert!(entry(&long).unwrap_err().contains("longer than 254"));
    }

    #[test]
    fn checks() {
        for (from, expected) in [
            (
                Some("Bob@Example.ORG"),
                Some(("bob@example.org", "@example.org")),
            ),
            (
                Some(" bob@example.org "),
                Some(("bob@example.org", "@example.org")),
            ),
            (Some("bob"), None),
            (Some("@example.org"), None),
            (Some("bob@"), None),
            (Some("b ob@example.org"), None),
            (None, None),
        ] {
            let got = check(from);
            assert_eq!(
                got.as_ref()
                    .map(|c| (c.address.as_str(), c.domain.as_str())),
                expected,
                "{from:?}"
            );
        }
        assert_eq!(
            check(Some("bob@example.org")).unwrap().keys(),
            ["bob@example.org", "@example.org"]
        );
    }
}
