//! Alias expansion, without I/O: what one address stands for (`resolve`), and the
//! recursive expansion of a recipient list (`expand`) against answers the I/O layer
//! fetched.
//!
//! Rules (docs/aliases.md): an address that appears in its own expansion, directly
//! (`a: a, b`) or through others (`a: b`, `b: a`), is delivered as it is, once, instead of
//! being expanded again; an expansion deeper than the depth limit stops and delivers the
//! address it reached; duplicates are dropped, the first occurrence wins.

use std::collections::{HashMap, HashSet};

use pepsi_conf::address::{self, Address, address_key};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::settings::SettingsTable;
use pepsi_contract::state::{Dsn, DsnRcpt};

use crate::file::AliasFile;
use pepsi_contract::settings::address_list as targets_of;

/// Settings-layer name of an address's alias targets (a JSON list of addresses, or a
/// string of comma-separated addresses).
pub const ALIAS_SETTING: &str = "alias";
/// Settings-layer name of a domain's catch-all targets, on the key `@domain`.
pub const CATCHALL_SETTING: &str = "catchall";

/// What one address stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Delivered as it is.
    Final,
    /// Replaced by these targets (each expanded in turn).
    Alias(Vec<String>),
}

/// The facts the I/O layer fetched, for `resolve`.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub settings: SettingsTable,
    /// Enabled mailboxes, lower-case.
    pub mailboxes: HashSet<String>,
    /// Local domains (normalized) among the domains asked about.
    pub local_domains: HashSet<String>,
}

/// What `address` stands for, in this order: its settings-layer `alias`, its alias-file
/// entry, the same two for the address without its extension, a bare alias-file name
/// when the domain is local; else, unless it is an enabled mailbox, its domain's
/// catch-all (settings layer first, then the file); else itself. Targets without `@` take
/// the domain of `address`.
pub fn resolve(address: &str, file: &AliasFile, local: &LocalRecipients, facts: &Facts) -> Answer {
    let Ok((local_part, domain)) = Address::parse(address).map(Address::into_parts) else {
        return Answer::Final;
    };
    let key = address_key(address);
    let stripped = local.mailbox_key(address);
    let qualify = |targets: Vec<String>| -> Answer {
        Answer::Alias(
            targets
                .into_iter()
                .map(|t| {
                    if t.contains('@') {
                        t
                    } else {
                        format!("{t}@{domain}")
                    }
                })
                .collect(),
        )
    };
    let mut keys = vec![key.clone()];
    if stripped != key {
        keys.push(stripped.clone());
    }
    for k in &keys {
        if let Some(targets) = facts.settings.exact(k, ALIAS_SETTING).and_then(targets_of) {
            return qualify(targets);
        }
        if let Some(targets) = file.addresses.get(k) {
            return qualify(targets.clone());
        }
    }
    if !file.names.is_empty() && facts.local_domains.contains(&domain) {
        let lower = local_part.to_lowercase();
        let base = address::parts(&stripped).map_or(lower.as_str(), |(l, _)| l);
        for name in [lower.as_str(), base] {
            if let Some(targets) = file.names.get(name) {
                return qualify(targets.clone());
            }
        }
    }
    if facts.mailboxes.contains(&stripped) {
        return Answer::Final;
    }
    let catchall = facts
        .settings
        .exact(&format!("@{domain}"), CATCHALL_SETTING)
        .and_then(targets_of)
        .or_else(|| file.catchalls.get(&domain).cloned());
    match catchall {
        Some(targets) => qualify(targets),
        None => Answer::Final,
    }
}

/// The result of expanding a recipient list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Expansion {
    /// The new recipients, each with the index of the original recipient it came from.
    pub recipients: Vec<(String, usize)>,
    /// Addresses found in their own expansion (delivered as they are).
    pub loops: Vec<String>,
    /// Addresses at which the depth limit stopped the expansion.
    pub too_deep: Vec<String>,
}

