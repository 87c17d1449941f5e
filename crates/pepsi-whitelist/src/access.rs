//! Whose list a run may touch. Pure: the caller's identity and the configuration in, the
//! mailbox (or the reason there is none) out.
//!
//! An owner (a user running the installed, setuid program) works on the mailbox of their
//! account: `<account>@DOMAIN`, or with `--mailbox` another address of theirs, one whose
//! local part (without its extension) is the account name in one of the local domains. An
//! operator (root, or anyone running the program without its bit, who has the database
//! rights of the configuration already) may name any mailbox.

use pepsi_conf::address::Address;
use pepsi_contract::local::LocalRecipients;

/// Who runs the program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The real uid.
    pub uid: u32,
    /// Its account name, when the password database has one.
    pub account: Option<String>,
    /// Root, or a run without the setuid bit.
    pub operator: bool,
}

/// The rules of a run, from `[pepsi-whitelist]` and `[pepsi]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// The domain of an account's own mailbox (`DOMAIN`, else the first local domain).
    pub domain: Option<String>,
    /// Accounts below this uid have no mailbox (`MIN_UID`).
    pub min_uid: u32,
    /// The local domains and the extension delimiters.
    pub local: LocalRecipients,
}

/// The mailbox `caller` works on: the one `asked` (`--mailbox`), else their own. The error
/// is the message for the user.
pub fn mailbox(caller: &Caller, asked: Option<&str>, rules: &Rules) -> Result<String, String> {
    let owner = || -> Result<&str, String> {
        let account = caller.account.as_deref().ok_or_else(|| {
            format!(
                "uid {} has no account name; name the mailbox with --mailbox",
                caller.uid
            )
        })?;
        if caller.uid == 0 {
            return Err("root has no mailbox of its own: name one with --mailbox".into());
        }
        if caller.uid < rules.min_uid {
            return Err(format!(
                "{account} (uid {}) is a system account, below [pepsi-whitelist] MIN_UID {}: \
                 it has no mailbox",
                caller.uid, rules.min_uid
            ));
        }
        Ok(account)
    };
    let Some(asked) = asked else {
        let account = owner()?;
        let domain = rules.domain.as_deref().ok_or(
            "no domain for an account's mailbox: set [pepsi-whitelist] DOMAIN or \
             [pepsi] LOCAL_DOMAINS",
        )?;
        let key = valid(&format!("{account}@{domain}"), rules)?;
        // `alice-x` with `-` a delimiter would otherwise be given alice's mailbox.
        if !key.starts_with(&format!("{}@", account.to_lowercase())) {
            return Err(format!(
                "{account}: the name holds an address extension delimiter ([pepsi] \
                 RECIPIENT_DELIMITER), so no mailbox is this account's own"
            ));
        }
        return Ok(key);
    };
    let key = valid(asked, rules).map_err(|e| format!("--mailbox {e}"))?;
    if caller.operator {
        return Ok(key);
    }
    let account = owner()?;
    let (local, domain) = Address::parse(&key)
        .map_err(|_| format!("--mailbox {asked:?}: not an address"))?
        .into_parts();
    if local != account.to_lowercase() || !rules.local.is_configured_local(&domain) {
        return Err(format!(
            "--mailbox {asked}: not a mailbox of {account}'s; yours are {account}@ one of the \
             local domains ({})",
            rules
                .local
                .configured_domains()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(key)
}

/// `address` in the form the lists are keyed by (extension removed, lower case), when it is
/// an address.
fn valid(address: &str, rules: &Rules) -> Result<String, String> {
    let key = rules.local.mailbox_key(address);
    match pepsi_contract::whitelist::check(Some(&key)) {
        Some(c) => Ok(c.address),
        None => Err(format!("{address:?}: not an address")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            domain: Some("example.test".into()),
            min_uid: 1000,
            local: LocalRecipients::new(["example.test".into(), "other.test".into()], "+"),
        }
    }

    fn caller(uid: u32, account: Option<&str>, operator: bool) -> Caller {
        Caller {
            uid,
            account: account.map(str::to_owned),
            operator,
        }
    }

    #[test]
    fn who_gets_which_mailbox() {
        let alice = caller(1001, Some("alice"), false);
        let root = caller(0, Some("root"), true);
        let daemon = caller(2, Some("daemon"), false);
        let dev = caller(1500, Some("dev"), true);
        for (who, asked, expected) in [
            (&alice, None, Ok("alice@example.test")),
            (&alice, Some("Alice@Other.Test"), Ok("alice@other.test")),
            (
                &alice,
                Some("alice+news@example.test"),
                Ok("alice@example.test"),
            ),
            (
                &alice,
                Some("bob@example.test"),
                Err("not a mailbox of alice's"),
            ),
            (
                &alice,
                Some("alice@elsewhere.org"),
                Err("not a mailbox of alice's"),
            ),
            (&alice, Some("alice"), Err("not an address")),
            (&root, None, Err("root has no mailbox")),
            (&root, Some("bob@example.test"), Ok("bob@example.test")),
            (&root, Some("bob@elsewhere.org"), Ok("bob@elsewhere.org")),
            (&daemon, None, Err("below [pepsi-whitelist] MIN_UID 1000")),
            (&daemon, Some("daemon@example.test"), Err("MIN_UID")),
            (&dev, None, Ok("dev@example.test")),
            (&dev, Some("carol@example.test"), Ok("carol@example.test")),
            (&caller(1200, None, false), None, Err("no account name")),
            (
                &caller(1300, Some("alice+x"), false),
                None,
                Err("extension delimiter"),
            ),
            (
                &caller(1300, Some("alice+x"), false),
                Some("alice@example.test"),
                Err("not a mailbox of"),
            ),
        ] {
            match (mailbox(who, asked, &rules()), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{who:?} {asked:?}"),
                (Err(e), Err(why)) => assert!(e.contains(why), "{who:?} {asked:?}: {e}"),
                (got, want) => panic!("{who:?} {asked:?}: {got:?}, wanted {want:?}"),
            }
        }
        let no_domain = Rules {
            domain: None,
            ..rules()
        };
        let e = mailbox(&alice, None, &no_domain).unwrap_err();
        assert!(e.contains("DOMAIN"), "{e}");
    }
}
