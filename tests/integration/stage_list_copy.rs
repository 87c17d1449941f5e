//! The list copy a member receives, through `pepsi-stage-list worker` and a real database:
//! each member's own RFC 8058 unsubscribe link (whose token leads back to that member in
//! `list_unsubscribe_token`), `List-Unsubscribe-Post` only with `LIST_WEB_URL`, digest
//! members left to the digests, the personal footer, and the DMARC mitigation of From
//! domains served by a real name server (dnsmasq).

use std::path::PathBuf;

use pepsi_testkit::TestDb;
use serde_json::json;

use crate::support;
use crate::support::ingress::Dns;

const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-list");
const FINISHED: &str = "0 {\"finished\":true}";
const WEB: &str = "https://lists.example.test";

struct Setup {
    _dir: tempfile::TempDir,
    config: PathBuf,
    list: i64,
}

/// The list team@example.test ("The Team") with members Alice and carol (regular), dave
/// (delivery turned off) and erin (MIME digests); nonmembers' posts accepted, so any From
/// may post. `web`: `[pepsi] LIST_WEB_URL`; `dns`: the name server's port.
async fn setup(db: &TestDb, web: Option<&str>, dns: Option<u16>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pepsi.conf");
    let mut pepsi = String::from("HOSTNAME = mx.example.test\n");
    if let Some(w) = web {
        pepsi.push_str(&format!("LIST_WEB_URL = {w}\n"));
    }
    if let Some(port) = dns {
        pepsi.push_str(&format!(
            "DNS_SERVERS = 127.0.0.1:{port}\nDNS_TIMEOUT = 2s\n"
        ));
    }
    std::fs::write(
        &config,
        format!(
            "[database]\nURL = {}\n\n[pepsi]\n{pepsi}\n\
             [stage-lists]\nPROGRAM = pepsi-stage-list\nDELIVER_STAGE = deliver\n\
             NEXT_STAGE = next\nBOUNCE_STAGE = bounced\nDMARC_TIMEOUT = 5s\n\n\
             [stage-deliver]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-next]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-bounced]\nPROGRAM = pepsi-stage-discard\n",
            db.url
        ),
    )
    .unwrap();
    let list: i64 = sqlx::query_scalar(
        "INSERT INTO pepsi.mailing_list (address, display_name, subject_prefix, \
         nonmember_action) VALUES ('team@example.test', 'The Team', '[team]', 'accept') \
         RETURNING list_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    for (address, name, status) in [
        ("alice@example.test", "Alice", "enabled"),
        ("carol@remote.test", "", "enabled"),
        ("dave@remote.test", "", "by_user"),
        ("erin@remote.test", "", "enabled"),
    ] {
        sqlx::query(
            "INSERT INTO pepsi.list_member (list_id, address, display_name, role, \
             delivery_status) VALUES ($1, $2, $3, 'member', $4)",
        )
        .bind(list)
        .bind(address)
        .bind(name)
        .bind(status)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO pepsi.list_member_preference (member_id, delivery_mode) \
         SELECT member_id, 'mime_digest' FROM pepsi.list_member WHERE address = 'erin@remote.test'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    Setup {
        _dir: dir,
        config,
        list,
    }
}

/// Sets the list's `dmarc_mitigation`, `personalize` and `reply_goes_to` (each when given).
async fn configure(
    db: &TestDb,
    dmarc: Option<&str>,
    personalize: Option<&str>,
    reply: Option<&str>,
) {
    sqlx::query(
        "UPDATE pepsi.mailing_list SET dmarc_mitigation = COALESCE($1, dmarc_mitigation), \
         personalize = COALESCE($2, personalize), reply_goes_to = COALESCE($3, reply_goes_to)",
    )
    .bind(dmarc)
    .bind(personalize)
    .bind(reply)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// A post from `from` to the list with `extra` header fields, run through the stage; the
/// copies it made: (recipient, headers, body), in member order.
async fn post(db: &TestDb, s: &Setup, from: &str, extra: &str) -> Vec<(String, String, String)> {
    sqlx::query("DELETE FROM pepsi.workqueue WHERE stage = 'deliver'")
        .execute(&db.pool)
        .await
        .unwrap();
    let headers = format!(
        "From: {from}\r\nTo: team@example.test\r\nSubject: lunch\r\n\
         Message-ID: <{}@remote.test>\r\nDKIM-Signature: v=1; d=remote.test; b=x\r\n{extra}",
        from.len() + extra.len()
    );
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind("sender@remote.test")
        .bind(vec!["team@example.test".to_owned()])
        .bind(headers.as_bytes())
        .bind(b"Who is in?\r\n".as_slice())
        .bind(json!({}))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, "lists").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[id]).await,
        vec![FINISHED]
    );
    let rows: Vec<(Vec<String>, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT w.rcpt_to, w.headers, b.body FROM pepsi.workqueue w \
         JOIN pepsi.workqueue_body b USING (body_id) WHERE w.stage = 'deliver' \
         ORDER BY w.workqueue_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(r, h, b)| {
            (
                r[0].clone(),
                String::from_utf8(h).unwrap(),
                String::from_utf8(b).unwrap(),
            )
        })
        .collect()
}

