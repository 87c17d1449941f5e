//! The per-address override layer: named settings in `pepsi.settings`, looked up for an
//! address with the fallback address → `@domain` → the global configuration.
//!
//! A row's `address` is either a lower-case address (`alice@example.org`) or a domain key
//! (`@example.org`) that applies to every address of that domain; `name` is the setting and
//! `value` its JSON value. Account owners write these rows themselves (by e-mail, through
//! a later tool), which is why the layer is apart from `config_override`.
//!
//! This module only reads. It runs one stored function, `pepsi.settings_get`, which
//! lower-cases the keys it is given, so lookups compare addresses without regard to case.
//! The shapes of the settings that are JSON objects, checked where they enter (`admin`) and
//! where a stage reads them, sit beside it: `vacation`, `block_languages`, `secretary`,
//! `auto_pay`.

pub mod auto_pay;
pub mod block_languages;
pub mod secretary;
pub mod vacation;

use std::collections::HashMap;

use serde_json::Value;
use sqlx::{PgPool, Row as _};

use pepsi_conf::address::{Address, normalize_domain};

const GET: &str = "SELECT address, name, value FROM pepsi.settings_get($1, $2)";

/// A settings value that lists addresses (`alias`, `catchall`, `send_as`): a JSON list of
/// strings, or one string of comma-separated addresses. Anything else (or an empty list)
/// lists nothing.
pub fn address_list(value: &Value) -> Option<Vec<String>> {
    let addresses = match value {
        Value::String(s) => parse_address_list(s).ok()?,
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
        _ => return None,
    };
    (!addresses.is_empty()).then_some(addresses)
}

/// Comma-separated addresses (angle brackets allowed), as an alias file's right-hand side
/// or a settings string holds them. Commands, files and `:include:` are refused, and so
/// is an entry with white space in it.
pub fn parse_address_list(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for t in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if t.starts_with('|') || t.starts_with('/') || t.starts_with(":include:") {
            return Err(format!(
                "target {t:?}: commands, files and :include: are not supported (use addresses)"
            ));
        }
        if t.contains(char::is_whitespace) {
            return Err(format!("target {t:?} is not an address"));
        }
        out.push(t.trim_start_matches('<').trim_end_matches('>').to_owned());
    }
    Ok(out)
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingSource {
    /// A row for the address itself (lower-case).
    Address(String),
    /// A row for the address's domain: the key `@domain`.
    Domain(String),
    /// Not in the settings layer: the global configuration's value.
    Global,
}

/// A setting's value and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    pub value: Value,
    pub source: SettingSource,
}

/// The keys a lookup for `address` tries, most specific first: the address (lower-case),
/// then `@domain`. A domain key (`@example.org`) yields itself only; text without `@` is
/// taken as a domain.
pub fn lookup_keys(address: &str) -> Vec<String> {
    let lower = address.trim().to_lowercase();
    if let Some(domain) = lower.strip_prefix('@') {
        return vec![format!("@{}", normalize(domain))];
    }
    match Address::parse(&lower) {
        Ok(a) => vec![a.to_string(), a.domain_key()],
        Err(_) => vec![format!("@{}", normalize(&lower))],
    }
}

fn normalize(domain: &str) -> String {
    normalize_domain(domain).unwrap_or_else(|| domain.to_owned())
}

/// Rows fetched in one query for a set of keys and names; resolve lookups against it
/// without further round trips.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SettingsTable {
    rows: HashMap<(String, String), Value>,
}

impl SettingsTable {
    /// A table from `(key, name, value)` triples (tests, and the fetch below).
    pub fn from_rows(rows: impl IntoIterator<Item = (String, String, Value)>) -> Self {
        Self {
            rows: rows
                .into_iter()
                .map(|(k, n, v)| ((k.to_lowercase(), n), v))
                .collect(),
        }
    }

    /// The row for exactly `key` (an address or `@domain`) and `name`.
    pub fn exact(&self, key: &str, name: &str) -> Option<&Value> {
        self.rows.get(&(key.to_lowercase(), name.to_owned()))
    }

    /// `name` for `address`: the address's row, else its domain's row.
    pub fn resolve(&self, address: &str, name: &str) -> Option<Setting> {
        let keys = lookup_keys(address);
        let last = keys.len() - 1;
        keys.into_iter().enumerate().find_map(|(i, key)| {
            let value = self.rows.get(&(key.clone(), name.to_owned()))?.clone();
            let source = if i == last {
                SettingSource::Domain(key.trim_start_matches('@').to_owned())
            } else {
                SettingSource::Address(key)
            };
            Some(Setting { value, source })
        })
    }