impl Expansion {
    /// True when the expansion is exactly the original list.
    pub fn unchanged(&self, original: &[String]) -> bool {
        self.recipients.len() == original.len()
            && self
                .recipients
                .iter()
                .zip(original)
                .enumerate()
                .all(|(i, ((r, from), o))| *from == i && r == o)
    }
}

/// Expands `rcpts` with `answer`, which gives `None` for an address it has no facts for
/// yet. Returns the expansion, or the addresses (comparison form, no duplicates) whose
/// facts are needed before it can finish.
pub fn expand(
    rcpts: &[String],
    max_depth: usize,
    answer: &dyn Fn(&str) -> Option<Answer>,
) -> Result<Expansion, Vec<String>> {
    let mut walk = Walk {
        answer,
        max_depth,
        out: Expansion::default(),
        seen: HashSet::new(),
        need: Vec::new(),
    };
    for (i, r) in rcpts.iter().enumerate() {
        walk.visit(r, i, &mut Vec::new());
    }
    if walk.need.is_empty() {
        Ok(walk.out)
    } else {
        Err(walk.need)
    }
}

struct Walk<'a> {
    answer: &'a dyn Fn(&str) -> Option<Answer>,
    max_depth: usize,
    out: Expansion,
    seen: HashSet<String>,
    need: Vec<String>,
}

impl Walk<'_> {
    fn visit(&mut self, address: &str, origin: usize, ancestors: &mut Vec<String>) {
        let key = address_key(address);
        if ancestors.contains(&key) {
            if !self.out.loops.contains(&key) {
                self.out.loops.push(key);
            }
            return self.deliver(address, origin);
        }
        match (self.answer)(address) {
            None => {
                if !self.need.contains(&key) {
                    self.need.push(key);
                }
            }
            Some(Answer::Final) => self.deliver(address, origin),
            Some(Answer::Alias(targets)) => {
                if ancestors.len() >= self.max_depth {
                    self.out.too_deep.push(key);
                    return self.deliver(address, origin);
                }
                ancestors.push(key);
                for t in &targets {
                    self.visit(t, origin, ancestors);
                }
                ancestors.pop();
            }
        }
    }

    fn deliver(&mut self, address: &str, origin: usize) {
        if self.seen.insert(address_key(address)) {
            self.out.recipients.push((address.to_owned(), origin));
        }
    }
}

/// `state.dsn` for the expanded recipients: a recipient kept as it was keeps its entry; an
/// expanded one inherits its alias's NOTIFY and gets as ORCPT the alias's ORCPT, or the
/// alias address itself when the client gave none (RFC 3461 §6.1).
pub fn rebuild_dsn(dsn: Option<Dsn>, original: &[String], expansion: &Expansion) -> Dsn {
    let mut dsn = dsn.unwrap_or_default();
    let rcpt: Vec<DsnRcpt> = expansion
        .recipients
        .iter()
        .map(|(address, from)| {
            let mut entry = dsn.rcpt(*from).cloned().unwrap_or_default();
            if *address != original[*from] && entry.orcpt.is_none() {
                let kind = if original[*from].is_ascii() {
                    "rfc822"
                } else {
                    "utf-8"
                };
                entry.orcpt = Some(format!("{kind};{}", original[*from]));
            }
            entry
        })
        .collect();
    dsn.rcpt = rcpt;
    dsn
}