/// The token of a copy's one-click link.
fn token_in(text: &str) -> String {
    let at = text.find("/lists/unsubscribe/").expect("a one-click link") + 19;
    text[at..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect()
}

/// Whose `list_unsubscribe_token` row the token's hash is.
async fn member_of_token(db: &TestDb, token: &str) -> Option<String> {
    sqlx::query_scalar(
        "SELECT m.address FROM pepsi.list_unsubscribe_token t JOIN pepsi.list_member m \
         USING (member_id) WHERE t.token_hash = sha256(convert_to($1, 'UTF8'))",
    )
    .bind(token)
    .fetch_optional(&db.pool)
    .await
    .unwrap()
}

fn field(headers: &str, name: &str) -> Vec<String> {
    let prefix = format!("{name}: ");
    headers
        .split("\r\n")
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(str::to_owned)
        .collect()
}

/// With LIST_WEB_URL each regular member's copy carries their own one-click link (its
/// token, by the shared contract, leads back to that member) and List-Unsubscribe-Post;
/// the digest member and the disabled one get no copy; the body stays one for all; a
/// second post carries the same links and makes no new token rows.
#[tokio::test]
async fn each_member_gets_their_own_one_click_link() {
    let db = TestDb::new().await;
    let s = setup(&db, Some(WEB), None).await;
    configure(&db, Some("none"), None, None).await;
    let copies = post(&db, &s, "Alice <alice@example.test>", "").await;
    let to: Vec<&str> = copies.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        to,
        ["alice@example.test", "carol@remote.test"],
        "no digest or disabled member"
    );
    let mut tokens = Vec::new();
    for (member, headers, body) in &copies {
        let unsub = field(headers, "List-Unsubscribe");
        assert_eq!(unsub.len(), 1, "{headers}");
        let token = token_in(&unsub[0]);
        assert_eq!(token.len(), 32, "{unsub:?}");
        assert_eq!(
            unsub[0],
            format!("<{WEB}/lists/unsubscribe/{token}>, <mailto:team-leave@example.test>")
        );
        assert_eq!(
            field(headers, "List-Unsubscribe-Post"),
            ["List-Unsubscribe=One-Click"]
        );
        assert_eq!(
            member_of_token(&db, &token).await.as_deref(),
            Some(member.as_str())
        );
        // The contract: hex of sha256(list secret || member_id as 8 bytes), first 16 bytes.
        let want: String = sqlx::query_scalar(
            "SELECT encode(substr(sha256(s.secret || int8send(m.member_id)), 1, 16), 'hex') \
             FROM pepsi.list_secret s JOIN pepsi.list_member m USING (list_id) \
             WHERE m.address = $1 AND m.list_id = $2",
        )
        .bind(member)
        .bind(s.list)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(token, want);
        assert!(
            body.ends_with(&format!(
                "List page: {WEB}/lists/team@example.test\r\n\
                 To unsubscribe send a message to team-leave@example.test\r\n"
            )),
            "the shared footer, with the list's page: {body}"
        );
        tokens.push(token);
    }
    assert_ne!(tokens[0], tokens[1]);
    let bodies: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT body_id) FROM pepsi.workqueue WHERE stage = 'deliver'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(bodies, 1, "one body for every copy");

    let again = post(&db, &s, "Alice <alice@example.test>", "").await;
    let again: Vec<String> = again.iter().map(|c| token_in(&c.1)).collect();
    assert_eq!(again, tokens, "a member's link does not change");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.list_unsubscribe_token")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 2);
}

