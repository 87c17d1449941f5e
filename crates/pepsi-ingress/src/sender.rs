//! Sender-login binding: the sender addresses an authenticated login may use, in MAIL FROM
//! and in the From header field (`SENDER_LOGIN_BINDING`, docs/ingress.md).
//!
//! A login owns: its own address (with or without a recipient-delimiter extension); every
//! address and `@domain` its `send_as` setting lists (a domain there means every address of
//! it: the domain's administrator); every address whose `alias` setting delivers to it (an
//! alias the account is a target of). The null sender is always allowed (a client's own
//! bounce or receipt). `owns` is the pure rule, tested as a table; `check` is the one query
//! around it.
//!
//! The From field must name the author unambiguously for the rule to mean anything: under
//! the binding, an authenticated message has exactly one From field naming exactly one
//! address (`sole_author`); a missing, repeated, group or unparsable From is refused
//! rather than passed with nothing to check.

use pepsi_conf::address::{self, Address};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::settings::{self, SettingsTable, address_list};
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
    let domain = Address::parse(&candidate)
        .ok()
        .map(|a| a.domain().to_owned());
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

/// The one author address of a header block, as SENDER_LOGIN_BINDING needs it: exactly one
/// From field, naming exactly one mailbox with an address. The error says what is wrong
/// (for the client's reply: ASCII, the field's text shortened). Pure.
pub fn sole_author(headers: &[u8]) -> Result<String, String> {
    let fields = pepsi_contract::message::field_values(headers, "From");
    let value = match fields.as_slice() {
        [] => return Err("the message has no From field".into()),
        [one] => one,
        many => return Err(format!("the message has {} From fields", many.len())),
    };
    let shown: String = value
        .chars()
        .take(80)
        .collect::<String>()
        .escape_default()
        .to_string();
    let unparsable = || format!("the From field \"{shown}\" names no address");
    let mut block = headers.to_vec();
    block.extend_from_slice(b"\r\n");
    let parsed = mail_parser::MessageParser::default().parse_headers(&block);
    match parsed.as_ref().and_then(|m| m.from()) {
        Some(mail_parser::Address::List(list)) => match list.as_slice() {
            [one] => one
                .address()
                .filter(|a| address::parts(a).is_some_and(|(l, d)| !l.is_empty() && !d.is_empty()))
                .map(str::to_owned)
                .ok_or_else(unparsable),
            [] => Err(unparsable()),
            many => Err(format!(
                "the From field names {} addresses ({}), not one",
                many.len(),
                many.iter()
                    .map(|a| a.address().unwrap_or("?").escape_default().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        },
        Some(mail_parser::Address::Group(_)) => Err(format!(
            "the From field \"{shown}\" is a group, not one address"
        )),
        None => Err(unparsable()),
    }
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
    fn sole_author_table() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("From: alice@example.test\r\n", Ok("alice@example.test")),
            (
                "Subject: s\r\nFrom: Alice <Alice@Example.test>\r\nTo: b@x.test\r\n",
                Ok("Alice@Example.test"),
            ),
            (
                "From: \"Alice\"\r\n <alice@example.test>\r\n",
                Ok("alice@example.test"),
            ),
            ("Subject: s\r\n", Err("the message has no From field")),
            (
                "From: a@example.test\r\nfrom: b@example.test\r\n",
                Err("the message has 2 From fields"),
            ),
            ("From: undisclosed:;\r\n", Err("is a group")),
            ("From: team: alice@example.test;\r\n", Err("is a group")),
            ("From: Alice\r\n", Err("names no address")),
            ("From: <>\r\n", Err("names no address")),
            ("From: \r\n", Err("names no address")),
            ("From: @example.test\r\n", Err("names no address")),
            (
                "From: a@example.test, ceo@example.test\r\n",
                Err("names 2 addresses (a@example.test, ceo@example.test)"),
            ),
        ];
        for (headers, want) in cases {
            match (sole_author(headers.as_bytes()), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{headers:?}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{headers:?}: {got}"),
                (got, want) => panic!("{headers:?}: {got:?}, wanted {want:?}"),
            }
        }
        let odd = sole_author("From: Ärger\u{7}\r\n".as_bytes()).unwrap_err();
        assert!(odd.is_ascii() && odd.contains("\\u{c4}rger\\u{7}"), "{odd}");
    }

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
