//! The list copy of an accepted post: what members receive. Pure: the original's header
//! block and body in, the copy's out, tested as a table.
//!
//! The copy keeps the original's fields but those a list replaces: the RFC 2369 and RFC
//! 2919 fields (`List-Id`, `List-Post`, `List-Help`, `List-Subscribe`, `List-Unsubscribe`,
//! `List-Owner`, `List-Archive`, `List-Unsubscribe-Post`), `Precedence` and `Return-Path`
//! are written afresh, so a post cannot bring its own; the subject gets the list's prefix
//! unless it already holds it (a reply keeps one prefix); `Reply-To` follows the list's
//! `reply_goes_to`. A plain-text post (a `text/*` single part in 7bit or 8bit) gets the
//! list's footer after its text; any other post is sent without one, never re-encoded.

use pepsi_conf::text::one_line;
use pepsi_contract::message;

/// What the copy is made from, besides the post.
#[derive(Debug, Clone)]
pub struct ListFacts<'a> {
    /// The list's address, `local@domain`, lower-case.
    pub address: &'a str,
    pub display_name: &'a str,
    pub subject_prefix: &'a str,
    /// `sender`, `list` or `explicit` (then `reply_to_address`).
    pub reply_goes_to: &'a str,
    pub reply_to_address: Option<&'a str>,
}

/// Fields the list writes itself; a post's own are removed first.
pub const LIST_FIELDS: &[&str] = &[
    "List-Id",
    "List-Post",
    "List-Help",
    "List-Subscribe",
    "List-Unsubscribe",
    "List-Unsubscribe-Post",
    "List-Owner",
    "List-Archive",
    "Precedence",
    "Return-Path",
];

impl ListFacts<'_> {
    fn parts(&self) -> (&str, &str) {
        pepsi_conf::address::parts(self.address).unwrap_or((self.address, ""))
    }

    /// The RFC 2919 list identifier: the address with `@` as `.`.
    pub fn list_id(&self) -> String {
        let (local, domain) = self.parts();
        format!("{local}.{domain}")
    }

    /// `<local><suffix>@<domain>`: one of the list's command addresses.
    pub fn command_address(&self, suffix: &str) -> String {
        let (local, domain) = self.parts();
        format!("{local}{suffix}@{domain}")
    }
}

/// Whether `headers` carry `X-Loop: <address>` (any letter case): a message this list (or
/// its owner address) sent before has come back. Lists keep each other's `X-Loop` fields, so
/// a post passed between two lists that are members of each other stops at the first one.
pub fn carries_loop(headers: &[u8], address: &str) -> bool {
    message::field_values(headers, "X-Loop")
        .iter()
        .any(|v| v.trim().eq_ignore_ascii_case(address))
}

/// Adds `X-Loop: <address>` (see [`carries_loop`]).
pub fn mark_loop(headers: &mut Vec<u8>, address: &str) {
    push(headers, "X-Loop", &one_line(address));
}

/// Whether `headers` already carry this list's `List-Id` (the post went round a loop).
pub fn carries_list_id(headers: &[u8], list_id: &str) -> bool {
    let wanted = format!("<{list_id}>");
    message::field_values(headers, "List-Id")
        .iter()
        .any(|v| v.to_ascii_lowercase().contains(&wanted))
}

/// The copy's header block, with the list's `List-Unsubscribe` (its `-leave` address): the
/// same for every reader. A copy fanned out per member takes [`shared_headers`] and
/// [`pepsi_list_digest::message::unsubscribe_fields`] instead.
pub fn headers(original: &[u8], list: &ListFacts<'_>) -> Vec<u8> {
    let mut h = shared_headers(original, list);
    push(
        &mut h,
        "List-Unsubscribe",
        &format!("<mailto:{}>", list.command_address("-leave")),
    );
    h
}

