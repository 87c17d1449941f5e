//! The alias file: the classic `name: target, target, ...` format, parsed into a table.
//! Pure apart from reading the file. Read by the aliases stage (`ALIAS_FILE`) to expand
//! recipients, and by the ingress to know them (`CHECK_RECIPIENTS`).

use std::collections::HashMap;
use std::path::Path;

/// The entries of an alias file, keys lower-case.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AliasFile {
    /// `alice@example.test` → targets.
    pub addresses: HashMap<String, Vec<String>>,
    /// `postmaster` (a bare local part, for every local domain) → targets.
    pub names: HashMap<String, Vec<String>>,
    /// `example.test` (written `@example.test`) → catch-all targets.
    pub catchalls: HashMap<String, Vec<String>>,
}

impl AliasFile {
    /// Reads and parses `path`; errors name the file and line.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read alias file {}: {e}", path.display()))?;
        Self::parse(&text)
            .map_err(|(line, msg)| anyhow::anyhow!("{}:{line}: {msg}", path.display()))
    }

    /// Parses the text of an alias file. Lines starting with `#` are comments; a line
    /// starting with a space or tab continues the previous entry. On error: the line
    /// number (1-based) and what was wrong.
    pub fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut file = AliasFile::default();
        // Logical entries: (first line number, text with continuations joined).
        let mut entries: Vec<(usize, String)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            if line.starts_with([' ', '\t']) {
                match entries.last_mut() {
                    Some((_, entry)) => {
                        entry.push_str(", ");
                        entry.push_str(trimmed);
                    }
                    None => return Err((n, "a continuation line before the first entry".into())),
                }
            } else {
                entries.push((n, trimmed.to_owned()));
            }
        }
        for (n, entry) in entries {
            let Some((name, targets)) = entry.split_once(':') else {
                return Err((n, format!("expected `name: target, ...`, found {entry:?}")));
            };
            let name = name.trim().to_lowercase();
            if name.is_empty() || name.contains(char::is_whitespace) {
                return Err((n, format!("{name:?} is not an alias name or address")));
            }
            let targets = crate::settings::parse_address_list(targets).map_err(|m| (n, m))?;
            if targets.is_empty() {
                return Err((n, format!("alias {name:?} has no targets")));
            }
            let table = if let Some(domain) = name.strip_prefix('@') {
                let domain = pepsi_conf::address::normalize_domain(domain)
                    .ok_or_else(|| (n, format!("{name:?} names no domain")))?;
                file.catchalls.entry(domain)
            } else if name.contains('@') {
                file.addresses
                    .entry(pepsi_conf::address::address_key(&name))
            } else {
                file.names.entry(name)
            };
            // A name given twice: the targets add up, as in sendmail's newaliases.
            table.or_default().extend(targets);
        }
        Ok(file)
    }

    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty() && self.names.is_empty() && self.catchalls.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_classic_format() {
        let f = AliasFile::parse(
            "# comment\n\
             postmaster: root\n\
             Sales@Example.test: alice@example.test,\n\
             \tbob@example.org\n\
             @example.test: postmaster@example.test\n\
             team: a, b\n\
             team: c\n",
        )
        .unwrap();
        assert_eq!(f.names["postmaster"], ["root"]);
        assert_eq!(
            f.addresses["sales@example.test"],
            ["alice@example.test", "bob@example.org"]
        );
        assert_eq!(f.catchalls["example.test"], ["postmaster@example.test"]);
        assert_eq!(f.names["team"], ["a", "b", "c"]);
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("a b\n", 1, "expected"),
            ("x: y\n  \nlog: |/usr/bin/logger\n", 3, "not supported"),
            ("  cont\n", 1, "continuation"),
            ("x:\n", 1, "no targets"),
            ("@: a\n", 1, "no domain"),
        ];
        for (text, line, needle) in cases {
            let (n, msg) = AliasFile::parse(text).unwrap_err();
            assert_eq!(n, line, "{text:?}");
            assert!(msg.contains(needle), "{text:?}: {msg}");
        }
    }
}
