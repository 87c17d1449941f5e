//! Reverse and forward paths (`<local@domain>`) as RFC 5321 §4.1.2 and RFC 6531 define
//! them. Pure: no I/O.

/// A parsed path. `address` is None for the null reverse path `<>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    pub address: Option<String>,
}

impl Path {
    /// The path of `address`; the empty string is the null path `<>`.
    pub fn new(address: &str) -> Path {
        Path {
            address: (!address.is_empty()).then(|| address.to_owned()),
        }
    }

    /// The domain part, lower-cased; None for `<>` and `<postmaster>`.
    pub fn domain(&self) -> Option<String> {
        let address = self.address.as_deref()?;
        address
            .rsplit_once('@')
            .map(|(_, d)| d.to_ascii_lowercase())
    }

    /// True when the address needs SMTPUTF8 (RFC 6531).
    pub fn is_utf8(&self) -> bool {
        self.address.as_deref().is_some_and(|a| !a.is_ascii())
    }
}

/// `<local@domain>`, or `<>` for the null path: the form a command line carries.
impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{}>", self.address.as_deref().unwrap_or(""))
    }
}

const MAX_LOCAL: usize = 64;
const MAX_DOMAIN: usize = 255;
const MAX_PATH: usize = 256;

/// Parses `<…>` at the start of `args` and returns the path and the rest of the line (the
/// ESMTP parameters). `<>` is accepted only when `allow_null`.
pub fn parse_path(args: &str, allow_null: bool) -> Result<(Path, &str), String> {
    if !args.starts_with('<') {
        return Err(format!(
            "the address must be in angle brackets, got {args:?}"
        ));
    }
    let close = find_close(args).ok_or_else(|| format!("no closing '>' in {args:?}"))?;
    let inner = &args[1..close];
    let rest = &args[close + 1..];
    if !rest.is_empty() && !rest.starts_with(' ') {
        return Err(format!("unexpected text after the address: {rest:?}"));
    }
    if inner.len() > MAX_PATH {
        return Err(format!("path longer than {MAX_PATH} octets"));
    }
    // A source route (`@a,@b:`) is obsolete; RFC 5321 says to accept and ignore it.
    let mailbox = if inner.starts_with('@') {
        match inner.find(':') {
            Some(colon) => &inner[colon + 1..],
            None => return Err(format!("malformed source route in <{inner}>")),
        }
    } else {
        inner
    };
    if mailbox.is_empty() {
        return if allow_null {
            Ok((Path { address: None }, rest))
        } else {
            Err("the null path <> is not a recipient".into())
        };
    }
    if !allow_null && mailbox.eq_ignore_ascii_case("postmaster") {
        return Ok((
            Path {
                address: Some("postmaster".into()),
            },
            rest,
        ));
    }
    check_mailbox(mailbox)?;
    Ok((
        Path {
            address: Some(mailbox.to_owned()),
        },
        rest,
    ))
}

/// Index of the `>` closing the path, skipping quoted strings.
fn find_close(args: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in args.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '>' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

fn check_mailbox(mailbox: &str) -> Result<(), String> {
    let at = mailbox
        .rfind('@')
        .ok_or_else(|| format!("{mailbox:?} has no domain"))?;
    let (local, domain) = (&mailbox[..at], &mailbox[at + 1..]);
    if local.is_empty() || local.len() > MAX_LOCAL {
        return Err(format!(
            "local part of {mailbox:?} must be 1 to {MAX_LOCAL} octets"
        ));
    }
    if local.starts_with('"') {
        if !(local.len() >= 2 && local.ends_with('"')) {
            return Err(format!("unterminated quoted local part in {mailbox:?}"));
        }
        if local.chars().any(|c| c.is_control()) {
            return Err(format!(
                "control character in the local part of {mailbox:?}"
            ));
        }
    } else {
        let atext = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~".contains(c);
        let ok = local
            .split('.')
            .all(|atom| !atom.is_empty() && atom.chars().all(|c| atext(c) || !c.is_ascii()));
        if !ok {
            return Err(format!("invalid local part in {mailbox:?}"));
        }
    }
    check_domain(domain).map_err(|e| format!("{e} in {mailbox:?}"))
}

/// A domain name or an address literal, as allowed after `@` or in HELO.
pub fn check_domain(domain: &str) -> Result<(), String> {
    if domain.is_empty() || domain.len() > MAX_DOMAIN {
        return Err(format!("domain must be 1 to {MAX_DOMAIN} octets"));
    }
    if let Some(literal) = domain.strip_prefix('[') {
        let literal = literal
            .strip_suffix(']')
            .ok_or_else(|| "unterminated address literal".to_owned())?;
        let valid = match literal.strip_prefix("IPv6:") {
            Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => literal.parse::<std::net::Ipv4Addr>().is_ok(),
        };
        return if valid {
            Ok(())
        } else {
            Err(format!("invalid address literal [{literal}]"))
        };
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || !c.is_ascii())
    };
    if domain.trim_end_matches('.').split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!("invalid domain {domain:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &str, null_ok: bool, expected: Result<(Option<&str>, &str), ()>) {
        let got = parse_path(args, null_ok)
            .map(|(p, rest)| (p.address, rest.to_owned()))
            .map_err(|_| ());
        let expected = expected.map(|(a, r)| (a.map(str::to_owned), r.to_owned()));
        assert_eq!(got, expected, "{args:?}");
    }

    #[test]
    fn path_table() {
        check("<a@example.org>", true, Ok((Some("a@example.org"), "")));
        check(
            "<a@example.org> SIZE=1",
            true,
            Ok((Some("a@example.org"), " SIZE=1")),
        );
        check("<>", true, Ok((None, "")));
        check("<>", false, Err(()));
        check(
            "<@relay.example:a@example.org>",
            true,
            Ok((Some("a@example.org"), "")),
        );
        check(
            "<\"john doe\"@example.org>",
            true,
            Ok((Some("\"john doe\"@example.org"), "")),
        );
        check(
            "<\"a>b\"@example.org>",
            true,
            Ok((Some("\"a>b\"@example.org"), "")),
        );
        check("<Postmaster>", false, Ok((Some("postmaster"), "")));
        check("<postmaster>", true, Err(()));
        check("<a@[192.0.2.1]>", true, Ok((Some("a@[192.0.2.1]"), "")));
        check(
            "<a@[IPv6:2001:db8::1]>",
            true,
            Ok((Some("a@[IPv6:2001:db8::1]"), "")),
        );
        check("<a@[300.1.1.1]>", true, Err(()));
        check(
            "<δοκιμή@παράδειγμα.δοκιμή>",
            true,
            Ok((Some("δοκιμή@παράδειγμα.δοκιμή"), "")),
        );
        check("a@example.org", true, Err(()));
        check("<a@example.org", true, Err(()));
        check("<a@example.org>x", true, Err(()));
        check("<a..b@example.org>", true, Err(()));
        check("<.a@example.org>", true, Err(()));
        check("<a b@example.org>", true, Err(()));
        check("<a@-bad.example>", true, Err(()));
        check("<a@exa_mple.org>", true, Err(()));
        check("<a@>", true, Err(()));
        check("<@example.org>", true, Err(()));
        check(&format!("<{}@example.org>", "x".repeat(65)), true, Err(()));
    }

    #[test]
    fn domain_and_utf8() {
        let (p, _) = parse_path("<a@Example.ORG>", true).unwrap();
        assert_eq!(p.domain().as_deref(), Some("example.org"));
        assert!(!p.is_utf8());
        let (p, _) = parse_path("<ü@example.org>", true).unwrap();
        assert!(p.is_utf8());
    }
}
