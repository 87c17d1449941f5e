//! Administrative writes outside the queue: mailbox accounts (`pepsi.mailbox_account`,
//! `pepsi.mailbox_password`), settings-layer rows (`pepsi.settings`: aliases, catch-alls,
//! local domains, every name of `KNOWN_SETTINGS`) and configuration overrides
//! (`pepsi.config_override`, validated by the caller with `config::check_override`). Each change runs in one transaction together with its `pepsi.event_log`
//! row (`audit::record`), so the log is complete whichever surface acted (pepsi-httpd's API
//! today, an operator tool tomorrow).
//!
//! It is also the one definition the operator tools and pepsi-httpd share for reading these
//! back and for the input of overrides: `applied_settings` (what applies to an address, as
//! its readers look it up), `override_scope` and `override_names`.
//!
//! Inputs are validated here, where they enter the database: addresses and domains are
//! normalized (`address::normalize_domain`: lower-case, IDN as punycode) and bounded in length.
//! Password hashing is the caller's (`password::hash_password`, on the blocking pool): this
//! module stores a hash and never sees a password. Every statement is a constant with bound
//! parameters.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::{PgPool, Row as _};

use pepsi_conf::address::normalize_domain;
use pepsi_conf::config::Scope;
use pepsi_contract::audit::{self, Actor};
use pepsi_contract::local::LOCAL_DOMAIN_SETTING;
use pepsi_contract::settings::{self, Setting, SettingSource};

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
    let (local, dom) = pepsi_conf::address::parts(t).ok_or_else(|| bad("no @"))?;
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

/// Enables or disables the mailbox `address` (a disabled mailbox receives no mail and
/// cannot log in); `account.enable` / `account.disable`. Returns false when it was already
/// so (nothing written).
pub async fn set_account_enabled(
    pool: &PgPool,
    actor: &Actor,
    address: &str,
    enabled: bool,
) -> Result<bool, AdminError> {
    let mut tx = pool.begin().await?;
    let was: Option<bool> = sqlx::query_scalar(
        "SELECT enabled FROM pepsi.mailbox_account WHERE address = $1 FOR UPDATE",
    )
    .bind(address)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(was) = was else {
        return Err(AdminError::NotFound(format!(
            "there is no mailbox {address}"
        )));
    };
    if was == enabled {
        tx.rollback().await?;
        return Ok(false);
    }
    sqlx::query("UPDATE pepsi.mailbox_account SET enabled = $2 WHERE address = $1")
        .bind(address)
        .bind(enabled)
        .execute(&mut *tx)
        .await?;
    let action = if enabled {
        "account.enable"
    } else {
        "account.disable"
    };
    audit::record(&mut tx, actor, action, None, json!({"address": address})).await?;
    tx.commit().await?;
    Ok(true)
}

/// What the key of a settings row must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    /// An address (`alice@example.org`).
    Address,
    /// A domain key (`@example.org`).
    Domain,
    /// Either: an address's own value, or every address of a domain.
    Either,
}

/// What the value of a settings row must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueKind {
    /// JSON `true`.
    True,
    /// A list of addresses, stored as a JSON list of normalized addresses.
    Addresses,
    /// A list of addresses and `@domain`s.
    AddressesOrDomains,
    /// An automatic reply: a JSON object (`settings::vacation::Vacation`).
    Vacation,
    /// Blocked languages: a JSON object (`settings::block_languages::LanguageBlock`).
    LanguageBlock,
    /// A confirm-to-send secretary: a JSON object (`settings::secretary::Secretary`).
    Secretary,
    /// Consent to pay postage: a JSON object (`settings::auto_pay::AutoPay`).
    AutoPay,
}

/// A settings name the software reads, with the shape of its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KnownSetting {
    pub name: &'static str,
    pub key: KeyKind,
    pub value: ValueKind,
    /// Who reads it, for the operator.
    pub read_by: &'static str,
    pub what: &'static str,
}

