//! Pure decisions of local delivery: where a recipient's Maildir is (the `MAILDIR`
//! template). Which recipients are local is `pepsi_common::local`'s to say. No I/O.

use std::path::{Path, PathBuf};

use pepsi_common::delivery::Failure;

/// One piece of a parsed `MAILDIR` template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// `%u`: the local part, lower-cased, without its `+tag` extension.
    User,
    /// `%d`: the domain, lower-cased.
    Domain,
    /// `%a`: `%u@%d`.
    Address,
}

/// A parsed `MAILDIR` template, e.g. `%u/Maildir` or `/srv/mail/%d/%u`. A relative result is
/// taken under the root directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses `%u`, `%d`, `%a` and `%%`; any other `%` sequence is refused, as is a template
    /// with no `%u`, `%d` or `%a` (every recipient would share one mailbox).
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                lit.push(c);
                continue;
            }
            let piece = match chars.next() {
                Some('%') => {
                    lit.push('%');
                    continue;
                }
                Some('u') => Piece::User,
                Some('d') => Piece::Domain,
                Some('a') => Piece::Address,
                Some(other) => {
                    return Err(format!(
                        "a template with %u, %d, %a or %% (unknown %{other})"
                    ));
                }
                None => return Err("a template with %u, %d, %a or %% (a lone % at the end)".into()),
            };
            if !lit.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut lit)));
            }
            pieces.push(piece);
        }
        if !lit.is_empty() {
            pieces.push(Piece::Text(lit));
        }
        if !pieces.iter().any(|p| !matches!(p, Piece::Text(_))) {
            return Err("a template naming the recipient with %u, %d or %a".into());
        }
        Ok(Template { pieces })
    }

    /// The Maildir of `address`; `delimiters` are the characters that start an address
    /// extension (`+` in `alice+lists@`), empty for none. A local part or domain that could
    /// leave its directory (`/`, a leading `.`, control characters, empty) is refused with a
    /// permanent 5.1.3.
    pub fn mailbox(
        &self,
        root: &Path,
        address: &str,
        delimiters: &str,
    ) -> Result<PathBuf, Box<Failure>> {
        let bad = |why: &str| {
            let mut f = Failure::new(
                format!("bad destination mailbox address {address:?}: {why}"),
                "5.1.3",
            );
            f.phase = Some("delivery".into());
            Box::new(f)
        };
        let Some((local, domain)) = address.rsplit_once('@') else {
            return Err(bad("no domain"));
        };
        let user = match local.find(|c| delimiters.contains(c)) {
            // A local part that *is* the delimiter followed by text keeps it all.
            Some(i) if i > 0 => &local[..i],
            _ => local,
        }
        .to_lowercase();
        let domain = domain.trim_end_matches('.').to_lowercase();
        for (what, v) in [("local part", &user), ("domain", &domain)] {
            if v.is_empty() {
                return Err(bad(&format!("empty {what}")));
            }
            if v.starts_with('.') {
                return Err(bad(&format!("{what} starts with a dot")));
            }
            if v.contains('/') || v.chars().any(char::is_control) {
                return Err(bad(&format!("{what} contains / or a control character")));
            }
        }
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::User => out.push_str(&user),
                Piece::Domain => out.push_str(&domain),
                Piece::Address => {
                    out.push_str(&user);
                    out.push('@');
                    out.push_str(&domain);
                }
            }
        }
        let path = PathBuf::from(out);
        Ok(if path.is_absolute() {
            path
        } else {
            root.join(path)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(template: &str, address: &str, want: Result<&str, &str>) {
        let t = Template::parse(template).unwrap();
        match (t.mailbox(Path::new("/srv/mail"), address, "+"), want) {
            (Ok(got), Ok(want)) => assert_eq!(got, Path::new(want), "{template} {address}"),
            (Err(f), Err(want)) => {
                assert_eq!(f.enhanced_status.as_deref(), Some("5.1.3"));
                assert!(
                    f.diagnostic.contains(want),
                    "{template} {address}: {}",
                    f.diagnostic
                );
            }
            (got, want) => panic!("{template} {address}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn mailbox_template_table() {
        let cases: &[(&str, &str, Result<&str, &str>)] = &[
            (
                "%u/Maildir",
                "alice@example.test",
                Ok("/srv/mail/alice/Maildir"),
            ),
            (
                "%u/Maildir",
                "Alice@Example.Test",
                Ok("/srv/mail/alice/Maildir"),
            ),
            (
                "%u/Maildir",
                "alice+lists@example.test",
                Ok("/srv/mail/alice/Maildir"),
            ),
            (
                "%u/Maildir",
                "+tag@example.test",
                Ok("/srv/mail/+tag/Maildir"),
            ),
            (
                "%d/%u",
                "bob@Example.Test.",
                Ok("/srv/mail/example.test/bob"),
            ),
            ("/home/%u/Maildir", "bob@x.test", Ok("/home/bob/Maildir")),
            ("%a", "Bob+x@X.test", Ok("/srv/mail/bob@x.test")),
            ("100%%/%u", "bob@x.test", Ok("/srv/mail/100%/bob")),
            (
                "%u/Maildir",
                "../etc@example.test",
                Err("starts with a dot"),
            ),
            ("%u/Maildir", "a/../../etc@example.test", Err("contains /")),
            ("%u/Maildir", "..@example.test", Err("starts with a dot")),
            (
                "%u/Maildir",
                ".hidden@example.test",
                Err("starts with a dot"),
            ),
            ("%u/Maildir", "a\nb@example.test", Err("control character")),
            ("%u/Maildir", "@example.test", Err("empty local part")),
            ("%d/%u", "bob@", Err("empty domain")),
            ("%u/Maildir", "nodomain", Err("no domain")),
        ];
        for (template, address, want) in cases {
            check(template, address, *want);
        }
    }

    #[test]
    fn templates_that_are_refused() {
        for (t, want) in [
            ("%x/Maildir", "unknown %x"),
            ("Maildir/%", "lone %"),
            ("/var/mail/shared", "naming the recipient"),
        ] {
            let err = Template::parse(t).unwrap_err();
            assert!(err.contains(want), "{t}: {err}");
        }
    }
}