/// The copy's header block without `List-Unsubscribe`, which each member's row carries
/// ([`pepsi_list_digest::message::unsubscribe_fields`], `pepsi.list_fanout`'s
/// `p_member_fields`).
pub fn shared_headers(original: &[u8], list: &ListFacts<'_>) -> Vec<u8> {
    let mut h = original.to_vec();
    for name in LIST_FIELDS {
        h = message::remove_fields(&h, name);
    }
    let prefix = one_line(list.subject_prefix);
    let prefix = prefix.as_str();
    if !prefix.is_empty() {
        let subject = message::field_values(&h, "Subject")
            .into_iter()
            .next()
            .unwrap_or_default();
        if !subject
            .to_ascii_lowercase()
            .contains(&prefix.to_ascii_lowercase())
        {
            h = message::remove_fields(&h, "Subject");
            push(
                &mut h,
                "Subject",
                format!("{prefix} {}", one_line(&subject)).trim_end(),
            );
        }
    }
    match (list.reply_goes_to, list.reply_to_address) {
        ("list", _) => {
            h = message::remove_fields(&h, "Reply-To");
            push(&mut h, "Reply-To", &format!("<{}>", list.address));
        }
        ("explicit", Some(to)) => {
            if let Ok(to) = pepsi_conf::address::Address::parse(&one_line(to)) {
                h = message::remove_fields(&h, "Reply-To");
                push(&mut h, "Reply-To", &format!("<{to}>"));
            }
        }
        _ => {}
    }
    let name = phrase(list.display_name);
    let id = list.list_id();
    push(
        &mut h,
        "List-Id",
        &if name.is_empty() {
            format!("<{id}>")
        } else {
            format!("{name} <{id}>")
        },
    );
    push(&mut h, "List-Post", &format!("<mailto:{}>", list.address));
    push(
        &mut h,
        "List-Help",
        &format!("<mailto:{}?subject=help>", list.command_address("-request")),
    );
    push(
        &mut h,
        "List-Subscribe",
        &format!("<mailto:{}>", list.command_address("-join")),
    );
    push(
        &mut h,
        "List-Owner",
        &format!("<mailto:{}>", list.command_address("-owner")),
    );
    push(&mut h, "Precedence", "list");
    mark_loop(&mut h, list.address);
    h
}

/// Where `pepsi.list_fanout` puts a member's one-click unsubscribe token in the fields and
/// the footer it appends per member.
pub const TOKEN: &str = "{token}";
/// Where `pepsi.list_fanout` puts the member (name and address, or the address) in a
/// personal footer.
pub const MEMBER: &str = "{member}";

/// A member's one-click unsubscribe link (RFC 8058): `<web>/lists/unsubscribe/<token>`.
pub fn unsubscribe_url(web_url: &str) -> String {
    format!("{web_url}/lists/unsubscribe/{TOKEN}")
}

/// The copy's body and, for a list whose footer is personal (`personalize = individual`),
/// the footer `pepsi.list_fanout` appends to each member's own body ([`personal_footer`]).
/// A post that takes no footer (not plain text) is the post as it is, shared by all.
pub fn body_and_footer(
    headers: &[u8],
    original: &[u8],
    list: &ListFacts<'_>,
    personal: bool,
    web_url: Option<&str>,
) -> (Vec<u8>, Option<String>) {
    if !personal || !takes_footer(headers) {
        return (body(headers, original, list, web_url), None);
    }
    let mut b = original.to_vec();
    if !b.is_empty() && !b.ends_with(b"\r\n") {
        b.extend_from_slice(b"\r\n");
    }
    (b, Some(personal_footer(list, web_url)))
}

/// The personal footer: the list's name, whom this copy is for ([`MEMBER`]) and how they
/// leave: their own link ([`TOKEN`]) with the list pages' base, else the `-leave` address.
pub fn personal_footer(list: &ListFacts<'_>, web_url: Option<&str>) -> String {
    let leave = match web_url {
        Some(web) => format!("To unsubscribe: {}", unsubscribe_url(web)),
        None => format!(
            "To unsubscribe send a message to {}",
            list.command_address("-leave")
        ),
    };
    format!(
        "-- \r\n{} mailing list -- {}\r\nThis copy is for {MEMBER}\r\n{leave}\r\n",
        footer_name(list),
        list.address
    )
}

