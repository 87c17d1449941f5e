//! What the tool takes as a list's address, a member's address, a role and a posting rule.
//! Pure: each check returns the stored form or an error that names the text and says what
//! is allowed. Whether a domain is local, or an address a mailbox, is the database's
//! question (`store`), asked after these.

use pepsi_admin::admin;
use pepsi_conf::address::Address;
use serde::Serialize;

use pepsi_contract::list::{SUFFIXES, reserved_suffixes};

/// A list's address as stored: lower-case, normalised by `pepsi_conf::address::Address`;
/// its name (the local part) of at most `pepsi_contract::list::MAX_NAME_LEN` characters of
/// a-z, 0-9, `.`, `_` and `-`, starting with a letter or a digit, not ending in a command
/// suffix; its domain a domain name.
pub fn list_address(text: &str) -> Result<String, String> {
    let parsed = Address::parse(text).map_err(|e| format!("list address {e}"))?;
    let name = parsed.local().to_lowercase();
    let domain = admin::domain(parsed.domain(), "list address")
        .map_err(|_| format!("list address {text:?}: the domain is not a domain name"))?;
    let name_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if !name_ok {
        return Err(format!(
            "list address {text:?}: a list's name (before the @) may hold only a-z, 0-9, \
             '.', '_' and '-', and starts with a letter or a digit"
        ));
    }
    if name.len() > pepsi_contract::list::MAX_NAME_LEN {
        return Err(format!(
            "list address {text:?}: a list's name (before the @) may have at most {} \
             characters, so that its confirmation address ({name}-confirm+<token>@) fits \
             the 64 octets of a local part",
            pepsi_contract::list::MAX_NAME_LEN
        ));
    }
    // A list's own name never ends in a command suffix, so `team-join@` is always the
    // command and never a list (`pepsi_contract::list`).
    if let Some(suffix) = reserved_suffixes().find(|s| name.ends_with(*s)) {
        let base = &name[..name.len() - suffix.len()];
        return Err(format!(
            "list address {text:?} ends in {suffix}, which makes it a command address \
             (of a list {base}@{domain}); a list's name may not end in {}",
            reserved_suffixes().collect::<Vec<_>>().join(", ")
        ));
    }
    let address = format!("{name}@{domain}");
    if address.len() > admin::MAX_ADDRESS_LEN {
        return Err(format!(
            "list address {text:?} is longer than {} characters",
            admin::MAX_ADDRESS_LEN
        ));
    }
    Ok(address)
}

/// The list a command names, in the form it is stored in; only well-formed, since an
/// unknown list is the database's answer.
pub fn named_list(text: &str) -> Result<String, String> {
    Address::parse(text)
        .map(|a| a.key())
        .map_err(|e| format!("list {e}"))
}

/// The addresses a list's fixed command addresses would take: `team-join@d`, ... (for the
/// check that none of them is a mailbox; `-confirm+token` and `+bounces-member` carry a
/// tail and are never a mailbox's name).
pub fn command_addresses(list: &Address) -> Vec<String> {
    let name = list.local().to_lowercase();
    SUFFIXES
        .iter()
        .map(|(s, _)| format!("{name}{s}@{}", list.domain()))
        .collect()
}

/// A member's (or owner's, moderator's, nonmember's) address as stored: the rule of every
/// operator tool (`pepsi_admin::admin::address`: lower-case, no white space, quotes or angle
/// brackets, a real domain, at most 254 characters).
pub fn member_address(text: &str) -> Result<String, String> {
    admin::address(text, "address").map_err(|e| e.to_string())
}

/// What a row of `pepsi.list_member` is to its list (the CHECK of its `role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Receives the list's posts.
    Member,
    /// Runs the list; mail to list-owner@ reaches it.
    Owner,
    /// Decides on held posts and subscriptions.
    Moderator,
    /// Not subscribed; the row carries a posting rule (--action) for this sender.
    Nonmember,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Owner => "owner",
            Role::Moderator => "moderator",
            Role::Nonmember => "nonmember",
        }
    }

    /// `a member`, `an owner`: for sentences.
    pub fn with_article(self) -> &'static str {
        match self {
            Role::Member => "a member",
            Role::Owner => "an owner",
            Role::Moderator => "a moderator",
            Role::Nonmember => "a nonmember",
        }
    }
}