/// Every settings name a Pepsi program reads (docs/local.md). A stage that reads a new name
/// adds it here, so operator tools can validate rows where they enter.
pub const KNOWN_SETTINGS: &[KnownSetting] = &[
    KnownSetting {
        name: LOCAL_DOMAIN_SETTING,
        key: KeyKind::Domain,
        value: ValueKind::True,
        read_by: "every local-domain check",
        what: "the domain is local (its mail is delivered here)",
    },
    KnownSetting {
        name: "alias",
        key: KeyKind::Address,
        value: ValueKind::Addresses,
        read_by: "pepsi-stage-aliases",
        what: "mail to the address goes to these addresses instead",
    },
    KnownSetting {
        name: "catchall",
        key: KeyKind::Domain,
        value: ValueKind::Addresses,
        read_by: "pepsi-stage-aliases",
        what: "mail to an unknown address of the domain goes to these addresses",
    },
    KnownSetting {
        name: "send_as",
        key: KeyKind::Address,
        value: ValueKind::AddressesOrDomains,
        read_by: "pepsi-ingress (SENDER_LOGIN_BINDING)",
        what: "the login may also send as these addresses and every address of these @domains",
    },
    KnownSetting {
        name: pepsi_contract::settings::vacation::VACATION_SETTING,
        key: KeyKind::Address,
        value: ValueKind::Vacation,
        read_by: "pepsi-stage-vacation",
        what: "answer mail to the address automatically: a JSON object with text and, optionally, subject, start and end (YYYY-MM-DD), days between replies to one sender (default 7) and further addresses of the owner",
    },
    KnownSetting {
        name: pepsi_contract::settings::block_languages::BLOCK_SETTING,
        key: KeyKind::Either,
        value: ValueKind::LanguageBlock,
        read_by: "pepsi-stage-block-language",
        what: "mail in these languages is refused (a DSN) or delivered to the Junk folder: a JSON object with languages (ISO 639-1 codes) and action (refuse, the default, or junk); on @domain, for every address of the domain without a row of its own",
    },
    KnownSetting {
        name: pepsi_contract::settings::secretary::SECRETARY_SETTING,
        key: KeyKind::Address,
        value: ValueKind::Secretary,
        read_by: "pepsi-stage-secretary",
        what: "hold mail from senders the mailbox does not trust until they confirm (or pay postage): a JSON object, {} for the defaults, with unauthenticated and automated (hold, junk or deliver), expire_days (14), challenge_days (7), digest_days (1) and postage (CURRENCY:VALUE)",
    },
    KnownSetting {
        name: pepsi_contract::settings::auto_pay::AUTO_PAY_SETTING,
        key: KeyKind::Address,
        value: ValueKind::AutoPay,
        read_by: "pepsi-stage-auto-pay",
        what: "pay the postage a recipient's secretary asks of the user's mail, within limits: a JSON object with per_payment and per_month (CURRENCY:VALUE)",
    },
];

/// The known setting `name`, or an error listing the known ones.
pub fn known_setting(name: &str) -> Result<&'static KnownSetting, AdminError> {
    KNOWN_SETTINGS
        .iter()
        .find(|k| k.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = KNOWN_SETTINGS.iter().map(|k| k.name).collect();
            AdminError::Invalid(format!(
                "setting {name:?} is not one Pepsi reads (known: {})",
                names.join(", ")
            ))
        })
}

/// A settings key as stored: `@domain` normalized, or an address normalized; checked
/// against what `known` accepts.
pub fn setting_key(known: &KnownSetting, text: &str) -> Result<String, AdminError> {
    let key = match text.trim().strip_prefix('@') {
        Some(d) => format!("@{}", domain(d, "key")?),
        None => address(text, "key")?,
    };
    let is_domain = key.starts_with('@');
    match (known.key, is_domain) {
        (KeyKind::Address, true) => Err(AdminError::Invalid(format!(
            "setting {} belongs to an address, not to a domain ({key})",
            known.name
        ))),
        (KeyKind::Domain, false) => Err(AdminError::Invalid(format!(
            "setting {} belongs to a domain, written @domain, not to an address ({key})",
            known.name
        ))),
        _ => Ok(key),
    }
}

