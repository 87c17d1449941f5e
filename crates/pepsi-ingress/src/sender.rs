//! Sender-login binding: the sender addresses an authenticated login may use, in MAIL FROM
//! and in the From header field (`SENDER_LOGIN_BINDING`, docs/ingress.md).
//!
//! A login owns: its own address (with or without a recipient-delimiter extension); every
//! address and `@domain` its `send_as` setting lists (a domain there means every address of
//! it: the domain's administrator); every address whose `alias` setting delivers to it (an
//! alias the account is a target of). The null sender is always allowed (a client's own
//! bounce or receipt). `owns` is the pure rule, tested as a table; `check` is the one query
//! around it.

use pepsi_common::local::{LocalRecipients, split_address};
use pepsi_common::settings::{self, SettingsTable, address_list};
use sqlx::PgPool;

/// The setting on a login listing the further addresses and `@domain`s it may send as.
pub const SEND_AS_SETTING: &str = "send_as";
/// The setting of an alias: its targets may send as the alias.
pub const ALIAS_SETTING: &str = "alias";

/// Whether `login` may use `address` as a sender, given the settings rows for the login
/// and the address (`keys` below). Pure.
pub fn owns(login: &str, address: &str, local: &LocalRecipients, table: &SettingsTable) -> bool {
    let login = login.to_lowercase();
    let candidate = local.mailbox_key(address);
    if candidate == login {
        return true;
    }
    let domain = split_address(&candidate).map(|(_, d)| d);
    let granted = table
        .exact(&login, SEND_AS_SETTING)
        .and_then(address_list)
        .unwrap_or_default();
    for entry in granted {
        let entry = entry.to_lowercase();
        match entry.strip_prefix('@') {
            Some(d) => {
                if domain.as_deref() == Some(d) {
                    return true;
                }
            }
            None => {
                if local.mailbox_key(&entry) == candidate {
                    return true;
                }
            }
        }
    }
    [address.to_lowercase(), candidate.clone()]
        .iter()
        .filter_map(|key| table.exact(key, ALIAS_SETTING).and_then(address_list))
        .flatten()
        .any(|target| local.mailbox_key(&target) == login)
}

/// The settings keys `owns` reads for `login` and `addresses`.
fn keys(login: &str, addresses: &[String], local: &LocalRecipients) -> Vec<String> {
    let mut keys = vec![login.to_lowercase()];
    for a in addresses {
        for k in [a.to_lowercase(), local.mailbox_key(a)] {
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys
}

/// The first of `addresses` that `login` does not own, if any: one query for all of them.
pub async fn first_not_owned(
    pool: &PgPool,
    local: &LocalRecipients,
    login: &str,
    addresses: &[String],
) -> Result<Option<String>, sqlx::Error> {
    let pending: Vec<String> = addresses
        .iter()
        .filter(|a| local.mailbox_key(a) != login.to_lowercase())
        .cloned()
        .collect();
    if pending.is_empty() {
        return Ok(None);
    }
    let table = settings::fetch(
        pool,
        &keys(login, &pending, local),
        &[SEND_AS_SETTING, ALIAS_SETTING],
    )
    .await?;
    Ok(pending.into_iter().find(|a| !owns(login, a, local, &table)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ownership_table() {
        let local = LocalRecipients::new(["example.test".to_owned()], "+");
        let table = SettingsTable::from_rows([
            (
                "alice@example.test".to_owned(),
                SEND_AS_SETTING.to_owned(),
                json!(["@admin.test", "Shared@Example.test"]),
            ),
            (
                "sales@example.test".to_owned(),
                ALIAS_SETTING.to_owned(),
                json!("alice@example.test, bob@example.test"),
            ),
            (
                "ceo@example.test".to_owned(),
                ALIAS_SETTING.to_owned(),
                json!(["carol@example.test"]),
            ),
        ]);
        let cases = [
            ("alice@example.test", "alice@example.test", true),
            ("alice@example.test", "Alice@EXAMPLE.test", true),
            ("alice@example.test", "alice+news@example.test", true),
            ("alice@example.test", "shared@example.test", true),
            ("alice@example.test", "anyone@admin.test", true),
            ("alice@example.test", "anyone@sub.admin.test", false),
            ("alice@example.test", "sales@example.test", true),
            ("bob@example.test", "sales@example.test", true),
            ("alice@example.test", "ceo@example.test", false),
            ("bob@example.test", "alice@example.test", false),
            ("bob@example.test", "anyone@admin.test", false),
            ("alice@example.test", "alice@example.org", false),
        ];
        for (login, address, want) in cases {
            assert_eq!(
                owns(login, address, &local, &table),
                want,
                "{login} as {address}"
            );
        }
    }
}
