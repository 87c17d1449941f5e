//! What a post to a list does: the posting policy, as a pure decision over the facts the
//! stage looked up, tested as a table. First rule that applies wins:
//!
//! 1. the post carries this list's own `List-Id`: it came back through a loop → discard;
//!    a post a moderator approved (`state.list_approval` for this list) → accept;
//! 2. the sender is banned (from this list or every list) → reject;
//! 3. a header filter matched (`list_header_filter`, the first by position) with hold,
//!    reject, discard or defer → that;
//! 4. the sender's own rule (a member or nonmember row with `moderation_action`);
//! 5. the list is under emergency moderation → hold;
//! 6. the post is larger than the list's `max_message_size` → hold;
//! 7. a header filter matched with accept → accept (whoever the sender is);
//! 8. a member → the list's `member_action`; anyone else → its `nonmember_action`.
//!
//! An accepted post then passes the list's content filter (`content`); one left with
//! nothing gets the list's `empty_action` (`when_empty`).
//!
//! The sender is the post's From address (the envelope sender when it has none): what
//! people subscribe and are recognised by.

use crate::content::EmptyAction;

/// What the list does with one post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Sent to the members.
    Accept,
    /// Kept for a moderator, with the reason.
    Hold(String),
    /// Refused: the sender gets a DSN with the reason.
    Reject(String),
    /// Dropped without a word, with the reason (logged).
    Discard(String),
    /// Tried again later.
    Defer(String),
}

/// A posting rule's action, as `mailing_list.member_action` and friends store it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Accept,
    Hold,
    Reject,
    Discard,
    Defer,
}

impl Action {
    /// The stored word (the schema's CHECK allows exactly these).
    pub fn parse(word: &str) -> Option<Action> {
        Some(match word {
            "accept" => Action::Accept,
            "hold" => Action::Hold,
            "reject" => Action::Reject,
            "discard" => Action::Discard,
            "defer" => Action::Defer,
            _ => return None,
        })
    }

    fn decide(self, why: &str) -> Decision {
        match self {
            Action::Accept => Decision::Accept,
            Action::Hold => Decision::Hold(why.to_owned()),
            Action::Reject => Decision::Reject(why.to_owned()),
            Action::Discard => Decision::Discard(why.to_owned()),
            Action::Defer => Decision::Defer(why.to_owned()),
        }
    }
}

/// Everything the decision reads.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    pub sender: &'a str,
    /// Whether the sender is a member (role `member`).
    pub is_member: bool,
    /// The sender's own rule, from a member or nonmember row.
    pub own_action: Option<Action>,
    pub banned: bool,
    /// The first header filter that matched: its action and a description.
    pub filter: Option<(Action, String)>,
    /// Whether the post already carries this list's List-Id.
    pub own_list_id: bool,
    /// Whether a moderator approved this post for this list (`state.list_approval`).
    pub approved: bool,
    pub emergency: bool,
    pub size: u64,
    pub max_message_size: u64,
    pub member_action: Action,
    pub nonmember_action: Action,
}

/// The decision for one post.
pub fn decide(f: &Facts<'_>) -> Decision {
    if f.own_list_id {
        return Decision::Discard("the post already went through this list (a loop)".into());
    }
    if f.approved {
        return Decision::Accept;
    }
    if f.banned {
        return Decision::Reject(format!("{} may not post to this list", f.sender));
    }
    if let Some((action, why)) = &f.filter
        && *action != Action::Accept
    {
        return action.decide(why);
    }
    if let Some(action) = f.own_action {
        return action.decide(&format!("the list's rule for {}", f.sender));
    }
    if f.emergency {
        return Decision::Hold("the list is under emergency moderation".into());
    }
    if f.size > f.max_message_size {
        return Decision::Hold(format!(
            "the post is {} bytes, more than the list's limit of {}",
            f.size, f.max_message_size
        ));
    }
    if matches!(f.filter, Some((Action::Accept, _))) {
        return Decision::Accept;
    }
    if f.is_member {
        f.member_action.decide("posts from members")
    } else {
        f.nonmember_action
            .decide(&format!("{} is not a member of the list", f.sender))
    }
}