/// The value to store for `known` from the operator's words: `yes`/`true` for a flag; for
/// a list, each word an address (or `@domain` where allowed), commas also separating.
pub fn setting_value(known: &KnownSetting, words: &[String]) -> Result<Value, AdminError> {
    let name = known.name;
    match known.value {
        ValueKind::True => match words {
            [w] if matches!(w.to_ascii_lowercase().as_str(), "true" | "yes" | "on" | "1") => {
                Ok(json!(true))
            }
            _ => Err(AdminError::Invalid(format!(
                "setting {name} takes the value yes (delete the row to turn it off), not {:?}",
                words.join(" ")
            ))),
        },
        ValueKind::Vacation => {
            let value = json_object(name, words, "{\"text\": \"I am away\"}")?;
            let mut v = pepsi_contract::settings::vacation::Vacation::from_value(&value)
                .map_err(AdminError::Invalid)?;
            let mut addresses = Vec::with_capacity(v.addresses.len());
            for (i, a) in v.addresses.iter().enumerate() {
                addresses.push(address(a, &format!("{name} address {}", i + 1))?);
            }
            v.addresses = addresses;
            Ok(serde_json::to_value(&v).expect("a plain struct"))
        }
        ValueKind::LanguageBlock => {
            let value = json_object(name, words, "{\"languages\": [\"ru\"]}")?;
            let block =
                pepsi_contract::settings::block_languages::LanguageBlock::from_value(&value)
                    .map_err(AdminError::Invalid)?;
            Ok(serde_json::to_value(&block).expect("a plain struct"))
        }
        ValueKind::Secretary => {
            let value = json_object(name, words, "{}")?;
            let s = pepsi_contract::settings::secretary::Secretary::from_value(&value)
                .map_err(AdminError::Invalid)?;
            Ok(serde_json::to_value(&s).expect("a plain struct"))
        }
        ValueKind::AutoPay => {
            let value = json_object(
                name,
                words,
                "{\"per_payment\": \"KUDOS:1\", \"per_month\": \"KUDOS:10\"}",
            )?;
            let a = pepsi_contract::settings::auto_pay::AutoPay::from_value(&value)
                .map_err(AdminError::Invalid)?;
            Ok(serde_json::to_value(&a).expect("a plain struct"))
        }
        ValueKind::Addresses | ValueKind::AddressesOrDomains => {
            let items: Vec<&str> = words
                .iter()
                .flat_map(|w| w.split(','))
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .collect();
            if items.is_empty() || items.len() > MAX_ALIAS_TARGETS {
                return Err(AdminError::Invalid(format!(
                    "setting {name} takes 1 to {MAX_ALIAS_TARGETS} addresses, got {}",
                    items.len()
                )));
            }
            let mut out = Vec::with_capacity(items.len());
            for (i, t) in items.iter().enumerate() {
                let what = format!("{name} value {}", i + 1);
                let v = match t.strip_prefix('@') {
                    Some(d) if known.value == ValueKind::AddressesOrDomains => {
                        format!("@{}", domain(d, &what)?)
                    }
                    _ => address(t.trim_start_matches('<').trim_end_matches('>'), &what)?,
                };
                if !out.contains(&v) {
                    out.push(v);
                }
            }
            Ok(json!(out))
        }
    }
}

/// The operator's words as the JSON object a setting `name` takes (`example` shows one).
fn json_object(name: &str, words: &[String], example: &str) -> Result<Value, AdminError> {
    serde_json::from_str(&words.join(" ")).map_err(|e| {
        AdminError::Invalid(format!(
            "setting {name} takes a JSON object such as {example}: {e}"
        ))
    })
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

/// One setting that applies to an address, and the row it comes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Applied {
    pub name: String,
    pub value: Value,
    /// The key of the row: the address itself or `@domain` (`configuration` for a value of
    /// the configuration file).
    pub from: String,
}

impl Applied {
    pub fn new(name: &str, s: Setting) -> Self {
        let from = match s.source {
            SettingSource::Address(a) => a,
            SettingSource::Domain(d) => format!("@{d}"),
            SettingSource::Global => "configuration".into(),
        };
        Applied {
            name: name.into(),
            value: s.value,
            from,
        }
    }
}

