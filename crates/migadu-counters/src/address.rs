//! Where an address splits: at its last `@`. The one place the counting service splits
//! addresses; `validate` normalizes them. The service links no Pepsi crate (it runs apart
//! from the mail server), so it keeps this rule of its own rather than
//! `pepsi_conf::address`.

/// `text` at its last `@` into what is before and after it, as written; `None` without an
/// `@`.
pub fn parts(text: &str) -> Option<(&str, &str)> {
    text.rsplit_once('@')
}

/// The local part of `text`: before its last `@`, or all of it without one.
pub fn local_part(text: &str) -> &str {
    parts(text).map_or(text, |(local, _)| local)
}

/// The domain of `text`: after its last `@`, or empty without one.
pub fn domain_part(text: &str) -> &str {
    parts(text).map_or("", |(_, domain)| domain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_the_last_at() {
        let cases = [
            (
                "alice@example.com",
                Some(("alice", "example.com")),
                "alice",
                "example.com",
            ),
            ("a@b@c.test", Some(("a@b", "c.test")), "a@b", "c.test"),
            ("@c.test", Some(("", "c.test")), "", "c.test"),
            ("nobody", None, "nobody", ""),
        ];
        for (input, split, local, domain) in cases {
            assert_eq!(parts(input), split, "{input:?}");
            assert_eq!(local_part(input), local, "{input:?}");
            assert_eq!(domain_part(input), domain, "{input:?}");
        }
    }
}
