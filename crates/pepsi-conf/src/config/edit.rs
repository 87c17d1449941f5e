//! Changing options in a configuration file's text, keeping everything else — comments,
//! blank lines, order, the options around — as the operator wrote it. `pepsi-setup apply`
//! edits `/etc/pepsi/pepsi.conf` with it; the writing side of the format [`super::parse`]
//! reads, so a value written here reads back as the same value.
//!
//! Pure: text in, text out. It edits the one file it is given; an `@inline@` include or a
//! `secrets.d/` fragment that sets the same option later still wins, which the caller finds
//! out by loading the result.

use std::fmt;

/// One change to one option of one section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// `OPTION = value` in `[section]`: the last line that sets it is replaced and earlier
    /// ones removed; else a line is added at the end of the section's last block; else the
    /// section is added at the end of the file.
    Set {
        section: String,
        option: String,
        value: String,
    },
    /// No line of `[section]` sets `OPTION` any more.
    Unset { section: String, option: String },
}

impl Edit {
    pub fn set(section: &str, option: &str, value: impl Into<String>) -> Edit {
        Edit::Set {
            section: section.to_owned(),
            option: option.to_owned(),
            value: value.into(),
        }
    }

    pub fn unset(section: &str, option: &str) -> Edit {
        Edit::Unset {
            section: section.to_owned(),
            option: option.to_owned(),
        }
    }
}

impl fmt::Display for Edit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Edit::Set {
                section,
                option,
                value,
            } => write!(f, "[{section}] {option} = {}", value_text(value)),
            Edit::Unset { section, option } => write!(f, "[{section}] {option} removed"),
        }
    }
}

/// Why an edit cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("[{section}] {option}: a value cannot hold a line break or a control character")]
    ControlCharacter { section: String, option: String },
    #[error("{name:?} is not a section or option name (letters, digits, - _ . :)")]
    Name { name: String },
}

/// How `value` is written after `OPTION = ` so that reading it gives `value` back: every
/// `$` doubled (nothing is expanded), and in double quotes when it has spaces at either
/// end, starts with a quote or is empty.
pub fn value_text(value: &str) -> String {
    let escaped = value.replace('$', "$$");
    if escaped.is_empty() || escaped.starts_with('"') || escaped.trim() != escaped {
        format!("\"{escaped}\"")
    } else {
        escaped
    }
}

/// `text` with every edit made, in order.
pub fn apply(text: &str, edits: &[Edit]) -> Result<String, EditError> {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for edit in edits {
        apply_one(&mut lines, edit)?;
    }
    let mut out = lines.join("\n");
    out.push('\n');
    Ok(out)
}

fn check_name(name: &str) -> Result<(), EditError> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(EditError::Name {
            name: name.to_owned(),
        })
    }
}

/// The section a header line opens, or `None` for any other line.
fn header(line: &str) -> Option<&str> {
    let t = line.trim();
    t.strip_prefix('[')?.strip_suffix(']').map(str::trim)
}

/// The option an assignment line sets, or `None`.
fn assignment(line: &str) -> Option<&str> {
    let t = line.trim();
    if t.is_empty() || t.starts_with(['#', ';', '@', '[']) {
        return None;
    }
    t.split_once('=').map(|(o, _)| o.trim())
}

