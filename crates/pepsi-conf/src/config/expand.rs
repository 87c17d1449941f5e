//! `$VAR`, `${VAR}` and `${VAR:-default}` expansion against `[PATHS]` and the environment.
//!
//! Pure apart from the environment lookup, which the caller passes in so tests need not touch
//! the process environment. A value that came from the database overlay is expanded in
//! restricted mode: it may name only `[PATHS]` entries written outside `secrets.d/`, never the
//! environment, so whoever can write the table cannot copy a secret into, say, a URL.

use super::SectionData;
use super::error::ExpandProblem;

/// Longest chain of `[PATHS]` entries referring to one another; far beyond any real file.
pub(super) const MAX_DEPTH: usize = 32;

/// Who wrote the text being expanded, which decides what it may refer to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trust {
    /// Written by the operator in a file: `[PATHS]`, secrets and the environment.
    File,
    /// Read from the database overlay: non-secret `[PATHS]` entries only.
    Override,
}

pub(super) struct Expander<'a> {
    pub(super) paths: Option<&'a SectionData>,
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
}

impl Expander<'_> {
    pub(super) fn expand(&self, text: &str, trust: Trust) -> Result<String, ExpandProblem> {
        self.expand_in(text, trust, &mut Vec::new())
    }

    /// `stack` holds the `[PATHS]` keys being expanded, outermost first, to name a loop.
    fn expand_in(
        &self,
        text: &str,
        trust: Trust,
        stack: &mut Vec<(String, String)>,
    ) -> Result<String, ExpandProblem> {
        let bytes = text.as_bytes();
        let mut out = String::with_capacity(text.len());
        let mut i = 0;
        while let Some(offset) = text[i..].find('$') {
            let dollar = i + offset;
            out.push_str(&text[i..dollar]);
            match bytes.get(dollar + 1) {
                Some(b'$') => {
                    out.push('$');
                    i = dollar + 2;
                }
                Some(b'{') => {
                    let close =
                        matching_brace(text, dollar + 2).ok_or(ExpandProblem::Malformed {
                            text: text.to_owned(),
                            reason: "unterminated ${",
                        })?;
                    let inner = &text[dollar + 2..close];
                    let (name, default) = match inner.find(":-") {
                        Some(pos) => (&inner[..pos], Some(&inner[pos + 2..])),
                        None => (inner, None),
                    };
                    if !is_variable_name(name) {
                        return Err(ExpandProblem::Malformed {
                            text: text.to_owned(),
                            reason: if name.contains(':') {
                                "unsupported operator (only ${VAR:-default} is understood)"
                            } else {
                                "invalid variable name after ${"
                            },
                        });
                    }
                    let found = self.lookup(name, trust, stack)?;
                    match (found, default) {
                        (Some(value), Some(_)) if !value.is_empty() => out.push_str(&value),
                        (_, Some(default)) => out.push_str(&self.expand_in(default, trust, stack)?),
                        (Some(value), None) => out.push_str(&value),
                        (None, None) => return Err(unset(name, trust)),
                    }
                    i = close + 1;
                }
                Some(&b) if b == b'_' || b.is_ascii_alphabetic() => {
                    let start = dollar + 1;
                    let end = text[start..]
                        .find(|c: char| !(c == '_' || c.is_ascii_alphanumeric()))
                        .map_or(text.len(), |n| start + n);
                    let name = &text[start..end];
                    match self.lookup(name, trust, stack)? {
                        Some(value) => out.push_str(&value),
                        None => return Err(unset(name, trust)),
                    }
                    i = end;
                }
                // A `$` that starts no reference stays as written, so `price: 5$` needs no escape.
                _ => {
                    out.push('$');
                    i = dollar + 1;
                }
            }
        }
        out.push_str(&text[i..]);
        Ok(out)
    }

    fn lookup(
        &self,
        name: &str,
        trust: Trust,
        stack: &mut Vec<(String, String)>,
    ) -> Result<Option<String>, ExpandProblem> {
        let key = name.to_ascii_uppercase();
        let entry = self
            .paths
            .and_then(|paths| paths.options.get(&key))
            .filter(|entry| trust == Trust::File || !entry.secret);
        // An entry that names itself (`HOME = ${HOME:-/var/lib/pepsi}`) means the environment
        // variable of that name, as in a shell; only a longer cycle is a loop.
        let own = stack.last().is_some_and(|(k, _)| *k == key);
        let entry = entry.filter(|_| !own);
        let Some(entry) = entry else {
            return Ok(match trust {
                Trust::File => (self.env)(name),
                Trust::Override => None,
            });
        };
        if stack.iter().any(|(k, _)| *k == key) {
            let mut chain: Vec<&str> = stack.iter().map(|(_, shown)| shown.as_str()).collect();
            chain.push(&entry.name);
            return Err(ExpandProblem::Loop {
                chain: chain.join(" -> "),
            });
        }
        if stack.len() >= MAX_DEPTH {
            return Err(ExpandProblem::TooDeep {
                variable: entry.name.clone(),
                limit: MAX_DEPTH,
            });
        }
        stack.push((key, entry.name.clone()));
        // The [PATHS] entry was written by the operator, so its own references are trusted
        // even when the text that named it came from the database.
        let result = self.expand_in(&entry.value, Trust::File, stack);
        stack.pop();
        match result {
            Err(ExpandProblem::Unset {
                variable,
                searched,
                via: None,
            }) => Err(ExpandProblem::Unset {
                variable,
                searched,
                via: Some(format!("[PATHS] {} at {}", entry.name, entry.origin)),
            }),
            other => other.map(Some),
        }
    }
}

