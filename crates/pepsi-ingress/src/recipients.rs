//! `CHECK_RECIPIENTS`: which addresses of a local domain are real recipients, so mail to
//! any other is refused at RCPT (`550 5.1.1`) instead of being accepted and bounced to a
//! sender that may be forged (backscatter).
//!
//! A recipient is known when it is `postmaster` (RFC 5321 §4.5.1), an enabled mailbox
//! (`pepsi.mailbox_account`, with the recipient delimiter's extension stripped), an alias
//! (an `alias` setting, or an entry of an aliases stage's `ALIAS_FILE`), covered by a
//! catch-all of its domain (a `catchall` setting or an `@domain` entry of an alias file),
//! an SRS address (`SRS0=`/`SRS1=`: the SRS stage verifies it and returns a forged one), or
//! an address of an existing mailing list (`pepsi.mailing_list`): the list's own address
//! and its command addresses (`-join`, `-subscribe`, `-leave`, `-unsubscribe`, `-request`,
//! `-owner`, `-bounces`, VERP `+bounces-<member>`, `-confirm+<token>`), read by
//! `pepsi_contract::list`. Command addresses of a list that does not exist are unknown.
//! `known` is the pure rule, tested as a table; `is_known` is the one query around it, and
//! a second one (`is_list`) only for an address the first did not find.

use std::collections::HashSet;

use pepsi_conf::address::{self, Address};
use pepsi_conf::config::Config;
use pepsi_contract::alias_file::AliasFile;
use pepsi_contract::local::{self, LocalRecipients};
use pepsi_contract::settings::{SettingsTable, lookup_keys};
use sqlx::PgPool;

const ALIAS_SETTING: &str = "alias";
const CATCHALL_SETTING: &str = "catchall";

/// The alias files of every stage whose PROGRAM is the aliases stage, merged: what the
/// recipient check knows besides the database. Read once at start.
pub fn alias_files(cfg: &Config) -> anyhow::Result<AliasFile> {
    let mut merged = AliasFile::default();
    for stage in pepsi_contract::stage::StageOptions::stages_of(cfg, "pepsi-stage-aliases") {
        let section = cfg.stage_section_named(&stage);
        if let Some(path) = section.path_opt("ALIAS_FILE")? {
            let file = AliasFile::load(&path)
                .map_err(|e| anyhow::anyhow!("[stage-{stage}] ALIAS_FILE: {e}"))?;
            for (k, v) in file.addresses {
                merged.addresses.entry(k).or_default().extend(v);
            }
            for (k, v) in file.names {
                merged.names.entry(k).or_default().extend(v);
            }
            for (k, v) in file.catchalls {
                merged.catchalls.entry(k).or_default().extend(v);
            }
        }
    }
    Ok(merged)
}

/// Whether `address` (in a local domain) is a real recipient. Pure: `table` holds the
/// `alias` and `catchall` rows of its keys, `mailboxes` the enabled mailboxes among them.
pub fn known(
    address: &str,
    local: &LocalRecipients,
    file: &AliasFile,
    table: &SettingsTable,
    mailboxes: &HashSet<String>,
) -> bool {
    let Ok(parsed) = Address::parse(address) else {
        return false;
    };
    let lower = parsed.local().to_lowercase();
    let mailbox = local.mailbox_key(address);
    let base = address::parts(&mailbox).map_or(lower.as_str(), |(l, _)| l);
    if base == "postmaster" || lower.starts_with("srs0=") || lower.starts_with("srs1=") {
        return true;
    }
    if mailboxes.contains(&mailbox) {
        return true;
    }
    let exact = parsed.key();
    [&exact, &mailbox]
        .iter()
        .any(|k| table.exact(k, ALIAS_SETTING).is_some() || file.addresses.contains_key(k.as_str()))
        || [lower.as_str(), base]
            .iter()
            .any(|n| file.names.contains_key(*n))
        || table
            .exact(&parsed.domain_key(), CATCHALL_SETTING)
            .is_some()
        || file.catchalls.contains_key(parsed.domain())
}

/// One query for what `known` needs about `address`, then the rule; an address it does not
/// know is then looked up as a list's ([`is_list`]).
pub async fn is_known(
    pool: &PgPool,
    local: &LocalRecipients,
    file: &AliasFile,
    address: &str,
) -> Result<bool, sqlx::Error> {
    let mailbox = local.mailbox_key(address);
    let mut keys = lookup_keys(address);
    for k in lookup_keys(&mailbox) {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let (table, mailboxes) = local::recipient_facts(
        pool,
        &keys,
        &[ALIAS_SETTING, CATCHALL_SETTING],
        std::slice::from_ref(&mailbox),
    )
    .await?;
    if known(address, local, file, &table, &mailboxes) {
        return Ok(true);
    }
    is_list(pool, address).await
}

/// Whether `address` is an address of an existing mailing list (its posting address or one
/// of its command addresses). A list has no mailbox, so no mailbox quota applies to it.
pub async fn is_list(pool: &PgPool, address: &str) -> Result<bool, sqlx::Error> {
    Ok(pepsi_contract::list::existing(pool, address)
        .await?
        .is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn known_recipients_table() {
        let local =
            LocalRecipients::new(["example.test".to_owned(), "hosted.test".to_owned()], "+");
        let file = AliasFile::parse(
            "abuse: alice@example.test\nsales@example.test: bob@example.test\n@catch.test: alice@example.test\n",
        )
        .unwrap();
        let table = SettingsTable::from_rows([
            (
                "team@example.test".to_owned(),
                ALIAS_SETTING.to_owned(),
                json!("alice@example.test"),
            ),
            (
                "@hosted.test".to_owned(),
                CATCHALL_SETTING.to_owned(),
                json!("alice@example.test"),
            ),
        ]);
        let mailboxes: HashSet<String> = ["alice@example.test".to_owned()].into();
        let cases = [
            ("alice@example.test", true),
            ("Alice+news@EXAMPLE.test", true),
            ("nobody@example.test", false),
            ("postmaster@example.test", true),
            ("Postmaster+x@example.test", true),
            ("SRS0=HHHH=TT=remote.test=dest@example.test", true),
            (
                "srs1=HHHH=other.test==HHHH=TT=remote.test=dest@example.test",
                true,
            ),
            ("abuse@example.test", true),
            ("sales@example.test", true),
            ("team@example.test", true),
            ("team+x@example.test", true),
            ("anyone@hosted.test", true),
            ("anyone@catch.test", true),
            ("no-at-all", false),
        ];
        for (address, want) in cases {
            assert_eq!(
                known(address, &local, &file, &table, &mailboxes),
                want,
                "{address}"
            );
        }
    }
}