/// What applies to one address or `@domain`: its mailbox and each known setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AddressSettings {
    /// The address (or `@domain`) as stored.
    pub address: String,
    /// The mailbox account, when the address has one.
    pub account: Option<Account>,
    /// The known settings that apply, in `KNOWN_SETTINGS` order.
    pub settings: Vec<Applied>,
}

/// What applies to `text` (an address or `@domain`, normalized here; `Invalid` otherwise):
/// each known setting looked up the way its reader does — an address's own row for an
/// `Address` setting, the domain's row for a `Domain` one, the address's row else its
/// domain's for `Either` — with the row it comes from. One query for the settings.
pub async fn applied_settings(pool: &PgPool, text: &str) -> Result<AddressSettings, AdminError> {
    let text = text.trim();
    let address = match text.strip_prefix('@') {
        Some(d) => format!("@{}", domain(d, "address")?),
        None => address(text, "address")?,
    };
    let account = if address.starts_with('@') {
        None
    } else {
        list_accounts(pool, Some(&address), 100)
            .await?
            .into_iter()
            .find(|acc| acc.address == address)
    };
    let names: Vec<&str> = KNOWN_SETTINGS.iter().map(|k| k.name).collect();
    let table = settings::fetch(pool, &settings::lookup_keys(&address), &names).await?;
    let domain_key = pepsi_conf::address::domain_part(&address).map(|d| format!("@{d}"));
    let applied = KNOWN_SETTINGS
        .iter()
        .filter_map(|k| {
            let exact = |key: &str| {
                table.exact(key, k.name).map(|value| Setting {
                    value: value.clone(),
                    source: match key.strip_prefix('@') {
                        Some(d) => SettingSource::Domain(d.to_owned()),
                        None => SettingSource::Address(key.to_owned()),
                    },
                })
            };
            let s = match k.key {
                KeyKind::Address => exact(&address),
                KeyKind::Domain => exact(domain_key.as_deref()?),
                KeyKind::Either => table.resolve(&address, k.name),
            }?;
            Some(Applied::new(k.name, s))
        })
        .collect();
    Ok(AddressSettings {
        address,
        account,
        settings: applied,
    })
}

/// An override's scope as stored: `global`, `domain:DOMAIN` or `address:ADDRESS`, the
/// name normalized (lower case, IDN as punycode); `Invalid` naming the text otherwise.
pub fn override_scope(text: &str) -> Result<Scope, AdminError> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("global") {
        return Ok(Scope::Global);
    }
    match t.split_once(':') {
        Some((kind, name)) if kind.eq_ignore_ascii_case("domain") => {
            Ok(Scope::Domain(domain(name, "scope")?))
        }
        Some((kind, name)) if kind.eq_ignore_ascii_case("address") => {
            Ok(Scope::Address(address(name, "scope")?))
        }
        _ => Err(AdminError::Invalid(format!(
            "scope {t:?} is not global, domain:DOMAIN or address:ADDRESS"
        ))),
    }
}

/// An override's section and option as stored: the section lower-case, the option
/// upper-case, both 1 to 100 letters, digits, `-`, `_` and `.`.
pub fn override_names(section: &str, option: &str) -> Result<(String, String), AdminError> {
    let ok = |t: &str| {
        !t.is_empty()
            && t.len() <= 100
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    let (s, o) = (section.trim(), option.trim());
    if !ok(s) {
        return Err(AdminError::Invalid(format!(
            "section {section:?} is not a section name (letters, digits, -, _ and .)"
        )));
    }
    if !ok(o) {
        return Err(AdminError::Invalid(format!(
            "option {option:?} is not an option name (letters, digits, -, _ and .)"
        )));
    }
    Ok((s.to_ascii_lowercase(), o.to_ascii_uppercase()))
}

/// An override's value: one line, as in the file.
pub fn override_value(value: &str) -> Result<&str, AdminError> {
    if value.contains(['\n', '\r', '\0']) {
        return Err(AdminError::Invalid(
            "the value holds a line break or NUL: a configuration value is one line".into(),
        ));
    }
    Ok(value)
}

/// A row of `pepsi.config_override` as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverrideListing {
    pub scope: String,
    pub section: String,
    pub option: String,
    pub value: String,
    pub updated_at: DateTime<Utc>,
    pub updated_by: String,
}