/// Without LIST_WEB_URL: the -leave address alone, no List-Unsubscribe-Post, a footer
/// without a page, and no secret or token made.
#[tokio::test]
async fn without_list_web_url_only_the_mailto() {
    let db = TestDb::new().await;
    let s = setup(&db, None, None).await;
    configure(&db, Some("none"), None, None).await;
    let copies = post(&db, &s, "alice@example.test", "").await;
    assert_eq!(copies.len(), 2);
    for (_, headers, body) in &copies {
        assert_eq!(
            field(headers, "List-Unsubscribe"),
            ["<mailto:team-leave@example.test>"]
        );
        assert!(!headers.contains("List-Unsubscribe-Post"), "{headers}");
        assert!(!headers.contains("https://"), "{headers}");
        assert!(
            body.ends_with(
                "The Team mailing list -- team@example.test\r\n\
                 To unsubscribe send a message to team-leave@example.test\r\n"
            ),
            "{body}"
        );
    }
    let made: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM pepsi.list_secret) \
              + (SELECT count(*) FROM pepsi.list_unsubscribe_token)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(made, 0);
}

/// personalize = individual: each member's plain-text copy has a body of its own whose
/// footer names them and carries the link of their header; an HTML post keeps one shared
/// body without a footer; without LIST_WEB_URL the footer names the -leave address.
#[tokio::test]
async fn a_personal_footer_names_each_member() {
    let db = TestDb::new().await;
    let s = setup(&db, Some(WEB), None).await;
    configure(&db, Some("none"), Some("individual"), None).await;
    let copies = post(&db, &s, "alice@example.test", "").await;
    assert_eq!(copies.len(), 2);
    let whom = ["Alice <alice@example.test>", "carol@remote.test"];
    for ((_, headers, body), who) in copies.iter().zip(whom) {
        let token = token_in(headers);
        assert_eq!(
            body,
            &format!(
                "Who is in?\r\n-- \r\nThe Team mailing list -- team@example.test\r\n\
                 This copy is for {who}\r\nTo unsubscribe: {WEB}/lists/unsubscribe/{token}\r\n"
            )
        );
    }
    let bodies: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT body_id) FROM pepsi.workqueue WHERE stage = 'deliver'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(bodies, 2, "one body per member");

    let html = post(&db, &s, "alice@example.test", "Content-Type: text/html\r\n").await;
    assert!(html.iter().all(|c| c.2 == "Who is in?\r\n"), "{html:?}");

    let db2 = TestDb::new().await;
    let s2 = setup(&db2, None, None).await;
    configure(&db2, Some("none"), Some("individual"), None).await;
    let copies = post(&db2, &s2, "alice@example.test", "").await;
    assert!(
        copies[1].2.ends_with(
            "This copy is for carol@remote.test\r\n\
             To unsubscribe send a message to team-leave@example.test\r\n"
        ),
        "{}",
        copies[1].2
    );
}