/// Answers from a fixed table (tests): an address in `table` is an alias, any other is
/// final.
pub fn table_answer(table: &HashMap<String, Vec<String>>) -> impl Fn(&str) -> Option<Answer> + '_ {
    move |a: &str| {
        Some(match table.get(&address_key(a)) {
            Some(t) => Answer::Alias(t.clone()),
            None => Answer::Final,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn table(entries: &[(&str, &[&str])]) -> HashMap<String, Vec<String>> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// One row of the expansion table: aliases, input, expected (address, origin) pairs,
    /// expected loop members.
    fn check(
        aliases: &[(&str, &[&str])],
        input: &[&str],
        expected: &[(&str, usize)],
        loops: &[&str],
    ) {
        let t = table(aliases);
        let answer = table_answer(&t);
        let got = expand(&strings(input), 10, &answer).unwrap();
        let want: Vec<(String, usize)> =
            expected.iter().map(|(a, i)| (a.to_string(), *i)).collect();
        assert_eq!(got.recipients, want, "{aliases:?} {input:?}");
        assert_eq!(got.loops, strings(loops), "{aliases:?} {input:?}");
    }

    #[test]
    fn expansion_table() {
        // Nothing to expand.
        check(
            &[],
            &["a@x.test", "b@x.test"],
            &[("a@x.test", 0), ("b@x.test", 1)],
            &[],
        );
        // One alias to two targets; the other recipient stays.
        check(
            &[("list@x.test", &["a@x.test", "b@y.test"])],
            &["list@x.test", "c@x.test"],
            &[("a@x.test", 0), ("b@y.test", 0), ("c@x.test", 1)],
            &[],
        );
        // Recursive.
        check(
            &[
                ("a@x.test", &["b@x.test"]),
                ("b@x.test", &["c@x.test", "d@x.test"]),
            ],
            &["a@x.test"],
            &[("c@x.test", 0), ("d@x.test", 0)],
            &[],
        );
        // Postfix's self-reference: a: a, b delivers to a and b.
        check(
            &[("a@x.test", &["a@x.test", "b@x.test"])],
            &["a@x.test"],
            &[("a@x.test", 0), ("b@x.test", 0)],
            &["a@x.test"],
        );
        // A true cycle with no terminal ends at the loop member, delivered once.
        check(
            &[("a@x.test", &["b@x.test"]), ("b@x.test", &["a@x.test"])],
            &["a@x.test", "b@x.test"],
            &[("a@x.test", 0), ("b@x.test", 1)],
            &["a@x.test", "b@x.test"],
        );
        // Duplicates: across recipients and targets, case-insensitive; the first wins.
        check(
            &[("l@x.test", &["A@x.test", "b@x.test", "a@X.TEST"])],
            &["a@x.test", "l@x.test"],
            &[("a@x.test", 0), ("b@x.test", 1)],
            &[],
        );
        // Alias keys compare without case.
        check(
            &[("list@x.test", &["a@x.test"])],
            &["LIST@X.test"],
            &[("a@x.test", 0)],
            &[],
        );
    }

    #[test]
    fn depth_limit_stops_a_long_chain() {
        let t = table(&[
            ("a1@x.test", &["a2@x.test"]),
            ("a2@x.test", &["a3@x.test"]),
            ("a3@x.test", &["a4@x.test"]),
        ]);
        let answer = table_answer(&t);
        let got = expand(&strings(&["a1@x.test"]), 2, &answer).unwrap();
        assert_eq!(got.recipients, vec![("a3@x.test".to_owned(), 0)]);
        assert_eq!(got.too_deep, strings(&["a3@x.test"]));
    }

    #[test]
    fn unknown_addresses_are_asked_for() {
        let answer =
            |a: &str| (a == "a@x.test").then(|| Answer::Alias(strings(&["b@x.test", "c@x.test"])));
        assert_eq!(
            expand(&strings(&["a@x.test", "D@x.test"]), 10, &answer).unwrap_err(),
            strings(&["b@x.test", "c@x.test", "d@x.test"])
        );
    }

    #[test]
    fn unchanged_only_for_the_identical_list() {
        let orig = strings(&["a@x.test", "b@x.test"]);
        let same = Expansion {
            recipients: vec![("a@x.test".into(), 0), ("b@x.test".into(), 1)],
            ..Default::default()
        };
        assert!(same.unchanged(&orig));
        let fewer = Expansion {
            recipients: vec![("a@x.test".into(), 0)],
            ..Default::default()
        };
        assert!(!fewer.unchanged(&orig));
    }

    #[test]
    fn resolve_precedence() {
        let file = AliasFile::parse(
            "postmaster: root\n\
             sales@x.test: s1@x.test\n\
             alice@x.test: file-alice@x.test\n\
             @x.test: catch@x.test\n\
             @y.test: catch\n",
        )
        .unwrap();
        let local = LocalRecipients::new(["x.test".to_owned()], "+");
        let facts = Facts {
            settings: SettingsTable::from_rows([
                (
                    "alice@x.test".into(),
                    ALIAS_SETTING.into(),
                    json!(["db-alice@x.test"]),
                ),
                (
                    "bob@x.test".into(),
                    ALIAS_SETTING.into(),
                    json!("b1@x.test, b2"),
                ),
                (
                    "@z.test".into(),
                    CATCHALL_SETTING.into(),
                    json!("zz@z.test"),
                ),
            ]),
            mailboxes: ["real@x.test".to_owned()].into(),
            local_domains: ["x.test".to_owned()].into(),
        };
        let alias = |v: &[&str]| Answer::Alias(strings(v));
        let cases = [
            ("Alice@x.test", alias(&["db-alice@x.test"])),
            ("alice+tag@x.test", alias(&["db-alice@x.test"])),
            ("bob@x.test", alias(&["b1@x.test", "b2@x.test"])),
            ("sales+q@x.test", alias(&["s1@x.test"])),
            ("postmaster@x.test", alias(&["root@x.test"])),
            ("postmaster@y.test", alias(&["catch@y.test"])),
            ("real@x.test", Answer::Final),
            ("real+tag@x.test", Answer::Final),
            ("nobody@x.test", alias(&["catch@x.test"])),
            ("anyone@z.test", alias(&["zz@z.test"])),
            ("someone@remote.test", Answer::Final),
            ("not-an-address", Answer::Final),
        ];
        for (address, expected) in cases {
            assert_eq!(
                resolve(address, &file, &local, &facts),
                expected,
                "{address}"
            );
        }
    }

    #[test]
    fn dsn_entries_follow_their_alias() {
        let original = strings(&["list@x.test", "c@x.test"]);
        let expansion = Expansion {
            recipients: vec![
                ("a@x.test".into(), 0),
                ("b@x.test".into(), 0),
                ("c@x.test".into(), 1),
            ],
            ..Default::default()
        };
        let dsn = json!({"ret": "HDRS", "envid": "e1", "rcpt": [
            {"notify": ["FAILURE"], "orcpt": null},
            {"notify": ["NEVER"], "orcpt": "rfc822;c@x.test"}
        ]});
        let rebuilt = |dsn: serde_json::Value| {
            rebuild_dsn(Some(Dsn::from_value(&dsn).unwrap()), &original, &expansion).to_value()
        };
        assert_eq!(
            rebuilt(dsn),
            json!({"ret": "HDRS", "envid": "e1", "rcpt": [
                {"notify": ["FAILURE"], "orcpt": "rfc822;list@x.test"},
                {"notify": ["FAILURE"], "orcpt": "rfc822;list@x.test"},
                {"notify": ["NEVER"], "orcpt": "rfc822;c@x.test"}
            ]})
        );
        let given = json!({"rcpt": [{"notify": null, "orcpt": "rfc822;orig@x.test"}, null]});
        assert_eq!(
            rebuilt(given)["rcpt"][0],
            json!({"notify": null, "orcpt": "rfc822;orig@x.test"})
        );
        // Without a dsn, a kept recipient gets an entry without parameters.
        assert_eq!(
            rebuild_dsn(None, &original, &expansion).to_value(),
            json!({"ret": null, "envid": null, "rcpt": [
                {"notify": null, "orcpt": "rfc822;list@x.test"},
                {"notify": null, "orcpt": "rfc822;list@x.test"},
                {"notify": null, "orcpt": null}
            ]})
        );
    }
}
