//! Presentation of accounts and settings for people and for scripts: the serde shapes of
//! `--json` and the tables. Pure functions, no I/O.

use chrono::{DateTime, Utc};
use pepsi_admin::admin::{Account, Applied, KNOWN_SETTINGS, KeyKind, SettingRow, ValueKind};
use pepsi_admin::queue::json::ts;
use pepsi_conf::text::{clip, table};
use pepsi_contract::settings::address_list;
use serde::Serialize;
use serde_json::Value;

/// A value as one line: a list of addresses comma-separated, `yes` for true, else JSON.
pub fn value(v: &Value) -> String {
    match v {
        Value::Bool(true) => "yes".into(),
        Value::Array(_) | Value::String(_) => match address_list(v) {
            Some(list) => list.join(", "),
            None => v.to_string(),
        },
        other => other.to_string(),
    }
}

pub fn key_kind(k: KeyKind) -> &'static str {
    match k {
        KeyKind::Address => "address",
        KeyKind::Domain => "@domain",
        KeyKind::Either => "address or @domain",
    }
}

pub fn value_kind(v: ValueKind) -> &'static str {
    match v {
        ValueKind::True => "yes",
        ValueKind::Addresses => "addresses",
        ValueKind::AddressesOrDomains => "addresses and @domains",
        ValueKind::Vacation => "a JSON object (text, subject, start, end, days, addresses)",
        ValueKind::LanguageBlock => "a JSON object (languages, action: refuse or junk)",
        ValueKind::Secretary => {
            "a JSON object (unauthenticated, automated, expire_days, challenge_days, digest_days, postage)"
        }
        ValueKind::AutoPay => "a JSON object (per_payment, per_month)",
    }
}

pub fn accounts(rows: &[Account]) -> String {
    if rows.is_empty() {
        return "no mailboxes\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|a| {
            vec![
                a.address.clone(),
                if a.enabled { "yes" } else { "no" }.into(),
                if a.has_password { "yes" } else { "no" }.into(),
                ts(a.created_at),
            ]
        })
        .collect();
    table(
        &["ADDRESS", "ENABLED", "PASSWORD", "CREATED"],
        &[false; 4],
        &cells,
    )
}

/// An alias or catch-all as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alias {
    pub address: String,
    /// `alias` or `catchall`.
    pub kind: String,
    pub targets: Vec<String>,
    pub updated_at: DateTime<Utc>,
}

impl Alias {
    pub fn from_row(r: &SettingRow) -> Self {
        Alias {
            address: r.address.clone(),
            kind: r.name.clone(),
            targets: address_list(&r.value).unwrap_or_default(),
            updated_at: r.updated_at,
        }
    }
}

pub fn aliases(rows: &[Alias]) -> String {
    if rows.is_empty() {
        return "no aliases\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|a| {
            vec![
                a.address.clone(),
                a.kind.clone(),
                clip(&a.targets.join(", "), 80),
            ]
        })
        .collect();
    table(&["ADDRESS", "KIND", "TARGETS"], &[false; 3], &cells)
}

/// A local domain as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Domain {
    pub domain: String,
    /// `config` ([pepsi] LOCAL_DOMAINS) or `settings` (a `local_domain` row).
    pub source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<DateTime<Utc>>,
}

pub fn domains(rows: &[Domain]) -> String {
    if rows.is_empty() {
        return "no local domains\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|d| vec![d.domain.clone(), d.source.into()])
        .collect();
    table(&["DOMAIN", "SOURCE"], &[false; 2], &cells)
}

pub fn settings(rows: &[SettingRow]) -> String {
    if rows.is_empty() {
        return "no settings\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.address.clone(),
                r.name.clone(),
                clip(&value(&r.value), 80),
                ts(r.updated_at),
            ]
        })
        .collect();
    table(&["KEY", "NAME", "VALUE", "UPDATED"], &[false; 4], &cells)
}

pub fn shown(address: &str, account: Option<&Account>, applied: &[Applied]) -> String {
    let mut out = format!("{address}\n");
    match account {
        Some(a) => out.push_str(&format!(
            "  mailbox: yes, {}, {}, created {}\n",
            if a.enabled { "enabled" } else { "disabled" },
            if a.has_password {
                "with a password"
            } else {
                "without a password"
            },
            ts(a.created_at)
        )),
        None if address.starts_with('@') => {}
        None => out.push_str("  mailbox: none\n"),
    }
    if applied.is_empty() {
        out.push_str("  settings: none apply\n");
        return out;
    }
    out.push('\n');
    let cells: Vec<Vec<String>> = applied
        .iter()
        .map(|a| vec![a.name.clone(), clip(&value(&a.value), 70), a.from.clone()])
        .collect();
    out.push_str(&table(&["SETTING", "VALUE", "FROM"], &[false; 3], &cells));
    out
}

pub fn names() -> String {
    let cells: Vec<Vec<String>> = KNOWN_SETTINGS
        .iter()
        .map(|k| {
            vec![
                k.name.into(),
                key_kind(k.key).into(),
                value_kind(k.value).into(),
                k.read_by.into(),
            ]
        })
        .collect();
    table(&["NAME", "KEY", "VALUE", "READ BY"], &[false; 4], &cells)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pepsi_contract::settings::{Setting, SettingSource};
    use serde_json::json;

    #[test]
    fn values_read_as_one_line() {
        let cases = [
            (json!(true), "yes"),
            (
                json!(["a@x.example", "b@x.example"]),
                "a@x.example, b@x.example",
            ),
            (
                json!("a@x.example, b@x.example"),
                "a@x.example, b@x.example",
            ),
            (json!(7), "7"),
            (json!([]), "[]"),
        ];
        for (v, want) in cases {
            assert_eq!(value(&v), want, "{v}");
        }
    }

    #[test]
    fn show_names_the_row_each_setting_comes_from() {
        let applied = [
            Applied::new(
                "alias",
                Setting {
                    value: json!(["bob@x.example"]),
                    source: SettingSource::Address("alice@x.example".into()),
                },
            ),
            Applied::new(
                "send_as",
                Setting {
                    value: json!(["@y.example"]),
                    source: SettingSource::Domain("x.example".into()),
                },
            ),
        ];
        let out = shown("alice@x.example", None, &applied);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[1], "  mailbox: none");
        assert!(lines[4].starts_with("alias") && lines[4].ends_with("alice@x.example"));
        assert!(lines[5].starts_with("send_as") && lines[5].ends_with("@x.example"));
    }
}