/// DMARC per From domain, from a real name server: p=reject (and p=quarantine found at the
/// organisational domain) takes the From and keeps the author in Reply-To; p=none and no
/// record leave it; a name server that refuses counts as p=reject; `wrap` attaches the
/// post; answers are cached in list_dmarc_policy, failures not.
#[tokio::test]
async fn dmarc_policies_decide_the_from() {
    let dns = Dns::start(&[
        "--txt-record=_dmarc.reject.test,v=DMARC1; p=reject".into(),
        "--txt-record=_dmarc.none.test,v=DMARC1; p=none".into(),
        "--txt-record=_dmarc.quar.test,v=DMARC1; p=quarantine".into(),
    ]);
    let db = TestDb::new().await;
    let s = setup(&db, None, Some(dns.port)).await;
    // (From, the copy's From, its Reply-To)
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "Bob <bob@reject.test>",
            "\"Bob via The Team\" <team@example.test>",
            &["Bob <bob@reject.test>"],
        ),
        (
            "q@mail.quar.test",
            "\"q@mail.quar.test via The Team\" <team@example.test>",
            &["q@mail.quar.test"],
        ),
        ("Nina <nina@none.test>", "Nina <nina@none.test>", &[]),
        ("olaf@nodmarc.test", "olaf@nodmarc.test", &[]),
        (
            "Una <una@unanswered.example>",
            "\"Una via The Team\" <team@example.test>",
            &["Una <una@unanswered.example>"],
        ),
    ];
    for (from, want_from, want_reply) in cases {
        let copies = post(&db, &s, from, "").await;
        assert_eq!(copies.len(), 2, "{from}");
        let h = &copies[0].1;
        assert_eq!(field(h, "From"), [*want_from], "{from}: {h}");
        assert_eq!(field(h, "Reply-To"), *want_reply, "{from}: {h}");
        let munged = want_from.contains(" via ");
        assert_eq!(!h.contains("DKIM-Signature"), munged, "{from}: {h}");
    }
    let cached: Vec<(String, String)> = sqlx::query_as(
        "SELECT domain, policy FROM pepsi.list_dmarc_policy \
         WHERE expires_at > now() + interval '3 hours' ORDER BY domain",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let cached: Vec<(&str, &str)> = cached
        .iter()
        .map(|(d, p)| (d.as_str(), p.as_str()))
        .collect();
    assert_eq!(
        cached,
        [
            ("mail.quar.test", "quarantine"),
            ("nodmarc.test", "absent"),
            ("none.test", "none"),
            ("reject.test", "reject"),
        ],
        "answers cached for DMARC_CACHE (4h), failures not"
    );

    // Replies to the list: the author goes to Cc. Wrapped: the post is attached whole.
    configure(&db, None, None, Some("list")).await;
    let copies = post(&db, &s, "Bob <bob@reject.test>", "").await;
    let h = &copies[0].1;
    assert_eq!(field(h, "Reply-To"), ["<team@example.test>"], "{h}");
    assert_eq!(field(h, "Cc"), ["Bob <bob@reject.test>"], "{h}");
    configure(&db, Some("wrap"), None, Some("sender")).await;
    let copies = post(&db, &s, "Bob <bob@reject.test>", "").await;
    let (h, b) = (&copies[0].1, &copies[0].2);
    assert!(
        h.contains("Content-Type: multipart/mixed; boundary="),
        "{h}"
    );
    assert!(
        h.contains("List-Id: \"The Team\" <team.example.test>"),
        "{h}"
    );
    assert!(
        b.contains("Content-Type: message/rfc822\r\n")
            && b.contains("From: Bob <bob@reject.test>\r\n")
            && b.contains("DKIM-Signature: v=1; d=remote.test; b=x\r\n"),
        "{b}"
    );
    let copies = post(&db, &s, "Nina <nina@none.test>", "").await;
    assert!(
        !copies[0].1.contains("multipart/mixed"),
        "p=none is not wrapped"
    );
}
