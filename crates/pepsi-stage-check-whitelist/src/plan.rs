//! The whitelist stage's decisions, apart from the database: what a message is checked
//! against, what authenticated mail teaches, and the verdict from the entries found. Pure.

use pepsi_contract::local::LocalRecipients;

/// At most this many recipients of one message are learnt (a message to a long list
/// teaches nothing about whom its sender trusts).
pub const MAX_LEARNED: usize = 50;

/// The mailboxes of a message's recipients, the form the lists are keyed by (extension
/// removed, lower case: `Alice+news@example.test` → `alice@example.test`), each once, in
/// order.
pub fn mailboxes(rcpt_to: &[String], local: &LocalRecipients) -> Vec<String> {
    let keys: Vec<String> = rcpt_to.iter().map(|r| local.mailbox_key(r)).collect();
    pepsi_contract::local::distinct_lowercase(&keys)
}

pub use pepsi_contract::whitelist::{Check, MAX_ENTRY, check, entry};

/// What an authenticated message teaches: `mailbox` (the login that sent it) trusts
/// `senders`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Learning {
    pub mailbox: String,
    pub senders: Vec<String>,
}

/// Learning from a message: only authenticated mail (`auth_user`) with an envelope sender
/// teaches, and what it teaches is the login's: the login's mailbox (its address without
/// extension) learns the recipients as written (lower case), never its own address. The
/// envelope sender names no mailbox here: where SENDER_LOGIN_BINDING is off, a login may
/// send as anyone, and must not add entries to another user's list. `None` when there is
/// nothing to learn (also for a login that is not an address).
pub fn learning(
    auth_user: Option<&str>,
    mail_from: &str,
    rcpt_to: &[String],
    local: &LocalRecipients,
) -> Option<Learning> {
    let login = auth_user.filter(|u| !u.is_empty())?;
    if mail_from.is_empty() {
        return None;
    }
    let mailbox = check(Some(&local.mailbox_key(login)))?.address;
    let senders: Vec<String> = pepsi_contract::local::distinct_lowercase(rcpt_to)
        .into_iter()
        .filter(|r| local.mailbox_key(r) != mailbox && check(Some(r)).is_some())
        .take(MAX_LEARNED)
        .collect();
    (!senders.is_empty()).then_some(Learning { mailbox, senders })
}

/// The verdict for `mailboxes` from the `(mailbox, sender)` entries found for the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The recipients that trust the sender, in recipient order.
    pub trusted: Vec<String>,
    /// Every recipient does (and there is at least one).
    pub all: bool,
}

pub fn verdict(mailboxes: &[String], found: &[(String, String)]) -> Verdict {
    let trusted: Vec<String> = mailboxes
        .iter()
        .filter(|m| found.iter().any(|(mailbox, _)| mailbox == *m))
        .cloned()
        .collect();
    Verdict {
        all: !mailboxes.is_empty() && trusted.len() == mailboxes.len(),
        trusted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn local() -> LocalRecipients {
        LocalRecipients::new(["example.test".into()], "+")
    }

    #[test]
    fn learning_table() {
        let rcpts = v(&[
            "Carol@Example.net",
            "alice@example.test",
            "carol@example.net",
            "x",
        ]);
        // Authenticated: the login's mailbox learns each other valid recipient once.
        assert_eq!(
            learning(
                Some("alice@example.test"),
                "Alice+out@Example.test",
                &rcpts,
                &local()
            ),
            Some(Learning {
                mailbox: "alice@example.test".into(),
                senders: v(&["carol@example.net"])
            })
        );
        // Security review #11: the login learns, whatever the envelope sender says.
        assert_eq!(
            learning(
                Some("Mallory@Example.test"),
                "alice@example.test",
                &v(&["evil@evil.test"]),
                &local()
            ),
            Some(Learning {
                mailbox: "mallory@example.test".into(),
                senders: v(&["evil@evil.test"])
            })
        );
        // Not authenticated, a login that is no address, a null sender, or nothing but
        // itself: nothing.
        assert_eq!(learning(None, "alice@example.test", &rcpts, &local()), None);
        assert_eq!(
            learning(Some(""), "alice@example.test", &rcpts, &local()),
            None
        );
        assert_eq!(
            learning(Some("alice"), "alice@example.test", &rcpts, &local()),
            None
        );
        assert_eq!(
            learning(Some("alice@example.test"), "", &rcpts, &local()),
            None
        );
        assert_eq!(
            learning(
                Some("alice@example.test"),
                "alice@example.test",
                &v(&["alice+self@example.test"]),
                &local()
            ),
            None
        );
        // A long list teaches at most MAX_LEARNED.
        let many: Vec<String> = (0..200).map(|i| format!("r{i}@example.net")).collect();
        assert_eq!(
            learning(
                Some("alice@example.test"),
                "alice@example.test",
                &many,
                &local()
            )
            .unwrap()
            .senders
            .len(),
            MAX_LEARNED
        );
    }

    #[test]
    fn verdicts() {
        let boxes = v(&["a@example.test", "b@example.test"]);
        let entry = |m: &str, s: &str| (m.to_owned(), s.to_owned());
        for (found, trusted, all) in [
            (vec![], vec![], false),
            (
                vec![entry("b@example.test", "@example.org")],
                vec!["b@example.test"],
                false,
            ),
            (
                vec![
                    entry("b@example.test", "bob@example.org"),
                    entry("a@example.test", "@example.org"),
                ],
                vec!["a@example.test", "b@example.test"],
                true,
            ),
        ] {
            let got = verdict(&boxes, &found);
            assert_eq!(got.trusted, v(&trusted), "{found:?}");
            assert_eq!(got.all, all, "{found:?}");
        }
        assert!(!verdict(&[], &[]).all);
    }

    #[test]
    fn mailboxes_are_each_recipient_once_in_lower_case_without_extension() {
        assert_eq!(
            mailboxes(
                &v(&["A@x.test", "b@x.test", "a+news@X.test", "a@x.test"]),
                &local()
            ),
            ["a@x.test", "b@x.test"]
        );
    }
}