    /// As `resolve`, falling back to `global` (the configuration's value) when the layer
    /// has no row.
    pub fn resolve_or(&self, address: &str, name: &str, global: Option<Value>) -> Option<Setting> {
        self.resolve(address, name).or_else(|| {
            global.map(|value| Setting {
                value,
                source: SettingSource::Global,
            })
        })
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// Fetches, in one query, the rows for every key in `keys` (addresses or `@domain`s; use
/// [`lookup_keys`] to get both for an address) and every name in `names`.
pub async fn fetch(
    pool: &PgPool,
    keys: &[String],
    names: &[&str],
) -> Result<SettingsTable, sqlx::Error> {
    if keys.is_empty() || names.is_empty() {
        return Ok(SettingsTable::default());
    }
    let rows = sqlx::query(GET)
        .bind(keys)
        .bind(names)
        .fetch_all(pool)
        .await?;
    let mut triples = Vec::with_capacity(rows.len());
    for row in rows {
        triples.push((
            row.try_get::<String, _>("address")?,
            row.try_get::<String, _>("name")?,
            row.try_get::<Value, _>("value")?,
        ));
    }
    Ok(SettingsTable::from_rows(triples))
}

/// Reads the setting `name` of the `addresses` a stage's round has not seen yet, in one
/// query, into `round`: each address's own row, and with `domains` its `@domain` row where it
/// has none. `parse` checks a row; one it refuses is logged and taken as no setting.
pub async fn learn_round<T>(
    pool: &PgPool,
    round: &std::cell::RefCell<crate::round::RoundMemo<String, Option<T>>>,
    addresses: &[String],
    name: &str,
    domains: bool,
    parse: impl Fn(&Value) -> Result<T, String>,
) -> Result<(), sqlx::Error> {
    let missing: Vec<String> = {
        let mut round = round.borrow_mut();
        round.expire();
        addresses
            .iter()
            .filter(|a| !round.knows(a.as_str()))
            .cloned()
            .collect()
    };
    if missing.is_empty() {
        return Ok(());
    }
    let mut keys: Vec<String> = Vec::new();
    for a in &missing {
        let wanted = if domains {
            lookup_keys(a)
        } else {
            vec![a.to_lowercase()]
        };
        for k in wanted {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    let table = fetch(pool, &keys, &[name]).await?;
    let mut round = round.borrow_mut();
    for a in missing {
        let value = if domains {
            table.resolve(&a, name).map(|s| s.value)
        } else {
            table.exact(&a, name).cloned()
        };
        let setting = value.and_then(|v| {
            parse(&v)
                .inspect_err(|e| tracing::warn!(address = %a, "{name} setting not used: {e}"))
                .ok()
        });
        round.insert(a, setting);
    }
    Ok(())
}

/// One setting for one address: its own row, else its domain's, else `global`.
pub async fn lookup(
    pool: &PgPool,
    address: &str,
    name: &str,
    global: Option<Value>,
) -> Result<Option<Setting>, sqlx::Error> {
    let table = fetch(pool, &lookup_keys(address), &[name]).await?;
    Ok(table.resolve_or(address, name, global))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_most_specific_first() {
        assert_eq!(
            lookup_keys("Alice@Example.ORG"),
            ["alice@example.org", "@example.org"]
        );
        assert_eq!(lookup_keys("@Example.org."), ["@example.org"]);
        assert_eq!(lookup_keys("example.org"), ["@example.org"]);
    }

    #[test]
    fn resolve_falls_back_address_domain_global() {
        let t = SettingsTable::from_rows([
            ("alice@example.org".into(), "x".into(), json!(1)),
            ("@example.org".into(), "x".into(), json!(2)),
            ("@example.org".into(), "y".into(), json!(3)),
        ]);
        let check = |addr: &str, name: &str, expected: Option<(Value, SettingSource)>| {
            let got = t
                .resolve_or(addr, name, Some(json!("g")))
                .map(|s| (s.value, s.source));
            assert_eq!(got, expected, "{addr} {name}");
        };
        check(
            "ALICE@example.org",
            "x",
            Some((json!(1), SettingSource::Address("alice@example.org".into()))),
        );
        check(
            "bob@example.org",
            "x",
            Some((json!(2), SettingSource::Domain("example.org".into()))),
        );
        check(
            "alice@example.org",
            "y",
            Some((json!(3), SettingSource::Domain("example.org".into()))),
        );
        check(
            "alice@other.test",
            "x",
            Some((json!("g"), SettingSource::Global)),
        );
        assert_eq!(t.resolve("alice@other.test", "x"), None);
    }
}
