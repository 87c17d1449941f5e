//! What a `.forward` file says: pure, no I/O.
//!
//! The grammar is the one users know from sendmail and Postfix's local(8): entries separated
//! by commas or line breaks, a line starting with `#` a comment, an entry in double quotes
//! taken as written. An address entry (`bob@example.org`, `<bob@example.org>`, or a bare
//! `bob`, which means `bob@` the recipient's domain) is a forwarding target; `\alice` keeps a
//! copy for that address without forwarding it again. Program (`|command`), file (`/path`)
//! and `:include:` entries are not carried out: Pepsi runs no user's commands and writes no
//! user's files from the queue (docs/dot-forward.md says why); they are listed as ignored,
//! with the reason, and so is anything that is not an address.

use pepsi_conf::address::{Address, address_key};

/// The longest address accepted (RFC 5321's path limit less the brackets).
pub const MAX_ADDRESS: usize = 254;

/// A parsed `.forward`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forward {
    /// Where copies go, in file order, each once.
    pub targets: Vec<String>,
    /// `\name` entries: copies kept here, not forwarded again; each once.
    pub keep: Vec<String>,
    /// Entries not carried out, with why.
    pub ignored: Vec<(String, String)>,
}

/// Parses `bytes` for `recipient` (whose domain completes bare names), taking at most
/// `max_addresses` targets and kept copies together.
pub fn parse(bytes: &[u8], recipient: &str, max_addresses: usize) -> Forward {
    let domain = Address::parse(recipient)
        .map(|a| a.domain().to_owned())
        .unwrap_or_default();
    let mut out = Forward::default();
    let mut seen: Vec<String> = Vec::new();
    for raw_line in bytes.split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(raw_line) else {
            out.ignored.push((
                String::from_utf8_lossy(raw_line).trim().to_owned(),
                "not UTF-8".into(),
            ));
            continue;
        };
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        for entry in entries(line) {
            let (kind, address) = match classify(&entry, &domain) {
                Ok(found) => found,
                Err(why) => {
                    out.ignored.push((entry, why));
                    continue;
                }
            };
            let key = address_key(&address);
            if seen.contains(&key) {
                continue;
            }
            if seen.len() >= max_addresses {
                out.ignored.push((
                    entry,
                    format!("more than MAX_ADDRESSES ({max_addresses}) addresses"),
                ));
                continue;
            }
            seen.push(key);
            match kind {
                Kind::Target => out.targets.push(address),
                Kind::Keep => out.keep.push(address),
            }
        }
    }
    out
}

enum Kind {
    Target,
    Keep,
}

/// The line's entries: split at commas outside double quotes, trimmed, empty ones dropped;
/// a quoted entry keeps its quotes (so `classify` can tell `"|cmd"` from a bare word).
fn entries(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => {
                out.push(std::mem::take(&mut cur));
            }
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect()
}

/// What one entry asks for, or why it is ignored.
fn classify(entry: &str, domain: &str) -> Result<(Kind, String), String> {
    let unquoted = entry
        .strip_prefix('"')
        .and_then(|e| e.strip_suffix('"'))
        .unwrap_or(entry)
        .trim();
    if unquoted.starts_with('|') {
        return Err("program delivery (|command) is not supported".into());
    }
    if unquoted.starts_with('/') {
        return Err("file delivery (/path) is not supported".into());
    }
    if unquoted
        .get(..9)
        .is_some_and(|p| p.eq_ignore_ascii_case(":include:"))
    {
        return Err(":include: is not supported".into());
    }
    let (kind, rest) = match unquoted.strip_prefix('\\') {
        Some(rest) => (Kind::Keep, rest),
        None => (Kind::Target, unquoted),
    };
    let rest = rest
        .strip_prefix('<')
        .and_then(|r| r.strip_suffix('>'))
        .unwrap_or(rest)
        .trim();
    let address = if rest.contains('@') || domain.is_empty() {
        rest.to_owned()
    } else {
        format!("{rest}@{domain}")
    };
    check_address(&address)?;
    Ok((kind, address))
}

