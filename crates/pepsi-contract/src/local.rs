//! The local-recipient resolver: which domains this server delivers for, and which mailbox
//! a recipient with an extension (`alice+tag@example.org`) belongs to. How an address
//! splits and normalizes is `pepsi_conf::address`.
//!
//! Local domains are `[pepsi] LOCAL_DOMAINS` plus the domains the settings layer marks
//! local: a `pepsi.settings` row with address `@<domain>`, name `local_domain` and value
//! `true`. Domains are compared in their ASCII form (lower-case, IDN labels as punycode,
//! no trailing dot). Local parts keep their case for delivery and compare without it.
//!
//! The address helpers are pure; the database is read only by `LocalRecipients`'s async
//! methods and `recipient_facts` (through `pepsi.settings_get` and
//! `pepsi.recipient_facts`), and never written.

use std::collections::{BTreeSet, HashSet};

use serde_json::Value;
use sqlx::{PgPool, Row as _};

use crate::settings::SettingsTable;
use pepsi_conf::address::{Address, address_key, normalize_domain};
use pepsi_conf::config::{Config, ConfigError};

/// The settings-layer name that marks a domain key (`@example.org`) local.
pub const LOCAL_DOMAIN_SETTING: &str = "local_domain";

const RECIPIENT_FACTS: &str = "SELECT address, name, value FROM pepsi.recipient_facts($1, $2, $3)";