/// The copy's body: the post's, with the footer after a plain-text post's text.
pub fn body(
    headers: &[u8],
    original: &[u8],
    list: &ListFacts<'_>,
    web_url: Option<&str>,
) -> Vec<u8> {
    if !takes_footer(headers) {
        return original.to_vec();
    }
    let mut b = original.to_vec();
    if !b.is_empty() && !b.ends_with(b"\r\n") {
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(footer(list, web_url).as_bytes());
    b
}

/// The list's public page: `<web>/lists/<address>` (pepsi-httpd's `/lists/{list}`).
pub fn list_page_url(web_url: &str, list: &ListFacts<'_>) -> String {
    format!("{web_url}/lists/{}", list.address)
}

/// The footer shared by every member: the list's name, its page when the list pages have
/// a public base (`web_url`), and how to leave it by mail (ASCII, CRLF lines, after `-- `).
/// Leaving stays the last line, as in the personal footer.
pub fn footer(list: &ListFacts<'_>, web_url: Option<&str>) -> String {
    let page = web_url
        .map(|web| format!("List page: {}\r\n", list_page_url(web, list)))
        .unwrap_or_default();
    format!(
        "-- \r\n{} mailing list -- {}\r\n{page}To unsubscribe send a message to {}\r\n",
        footer_name(list),
        list.address,
        list.command_address("-leave")
    )
}

/// The list's name in a footer: its display name when that is ASCII (a footer is added to
/// a body of any charset), else its address. Braces are dropped so a name never reads as a
/// placeholder of the personal footer.
fn footer_name(list: &ListFacts<'_>) -> String {
    if list.display_name.trim().is_empty() || !list.display_name.is_ascii() {
        list.address.to_owned()
    } else {
        one_line(list.display_name).replace(['{', '}'], "")
    }
}

/// Whether a post with `headers` is a plain-text single part the footer can follow
/// without re-encoding: no Content-Type or `text/plain`, no transfer encoding or 7bit/8bit.
fn takes_footer(headers: &[u8]) -> bool {
    let first = |name: &str| {
        message::field_values(headers, name)
            .into_iter()
            .next()
            .map(|v| v.trim().to_ascii_lowercase())
    };
    let plain = first("Content-Type").is_none_or(|t| {
        t.split(';')
            .next()
            .is_some_and(|m| m.trim() == "text/plain")
    });
    let raw =
        first("Content-Transfer-Encoding").is_none_or(|e| matches!(e.as_str(), "7bit" | "8bit"));
    plain && raw
}

/// A display name as a quoted phrase, or nothing when it is empty or not ASCII.
fn phrase(name: &str) -> String {
    let name = one_line(name);
    if name.is_empty() || !name.is_ascii() {
        return String::new();
    }
    format!("\"{}\"", name.replace('\\', "\\\\").replace('"', "\\\""))
}

fn push(h: &mut Vec<u8>, name: &str, value: &str) {
    h.extend_from_slice(name.as_bytes());
    h.extend_from_slice(b": ");
    h.extend_from_slice(value.as_bytes());
    h.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn team() -> ListFacts<'static> {
        ListFacts {
            address: "team@example.org",
            display_name: "The Team",
            subject_prefix: "[team]",
            reply_goes_to: "sender",
            reply_to_address: None,
        }
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8(b.to_vec()).unwrap()
    }

    const POST: &[u8] = b"From: Bob <bob@example.net>\r\nTo: team@example.org\r\n\
        Subject: lunch\r\nList-Id: <evil.example.com>\r\nPrecedence: bulk\r\n\
        Reply-To: bob@home.example.net\r\n";

    #[test]
    fn the_copys_fields() {
        let h = text(&headers(POST, &team()));
        for want in [
            "From: Bob <bob@example.net>\r\n",
            "Subject: [team] lunch\r\n",
            "Reply-To: bob@home.example.net\r\n",
            "List-Id: \"The Team\" <team.example.org>\r\n",
            "List-Post: <mailto:team@example.org>\r\n",
            "List-Help: <mailto:team-request@example.org?subject=help>\r\n",
            "List-Subscribe: <mailto:team-join@example.org>\r\n",
            "List-Unsubscribe: <mailto:team-leave@example.org>\r\n",
            "List-Owner: <mailto:team-owner@example.org>\r\n",
            "Precedence: list\r\n",
        ] {
            assert!(h.contains(want), "{want:?} in {h}");
        }
        assert!(
            !h.contains("evil.example.com") && !h.contains("bulk"),
            "{h}"
        );
        assert_eq!(h.matches("List-Id:").count(), 1);
        // A real parser reads the list fields back.
        let mut raw = h.into_bytes();
        raw.extend_from_slice(b"\r\nhi\r\n");
        let parsed = mail_parser::MessageParser::default().parse(&raw).unwrap();
        assert_eq!(parsed.subject(), Some("[team] lunch"));
        assert_eq!(
            parsed
                .list_post()
                .as_address()
                .and_then(|a| a.first())
                .and_then(|a| a.address()),
            Some("mailto:team@example.org")
        );
    }

    #[test]
    fn subject_and_reply_to_table() {
        let cases: &[(&[u8], &str, Option<&str>, &str)] = &[
            (
                b"Subject: Re: [team] lunch\r\n",
                "sender",
                None,
                "Subject: Re: [team] lunch\r\n",
            ),
            (
                b"Subject: [TEAM] caps\r\n",
                "sender",
                None,
                "Subject: [TEAM] caps\r\n",
            ),
            (b"From: a@b.c\r\n", "sender", None, "Subject: [team]\r\n"),
            (
                b"Subject: x\r\nReply-To: bob@example.net\r\n",
                "list",
                None,
                "Reply-To: <team@example.org>\r\n",
            ),
            (
                b"Subject: x\r\n",
                "explicit",
                Some("help@example.org"),
                "Reply-To: <help@example.org>\r\n",
            ),
            (
                b"Subject: folded\r\n  on two lines\r\n",
                "sender",
                None,
                "Subject: [team] folded on two lines\r\n",
            ),
        ];
        for (post, reply, to, want) in cases {
            let mut list = team();
            list.reply_goes_to = reply;
            list.reply_to_address = *to;
            let h = text(&headers(post, &list));
            assert!(h.contains(want), "{want:?} in {h}");
            assert!(h.matches("Reply-To:").count() <= 1, "{h}");
        }
        let mut list = team();
        list.subject_prefix = "";
        list.display_name = "Grüße";
        let h = text(&headers(b"Subject: x\r\n", &list));
        assert!(
            h.contains("Subject: x\r\n") && h.contains("List-Id: <team.example.org>\r\n"),
            "{h}"
        );
    }

    #[test]
    fn the_footer_follows_plain_text_only() {
        let list = team();
        // (LIST_WEB_URL, the copy's body of the post "hello")
        let cases: &[(Option<&str>, &str)] = &[
            (
                None,
                "hello\r\n-- \r\nThe Team mailing list -- team@example.org\r\n\
                 To unsubscribe send a message to team-leave@example.org\r\n",
            ),
            (
                Some("https://lists.example.org"),
                "hello\r\n-- \r\nThe Team mailing list -- team@example.org\r\n\
                 List page: https://lists.example.org/lists/team@example.org\r\n\
                 To unsubscribe send a message to team-leave@example.org\r\n",
            ),
            (
                Some("https://example.org/mail"),
                "hello\r\n-- \r\nThe Team mailing list -- team@example.org\r\n\
                 List page: https://example.org/mail/lists/team@example.org\r\n\
                 To unsubscribe send a message to team-leave@example.org\r\n",
            ),
        ];
        for (web, want) in cases {
            let plain = body(b"Subject: x\r\n", b"hello\r\n", &list, *web);
            assert_eq!(text(&plain), *want, "{web:?}");
            let (shared, personal) =
                body_and_footer(b"Subject: x\r\n", b"hello\r\n", &list, false, *web);
            assert_eq!((text(&shared).as_str(), personal), (*want, None), "{web:?}");
        }
        let no_crlf = body(
            b"Content-Type: text/plain; charset=utf-8\r\n",
            b"hi",
            &list,
            None,
        );
        assert!(text(&no_crlf).starts_with("hi\r\n-- \r\n"));
        for h in [
            &b"Content-Type: multipart/mixed; boundary=x\r\n"[..],
            b"Content-Type: text/html\r\n",
            b"Content-Transfer-Encoding: base64\r\n",
            b"Content-Transfer-Encoding: quoted-printable\r\n",
        ] {
            for web in [None, Some("https://lists.example.org")] {
                assert_eq!(
                    body(h, b"as is\r\n", &list, web),
                    b"as is\r\n",
                    "{}",
                    text(h)
                );
            }
        }
    }

    #[test]
    fn per_member_fields_and_footers_table() {
        let list = team();
        let web = Some("https://lists.example.org");
        // (LIST_WEB_URL, unsubscribe fields, the personal footer's last line)
        let cases: &[(Option<&str>, &str, &str)] = &[
            (
                web,
                "List-Unsubscribe: <https://lists.example.org/lists/unsubscribe/{token}>, \
                 <mailto:team-leave@example.org>\r\n\
                 List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n",
                "To unsubscribe: https://lists.example.org/lists/unsubscribe/{token}\r\n",
            ),
            (
                None,
                "List-Unsubscribe: <mailto:team-leave@example.org>\r\n",
                "To unsubscribe send a message to team-leave@example.org\r\n",
            ),
        ];
        for (web, fields, last) in cases {
            assert_eq!(
                pepsi_list_digest::message::unsubscribe_fields(list.address, *web),
                *fields
            );
            let f = personal_footer(&list, *web);
            assert!(
                f.starts_with(
                    "-- \r\nThe Team mailing list -- team@example.org\r\n\
                     This copy is for {member}\r\n"
                ) && f.ends_with(last),
                "{f}"
            );
        }
        // The shared block has no List-Unsubscribe; the whole one has the mailto.
        let shared = text(&shared_headers(POST, &list));
        assert!(!shared.contains("List-Unsubscribe"), "{shared}");
        assert_eq!(
            text(&headers(POST, &list)),
            format!("{shared}List-Unsubscribe: <mailto:team-leave@example.org>\r\n")
        );
        // A personal footer is the fan-out's to add; the post's text stays shared.
        let (b, f) = body_and_footer(b"Subject: x\r\n", b"hi", &list, true, web);
        assert_eq!((b.as_slice(), f.is_some()), (&b"hi\r\n"[..], true));
        let (b, f) = body_and_footer(b"Subject: x\r\n", b"hi\r\n", &list, false, web);
        assert_eq!(b, body(b"Subject: x\r\n", b"hi\r\n", &list, web));
        assert_eq!(f, None);
        let html = b"Content-Type: text/html\r\n";
        assert_eq!(
            body_and_footer(html, b"<p>hi</p>", &list, true, web),
            (b"<p>hi</p>".to_vec(), None)
        );
        // A display name cannot plant a placeholder.
        let mut odd = team();
        odd.display_name = "The {token} Team";
        assert!(!personal_footer(&odd, None).contains("{token}"));
        assert!(!footer(&odd, web).contains("{token}"));
    }

    #[test]
    fn values_from_the_database_stay_on_their_line() {
        let mut list = team();
        list.subject_prefix = "[team]\r\nBcc: eve@evil.test";
        list.reply_goes_to = "explicit";
        list.reply_to_address = Some("help@example.org>\r\nX-Evil: 1");
        let h = text(&headers(b"Subject: x\r\n", &list));
        assert!(!h.contains("\r\nBcc:") && !h.contains("\r\nX-Evil"), "{h}");
        assert!(
            h.contains("Subject: [team] Bcc: eve@evil.test x\r\n"),
            "{h}"
        );
    }

    #[test]
    fn loops_are_recognised() {
        let mut h = b"Subject: x\r\n".to_vec();
        assert!(!carries_loop(&h, "team@example.org"));
        mark_loop(&mut h, "team@example.org");
        assert!(carries_loop(&h, "Team@Example.org"));
        assert!(!carries_loop(&h, "other@example.org"));
        let copy = headers(b"Subject: x\r\nX-Loop: other@example.org\r\n", &team());
        assert!(
            carries_loop(&copy, "other@example.org"),
            "another list's mark is kept"
        );
        assert!(carries_loop(&copy, "team@example.org"));
        assert!(carries_list_id(
            b"List-Id: \"T\" <team.example.org>\r\n",
            "team.example.org"
        ));
        assert!(carries_list_id(
            b"List-Id: <Team.Example.ORG>\r\n",
            "team.example.org"
        ));
        assert!(!carries_list_id(
            b"List-Id: <other.example.org>\r\n",
            "team.example.org"
        ));
        assert!(!carries_list_id(b"Subject: x\r\n", "team.example.org"));
    }
}
