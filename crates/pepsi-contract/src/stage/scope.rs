//! Overrides for one recipient domain or address (`domain:` and `address:` rows of
//! `pepsi.config_override`) applied to the messages they are for: a stage's section is
//! parsed, at worker start, once more for every scope that has rows touching it, and a pass
//! takes the variant of its message's scope.
//!
//! A message's scope is its recipient when it has exactly one (then that address's rows,
//! else its domain's), else their common domain when they share one, else none (the
//! global section). Only a stage's own section options (and `[pepsi]` options a section
//! reads as its fallback) vary by scope; what the dispatcher and the graph read — PROGRAM,
//! NEXT_STAGE, BOUNCE_STAGE, the pool options — is global (pepsi-config refuses scoped rows
//! of those).
//!
//! Never does I/O: the rows are read by the caller (`config::load_all_overrides`).

use pepsi_conf::address::Address;
use pepsi_conf::config::{Config, OverrideRow, Scope, StageName};

/// The most scopes a worker parses sections for; rows of further scopes are ignored with a
/// warning (a bound on start-up work and memory, far above a real deployment's needs).
pub const MAX_SCOPES: usize = 10_000;

/// The file configuration and every override row, from which scoped configurations are
/// made.
#[derive(Clone, Default)]
pub struct ScopedOverrides {
    file: Option<Config>,
    rows: Vec<OverrideRow>,
}

impl ScopedOverrides {
    /// Scopes from `rows` (all of them, `global` ones included) over `file`.
    pub fn new(file: Config, rows: Vec<OverrideRow>) -> Self {
        ScopedOverrides {
            file: Some(file),
            rows,
        }
    }

    /// The distinct `domain:`/`address:` scopes with a row in `[stage-<name>]` for one of
    /// `stages`, or in `[pepsi]`; at most [`MAX_SCOPES`].
    pub fn scopes_touching(&self, stages: &[StageName]) -> Vec<Scope> {
        let mut out: Vec<Scope> = Vec::new();
        let mut ignored = 0usize;
        for row in &self.rows {
            let section = row.section.trim().to_ascii_lowercase();
            let touches = section == "pepsi"
                || StageName::of_section(&section).is_some_and(|n| stages.contains(&n));
            let Some(scope) = parse_scope(&row.scope) else {
                continue;
            };
            if !touches || out.contains(&scope) {
                continue;
            }
            if out.len() == MAX_SCOPES {
                ignored += 1;
                continue;
            }
            out.push(scope);
        }
        if ignored > 0 {
            tracing::warn!(
                ignored,
                "more than {MAX_SCOPES} domain and address scopes override stage options: the rest are not applied"
            );
        }
        out
    }

    /// The configuration as a message of `scope` sees it.
    pub fn config_for(&self, scope: &Scope) -> Option<Config> {
        Some(self.file.as_ref()?.with_overrides(&self.rows, scope))
    }
}

/// `domain:<d>` or `address:<a>` as stored (lower case); `None` for `global` or a
/// malformed scope.
fn parse_scope(text: &str) -> Option<Scope> {
    let (kind, name) = text.trim().split_once(':')?;
    let name = name.trim().to_lowercase();
    if name.is_empty() {
        return None;
    }
    if kind.eq_ignore_ascii_case("domain") {
        Some(Scope::Domain(name))
    } else if kind.eq_ignore_ascii_case("address") {
        Some(Scope::Address(name))
    } else {
        None
    }
}

/// The scope keys (as `Scope::to_db_string` writes them) a message with `rcpt_to` takes its
/// sections from, most specific first: `address:` and `domain:` for one recipient,
/// `domain:` for recipients of one domain, none otherwise.
pub fn message_scopes(rcpt_to: &[String]) -> Vec<String> {
    let split = |a: &str| -> Option<(String, String)> {
        let a = Address::parse(a).ok()?;
        Some((a.local().to_lowercase(), a.domain().to_owned()))
    };
    match rcpt_to {
        [] => Vec::new(),
        [one] => match split(one) {
            Some((local, domain)) => vec![
                Scope::Address(format!("{local}@{domain}")).to_db_string(),
                Scope::Domain(domain).to_db_string(),
            ],
            None => Vec::new(),
        },
        many => {
            let mut domains = many.iter().map(|a| split(a).map(|(_, d)| d));
            let Some(Some(first)) = domains.next() else {
                return Vec::new();
            };
            if domains.all(|d| d.as_deref() == Some(first.as_str())) {
                vec![Scope::Domain(first).to_db_string()]
            } else {
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_takes_the_scope_of_its_recipients() {
        let cases: &[(&[&str], &[&str])] = &[
            (
                &["Bob@Slow.Example"],
                &["address:bob@slow.example", "domain:slow.example"],
            ),
            (&["a@x.example", "B@X.example"], &["domain:x.example"]),
            (&["a@x.example", "b@y.example"], &[]),
            (
                &["k@bücher.example"],
                &[
                    "address:k@xn--bcher-kva.example",
                    "domain:xn--bcher-kva.example",
                ],
            ),
            (&[], &[]),
            (&["not-an-address"], &[]),
        ];
        for (rcpts, want) in cases {
            let rcpts: Vec<String> = rcpts.iter().map(|s| s.to_string()).collect();
            assert_eq!(message_scopes(&rcpts), *want, "{rcpts:?}");
        }
    }

    #[test]
    fn scopes_are_those_with_rows_for_the_stages_sections() {
        let row = |scope: &str, section: &str| OverrideRow {
            scope: scope.into(),
            section: section.into(),
            option: "X".into(),
            value: "1".into(),
        };
        let o = ScopedOverrides::new(
            Config::from_str_named("", "t.conf").unwrap(),
            vec![
                row("global", "stage-relay"),
                row("domain:a.example", "stage-relay"),
                row("domain:a.example", "stage-relay"),
                row("address:b@c.example", "pepsi"),
                row("domain:d.example", "stage-other"),
                row("bogus", "stage-relay"),
            ],
        );
        let got = o.scopes_touching(&[StageName::new("Relay").unwrap()]);
        assert_eq!(
            got,
            [
                Scope::Domain("a.example".into()),
                Scope::Address("b@c.example".into())
            ]
        );
    }
}