/// An envelope address as the queue carries it: `local@domain`, no space, control
/// character, bracket, quote, comma or second `@`, at most `MAX_ADDRESS` bytes.
fn check_address(address: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("not an address ({why})"));
    if address.len() > MAX_ADDRESS {
        return bad(&format!("longer than {MAX_ADDRESS} bytes"));
    }
    if address
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || "<>\"(),;:[]\\".contains(c))
    {
        return bad("a space or one of <>\"(),;:[]\\");
    }
    if address.matches('@').count() != 1 {
        return bad("not one @");
    }
    match Address::parse(address) {
        Ok(_) => Ok(()),
        Err(_) => bad("no local part or domain"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(file: &str, targets: &[&str], keep: &[&str], ignored: &[&str]) {
        let f = parse(file.as_bytes(), "alice@example.test", 5);
        assert_eq!(f.targets, targets, "targets of {file:?}");
        assert_eq!(f.keep, keep, "kept copies of {file:?}");
        let why: Vec<&str> = f.ignored.iter().map(|(e, _)| e.as_str()).collect();
        assert_eq!(why, ignored, "ignored entries of {file:?}");
    }

    #[test]
    fn entries_table() {
        check("bob@example.org\n", &["bob@example.org"], &[], &[]);
        check("bob@example.org", &["bob@example.org"], &[], &[]);
        check("<bob@example.org>\r\n", &["bob@example.org"], &[], &[]);
        check("bob\n", &["bob@example.test"], &[], &[]);
        check(
            "# a comment\n\n  bob@example.org , carol@example.net\n",
            &["bob@example.org", "carol@example.net"],
            &[],
            &[],
        );
        check(
            "\\alice, bob@example.org\n",
            &["bob@example.org"],
            &["alice@example.test"],
            &[],
        );
        check(
            "\"\\alice\", \"bob@example.org\"",
            &["bob@example.org"],
            &["alice@example.test"],
            &[],
        );
        check(
            "\"|/usr/bin/procmail\"\n/home/alice/mbox\n:include:/etc/list\nbob@example.org",
            &["bob@example.org"],
            &[],
            &[
                "\"|/usr/bin/procmail\"",
                "/home/alice/mbox",
                ":include:/etc/list",
            ],
        );
        check(
            "\"|cmd, with a comma\", bob@example.org",
            &["bob@example.org"],
            &[],
            &["\"|cmd, with a comma\""],
        );
        check(
            "bob@example.org\nBOB@Example.org\nbob@example.org",
            &["bob@example.org"],
            &[],
            &[],
        );
        check(
            "a b@example.org\nx@@y\n@example.org\nfoo@\n",
            &[],
            &[],
            &["a b@example.org", "x@@y", "@example.org", "foo@"],
        );
        // MAX_ADDRESSES is 5 here: the sixth is ignored, a repeat is not counted.
        check(
            "a1@x.org,a2@x.org,a2@x.org,a3@x.org,a4@x.org,\\alice,a6@x.org",
            &["a1@x.org", "a2@x.org", "a3@x.org", "a4@x.org"],
            &["alice@example.test"],
            &["a6@x.org"],
        );
    }

    #[test]
    fn non_utf8_and_oversized_entries_are_ignored() {
        let f = parse(
            b"\xff\xfe@example.org\nbob@example.org\n",
            "alice@example.test",
            5,
        );
        assert_eq!(f.targets, ["bob@example.org"]);
        assert_eq!(f.ignored.len(), 1);
        assert_eq!(f.ignored[0].1, "not UTF-8");
        let long = format!("{}@example.org", "x".repeat(MAX_ADDRESS));
        let f = parse(long.as_bytes(), "alice@example.test", 5);
        assert!(f.targets.is_empty());
        assert!(f.ignored[0].1.contains("longer than"), "{:?}", f.ignored);
    }
}