/// The overrides of `scope` (a stored scope string), or every one when `None`, in scope,
/// section and option order.
pub async fn list_overrides(
    pool: &PgPool,
    scope: Option<&str>,
) -> Result<Vec<OverrideListing>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT scope, section, option, value, updated_at, updated_by \
         FROM pepsi.config_override WHERE $1::text IS NULL OR lower(scope) = lower($1) \
         ORDER BY lower(scope), lower(section), upper(option)",
    )
    .bind(scope)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(OverrideListing {
                scope: r.try_get("scope")?,
                section: r.try_get("section")?,
                option: r.try_get("option")?,
                value: r.try_get("value")?,
                updated_at: r.try_get("updated_at")?,
                updated_by: r.try_get("updated_by")?,
            })
        })
        .collect()
}

/// Deletes the rows of `option` of `section` in `scope` in any letter case, returning the
/// value of one: what `put_override` replaces and `delete_override` removes.
async fn take_override(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    scope: &str,
    section: &str,
    option: &str,
) -> Result<Option<String>, sqlx::Error> {
    let values: Vec<String> = sqlx::query_scalar(
        "DELETE FROM pepsi.config_override \
         WHERE lower(scope) = lower($1) AND lower(section) = lower($2) AND upper(option) = upper($3) \
         RETURNING value",
    )
    .bind(scope)
    .bind(section)
    .bind(option)
    .fetch_all(&mut **tx)
    .await?;
    Ok(values.into_iter().next())
}

/// Stores `value` for `option` of `section` in `scope` (already validated by the caller:
/// `config::check_override`), replacing any row that differs only in letter case, so one
/// option has one row; `config.set` with the previous value. The table's trigger
/// announces the change on `config_changed` when the transaction commits. Returns the
/// previous value.
pub async fn put_override(
    pool: &PgPool,
    actor: &Actor,
    scope: &str,
    section: &str,
    option: &str,
    value: &str,
) -> Result<Option<String>, AdminError> {
    let mut tx = pool.begin().await?;
    let previous = take_override(&mut tx, scope, section, option).await?;
    sqlx::query(
        "INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ($1, $2, $3, $4)",
    )
    .bind(scope)
    .bind(section)
    .bind(option)
    .bind(value)
    .execute(&mut *tx)
    .await?;
    let detail = json!({"scope": scope, "section": section, "option": option,
                        "value": value, "previous": previous});
    audit::record(&mut tx, actor, "config.set", None, detail).await?;
    tx.commit().await?;
    Ok(previous)
}