/// `addresses` ASCII-lower-cased, each once, in their first order: a message's recipients
/// as the settings layer and per-mailbox tables key them.
pub fn distinct_lowercase(addresses: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(addresses.len());
    for a in addresses {
        let a = a.to_ascii_lowercase();
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

/// Which domains are local and how recipient extensions are written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalRecipients {
    /// The configured local domains, normalized.
    domains: BTreeSet<String>,
    /// The characters that start an extension (`RECIPIENT_DELIMITER`); empty: none.
    delimiters: Vec<char>,
}

impl LocalRecipients {
    /// A resolver for the given configured domains and delimiter characters (each
    /// character of `delimiters` starts an extension; empty for none).
    pub fn new(domains: impl IntoIterator<Item = String>, delimiters: &str) -> Self {
        Self {
            domains: domains
                .into_iter()
                .filter_map(|d| normalize_domain(&d))
                .collect(),
            delimiters: delimiters.chars().collect(),
        }
    }

    /// From `[pepsi] LOCAL_DOMAINS` (list, default none) and `[pepsi] RECIPIENT_DELIMITER`
    /// (default none).
    pub fn from_config(cfg: &Config) -> Result<Self, ConfigError> {
        let s = cfg.section("pepsi");
        Ok(Self::new(
            s.list_opt("LOCAL_DOMAINS")?.unwrap_or_default(),
            &s.string_opt("RECIPIENT_DELIMITER")?.unwrap_or_default(),
        ))
    }

    /// The same delimiters with another list of configured domains (a program's own
    /// `LOCAL_DOMAINS` that overrides `[pepsi]`'s).
    pub fn with_domains(&self, domains: impl IntoIterator<Item = String>) -> Self {
        Self {
            domains: domains
                .into_iter()
                .filter_map(|d| normalize_domain(&d))
                .collect(),
            delimiters: self.delimiters.clone(),
        }
    }

    /// The configured domains, normalized, in order.
    pub fn configured_domains(&self) -> impl Iterator<Item = &str> {
        self.domains.iter().map(String::as_str)
    }

    /// True when `domain` is one of the configured local domains (no database).
    pub fn is_configured_local(&self, domain: &str) -> bool {
        normalize_domain(domain).is_some_and(|d| self.domains.contains(&d))
    }

    /// The address with its extension removed: `Alice+tag@Example.org` →
    /// `Alice@example.org` (local part case kept, domain normalized). An address without an
    /// extension, or whose local part would become empty, comes back normalized only.
    pub fn strip_extension(&self, address: &str) -> String {
        let Ok(a) = Address::parse(address) else {
            return address.trim().to_owned();
        };
        let local = a.local();
        let base = match local.find(|c| self.delimiters.contains(&c)) {
            Some(0) | None => local,
            Some(i) => &local[..i],
        };
        format!("{base}@{}", a.domain())
    }

    /// The mailbox an address delivers to, in comparison form: extension removed,
    /// lower-case. `alice+tag@D` → `alice@d`.
    pub fn mailbox_key(&self, address: &str) -> String {
        address_key(&self.strip_extension(address))
    }

    /// Whether `domain` is local: configured, or marked in the settings layer.
    pub async fn is_local_domain(&self, pool: &PgPool, domain: &str) -> Result<bool, sqlx::Error> {
        let Some(d) = normalize_domain(domain) else {
            return Ok(false);
        };
        Ok(self
            .local_domains_among(pool, std::slice::from_ref(&d))
            .await?
            .contains(&d))
    }

    /// The local ones among `domains`, normalized; one query for all the domains that are
    /// not configured (none when every domain is).
    pub async fn local_domains_among(
        &self,
        pool: &PgPool,
        domains: &[String],
    ) -> Result<HashSet<String>, sqlx::Error> {
        let mut local = HashSet::new();
        let mut ask = Vec::new();
        for d in domains.iter().filter_map(|d| normalize_domain(d)) {
            if self.domains.contains(&d) {
                local.insert(d);
            } else if !ask.contains(&format!("@{d}")) {
                ask.push(format!("@{d}"));
            }
        }
        if ask.is_empty() {
            return Ok(local);
        }
        let table = crate::settings::fetch(pool, &ask, &[LOCAL_DOMAIN_SETTING]).await?;
        for key in &ask {
            if table.exact(key, LOCAL_DOMAIN_SETTING) == Some(&serde_json::Value::Bool(true)) {
                local.insert(key[1..].to_owned());
            }
        }
        Ok(local)
    }

    /// For each address, whether its domain is local (one query at most).
    pub async fn recipients_local(
        &self,
        pool: &PgPool,
        addresses: &[String],
    ) -> Result<Vec<bool>, sqlx::Error> {
        let domains: Vec<Option<String>> = addresses
            .iter()
            .map(|a| Address::parse(a).ok().map(|a| a.domain().to_owned()))
            .collect();
        let wanted: Vec<String> = domains.iter().flatten().cloned().collect();
        let local = self.local_domains_among(pool, &wanted).await?;
        Ok(domains
            .iter()
            .map(|d| d.as_ref().is_some_and(|d| local.contains(d)))
            .collect())
    }
}

/// What resolving a set of addresses needs, in one query: the settings rows for `keys` and
/// `names` (as `settings::fetch` returns them) and the enabled mailboxes
/// (`pepsi.mailbox_account`) among `mailboxes`, lower-case.
pub async fn recipient_facts(
    pool: &PgPool,
    keys: &[String],
    names: &[&str],
    mailboxes: &[String],
) -> Result<(SettingsTable, HashSet<String>), sqlx::Error> {
    if mailboxes.is_empty() && (keys.is_empty() || names.is_empty()) {
        return Ok(Default::default());
    }
    let rows = sqlx::query(RECIPIENT_FACTS)
        .bind(keys)
        .bind(names)
        .bind(mailboxes)
        .fetch_all(pool)
        .await?;
    let mut settings = Vec::new();
    let mut found = HashSet::new();
    for row in rows {
        let address: String = row.try_get("address")?;
        match row.try_get::<Option<String>, _>("name")? {
            Some(name) => settings.push((address, name, row.try_get::<Value, _>("value")?)),
            None => {
                found.insert(address);
            }
        }
    }
    Ok((SettingsTable::from_rows(settings), found))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_strip_to_the_mailbox() {
        let r = LocalRecipients::new(["Example.test".to_owned()], "+-");
        let cases = [
            ("alice+tag@example.test", "alice@example.test"),
            ("Alice-x+y@Example.TEST", "Alice@example.test"),
            ("alice@example.test", "alice@example.test"),
            ("+only@example.test", "+only@example.test"),
        ];
        for (input, expected) in cases {
            assert_eq!(r.strip_extension(input), expected, "{input}");
        }
        assert_eq!(
            r.mailbox_key("Alice+tag@example.test"),
            "alice@example.test"
        );
        let none = LocalRecipients::new(Vec::<String>::new(), "");
        assert_eq!(none.strip_extension("a+b@x.test"), "a+b@x.test");
        assert!(r.is_configured_local("EXAMPLE.test."));
        assert!(!r.is_configured_local("sub.example.test"));
    }
}
