//! What `pepsi-helper-mailbox-scan` prints and `pepsi-whitelist` reads, both ends: one line
//! per finding on the helper's standard output, each ending with LF.
//!
//! ```text
//! sent bob@example.org          the owner sent mail to this address (a To, Cc or Bcc of a
//!                               message in a sent folder)
//! replied carol@example.net     the owner answered mail from this address (the From of a
//!                               message flagged replied, R)
//! done 1234 2                   the last line: messages read, messages skipped (unreadable,
//!                               or past the scan's limit)
//! ```
//!
//! Addresses are lower case, each printed once per kind. The helper runs as the mailbox's
//! owner, so its reader trusts nothing it says: every line is parsed here, with the length
//! and address checks below, and a stream without its `done` line is a failed scan.

/// The longest line either end accepts (an address is at most 254 bytes).
pub const MAX_LINE: usize = 300;

/// One line of the scan's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The owner wrote to this address.
    Sent(String),
    /// The owner answered a message from this address.
    Replied(String),
    /// The scan is over: `messages` read, `skipped` not read.
    Done { messages: u64, skipped: u64 },
}

impl Finding {
    /// The line, with its LF.
    pub fn line(&self) -> String {
        match self {
            Finding::Sent(a) => format!("sent {a}\n"),
            Finding::Replied(a) => format!("replied {a}\n"),
            Finding::Done { messages, skipped } => format!("done {messages} {skipped}\n"),
        }
    }

    /// Parses one line (its LF removed or not); the error names what is wrong.
    pub fn parse(line: &str) -> Result<Finding, String> {
        if line.len() > MAX_LINE {
            return Err(format!(
                "a line of {} bytes (at most {MAX_LINE})",
                line.len()
            ));
        }
        let line = line.strip_suffix('\n').unwrap_or(line);
        let (verb, rest) = line.split_once(' ').unwrap_or((line, ""));
        match verb {
            "sent" => address(rest).map(Finding::Sent),
            "replied" => address(rest).map(Finding::Replied),
            "done" => {
                let mut n = rest.split(' ').map(str::parse::<u64>);
                match (n.next(), n.next(), n.next()) {
                    (Some(Ok(messages)), Some(Ok(skipped)), None) => {
                        Ok(Finding::Done { messages, skipped })
                    }
                    _ => Err(format!("`done` wants two counts, not {rest:?}")),
                }
            }
            other => Err(format!("unknown line {other:?}")),
        }
    }
}

/// An address as the protocol carries it: lower case, `local@domain`, at most 254 bytes,
/// no space or control character, one `@` with something on each side.
pub fn address(text: &str) -> Result<String, String> {
    let valid = text.len() <= 254
        && !text.chars().any(|c| c.is_whitespace() || c.is_control())
        && text == text.to_lowercase()
        && pepsi_conf::address::parts(text)
            .is_some_and(|(l, d)| !l.is_empty() && !d.is_empty() && !l.contains('@'));
    if valid {
        Ok(text.to_owned())
    } else {
        Err(format!("not an address in lower case: {text:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_both_ways() {
        for f in [
            Finding::Sent("bob@example.org".into()),
            Finding::Replied("carol@example.net".into()),
            Finding::Done {
                messages: 12,
                skipped: 0,
            },
        ] {
            assert_eq!(Finding::parse(&f.line()), Ok(f));
        }
    }

    #[test]
    fn lines_refused() {
        for (line, why) in [
            ("sent Bob@example.org", "lower case"),
            ("sent bob", "not an address"),
            ("sent @example.org", "not an address"),
            ("sent bob@", "not an address"),
            ("sent bob@a@b", "not an address"),
            ("sent bob @example.org", "not an address"),
            ("replied ", "not an address"),
            ("done 1", "two counts"),
            ("done 1 2 3", "two counts"),
            ("done x 2", "two counts"),
            ("owner bob@example.org", "unknown line"),
        ] {
            let e = Finding::parse(line).unwrap_err();
            assert!(e.contains(why), "{line}: {e}");
        }
        let long = format!("sent {}@example.org", "a".repeat(300));
        assert!(Finding::parse(&long).unwrap_err().contains("at most"));
    }
}
