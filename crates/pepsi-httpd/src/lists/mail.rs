//! The mail of the subscriber pages: a web subscription's confirmation, what became of a
//! confirmed request, a member's link, the goodbye after leaving on the web. Written by `crate::moderate::mail::compose` as the
//! list stage writes the list's own messages (from `<list>-request@`, `Auto-Submitted:
//! auto-replied`, the list's `List-Id`) and queued by `crate::moderate::mail::queue` (the
//! list stage's `DELIVER_STAGE`, `<list>-bounces@` as envelope sender). The texts are pure
//! functions.

use crate::moderate::mail::command_address;
pub use crate::moderate::mail::compose;

/// The confirmation of a web subscription of `who` to `list`: the link to the
/// confirmation page when the list pages have a public base (`web`), and always the
/// reply address and the `confirm <token>` command, which work without it.
pub fn confirmation_text(
    list: &str,
    who: &str,
    reply_to: &str,
    request: &str,
    token: &str,
    web: Option<&str>,
) -> String {
    let mut text = format!(
        "We received a request, made on the web, to subscribe\r\n\r\n    {who}\r\n\r\n\
         to the mailing list {list}.\r\n\r\n"
    );
    if let Some(base) = web {
        text.push_str(&format!(
            "To confirm, open this link and press the button on its page:\r\n\r\n    \
             {base}/lists/confirm/{token}\r\n\r\nor reply to this message (the reply goes to\r\n\
             {reply_to}).\r\n"
        ));
    } else {
        text.push_str(&format!(
            "To confirm, reply to this message (the reply goes to\r\n{reply_to}).\r\n"
        ));
    }
    text.push_str(&format!(
        "You may also send a message to {request}\r\nwith the subject:\r\n\r\n    \
         confirm {token}\r\n\r\nIf you did not ask for this, ignore this message: \
         nothing changes.\r\n"
    ));
    text
}

/// What the person is told once a confirmation is carried out (`event` as
/// `pepsi_contract::list::carry_out` names it): (subject, text).
pub fn outcome_text(list: &str, event: &str) -> (String, String) {
    match event {
        "subscription.confirmed" => (
            format!("Your subscription to {list} waits for approval"),
            format!(
                "Your subscription to {list} is confirmed and waits for a moderator's \
                 approval.\r\n"
            ),
        ),
        "member.subscribe" => (
            format!("Welcome to {list}"),
            format!(
                "Welcome to {list}.\r\n\r\nTo post, write to {list}.\r\nTo leave, write to \
                 {}.\r\n",
                command_address(list, "-leave")
            ),
        ),
        _ => (
            format!("You have left {list}"),
            format!("You have left {list}.\r\n"),
        ),
    }
}

/// The goodbye to a member who left `list` on the web (one-click or the member page):
/// (subject, text), with how to join again: the `-join` address, and the list's page when
/// the list pages have a public base (`web`).
pub fn goodbye_text(list: &str, web: Option<&str>) -> (String, String) {
    let join = command_address(list, "-join");
    let again = match web {
        Some(base) => format!(
            "To join again, write to {join}\r\nor subscribe on the list's page:\r\n\r\n    \
             {base}/lists/{list}\r\n"
        ),
        None => format!("To join again, write to {join}.\r\n"),
    };
    (
        format!("You have left {list}"),
        format!("You have left {list}.\r\n\r\n{again}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moderate::mail::Route;

    #[test]
    fn a_goodbye_says_how_to_join_again() {
        // (LIST_WEB_URL, the text)
        let cases: [(Option<&str>, &str); 2] = [
            (
                Some("https://lists.example.org"),
                "You have left team@example.org.\r\n\r\n\
                 To join again, write to team-join@example.org\r\n\
                 or subscribe on the list's page:\r\n\r\n    \
                 https://lists.example.org/lists/team@example.org\r\n",
            ),
            (
                None,
                "You have left team@example.org.\r\n\r\n\
                 To join again, write to team-join@example.org.\r\n",
            ),
        ];
        for (web, want) in cases {
            let (subject, text) = goodbye_text("team@example.org", web);
            assert_eq!(subject, "You have left team@example.org");
            assert_eq!(text, want, "{web:?}");
        }
    }

    #[test]
    fn a_confirmation_carries_the_link_only_with_a_public_base() {
        let with = confirmation_text(
            "team@example.org",
            "bob@example.net",
            "team-confirm+abc@example.org",
            "team-request@example.org",
            "abc",
            Some("https://lists.example.org"),
        );
        assert!(
            with.contains("https://lists.example.org/lists/confirm/abc\r\n"),
            "{with}"
        );
        assert!(with.contains("team-confirm+abc@example.org"), "{with}");
        let without = confirmation_text(
            "team@example.org",
            "bob@example.net",
            "team-confirm+abc@example.org",
            "team-request@example.org",
            "abc",
            None,
        );
        assert!(!without.contains("http"), "{without}");
        assert!(
            without.contains("team-confirm+abc@example.org"),
            "{without}"
        );
        assert!(without.contains("confirm abc"), "{without}");
    }

    #[test]
    fn a_confirmation_replies_to_its_confirm_address() {
        let route = Route {
            deliver_stage: "aliases".into(),
            hostname: "mx.example.org".into(),
        };
        let raw = compose(
            &route,
            "team@example.org",
            "bob@example.net",
            "confirm abc",
            "text\r\n",
            Some("team-confirm+abc@example.org"),
        )
        .unwrap();
        let text = String::from_utf8(raw).unwrap();
        for want in [
            "From: <team-request@example.org>\r\n",
            "Reply-To: <team-confirm+abc@example.org>\r\n",
            "Auto-Submitted: auto-replied\r\n",
            "List-Id: <team.example.org>\r\n",
        ] {
            assert!(text.contains(want), "{want:?} in {text}");
        }
    }
}