/// An accepted post the content filter (`content`) left with nothing: the list's
/// `empty_action`, except that a post a moderator approved goes out as it came (the
/// moderator saw it whole and sent it).
pub fn when_empty(action: EmptyAction, approved: bool, removed: &[String]) -> Decision {
    if approved {
        return Decision::Accept;
    }
    let why = format!(
        "nothing is left after the list's content filter removed {}",
        removed.join(", ")
    );
    match action {
        EmptyAction::Hold => Decision::Hold(why),
        EmptyAction::Reject => Decision::Reject(why),
        EmptyAction::Discard => Decision::Discard(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Facts<'static> {
        Facts {
            sender: "bob@example.net",
            is_member: true,
            own_action: None,
            banned: false,
            filter: None,
            own_list_id: false,
            approved: false,
            emergency: false,
            size: 1000,
            max_message_size: 10_000,
            member_action: Action::Accept,
            nonmember_action: Action::Hold,
        }
    }

    #[test]
    fn decisions_table() {
        type Change = fn(&mut Facts<'static>);
        let cases: Vec<(&str, Change, Decision)> = vec![
            ("a member posts", |_| {}, Decision::Accept),
            (
                "a nonmember is held by default",
                |f| f.is_member = false,
                Decision::Hold("bob@example.net is not a member of the list".into()),
            ),
            (
                "a nonmember rejected by the list's rule",
                |f| {
                    f.is_member = false;
                    f.nonmember_action = Action::Reject;
                },
                Decision::Reject("bob@example.net is not a member of the list".into()),
            ),
            (
                "the sender's own rule wins over the list's",
                |f| {
                    f.is_member = false;
                    f.own_action = Some(Action::Accept);
                },
                Decision::Accept,
            ),
            (
                "a moderated member",
                |f| f.own_action = Some(Action::Hold),
                Decision::Hold("the list's rule for bob@example.net".into()),
            ),
            (
                "a ban wins over the sender's rule",
                |f| {
                    f.banned = true;
                    f.own_action = Some(Action::Accept);
                },
                Decision::Reject("bob@example.net may not post to this list".into()),
            ),
            (
                "a loop is discarded before anything else",
                |f| {
                    f.own_list_id = true;
                    f.banned = true;
                },
                Decision::Discard("the post already went through this list (a loop)".into()),
            ),
            (
                "an approved post is accepted whatever the policy says",
                |f| {
                    f.approved = true;
                    f.is_member = false;
                    f.banned = true;
                    f.own_action = Some(Action::Discard);
                    f.emergency = true;
                    f.size = 20_000;
                },
                Decision::Accept,
            ),
            (
                "an approved post that came round a loop is still discarded",
                |f| {
                    f.approved = true;
                    f.own_list_id = true;
                },
                Decision::Discard("the post already went through this list (a loop)".into()),
            ),
            (
                "a header filter's hold wins over the sender's own accept",
                |f| {
                    f.filter = Some((Action::Hold, "header filter 10 (X-Spam)".into()));
                    f.own_action = Some(Action::Accept);
                },
                Decision::Hold("header filter 10 (X-Spam)".into()),
            ),
            (
                "a ban wins over a header filter",
                |f| {
                    f.banned = true;
                    f.filter = Some((Action::Accept, "header filter 10 (X-Spam)".into()));
                },
                Decision::Reject("bob@example.net may not post to this list".into()),
            ),
            (
                "a header filter's accept lets a nonmember post",
                |f| {
                    f.is_member = false;
                    f.filter = Some((Action::Accept, "header filter 20 (X-Team)".into()));
                },
                Decision::Accept,
            ),
            (
                "a header filter's accept does not beat emergency moderation",
                |f| {
                    f.emergency = true;
                    f.filter = Some((Action::Accept, "header filter 20 (X-Team)".into()));
                },
                Decision::Hold("the list is under emergency moderation".into()),
            ),
            (
                "a header filter's accept does not beat the sender's own rule",
                |f| {
                    f.own_action = Some(Action::Discard);
                    f.filter = Some((Action::Accept, "header filter 20 (X-Team)".into()));
                },
                Decision::Discard("the list's rule for bob@example.net".into()),
            ),
            (
                "emergency moderation holds members too",
                |f| f.emergency = true,
                Decision::Hold("the list is under emergency moderation".into()),
            ),
            (
                "too large",
                |f| f.size = 10_001,
                Decision::Hold(
                    "the post is 10001 bytes, more than the list's limit of 10000".into(),
                ),
            ),
            (
                "members deferred by the list",
                |f| f.member_action = Action::Defer,
                Decision::Defer("posts from members".into()),
            ),
            (
                "nonmembers discarded",
                |f| {
                    f.is_member = false;
                    f.nonmember_action = Action::Discard;
                },
                Decision::Discard("bob@example.net is not a member of the list".into()),
            ),
        ];
        for (label, change, want) in cases {
            let mut f = base();
            change(&mut f);
            assert_eq!(decide(&f), want, "{label}");
        }
    }

    #[test]
    fn actions_are_the_schemas_words() {
        for w in ["accept", "hold", "reject", "discard", "defer"] {
            assert!(Action::parse(w).is_some(), "{w}");
        }
        assert_eq!(Action::parse("Accept"), None);
        assert_eq!(Action::parse(""), None);
    }

    #[test]
    fn empty_posts_table() {
        let removed = vec![
            "image/png part".to_owned(),
            "text/html alternative".to_owned(),
        ];
        let why = "nothing is left after the list's content filter removed image/png part, \
                   text/html alternative";
        let cases = [
            (EmptyAction::Hold, false, Decision::Hold(why.into())),
            (EmptyAction::Reject, false, Decision::Reject(why.into())),
            (EmptyAction::Discard, false, Decision::Discard(why.into())),
            (EmptyAction::Reject, true, Decision::Accept),
            (EmptyAction::Hold, true, Decision::Accept),
        ];
        for (action, approved, want) in cases {
            assert_eq!(
                when_empty(action, approved, &removed),
                want,
                "{action:?} {approved}"
            );
        }
        for w in ["hold", "reject", "discard"] {
            assert!(EmptyAction::parse(w).is_some(), "{w}");
        }
        assert_eq!(EmptyAction::parse("accept"), None);
    }
}