fn apply_one(lines: &mut Vec<String>, edit: &Edit) -> Result<(), EditError> {
    let (section, option) = match edit {
        Edit::Set {
            section, option, ..
        }
        | Edit::Unset { section, option } => (section.as_str(), option.as_str()),
    };
    check_name(section)?;
    check_name(option)?;
    // Each line's section, and the lines that set the option.
    let mut current: Option<String> = None;
    let mut setting = Vec::new();
    let mut last_in_section = None;
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = header(line) {
            current = Some(name.to_ascii_uppercase());
            if current.as_deref() == Some(&section.to_ascii_uppercase()) {
                last_in_section = Some(i);
            }
            continue;
        }
        if current.as_deref() != Some(&section.to_ascii_uppercase()) {
            continue;
        }
        if assignment(line).is_some() {
            last_in_section = Some(i);
        }
        if assignment(line).is_some_and(|o| o.eq_ignore_ascii_case(option)) {
            setting.push(i);
        }
    }
    match edit {
        Edit::Unset { .. } => {
            for i in setting.into_iter().rev() {
                lines.remove(i);
            }
        }
        Edit::Set { value, .. } => {
            if value.chars().any(char::is_control) {
                return Err(EditError::ControlCharacter {
                    section: section.to_owned(),
                    option: option.to_owned(),
                });
            }
            let line = format!("{option} = {}", value_text(value));
            if let Some((&last, earlier)) = setting.split_last() {
                lines[last] = line;
                for &i in earlier.iter().rev() {
                    lines.remove(i);
                }
            } else if let Some(after) = last_in_section {
                lines.insert(after + 1, line);
            } else {
                while lines.last().is_some_and(|l| l.trim().is_empty()) {
                    lines.pop();
                }
                if !lines.is_empty() {
                    lines.push(String::new());
                }
                lines.push(format!("[{section}]"));
                lines.push(line);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn check(text: &str, edits: &[Edit], expected: &str) {
        assert_eq!(apply(text, edits).unwrap(), expected);
    }

    #[test]
    fn edits() {
        let file = "# top\n[pepsi]\nHOSTNAME = old.example\n# keep\nLOCAL_DOMAINS = a.example\n\n[stage-relay]\nPROGRAM = x\n";
        check(
            file,
            &[Edit::set("pepsi", "HOSTNAME", "mx.example.org")],
            "# top\n[pepsi]\nHOSTNAME = mx.example.org\n# keep\nLOCAL_DOMAINS = a.example\n\n[stage-relay]\nPROGRAM = x\n",
        );
        // A new option goes after the section's last option, case-insensitive names.
        check(
            file,
            &[Edit::set("PEPSI", "MAIL_LOG", "yes")],
            "# top\n[pepsi]\nHOSTNAME = old.example\n# keep\nLOCAL_DOMAINS = a.example\nMAIL_LOG = yes\n\n[stage-relay]\nPROGRAM = x\n",
        );
        // A new section at the end.
        check(
            file,
            &[Edit::set("pepsi-ingress", "TLS_CERT", "/etc/c.pem")],
            "# top\n[pepsi]\nHOSTNAME = old.example\n# keep\nLOCAL_DOMAINS = a.example\n\n[stage-relay]\nPROGRAM = x\n\n[pepsi-ingress]\nTLS_CERT = /etc/c.pem\n",
        );
        // Unset removes every line; set of a repeated option keeps the last place.
        check(
            "[a]\nX = 1\n[b]\nX = 9\n[a]\nx = 2\nY = 3\n",
            &[Edit::set("a", "X", "5")],
            "[a]\n[b]\nX = 9\n[a]\nX = 5\nY = 3\n",
        );
        check(
            "[a]\nX = 1\nY = 2\n[a]\nX = 3\n",
            &[Edit::unset("a", "x")],
            "[a]\nY = 2\n[a]\n",
        );
        check("[a]\nY = 2\n", &[Edit::unset("a", "X")], "[a]\nY = 2\n");
        // An empty section gets its first option right after the header.
        check(
            "[a]\n\n[b]\n",
            &[Edit::set("a", "X", "1")],
            "[a]\nX = 1\n\n[b]\n",
        );
        check("", &[Edit::set("a", "X", "1")], "[a]\nX = 1\n");
    }

    #[test]
    fn refusals() {
        assert!(matches!(
            apply("", &[Edit::set("a", "X", "1\n[b]")]),
            Err(EditError::ControlCharacter { .. })
        ));
        assert!(matches!(
            apply("", &[Edit::set("a]\n[b", "X", "1")]),
            Err(EditError::Name { .. })
        ));
        assert!(matches!(
            apply("", &[Edit::set("a", "X = 1", "1")]),
            Err(EditError::Name { .. })
        ));
    }

    /// Whatever is written reads back as itself: `$` is not expanded, spaces at the ends
    /// and quotes survive.
    #[test]
    fn values_read_back_unchanged() {
        for value in [
            "plain",
            "$HOME",
            "a$$b",
            " padded ",
            "\"quoted\"",
            "",
            "p@ss w#rd;",
        ] {
            let text = apply("[PATHS]\nHOME = /h\n", &[Edit::set("s", "V", value)]).unwrap();
            let cfg = Config::from_str_named(&text, "edited").unwrap();
            assert_eq!(cfg.section("s").string("V").unwrap(), value, "{text}");
        }
    }
}