/// Deletes the override of `option` of `section` in `scope` (any letter case);
/// `config.unset` with the value it had. `NotFound` when there is none.
pub async fn delete_override(
    pool: &PgPool,
    actor: &Actor,
    scope: &str,
    section: &str,
    option: &str,
) -> Result<String, AdminError> {
    let mut tx = pool.begin().await?;
    let Some(previous) = take_override(&mut tx, scope, section, option).await? else {
        return Err(AdminError::NotFound(format!(
            "there is no override of [{section}] {option} for scope {scope}"
        )));
    };
    let detail = json!({"scope": scope, "section": section, "option": option,
                        "previous": previous});
    audit::record(&mut tx, actor, "config.unset", None, detail).await?;
    tx.commit().await?;
    Ok(previous)
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
    fn override_scopes_and_names_are_normalized_or_refused_naming_the_text() {
        let scopes = [
            ("global", Ok("global")),
            (" GLOBAL ", Ok("global")),
            ("domain:Example.ORG", Ok("domain:example.org")),
            (
                "address:Alice@Bücher.example",
                Ok("address:alice@xn--bcher-kva.example"),
            ),
            (
                "domain:localhost",
                Err("scope \"localhost\" is not a domain name"),
            ),
            ("address:alice", Err("scope \"alice\" is not an address")),
            (
                "site:x.example",
                Err("\"site:x.example\" is not global, domain:DOMAIN"),
            ),
        ];
        for (text, want) in scopes {
            let got = override_scope(text)
                .map(|s| s.to_db_string())
                .map_err(|e| e.to_string());
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{text}"),
                (Err(g), Err(w)) => assert!(g.contains(w), "{text}: {g}"),
                (g, w) => panic!("{text}: got {g:?}, want {w:?}"),
            }
        }
        assert_eq!(
            override_names(" Stage-Relay ", "parallelism").unwrap(),
            ("stage-relay".into(), "PARALLELISM".into())
        );
        let e = override_names("stage relay", "X").unwrap_err().to_string();
        assert!(e.starts_with("section \"stage relay\""), "{e}");
        let e = override_names("pepsi", "").unwrap_err().to_string();
        assert!(e.starts_with("option \"\""), "{e}");
        assert!(override_value("4").is_ok());
        assert!(override_value("4\nX = 5").is_err());
    }

    #[test]
    fn setting_keys_and_values_are_checked_against_the_known_shape() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // (name, key, value words, stored key and value, or the error's words)
        type Case<'a> = (
            &'a str,
            &'a str,
            &'a [&'a str],
            Result<(&'a str, Value), &'a str>,
        );
        let cases: &[Case] = &[
            (
                "alias",
                "Team@Example.ORG",
                &["a@x.example", "B@X.example"],
                Ok(("team@example.org", json!(["a@x.example", "b@x.example"]))),
            ),
            (
                "alias",
                "team@example.org",
                &["a@x.example,b@x.example", "a@x.example"],
                Ok(("team@example.org", json!(["a@x.example", "b@x.example"]))),
            ),
            (
                "alias",
                "team@example.org",
                &["<a@x.example>"],
                Ok(("team@example.org", json!(["a@x.example"]))),
            ),
            (
                "alias",
                "@example.org",
                &["a@x.example"],
                Err("belongs to an address"),
            ),
            (
                "alias",
                "team@example.org",
                &["@x.example"],
                Err("alias value 1"),
            ),
            (
                "alias",
                "team@example.org",
                &[","],
                Err("takes 1 to 1000 addresses, got 0"),
            ),
            (
                "catchall",
                "@Example.org",
                &["a@x.example"],
                Ok(("@example.org", json!(["a@x.example"]))),
            ),
            (
                "catchall",
                "a@example.org",
                &["a@x.example"],
                Err("belongs to a domain"),
            ),
            (
                "local_domain",
                "@bücher.example",
                &["yes"],
                Ok(("@xn--bcher-kva.example", json!(true))),
            ),
            (
                "local_domain",
                "@x.example",
                &["no"],
                Err("takes the value yes"),
            ),
            (
                "local_domain",
                "@x.example",
                &["yes", "yes"],
                Err("takes the value yes"),
            ),
            (
                "send_as",
                "a@example.org",
                &["@Ops.example", "b@x.example"],
                Ok(("a@example.org", json!(["@ops.example", "b@x.example"]))),
            ),
            (
                "send_as",
                "a@example.org",
                &["@-bad"],
                Err("send_as value 1"),
            ),
            (
                "colour",
                "a@example.org",
                &["blue"],
                Err("is not one Pepsi reads (known: local_domain"),
            ),
        ];
        for (name, key, value, want) in cases {
            let got = known_setting(name)
                .and_then(|k| Ok((setting_key(k, key)?, setting_value(k, &words(value))?)));
            match (got, want) {
                (Ok((k, v)), Ok((wk, wv))) => {
                    assert_eq!((k.as_str(), &v), (*wk, wv), "{name} {key} {value:?}")
                }
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{name} {key}: {e}"),
                (got, want) => panic!("{name} {key} {value:?}: {got:?}, wanted {want:?}"),
            }
        }
        let many: Vec<String> = (0..1001).map(|i| format!("a{i}@x.example")).collect();
        let alias = known_setting("alias").unwrap();
        assert!(setting_value(alias, &many).is_err());
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