/// What becomes of a post from a sender (`moderation_action`, `member_action`,
/// `nonmember_action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Posted to the list.
    Accept,
    /// Held for a moderator.
    Hold,
    /// Returned to the sender with a notice.
    Reject,
    /// Dropped without a notice.
    Discard,
    /// Left for a moderator to decide later.
    Defer,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Accept => "accept",
            Action::Hold => "hold",
            Action::Reject => "reject",
            Action::Discard => "discard",
            Action::Defer => "defer",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema's CHECK on `mailing_list.address` refuses exactly the endings this tool
    /// refuses (`pepsi_contract::list::reserved_suffixes`).
    #[test]
    fn the_schema_refuses_the_same_suffixes() {
        const SCHEMA: &str = include_str!("../../pepsi-setup/db/pepsi-0016.sql");
        let check = SCHEMA
            .lines()
            .find(|l| l.contains("address !~ '-("))
            .expect("the suffix CHECK in pepsi-0016.sql");
        let inner = &check[check.find("-(").unwrap() + 2..check.find(")@").unwrap()];
        let mut in_schema: Vec<String> = inner.split('|').map(|w| format!("-{w}")).collect();
        let mut here: Vec<String> = reserved_suffixes().map(str::to_owned).collect();
        in_schema.sort();
        here.sort();
        assert_eq!(in_schema, here);
    }

    #[test]
    fn list_addresses_are_normalised_or_refused_naming_what_is_wrong() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("team@example.org", Ok("team@example.org")),
            (" Team@Example.ORG. ", Ok("team@example.org")),
            (
                "dev.announce_2@example.org",
                Ok("dev.announce_2@example.org"),
            ),
            ("a-b@bücher.example", Ok("a-b@xn--bcher-kva.example")),
            ("team", Err("no @")),
            ("@example.org", Err("empty local part")),
            ("team@localhost", Err("the domain is not a domain name")),
            ("team+x@example.org", Err("may hold only a-z")),
            ("-team@example.org", Err("starts with a letter or a digit")),
            ("té@example.org", Err("may hold only a-z")),
            ("team-join@example.org", Err("ends in -join")),
            ("team-leave@example.org", Err("ends in -leave")),
            ("team-request@example.org", Err("ends in -request")),
            ("team-owner@example.org", Err("ends in -owner")),
            ("team-bounces@example.org", Err("ends in -bounces")),
            ("team-confirm@example.org", Err("ends in -confirm")),
            (
                "Team-Subscribe@example.org",
                Err("(of a list team@example.org)"),
            ),
            ("team-unsubscribe@example.org", Err("ends in -unsubscribe")),
            (
                "a-list-name-of-thirty-two-chars1@example.org",
                Err("at most 31 characters"),
            ),
            (
                "a-list-name-of-thirty-one-chars@example.org",
                Ok("a-list-name-of-thirty-one-chars@example.org"),
            ),
            // A suffix inside the name is not one at its end.
            ("join-team@example.org", Ok("join-team@example.org")),
            ("team-joined@example.org", Ok("team-joined@example.org")),
        ];
        for (input, want) in cases {
            match (list_address(input), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, *w, "{input}"),
                (Err(e), Err(w)) => {
                    assert!(e.contains(w), "{input}: {e}");
                    assert!(e.starts_with("list address"), "{input}: {e}");
                }
                (got, want) => panic!("{input}: {got:?}, wanted {want:?}"),
            }
        }
        // The longest name at a long (valid) domain: the whole address is too long.
        let domain = vec!["d".repeat(55); 4].join(".") + ".example.org";
        let long = format!("{}@{domain}", "a".repeat(31));
        assert!(list_address(&long).unwrap_err().contains("longer than 254"));
    }

    #[test]
    fn command_addresses_cover_every_fixed_suffix() {
        let list = Address::parse("Team@Example.org").unwrap();
        let all = command_addresses(&list);
        assert_eq!(all.len(), SUFFIXES.len());
        assert!(all.contains(&"team-join@example.org".to_owned()));
        assert!(all.contains(&"team-unsubscribe@example.org".to_owned()));
        assert!(!all.iter().any(|a| a.contains("confirm")));
    }

    #[test]
    fn member_addresses_follow_the_tools_rule() {
        assert_eq!(
            member_address(" Bob@Example.NET ").unwrap(),
            "bob@example.net"
        );
        for (input, why) in [
            ("bob", "no @"),
            ("bob smith@example.net", "holds a character"),
            ("bob@example", "the domain"),
        ] {
            let e = member_address(input).unwrap_err();
            assert!(e.contains(why) && e.contains(input), "{input}: {e}");
        }
    }
}
