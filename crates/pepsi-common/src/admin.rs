//! Administrative writes outside the queue: mailbox accounts (`pepsi.mailbox_account`,
//! `pepsi.mailbox_password`) and settings-layer rows (`pepsi.settings`: aliases, catch-alls,
//! local domains). Each change runs in one transaction together with its `pepsi.event_log`
//! row (`audit::record`), so the log is complete whichever surface acted (pepsi-httpd's API
//! today, an operator tool tomorrow).
//!
//! Inputs are validated here, where they enter the database: addresses and domains are
//! normalized (`local::normalize_domain`: lower-case, IDN as punycode) and bounded in length.
//! Password hashing is the caller's (`password::hash_password`, on the blocking pool): this
//! module stores a hash and never sees a password. Every statement is a constant with bound
//! parameters.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::{PgPool, Row as _};

use crate::audit::{self, Actor};
use crate::local::{LOCAL_DOMAIN_SETTING, normalize_domain};

/// The longest address accepted (RFC 5321's path limit).
pub const MAX_ADDRESS_LEN: usize = 254;
/// The most targets one alias may list.
pub const MAX_ALIAS_TARGETS: usize = 1000;

/// Why an administrative change was not made.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The input is malformed; the message names the field and the value.
    #[error("{0}")]
    Invalid(String),
    /// The thing to create exists already.
    #[error("{0}")]
    Exists(String),
    /// The thing to change or delete does not exist.
    #[error("{0}")]
    NotFound(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// A domain as stored: normalized, at most 253 characters of letters, digits, `-` and `.`
/// (an IDN becomes punycode); `what` names the field in the error.
pub fn domain(text: &str, what: &str) -> Result<String, AdminError> {
    let bad = || AdminError::Invalid(format!("{what} {text:?} is not a domain name"));
    let d = normalize_domain(text).ok_or_else(bad)?;
    let labels_ok = d.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    if d.len() > 253 || !labels_ok || !d.contains('.') {
        return Err(bad());
    }
    Ok(d)
}

/// An address as stored: `local@domain`, the local part lower-case (addresses compare
/// without case), the domain normalized; no white space, control characters, quotes or
/// angle brackets; at most `MAX_ADDRESS_LEN` characters.
pub fn address(text: &str, what: &str) -> Result<String, AdminError> {
    let bad = |why: &str| AdminError::Invalid(format!("{what} {text:?} is not an address: {why}"));
    let t = text.trim();
    let at = t.rfind('@').ok_or_else(|| bad("no @"))?;
    let (local, dom) = (&t[..at], &t[at + 1..]);
    if local.is_empty() {
        return Err(bad("empty local part"));
    }
    if local
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | '"' | '@' | ','))
    {
        return Err(bad(
            "the local part holds a character addresses here may not",
        ));
    }
    let dom = domain(dom, what).map_err(|_| bad("the domain is not a domain name"))?;
    let out = format!("{}@{dom}", local.to_lowercase());
    if out.len() > MAX_ADDRESS_LEN {
        return Err(bad("longer than 254 characters"));
    }
    Ok(out)
}

/// A mailbox account as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Account {
    pub address: String,
    pub enabled: bool,
    pub has_password: bool,
    pub created_at: DateTime<Utc>,
}

/// Mailbox accounts in address order, at most `limit`, only those containing `search` (any
/// letter case) when given.
pub async fn list_accounts(
    pool: &PgPool,
    search: Option<&str>,
    limit: i64,
) -> Result<Vec<Account>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT a.address, a.enabled, a.created_at, \
         EXISTS (SELECT 1 FROM pepsi.mailbox_password p WHERE p.address = a.address) AS has_password \
         FROM pepsi.mailbox_account a \
         WHERE $1::text IS NULL OR strpos(a.address, lower($1)) > 0 \
         ORDER BY a.address LIMIT $2",
    )
    .bind(search)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Account {
                address: r.try_get("address")?,
                enabled: r.try_get("enabled")?,
                has_password: r.try_get("has_password")?,
                created_at: r.try_get("created_at")?,
            })
        })
        .collect()
}

/// Creates the mailbox `address` (already normalized by [`address`]) with the password hash
/// `hash` when given; `account.create`.
pub async fn create_account(
    pool: &PgPool,
    actor: &Actor,
    address: &str,
    hash: Option<&str>,
    enabled: bool,
) -> Result<(), AdminError> {
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO pepsi.mailbox_account (address, enabled) VALUES ($1, $2) \
         ON CONFLICT (address) DO NOTHING",
    )
    .bind(address)
    .bind(enabled)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Err(AdminError::Exists(format!(
            "mailbox {address} exists already"
        )));
    }
    if let Some(hash) = hash {
        sqlx::query("INSERT INTO pepsi.mailbox_password (address, password_hash) VALUES ($1, $2)")
            .bind(address)
            .bind(hash)
            .execute(&mut *tx)
            .await?;
    }
    let detail = json!({"address": address, "enabled": enabled, "password": hash.is_some()});
    audit::record(&mut tx, actor, "account.create", None, detail).await?;
    tx.commit().await?;
    Ok(())
}