fn unset(name: &str, trust: Trust) -> ExpandProblem {
    ExpandProblem::Unset {
        variable: name.to_owned(),
        searched: match trust {
            Trust::File => "[PATHS] or the environment",
            Trust::Override => {
                "[PATHS] (a database override cannot read the environment or secrets.d)"
            }
        },
        via: None,
    }
}

/// Index of the `}` closing a `${` whose contents start at `from`, allowing nested `${...}`
/// inside a default.
fn matching_brace(text: &str, from: usize) -> Option<usize> {
    let mut depth = 1usize;
    for (offset, b) in text.as_bytes()[from..].iter().enumerate() {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(from + offset);
                }
            }
            _ => {}
        }
    }
    None
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const PATHS: &str = "\
[paths]
PREFIX = /opt/pepsi
DATA = $PREFIX/data
SPOOL = ${DATA}/spool
FROM_ENV = ${PEPSI_TEST_HOME}/x
BROKEN = $NOWHERE/x
LOOP_A = $LOOP_B
LOOP_B = ${LOOP_A}
SELF = ${SELF:-self default}
LOOP_SELF = $LOOP_OTHER
LOOP_OTHER = $LOOP_SELF
EMPTY =
";

    fn env(name: &str) -> Option<String> {
        match name {
            "PEPSI_TEST_HOME" => Some("/home/test".to_owned()),
            "PEPSI_TEST_EMPTY" => Some(String::new()),
            "PREFIX" => Some("/from/env".to_owned()),
            _ => None,
        }
    }

    /// Expands `input` as file text and as override text against the `[PATHS]` above, and
    /// compares both renderings (`ok <value>` or `err <problem>`).
    fn check(input: &str, file: &str, overridden: &str) {
        let config = Config::from_str_named(PATHS, "paths.conf").unwrap();
        let expander = Expander {
            paths: config.sections.get("PATHS"),
            env: &env,
        };
        let render = |trust| match expander.expand(input, trust) {
            Ok(value) => format!("ok {value}"),
            Err(problem) => format!("err {problem}"),
        };
        assert_eq!(render(Trust::File), file, "file text {input:?}");
        assert_eq!(
            render(Trust::Override),
            overridden,
            "override text {input:?}"
        );
    }

    #[test]
    fn expansion_table() {
        let no_env = "[PATHS] (a database override cannot read the environment or secrets.d)";
        let cases: &[(&str, &str, &str)] = &[
            ("plain", "ok plain", "ok plain"),
            ("", "ok ", "ok "),
            ("$PREFIX/bin", "ok /opt/pepsi/bin", "ok /opt/pepsi/bin"),
            ("${prefix}/bin", "ok /opt/pepsi/bin", "ok /opt/pepsi/bin"),
            (
                "$SPOOL",
                "ok /opt/pepsi/data/spool",
                "ok /opt/pepsi/data/spool",
            ),
            (
                "${PEPSI_TEST_HOME}/y",
                "ok /home/test/y",
                &format!("err variable PEPSI_TEST_HOME is not set in {no_env} and has no default"),
            ),
            // [PATHS] entries may read the environment even when an override names them.
            ("$FROM_ENV", "ok /home/test/x", "ok /home/test/x"),
            ("${UNSET:-/fallback}", "ok /fallback", "ok /fallback"),
            ("${UNSET:-$PREFIX/d}", "ok /opt/pepsi/d", "ok /opt/pepsi/d"),
            (
                "${UNSET:-${SPOOL}}",
                "ok /opt/pepsi/data/spool",
                "ok /opt/pepsi/data/spool",
            ),
            ("${UNSET:-}", "ok ", "ok "),
            ("${PEPSI_TEST_EMPTY:-dflt}", "ok dflt", "ok dflt"),
            ("${EMPTY:-dflt}", "ok dflt", "ok dflt"),
            (
                "${PEPSI_TEST_EMPTY}",
                "ok ",
                &format!("err variable PEPSI_TEST_EMPTY is not set in {no_env} and has no default"),
            ),
            ("${PREFIX:-unused}", "ok /opt/pepsi", "ok /opt/pepsi"),
            ("$$PREFIX", "ok $PREFIX", "ok $PREFIX"),
            ("a$$b$$$$", "ok a$b$$", "ok a$b$$"),
            ("cost 5$", "ok cost 5$", "ok cost 5$"),
            ("$1 $-", "ok $1 $-", "ok $1 $-"),
            ("$PREFIX.d", "ok /opt/pepsi.d", "ok /opt/pepsi.d"),
            (
                "$PREFIXES",
                "err variable PREFIXES is not set in [PATHS] or the environment and has no default",
                &format!("err variable PREFIXES is not set in {no_env} and has no default"),
            ),
            (
                "$BROKEN",
                "err variable NOWHERE is not set in [PATHS] or the environment and has no default (reached through [PATHS] BROKEN at paths.conf:6)",
                "err variable NOWHERE is not set in [PATHS] or the environment and has no default (reached through [PATHS] BROKEN at paths.conf:6)",
            ),
            (
                "$LOOP_A",
                "err expansion loops through [PATHS]: LOOP_A -> LOOP_B -> LOOP_A",
                "err expansion loops through [PATHS]: LOOP_A -> LOOP_B -> LOOP_A",
            ),
            ("x${SELF}", "ok xself default", "ok xself default"),
            (
                "$LOOP_SELF",
                "err expansion loops through [PATHS]: LOOP_SELF -> LOOP_OTHER -> LOOP_SELF",
                "err expansion loops through [PATHS]: LOOP_SELF -> LOOP_OTHER -> LOOP_SELF",
            ),
            (
                "${PREFIX",
                "err unterminated ${ in \"${PREFIX\"",
                "err unterminated ${ in \"${PREFIX\"",
            ),
            (
                "${}",
                "err invalid variable name after ${ in \"${}\"",
                "err invalid variable name after ${ in \"${}\"",
            ),
            (
                "${A-B}",
                "err invalid variable name after ${ in \"${A-B}\"",
                "err invalid variable name after ${ in \"${A-B}\"",
            ),
            (
                "${A:=x}",
                "err unsupported operator (only ${VAR:-default} is understood) in \"${A:=x}\"",
                "err unsupported operator (only ${VAR:-default} is understood) in \"${A:=x}\"",
            ),
            ("ünï$PREFIX©", "ok ünï/opt/pepsi©", "ok ünï/opt/pepsi©"),
        ];
        for (input, file, overridden) in cases {
            check(input, file, overridden);
        }
    }

    #[test]
    fn secret_paths_entries_are_hidden_from_overrides() {
        let mut config = Config::from_str_named("[PATHS]\nKEY = s3cret\n", "x.conf").unwrap();
        config
            .sections
            .get_mut("PATHS")
            .unwrap()
            .options
            .get_mut("KEY")
            .unwrap()
            .secret = true;
        let expander = Expander {
            paths: config.sections.get("PATHS"),
            env: &env,
        };
        assert_eq!(expander.expand("k=$KEY", Trust::File).unwrap(), "k=s3cret");
        assert!(matches!(
            expander.expand("k=$KEY", Trust::Override),
            Err(ExpandProblem::Unset { ref variable, .. }) if variable == "KEY"
        ));
    }

    #[test]
    fn a_long_chain_stops_at_the_depth_limit() {
        // V1 -> V2 -> ... -> V{MAX_DEPTH + 1} = end: one entry more than the limit allows.
        let mut text = String::from("[PATHS]\n");
        for n in 1..=MAX_DEPTH {
            text.push_str(&format!("V{n} = $V{}\n", n + 1));
        }
        text.push_str(&format!("V{} = end\n", MAX_DEPTH + 1));
        let config = Config::from_str_named(&text, "deep.conf").unwrap();
        let expander = Expander {
            paths: config.sections.get("PATHS"),
            env: &env,
        };
        assert_eq!(
            expander.expand("$V2", Trust::File).unwrap(),
            "end",
            "a chain of exactly {MAX_DEPTH} entries still resolves"
        );
        assert_eq!(
            expander.expand("$V1", Trust::File).unwrap_err().to_string(),
            format!(
                "expansion of V{} nests deeper than {MAX_DEPTH} levels",
                MAX_DEPTH + 1
            )
        );
    }
}
