//! Mailing lists through the whole system on the shipped graph (init → aliases → whitelist →
//! route → lists → vacation → local): a list made and filled with the real pepsi-list, mail
//! in over SMTP to a real ingress, the real list stage and Maildir delivery. A member's post
//! reaches every member once as the list copy with the member's VERP envelope sender; a
//! mailbox addressed beside the list gets the plain message; a nonmember's post is held;
//! owner mail reaches the owner; subscribing by mail is confirmed by the requester (and its
//! reply to the confirmation's Reply-To must reach the list); a bad command comes back as a
//! DSN; a list that does not exist is refused at RCPT.

use std::time::Duration;

use crate::support::system::{System, split};

const WAIT: Duration = Duration::from_secs(30);

/// The mailboxes of the lists' system: alice, bob and carol are the list's members, olga
/// its owner; dave and erin are on no list.
const USERS: &[&str] = &["alice", "bob", "carol", "dave", "erin", "olga"];

/// The footer the list copy of a plain-text post ends with.
const FOOTER: &str = "-- \r\nThe Team mailing list -- team@example.test\r\n\
                      To unsubscribe send a message to team-leave@example.test\r\n";

/// Runs pepsi-list with the system's configuration and database: (exit status, stdout,
/// stderr).
fn pepsi_list(sys: &System, args: &[&str]) -> (Option<i32>, String, String) {
    let tool = pepsi_testkit::programs::program("pepsi-list", env!("CARGO_BIN_EXE_pepsi-list"));
    let out = sys
        .command(&tool)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// pepsi-list `args`, which must succeed.
fn pepsi_list_ok(sys: &System, args: &[&str]) -> String {
    let (code, out, err) = pepsi_list(sys, args);
    assert_eq!(code, Some(0), "pepsi-list {args:?}: {out}{err}");
    out
}

/// The system with the list team@example.test ("The Team", prefix `[team]`, owner olga)
/// made by pepsi-list, and alice, bob and carol added as members.
async fn system_with_team() -> System {
    let sys = System::new("", USERS).await;
    pepsi_list_ok(
        &sys,
        &[
            "create",
            "team@example.test",
            "--display-name",
            "The Team",
            "--subject-prefix",
            "[team]",
            "--owner",
            "olga@example.test",
        ],
    );
    pepsi_list_ok(
        &sys,
        &[
            "add",
            "team@example.test",
            "alice@example.test",
            "bob@example.test",
            "carol@example.test",
        ],
    );
    sys
}

/// The header block of a stored message, as text.
fn headers_of(message: &[u8]) -> String {
    String::from_utf8_lossy(split(message).0).into_owned()
}

/// The first `name:` field of a header block, unfolded and trimmed.
fn field(headers: &str, name: &str) -> Option<String> {
    let unfolded = headers.replace("\r\n ", " ").replace("\r\n\t", " ");
    unfolded.split("\r\n").find_map(|line| {
        let (n, value) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

/// The local parts of team@example.test's members, in order.
async fn members(sys: &System) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT split_part(m.address, '@', 1) FROM pepsi.list_member m \
         JOIN pepsi.mailing_list l USING (list_id) \
         WHERE l.address = 'team@example.test' AND m.role = 'member' ORDER BY m.address",
    )
    .fetch_all(&sys.db.pool)
    .await
    .unwrap()
}

/// Waits for one message more in `user`'s Maildir than `before` holds (Maildir names need
/// not sort by arrival) and returns it.
async fn wait_new(sys: &System, user: &str, before: &[Vec<u8>]) -> Vec<u8> {
    let now = sys.wait_messages(user, before.len() + 1, WAIT).await;
    let mut new: Vec<Vec<u8>> = now.into_iter().filter(|m| !before.contains(m)).collect();
    assert_eq!(new.len(), 1, "one new message for {user}");
    new.pop().unwrap()
}

/// The reply to `RCPT TO:<rcpt>` in a fresh session from bob.
async fn rcpt_reply(port: u16, rcpt: &str) -> String {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (r, mut w) = stream.into_split();
    let mut r = tokio::io::BufReader::new(r);
    let mut last = String::new();
    for line in [
        "",
        "EHLO client.example.test",
        "MAIL FROM:<bob@example.test>",
        &format!("RCPT TO:<{rcpt}>"),
    ] {
        if !line.is_empty() {
            w.write_all(format!("{line}\r\n").as_bytes()).await.unwrap();
        }
        loop {
            last.clear();
            assert!(
                r.read_line(&mut last).await.unwrap() > 0,
                "connection closed"
            );
            if last.as_bytes().get(3) != Some(&b'-') {
                break;
            }
        }
    }
    w.write_all(b"QUIT\r\n").await.unwrap();
    last.trim_end().to_owned()
}

/// The number of messages in each of `USERS`' Maildirs, in that order.
fn counts(sys: &System) -> Vec<usize> {
    USERS.iter().map(|u| sys.messages(u).len()).collect()
}

/// A post from a member reaches alice, bob and carol once each as the list copy (List-*
/// fields, Precedence, prefixed subject, footer, the member's VERP Return-Path); dave,
/// addressed in the same transaction, gets the message as it was sent. A nonmember's post
/// is held and reaches nobody; mail to `-owner@` reaches olga alone.
#[tokio::test]
async fn a_members_post_reaches_each_member_once_as_the_list_copy() {
    let mut sys = system_with_team().await;
    sys.start().await;

    // A member's post, with dave addressed beside the list in the same transaction.
    let body = "Lunch at noon?\r\nBring a friend.\r\n";
    let post = format!(
        "From: alice@example.test\r\nTo: team@example.test, dave@example.test\r\n\
         Subject: lunch\r\nMessage-ID: <post-1@example.test>\r\n\r\n{body}"
    );
    let reply = sys
        .send(
            "alice@example.test",
            &["team@example.test", "dave@example.test"],
            post.as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    for member in ["alice", "bob", "carol"] {
        sys.wait_messages(member, 1, WAIT).await;
    }
    sys.wait_messages("dave", 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    // Read once nothing is queued, so a second copy would be counted.
    assert_eq!(
        counts(&sys),
        [1, 1, 1, 1, 0, 0],
        "one copy each to alice, bob, carol and dave ({USERS:?})\n{}",
        sys.logs()
    );
    for member in ["alice", "bob", "carol"] {
        let got = &sys.messages(member)[0];
        let headers = headers_of(got);
        let lines: Vec<&str> = headers.split("\r\n").collect();
        assert_eq!(
            lines[0],
            format!("Return-Path: <team+bounces-{member}=example.test@example.test>"),
            "the member's VERP address is the envelope sender:\n{headers}"
        );
        assert_eq!(lines[1], format!("Delivered-To: {member}@example.test"));
        for field in [
            "\r\nList-Id: \"The Team\" <team.example.test>\r\n",
            "\r\nList-Post: <mailto:team@example.test>\r\n",
            "\r\nList-Unsubscribe: <mailto:team-leave@example.test>\r\n",
            "\r\nPrecedence: list\r\n",
            "\r\nSubject: [team] lunch\r\n",
            "\r\nFrom: alice@example.test\r\n",
            "\r\nMessage-ID: <post-1@example.test>\r\n",
        ] {
            assert!(headers.contains(field), "{member}: {field:?} in\n{headers}");
        }
        assert!(
            !headers.contains("\r\nSubject: lunch\r\n"),
            "{member}: one Subject, the prefixed one:\n{headers}"
        );
        assert_eq!(
            String::from_utf8_lossy(split(got).1),
            format!("{body}{FOOTER}"),
            "{member}: the footer follows the post's text"
        );
    }
    let to_dave = &sys.messages("dave")[0];
    let headers = headers_of(to_dave);
    assert!(
        headers.starts_with("Return-Path: <alice@example.test>\r\n"),
        "{headers}"
    );
    assert!(headers.contains("\r\nSubject: lunch\r\n"), "{headers}");
    for field in ["List-Id:", "List-Post:", "List-Unsubscribe:", "Precedence:"] {
        assert!(
            !headers.contains(field),
            "dave's copy is not the list's: {field} in\n{headers}"
        );
    }
    assert_eq!(String::from_utf8_lossy(split(to_dave).1), body);

    // A nonmember's post is held for the moderators; nobody receives it.
    let before = counts(&sys);
    let post = "From: erin@example.test\r\nTo: team@example.test\r\nSubject: buy now\r\n\
                Message-ID: <post-2@example.test>\r\n\r\nA great offer.\r\n";
    let reply = sys
        .send("erin@example.test", &["team@example.test"], post.as_bytes())
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let until = std::time::Instant::now() + WAIT;
    let held: Vec<(String, String, String)> = loop {
        let held = sqlx::query_as(
            "SELECT sender, subject, message_id FROM pepsi.list_held_message \
             JOIN pepsi.mailing_list USING (list_id) WHERE address = 'team@example.test'",
        )
        .fetch_all(&sys.db.pool)
        .await
        .unwrap();
        if !held.is_empty() {
            break held;
        }
        assert!(
            std::time::Instant::now() < until,
            "no held post after {WAIT:?}: {:#?}\n{}",
            sys.queue().await,
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        held,
        [(
            "erin@example.test".to_owned(),
            "buy now".to_owned(),
            "<post-2@example.test>".to_owned()
        )]
    );
    sys.wait_empty(WAIT).await;
    assert_eq!(
        counts(&sys),
        before,
        "a held post reaches nobody ({USERS:?})"
    );

    // Mail to the owner address reaches the owner, from the list's -bounces address.
    let to_owner = "From: dave@example.test\r\nTo: team-owner@example.test\r\n\
                    Subject: please add me\r\n\r\nMay I join?\r\n";
    let reply = sys
        .send(
            "dave@example.test",
            &["team-owner@example.test"],
            to_owner.as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let got = sys.wait_messages("olga", 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    let headers = headers_of(&got[0]);
    assert!(
        headers.starts_with("Return-Path: <team-bounces@example.test>\r\n"),
        "{headers}"
    );
    assert!(
        headers.contains("\r\nSubject: please add me\r\n"),
        "{headers}"
    );
    assert!(!headers.contains("List-Id:"), "{headers}");
    assert_eq!(
        counts(&sys),
        [1, 1, 1, 1, 0, 1],
        "the owner's mail reaches olga alone ({USERS:?})"
    );
}

/// Sends erin's message with `subject` and `text` to `to`, which must be taken.
async fn send_from_erin(sys: &System, to: &str, subject: &str, text: &str) {
    let message =
        format!("From: erin@example.test\r\nTo: {to}\r\nSubject: {subject}\r\n\r\n{text}\r\n");
    let reply = sys
        .send("erin@example.test", &[to], message.as_bytes())
        .await;
    assert!(reply.starts_with("250"), "{to}: {reply}");
}

/// erin asks team-join@ to subscribe her: checks the confirmation that reaches her Maildir
/// (and nobody else's), the pending request and that she is no member yet; returns the
/// confirmation's token and the Reply-To address it names.
async fn request_subscription(sys: &System) -> (String, String) {
    send_from_erin(sys, "team-join@example.test", "subscribe", "subscribe").await;
    let got = sys.wait_messages("erin", 1, WAIT).await;
    sys.wait_empty(WAIT).await;
    let confirmation = headers_of(&got[0]);
    assert!(
        confirmation.starts_with("Return-Path: <team-bounces@example.test>\r\n"),
        "{confirmation}"
    );
    assert_eq!(
        field(&confirmation, "From").as_deref(),
        Some("<team-request@example.test>")
    );
    assert_eq!(
        field(&confirmation, "Auto-Submitted").as_deref(),
        Some("auto-replied")
    );
    let reply_to = field(&confirmation, "Reply-To").expect("a Reply-To");
    let reply_to = reply_to
        .strip_prefix('<')
        .and_then(|a| a.strip_suffix('>'))
        .unwrap_or(&reply_to)
        .to_owned();
    let token = reply_to
        .strip_prefix("team-confirm+")
        .and_then(|t| t.strip_suffix("@example.test"))
        .unwrap_or_else(|| panic!("Reply-To is the confirm address: {reply_to}"))
        .to_owned();
    assert_eq!(
        field(&confirmation, "Subject"),
        Some(format!("confirm {token}")),
        "{confirmation}"
    );
    assert_eq!(counts(sys), [0, 0, 0, 0, 1, 0], "erin alone ({USERS:?})");
    let pending: Vec<(String, String)> =
        sqlx::query_as("SELECT address, kind FROM pepsi.list_pending")
            .fetch_all(&sys.db.pool)
            .await
            .unwrap();
    assert_eq!(
        pending,
        [("erin@example.test".to_owned(), "subscribe".to_owned())]
    );
    assert_eq!(members(sys).await, ["alice", "bob", "carol"]);
    (token, reply_to)
}

/// Subscribing by mail (docs/lists.md, "Commands by mail"): a request to `-join@` gets a
/// confirmation in the requester's Maildir and a `list_pending` row, not a membership;
/// `confirm <token>` to `-request@` makes the member (`subscribed_via = mail`) and sends a
/// welcome, and the next post reaches the new member. The used token, and a `-request@`
/// message without a command, come back to the sender as DSNs (5.7.1, 5.5.2).
#[tokio::test]
async fn subscribing_by_mail_is_confirmed_by_the_address_and_a_bad_command_comes_back_as_a_dsn() {
    let mut sys = system_with_team().await;
    sys.start().await;
    let (token, _) = request_subscription(&sys).await;

    let confirm = format!("confirm {token}");
    let before = sys.messages("erin");
    send_from_erin(&sys, "team-request@example.test", &confirm, "").await;
    let welcome = headers_of(&wait_new(&sys, "erin", &before).await);
    sys.wait_empty(WAIT).await;
    assert!(
        welcome.starts_with("Return-Path: <team-bounces@example.test>\r\n"),
        "{welcome}"
    );
    assert_eq!(
        field(&welcome, "Subject").as_deref(),
        Some("Welcome to team@example.test"),
        "{welcome}"
    );
    assert_eq!(members(&sys).await, ["alice", "bob", "carol", "erin"]);
    let via: String = sqlx::query_scalar(
        "SELECT subscribed_via FROM pepsi.list_member WHERE address = 'erin@example.test'",
    )
    .fetch_one(&sys.db.pool)
    .await
    .unwrap();
    assert_eq!(via, "mail");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.list_pending")
        .fetch_one(&sys.db.pool)
        .await
        .unwrap();
    assert_eq!(pending, 0, "the request is carried out");

    // The next post reaches the new member with her own VERP address.
    let post = "From: alice@example.test\r\nTo: team@example.test\r\nSubject: welcome erin\r\n\
                \r\nHello Erin.\r\n";
    let before = sys.messages("erin");
    let reply = sys
        .send(
            "alice@example.test",
            &["team@example.test"],
            post.as_bytes(),
        )
        .await;
    assert!(reply.starts_with("250"), "{reply}");
    let copy = headers_of(&wait_new(&sys, "erin", &before).await);
    sys.wait_empty(WAIT).await;
    assert!(
        copy.starts_with("Return-Path: <team+bounces-erin=example.test@example.test>\r\n"),
        "{copy}"
    );
    assert_eq!(
        field(&copy, "Subject").as_deref(),
        Some("[team] welcome erin")
    );
    assert_eq!(
        counts(&sys),
        [1, 1, 1, 0, 3, 0],
        "one copy per member ({USERS:?})"
    );

    // The used token, and a -request message without a command: a DSN each to erin.
    for (subject, status) in [(confirm.as_str(), "5.7.1"), ("what is this list?", "5.5.2")] {
        let to = "team-request@example.test";
        let before = sys.messages("erin");
        send_from_erin(&sys, to, subject, "hello").await;
        let dsn = String::from_utf8_lossy(&wait_new(&sys, "erin", &before).await).into_owned();
        sys.wait_empty(WAIT).await;
        assert!(dsn.starts_with("Return-Path: <>\r\n"), "{subject}: {dsn}");
        for wanted in [
            "report-type=\"delivery-status\"".to_owned(),
            format!("Final-Recipient: rfc822; {to}"),
            "Action: failed".to_owned(),
            format!("Status: {status}"),
        ] {
            assert!(dsn.contains(&wanted), "{subject}: {wanted:?} in\n{dsn}");
        }
    }
    assert_eq!(
        counts(&sys),
        [1, 1, 1, 0, 5, 0],
        "nothing but the DSNs to erin ({USERS:?})"
    );
    assert_eq!(members(&sys).await, ["alice", "bob", "carol", "erin"]);
}

/// The confirmation's own way back (docs/lists.md: "reply to this message"): a reply to
/// its Reply-To, `team-confirm+<token>@`, is taken by the MX and makes erin a member.
#[tokio::test]
async fn a_reply_to_the_confirmation_subscribes_the_requester() {
    let mut sys = system_with_team().await;
    sys.start().await;
    let (token, reply_to) = request_subscription(&sys).await;
    let rcpt = rcpt_reply(sys.port, &reply_to).await;
    assert!(
        rcpt.starts_with("250"),
        "the MX must take the address a confirmation asks to be answered at ({} octets \
         before the @): {rcpt}",
        reply_to.find('@').unwrap_or(reply_to.len())
    );
    let before = sys.messages("erin");
    send_from_erin(&sys, &reply_to, &format!("Re: confirm {token}"), "yes").await;
    let welcome = wait_new(&sys, "erin", &before).await;
    sys.wait_empty(WAIT).await;
    assert_eq!(
        field(&headers_of(&welcome), "Subject").as_deref(),
        Some("Welcome to team@example.test")
    );
    assert_eq!(members(&sys).await, ["alice", "bob", "carol", "erin"]);
}

/// The ingress's CHECK_RECIPIENTS refuses the addresses of a list that does not exist at
/// RCPT, and takes those of the list that does.
#[tokio::test]
async fn mail_to_a_list_that_does_not_exist_is_refused_at_rcpt_with_5_1_1() {
    let mut sys = system_with_team().await;
    sys.start().await;
    for rcpt in ["nolist@example.test", "nolist-join@example.test"] {
        let reply = rcpt_reply(sys.port, rcpt).await;
        assert!(reply.starts_with("550 5.1.1"), "{rcpt}: {reply}");
    }
    // The existing list beside it is taken: the refusal is the list's absence.
    for rcpt in ["team@example.test", "team-join@example.test"] {
        let reply = rcpt_reply(sys.port, rcpt).await;
        assert!(reply.starts_with("250"), "{rcpt}: {reply}");
    }
    assert!(sys.queue().await.is_empty(), "nothing was accepted");
}

/// Issue 36's acceptance for DMARC: through SMTP, the dispatcher and the list stage, a post
/// whose From domain publishes `p=reject` reaches the members under the list's From with the
/// author in Reply-To, and one whose domain publishes `p=none` keeps its From. The list
/// stage asks a real name server (dnsmasq) serving the two `_dmarc` records.
#[tokio::test]
async fn a_p_reject_from_is_munged_and_a_p_none_from_left_alone() {
    let dns = crate::support::ingress::Dns::start(&[
        "--txt-record=_dmarc.reject.test,v=DMARC1; p=reject".into(),
        "--txt-record=_dmarc.none.test,v=DMARC1; p=none".into(),
    ]);
    let extra = format!(
        "[stage-lists]\nDNS_SERVERS = 127.0.0.1:{}\nDNS_TIMEOUT = 2s\n",
        dns.port
    );
    let mut sys = System::new(&extra, USERS).await;
    pepsi_list_ok(
        &sys,
        &["create", "team@example.test", "--display-name", "The Team"],
    );
    pepsi_list_ok(&sys, &["add", "team@example.test", "alice@example.test"]);
    pepsi_list_ok(
        &sys,
        &["configure", "team@example.test", "nonmember_action=accept"],
    );
    sys.start().await;

    // (the author, the From alice reads, her copy's Reply-To)
    let cases = [
        (
            "Rita <rita@reject.test>",
            "\"Rita via The Team\" <team@example.test>",
            Some("Rita <rita@reject.test>"),
        ),
        ("Nora <nora@none.test>", "Nora <nora@none.test>", None),
    ];
    for (i, (author, want_from, want_reply)) in cases.into_iter().enumerate() {
        let before = sys.messages("alice");
        let envelope = author
            .split(['<', '>'])
            .nth(1)
            .expect("an address in angle brackets");
        let post = format!(
            "From: {author}\r\nTo: team@example.test\r\nSubject: dmarc {i}\r\n\
             Message-ID: <dmarc-{i}@remote.test>\r\n\r\nHello.\r\n"
        );
        let reply = sys
            .send(envelope, &["team@example.test"], post.as_bytes())
            .await;
        assert!(reply.starts_with("250"), "{reply}");
        let got = wait_new(&sys, "alice", &before).await;
        let headers = headers_of(&got);
        assert_eq!(
            field(&headers, "From").as_deref(),
            Some(want_from),
            "{author}:\n{headers}"
        );
        assert_eq!(
            field(&headers, "Reply-To").as_deref(),
            want_reply,
            "{author}:\n{headers}"
        );
    }
}