/// Deletes the mailbox `address` and its password; `account.delete`.
pub async fn delete_account(pool: &PgPool, actor: &Actor, address: &str) -> Result<(), AdminError> {
    let mut tx = pool.begin().await?;
    let gone = sqlx::query("DELETE FROM pepsi.mailbox_account WHERE address = $1")
        .bind(address)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if gone == 0 {
        return Err(AdminError::NotFound(format!(
            "there is no mailbox {address}"
        )));
    }
    audit::record(
        &mut tx,
        actor,
        "account.delete",
        None,
        json!({"address": address}),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Sets (or replaces) the password hash of the mailbox `address`; `account.password` (the
/// event records that it changed, never the hash).
pub async fn set_account_password(
    pool: &PgPool,
    actor: &Actor,
    address: &str,
    hash: &str,
) -> Result<(), AdminError> {
    let mut tx = pool.begin().await?;
    let exists: Option<String> = sqlx::query_scalar(
        "SELECT address FROM pepsi.mailbox_account WHERE address = $1 FOR UPDATE",
    )
    .bind(address)
    .fetch_optional(&mut *tx)
    .await?;
    if exists.is_none() {
        return Err(AdminError::NotFound(format!(
            "there is no mailbox {address}"
        )));
    }
    sqlx::query(
        "INSERT INTO pepsi.mailbox_password (address, password_hash) VALUES ($1, $2) \
         ON CONFLICT (address) DO UPDATE SET password_hash = EXCLUDED.password_hash, updated_at = now()",
    )
    .bind(address)
    .bind(hash)
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        actor,
        "account.password",
        None,
        json!({"address": address}),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// One settings-layer row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SettingRow {
    pub address: String,
    pub name: String,
    pub value: Value,
    pub updated_at: DateTime<Utc>,
}

/// The rows of the settings named `names`, in address order, at most `limit`.
pub async fn list_settings(
    pool: &PgPool,
    names: &[&str],
    limit: i64,
) -> Result<Vec<SettingRow>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT address, name, value, updated_at FROM pepsi.settings \
         WHERE name = ANY ($1) ORDER BY address, name LIMIT $2",
    )
    .bind(names)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(SettingRow {
                address: r.try_get("address")?,
                name: r.try_get("name")?,
                value: r.try_get("value")?,
                updated_at: r.try_get("updated_at")?,
            })
        })
        .collect()
}

/// Stores setting `name` = `value` for `key` (a lower-case address or `@domain`); returns
/// true when the row is new. `settings.set`, with the previous value.
pub async fn put_setting(
    pool: &PgPool,
    actor: &Actor,
    key: &str,
    name: &str,
    value: &Value,
) -> Result<bool, AdminError> {
    let mut tx = pool.begin().await?;
    let previous: Option<Value> = sqlx::query_scalar(
        "SELECT value FROM pepsi.settings WHERE address = $1 AND name = $2 FOR UPDATE",
    )
    .bind(key)
    .bind(name)
    .fetch_optional(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO pepsi.settings (address, name, value) VALUES ($1, $2, $3) \
         ON CONFLICT (address, name) DO UPDATE SET value = EXCLUDED.value, updated_at = now()",
    )
    .bind(key)
    .bind(name)
    .bind(value)
    .execute(&mut *tx)
    .await?;
    let detail = json!({"address": key, "name": name, "value": value, "previous": previous});
    audit::record(&mut tx, actor, "settings.set", None, detail).await?;
    tx.commit().await?;
    Ok(previous.is_none())
}

/// Deletes setting `name` of `key`; `settings.delete` with the value it had. `NotFound`
/// when there is no such row.
pub async fn delete_setting(
    pool: &PgPool,
    actor: &Actor,
    key: &str,
    name: &str,
) -> Result<(), AdminError> {
    let mut tx = pool.begin().await?;
    let previous: Option<Value> = sqlx::query_scalar(
        "DELETE FROM pepsi.settings WHERE address = $1 AND name = $2 RETURNING value",
    )
    .bind(key)
    .bind(name)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(previous) = previous else {
        return Err(AdminError::NotFound(format!("{key} has no {name} setting")));
    };
    let detail = json!({"address": key, "name": name, "previous": previous});
    audit::record(&mut tx, actor, "settings.delete", None, detail).await?;
    tx.commit().await?;
    Ok(())
}

/// The settings-layer key of a local domain, and the setting that marks it.
pub fn local_domain_key(domain: &str) -> (String, &'static str) {
    (format!("@{domain}"), LOCAL_DOMAIN_SETTING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_normalized_or_refused_naming_the_field() {
        let ok = [
            ("Alice@Example.ORG", "alice@example.org"),
            (" bob@example.org. ", "bob@example.org"),
            ("k@bücher.example", "k@xn--bcher-kva.example"),
            ("a+b@x.example", "a+b@x.example"),
        ];
        for (input, want) in ok {
            assert_eq!(address(input, "address").unwrap(), want, "{input}");
        }
        let bad = [
            ("alice", "no @"),
            ("@example.org", "empty local part"),
            ("a b@example.org", "holds a character"),
            ("a\"b@example.org", "holds a character"),
            ("a@localhost", "the domain"),
            ("a@-x.example", "the domain"),
            ("a@exa mple.org", "the domain"),
        ];
        for (input, why) in bad {
            let e = address(input, "address").unwrap_err().to_string();
            assert!(e.starts_with("address "), "{e}");
            assert!(e.contains(why), "{input}: {e}");
        }
        let long = format!("{}@example.org", "a".repeat(250));
        assert!(address(&long, "address").is_err());
    }

    #[test]
    fn domains_are_normalized_or_refused() {
        let cases = [
            ("Example.ORG", Some("example.org")),
            ("example.org.", Some("example.org")),
            ("bücher.example", Some("xn--bcher-kva.example")),
            ("nodot", None),
            ("a..b", None),
            ("x_y.example", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(domain(input, "domain").ok().as_deref(), want, "{input}");
        }
    }
}
