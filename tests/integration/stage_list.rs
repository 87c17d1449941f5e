//! `pepsi-stage-list worker` against a real database: a list's posts fanned out to its
//! enabled members with VERP envelope senders and the list copy, exactly once even when the
//! pass is redone; held, refused, discarded and deferred posts; owner mail; bounces.

use std::path::PathBuf;

use pepsi_testkit::TestDb;
use serde_json::json;

use crate::support;

const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-list");

/// The status line of a pass that ended its row: every list recipient was handled here.
const FINISHED: &str = "0 {\"finished\":true}";

struct Setup {
    _dir: tempfile::TempDir,
    config: PathBuf,
}

/// The list team@example.test (members alice, carol and dave, whose delivery he turned off;
/// owner olga; a rule refusing spam@evil.test), its stage `lists` handing members' copies to
/// `deliver` and other recipients to `next`, bounces to `bounced`.
async fn setup(db: &TestDb) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pepsi.conf");
    std::fs::write(
        &config,
        format!(
            "[database]\nURL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\n\n\
             [stage-lists]\nPROGRAM = pepsi-stage-list\nDELIVER_STAGE = deliver\n\
             NEXT_STAGE = next\nBOUNCE_STAGE = bounced\n\n\
             [stage-deliver]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-next]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-bounced]\nPROGRAM = pepsi-stage-discard\n",
            db.url
        ),
    )
    .unwrap();
    let list: i64 = sqlx::query_scalar(
        "INSERT INTO pepsi.mailing_list (address, display_name, subject_prefix) \
         VALUES ('team@example.test', 'The Team', '[team]') RETURNING list_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    for (address, role, status, action) in [
        ("alice@example.test", "member", "enabled", None),
        ("carol@remote.test", "member", "enabled", None),
        ("dave@remote.test", "member", "by_user", None),
        ("olga@example.test", "owner", "enabled", None),
        ("spam@evil.test", "nonmember", "enabled", Some("reject")),
    ] {
        sqlx::query(
            "INSERT INTO pepsi.list_member (list_id, address, role, delivery_status, \
             moderation_action) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(list)
        .bind(address)
        .bind(role)
        .bind(status)
        .bind(action)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    Setup { _dir: dir, config }
}

/// A message from `from` to `rcpt`, running at the list stage.
async fn message(db: &TestDb, from: &str, rcpt: &[&str], extra: &str) -> i64 {
    message_with_body(db, from, rcpt, extra, "Who is in?\r\n").await
}

/// `message` with its own body (`extra` ends in the fields that describe it).
async fn message_with_body(db: &TestDb, from: &str, rcpt: &[&str], extra: &str, body: &str) -> i64 {
    let headers = format!(
        "From: {from}\r\nTo: team@example.test\r\nSubject: lunch\r\n\
         Message-ID: <{}@remote.test>\r\n{extra}",
        rcpt.len() + from.len() + extra.len()
    );
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind(from)
        .bind(rcpt.iter().map(|r| r.to_string()).collect::<Vec<_>>())
        .bind(headers.as_bytes())
        .bind(body.as_bytes())
        .bind(json!({}))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, "lists").await;
    id
}

/// The rows at `stage`: (envelope sender, recipients, headers, body id).
async fn rows_at(db: &TestDb, stage: &str) -> Vec<(String, Vec<String>, Vec<u8>, i64)> {
    sqlx::query_as(
        "SELECT mail_from, rcpt_to, headers, body_id FROM pepsi.workqueue WHERE stage = $1 \
         ORDER BY workqueue_id",
    )
    .bind(stage)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

async fn body(db: &TestDb, body_id: i64) -> String {
    let b: Vec<u8> = sqlx::query_scalar("SELECT body FROM pepsi.workqueue_body WHERE body_id = $1")
        .bind(body_id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    String::from_utf8(b).unwrap()
}

async fn gone(db: &TestDb, id: i64) -> bool {
    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pepsi.workqueue WHERE workqueue_id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
        == 0
}

/// A member's post to the list and to someone else: the other recipient goes on to `next`,
/// each enabled member gets the list copy on a row of their own with their VERP address as
/// envelope sender, all sharing one body; the pass redone after a crash sends nothing twice.
#[tokio::test]
async fn a_members_post_reaches_every_enabled_member_once() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let id = message(
        &db,
        "Alice <alice@example.test>",
        &["team@example.test", "bob@example.test"],
        "List-Id: <forged.example.com>\r\n",
    )
    .await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[id]).await,
        vec![FINISHED]
    );
    let next = rows_at(&db, "next").await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].1, vec!["bob@example.test"]);
    assert!(gone(&db, id).await, "the list's recipient is done");
    let copies = rows_at(&db, "deliver").await;
    let envelopes: Vec<(String, Vec<String>)> = copies
        .iter()
        .map(|(from, rcpt, _, _)| (from.clone(), rcpt.clone()))
        .collect();
    assert_eq!(
        envelopes,
        vec![
            (
                "team+bounces-alice=example.test@example.test".to_owned(),
                vec!["alice@example.test".to_owned()]
            ),
            (
                "team+bounces-carol=remote.test@example.test".to_owned(),
                vec!["carol@remote.test".to_owned()]
            ),
        ]
    );
    assert_eq!(copies[0].3, copies[1].3, "one body for every copy");
    let h = String::from_utf8(copies[0].2.clone()).unwrap();
    for want in [
        "Subject: [team] lunch\r\n",
        "List-Id: \"The Team\" <team.example.test>\r\n",
        "List-Unsubscribe: <mailto:team-leave@example.test>\r\n",
        "Precedence: list\r\n",
    ] {
        assert!(h.contains(want), "{want:?} in {h}");
    }
    assert!(!h.contains("forged.example.com"), "{h}");
    let b = body(&db, copies[0].3).await;
    assert!(
        b.starts_with("Who is in?\r\n-- \r\nThe Team mailing list -- team@example.test\r\n"),
        "{b}"
    );
    let posts: Vec<(String, i32)> =
        sqlx::query_as("SELECT sender, recipients FROM pepsi.list_post")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(posts, vec![("alice@example.test".to_owned(), 2)]);

    // The pass's own commit lost after the fan-out committed: the row is back, running at
    // the list stage with only the list's recipient, and the pass runs again.
    let again: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind("alice@example.test")
        .bind(vec!["team@example.test".to_owned()])
        .bind(b"From: alice@example.test\r\nSubject: lunch\r\n".as_slice())
        .bind(b"Who is in?\r\n".as_slice())
        .bind(json!({}))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE pepsi.list_post SET workqueue_id = $1")
        .bind(again)
        .execute(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, again, "lists").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[again]).await,
        vec![FINISHED]
    );
    assert_eq!(rows_at(&db, "deliver").await.len(), 2, "no second fan-out");
    assert!(gone(&db, again).await);
}

/// A nonmember's post is held with its body; a refused sender's post is bounced; a post
/// that already went through the list is dropped; a `-request` message without a command is
/// bounced.
#[tokio::test]
async fn held_refused_looped_and_command_mail() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let held = message(&db, "stranger@else.test", &["team@example.test"], "").await;
    let refused = message(&db, "spam@evil.test", &["team@example.test"], "").await;
    let looped = message(
        &db,
        "carol@remote.test",
        &["team@example.test"],
        "List-Id: The Team <team.example.test>\r\n",
    )
    .await;
    let join = message(&db, "new@else.test", &["team-request@example.test"], "").await;
    let lines = support::run_ids(STAGE, &s.config, &[held, refused, looped, join]).await;
    assert_eq!(lines, vec![FINISHED; 4]);
    let holds: Vec<(String, String, Vec<u8>)> =
        sqlx::query_as("SELECT sender, reason, body FROM pepsi.list_held_message")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        holds,
        vec![(
            "stranger@else.test".to_owned(),
            "stranger@else.test is not a member of the list".to_owned(),
            b"Who is in?\r\n".to_vec()
        )]
    );
    assert!(gone(&db, held).await && gone(&db, looped).await);
    assert!(
        rows_at(&db, "deliver").await.is_empty(),
        "nothing fanned out"
    );
    let bounced: Vec<(i64, serde_json::Value)> = sqlx::query_as(
        "SELECT workqueue_id, state -> 'bounce' FROM pepsi.workqueue WHERE stage = 'bounced' \
         ORDER BY workqueue_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(bounced.len(), 2, "{bounced:?}");
    let text = |v: &serde_json::Value| v.to_string();
    // The notifications are new rows; the posts' own rows are gone.
    assert!(
        text(&bounced[0].1).contains("5.7.1") && text(&bounced[0].1).contains("spam@evil.test"),
        "{bounced:?}"
    );
    assert!(
        text(&bounced[1].1).contains("5.5.2")
            && text(&bounced[1].1).contains("team-request@example.test"),
        "{bounced:?}"
    );
    assert!(gone(&db, refused).await && gone(&db, join).await);
}

/// Mail to the owner address reaches every owner from the list's bounce address; a VERP
/// bounce is recorded for the member it names: hard for 5.1.1, policy for 5.7.1.
#[tokio::test]
async fn owner_mail_and_bounces() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let owner = message(&db, "bob@else.test", &["team-owner@example.test"], "").await;
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind("")
        .bind(vec!["team+bounces-carol=remote.test@example.test".to_owned()])
        .bind(b"From: MAILER-DAEMON@remote.test\r\nSubject: Undelivered\r\n".as_slice())
        .bind(b"Reporting-MTA: dns; remote.test\r\n\r\nFinal-Recipient: rfc822; carol@remote.test\r\nAction: failed\r\nStatus: 5.1.1\r\n".as_slice())
        .bind(json!({}))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, "lists").await;
    let policy: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind("")
        .bind(vec![
            "team+bounces-alice=example.test@example.test".to_owned(),
        ])
        .bind(b"Subject: Undelivered\r\n".as_slice())
        .bind(b"Status: 5.7.1 (content refused)\r\n".as_slice())
        .bind(json!({}))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, policy, "lists").await;
    let lines = support::run_ids(STAGE, &s.config, &[owner, id, policy]).await;
    assert_eq!(lines, vec![FINISHED; 3]);
    let owners = rows_at(&db, "deliver").await;
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].0, "team-bounces@example.test");
    assert_eq!(owners[0].1, vec!["olga@example.test"]);
    let events: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT address, kind, status FROM pepsi.list_bounce_event ORDER BY event_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        events,
        vec![
            ("carol@remote.test".into(), "hard".into(), "5.1.1".into()),
            ("alice@example.test".into(), "policy".into(), "5.7.1".into()),
        ]
    );
}

/// The messages the list sent at `deliver` to `to`: (envelope sender, headers).
async fn sent_to(db: &TestDb, to: &str) -> Vec<(String, String)> {
    rows_at(db, "deliver")
        .await
        .into_iter()
        .filter(|(_, rcpt, _, _)| rcpt == &[to.to_owned()])
        .map(|(from, _, h, _)| (from, String::from_utf8(h).unwrap()))
        .collect()
}

/// The token a confirmation's subject (`confirm <token>`, unfolded) carries.
fn token_of(headers: &str) -> String {
    pepsi_contract::message::field_values(headers.as_bytes(), "Subject")
        .into_iter()
        .find_map(|v| v.strip_prefix("confirm").map(|t| t.trim().to_owned()))
        .unwrap_or_else(|| panic!("no confirmation subject in {headers}"))
}

async fn members(db: &TestDb) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT address FROM pepsi.list_member WHERE role = 'member' ORDER BY address",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Subscribing by mail is confirmed by the address (double opt-in): `-join` mails a token,
/// whose reply to `-confirm+<token>@` makes the member (once: the token is spent); leaving is
/// confirmed the same way; a fourth request from one address within the window sends no
/// fourth confirmation.
#[tokio::test]
async fn joining_and_leaving_by_mail_are_confirmed_by_the_address() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let join = message(&db, "New <new@else.test>", &["team-join@example.test"], "").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[join]).await,
        vec![FINISHED]
    );
    let sent = sent_to(&db, "new@else.test").await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].0, "team-bounces@example.test");
    let token = token_of(&sent[0].1);
    assert_eq!(token.len(), 24);
    assert!(
        sent[0]
            .1
            .contains(&format!("Reply-To: <team-confirm+{token}@example.test>")),
        "{}",
        sent[0].1
    );
    assert!(!members(&db).await.contains(&"new@else.test".to_owned()));
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT token_hash FROM pepsi.list_pending")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1);
    assert_ne!(stored[0], token.as_bytes(), "only the hash is stored");

    let reply = message(
        &db,
        "new@else.test",
        &[&format!("team-confirm+{token}@example.test")],
        "",
    )
    .await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[reply]).await,
        vec![FINISHED]
    );
    assert!(members(&db).await.contains(&"new@else.test".to_owned()));
    let welcome = sent_to(&db, "new@else.test").await;
    assert_eq!(welcome.len(), 2);
    assert!(
        welcome[1]
            .1
            .contains("Subject: Welcome to team@example.test"),
        "{}",
        welcome[1].1
    );
    // The token is spent: the same reply again is bounced.
    let again = message(
        &db,
        "new@else.test",
        &[&format!("team-confirm+{token}@example.test")],
        "",
    )
    .await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[again]).await,
        vec![FINISHED]
    );
    let bounced: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT state -> 'bounce' FROM pepsi.workqueue WHERE stage = 'bounced'")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(bounced.len(), 1);
    assert!(bounced[0].to_string().contains("5.7.1"), "{bounced:?}");

    // Leaving: asked by the member, confirmed with `confirm <token>` to -request.
    let leave = message(&db, "carol@remote.test", &["team-leave@example.test"], "").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[leave]).await,
        vec![FINISHED]
    );
    let token = token_of(&sent_to(&db, "carol@remote.test").await[0].1);
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind("carol@remote.test")
        .bind(vec!["team-request@example.test".to_owned()])
        .bind(format!("From: carol@remote.test\r\nSubject: Re: confirm {token}\r\n").as_bytes())
        .bind(b"\r\n".as_slice())
        .bind(json!({}))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, "lists").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[id]).await,
        vec![FINISHED]
    );
    assert!(!members(&db).await.contains(&"carol@remote.test".to_owned()));

    // Four requests for one stranger's address: three confirmations (the list's limit).
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(message(&db, "victim@else.test", &["team-join@example.test"], "").await);
    }
    assert_eq!(
        support::run_ids(STAGE, &s.config, &ids).await,
        vec![FINISHED; 4]
    );
    assert_eq!(sent_to(&db, "victim@else.test").await.len(), 3);
}

/// A `-join` from `from` for itself, as the ingress stores it from the SMTP client `client`
/// (`state.origin.client_addr`), running at the list stage.
async fn join_from_client(db: &TestDb, from: &str, client: &str) -> i64 {
    let headers = format!("From: {from}\r\nTo: team-join@example.test\r\nSubject: join\r\n");
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind(from)
        .bind(vec!["team-join@example.test".to_owned()])
        .bind(headers.as_bytes())
        .bind(b"join\r\n".as_slice())
        .bind(json!({"origin": {"client_addr": client, "helo": "bot", "esmtp": true}}))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, "lists").await;
    id
}

/// Subscription bombing from one SMTP client: `-join` requests naming many strangers
/// from one client address get CONFIRMATIONS_PER_CLIENT confirmations in the window, the
/// rest none (each recipient delivered, nothing bounced); another client is not affected,
/// an IPv6 client counts by its /64, and mail from this host counts by its envelope
/// sender's domain.
#[tokio::test]
async fn join_requests_from_one_client_get_at_most_confirmations_per_client() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let conf = std::fs::read_to_string(&s.config).unwrap().replace(
        "BOUNCE_STAGE = bounced\n",
        "BOUNCE_STAGE = bounced\nCONFIRMATIONS_PER_CLIENT = 3\n",
    );
    std::fs::write(&s.config, conf).unwrap();
    let confirmations = |addresses: Vec<String>| {
        let db = &db;
        async move {
            let mut n = 0;
            for a in &addresses {
                n += sent_to(db, a).await.len();
            }
            n
        }
    };
    let strangers: Vec<String> = (0..4).map(|i| format!("stranger{i}@else.test")).collect();
    let mut ids = Vec::new();
    for a in &strangers {
        ids.push(join_from_client(&db, a, "198.51.100.7").await);
    }
    assert_eq!(
        support::run_ids(STAGE, &s.config, &ids).await,
        vec![FINISHED; 4]
    );
    assert_eq!(
        confirmations(strangers.clone()).await,
        3,
        "three confirmations, one dropped"
    );
    assert!(
        rows_at(&db, "bounced").await.is_empty(),
        "no DSN for a dropped request"
    );
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.list_pending")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(pending, 3, "no pending request without its confirmation");
    let counted: Vec<(String, i32)> = sqlx::query_as(
        "SELECT key, count FROM pepsi.list_confirm_rate WHERE key_kind = 'client' ORDER BY key",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(counted, vec![("198.51.100.7".to_owned(), 4)]);

    // Another client is not affected.
    let other = join_from_client(&db, "neighbour@else.test", "203.0.113.9").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[other]).await,
        vec![FINISHED]
    );
    assert_eq!(sent_to(&db, "neighbour@else.test").await.len(), 1);

    // IPv6: the addresses of one /64 are one client.
    let v6: Vec<String> = (0..4).map(|i| format!("six{i}@else.test")).collect();
    let mut ids = Vec::new();
    for (i, a) in v6.iter().enumerate() {
        ids.push(join_from_client(&db, a, &format!("2001:db8:7:7::{}", i + 1)).await);
    }
    assert_eq!(
        support::run_ids(STAGE, &s.config, &ids).await,
        vec![FINISHED; 4]
    );
    assert_eq!(confirmations(v6).await, 3);

    // From this host (loopback): counted by the envelope sender's domain, so one bot's
    // domain is limited and another domain is not.
    let bot: Vec<String> = (0..4).map(|i| format!("bot{i}@bots.test")).collect();
    let mut ids = Vec::new();
    for a in &bot {
        ids.push(join_from_client(&db, a, "127.0.0.1").await);
    }
    ids.push(join_from_client(&db, "person@people.test", "127.0.0.1").await);
    assert_eq!(
        support::run_ids(STAGE, &s.config, &ids).await,
        vec![FINISHED; 5]
    );
    assert_eq!(confirmations(bot).await, 3);
    assert_eq!(sent_to(&db, "person@people.test").await.len(), 1);
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT key FROM pepsi.list_confirm_rate WHERE key_kind = 'client' ORDER BY key",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        keys,
        [
            "198.51.100.7",
            "2001:db8:7:7::/64",
            "203.0.113.9",
            "domain:bots.test",
            "domain:people.test"
        ]
    );

    // A bad value stops the worker naming the option and the value.
    let conf = std::fs::read_to_string(&s.config).unwrap().replace(
        "CONFIRMATIONS_PER_CLIENT = 3",
        "CONFIRMATIONS_PER_CLIENT = many",
    );
    std::fs::write(&s.config, conf).unwrap();
    let err = support::worker_start_error(STAGE, &s.config);
    assert!(
        err.contains("CONFIRMATIONS_PER_CLIENT") && err.contains("many"),
        "{err}"
    );
}

/// A member whose VERP local part would pass 64 octets (RFC 5321) gets the list's plain
/// bounce address instead, which every server takes.
#[tokio::test]
async fn a_long_member_address_gets_the_plain_bounce_address() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let long = "a.very.long.mailbox.name.indeed@mail.subdomain.remote.test";
    sqlx::query(
        "INSERT INTO pepsi.list_member (list_id, address, role) \
         SELECT list_id, $1, 'member' FROM pepsi.mailing_list",
    )
    .bind(long)
    .execute(&db.pool)
    .await
    .unwrap();
    let id = message(&db, "alice@example.test", &["team@example.test"], "").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[id]).await,
        vec![FINISHED]
    );
    let senders: Vec<(String, Vec<String>)> = rows_at(&db, "deliver")
        .await
        .into_iter()
        .map(|(from, rcpt, _, _)| (from, rcpt))
        .collect();
    assert!(
        senders.contains(&(
            "team-bounces@example.test".to_owned(),
            vec![long.to_owned()]
        )),
        "{senders:?}"
    );
    for (from, _) in &senders {
        let local = from.rsplit_once('@').unwrap().0;
        assert!(local.len() <= 64, "{from}");
    }
    assert!(senders.contains(&(
        pepsi_contract::list::verp_address("team@example.test", "carol@remote.test"),
        vec!["carol@remote.test".to_owned()]
    )));
}

/// A flood of refused posts from one envelope sender (a forged one, say) gets at most
/// REFUSAL_NOTICES DSNs a day; the rest are dropped without one. Another sender still gets
/// theirs, and a pass run again counts nothing twice.
#[tokio::test]
async fn refusals_are_told_to_a_sender_at_most_refusal_notices_a_day() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let conf = std::fs::read_to_string(&s.config).unwrap().replace(
        "BOUNCE_STAGE = bounced\n",
        "BOUNCE_STAGE = bounced\nREFUSAL_NOTICES = 2\n",
    );
    std::fs::write(&s.config, conf).unwrap();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(message(&db, "spam@evil.test", &["team@example.test"], "").await);
    }
    let lines = support::run_ids(STAGE, &s.config, &ids).await;
    assert_eq!(lines, vec![FINISHED; 5]);
    let bounced = |db: &TestDb| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'bounced'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(bounced(&db).await, 2, "two notices, three dropped silently");
    let counted: i32 = sqlx::query_scalar(
        "SELECT count FROM pepsi.list_autoresponse WHERE address = 'spam@evil.test' \
         AND kind = 'reject_notice' AND day = current_date",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(counted, 5);
    // Another sender refused by a ban gets their notice.
    sqlx::query(
        "INSERT INTO pepsi.list_ban (list_id, pattern, created_by) \
         SELECT list_id, 'other@evil.test', 'test' FROM pepsi.mailing_list",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let other = message(&db, "other@evil.test", &["team@example.test"], "").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[other]).await,
        vec![FINISHED]
    );
    assert_eq!(bounced(&db).await, 3);
    // A bad value stops the worker naming the option.
    let conf = std::fs::read_to_string(&s.config)
        .unwrap()
        .replace("REFUSAL_NOTICES = 2", "REFUSAL_NOTICES = 1000");
    std::fs::write(&s.config, conf).unwrap();
    let err = support::worker_start_error(STAGE, &s.config);
    assert!(err.contains("REFUSAL_NOTICES = 1000"), "{err}");
}

/// Header filters (`list_header_filter`), first by position: a post whose `X-Spam-Flag`
/// says YES is held, one with `X-Team: internal` from a nonmember is accepted, a filter on
/// a field the post lacks does nothing, and a sender's own rule (reject) beats a filter's
/// accept.
#[tokio::test]
async fn header_filters_decide_in_position_order() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    for (position, header, pattern, action) in [
        (10, "X-Spam-Flag", "^yes", "hold"),
        (20, "x-team", "internal", "accept"),
        (30, "X-Absent", ".", "reject"),
    ] {
        sqlx::query(
            "INSERT INTO pepsi.list_header_filter (list_id, position, header, pattern, action) \
             SELECT list_id, $1, $2, $3, $4 FROM pepsi.mailing_list",
        )
        .bind(position)
        .bind(header)
        .bind(pattern)
        .bind(action)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let spam = message(
        &db,
        "alice@example.test",
        &["team@example.test"],
        "X-Spam-Flag: YES\r\nX-Team: internal\r\n",
    )
    .await;
    let team = message(
        &db,
        "stranger@else.test",
        &["team@example.test"],
        "X-Team: the\r\n internal one\r\n",
    )
    .await;
    let banned = message(
        &db,
        "spam@evil.test",
        &["team@example.test"],
        "X-Team: internal\r\n",
    )
    .await;
    let lines = support::run_ids(STAGE, &s.config, &[spam, team, banned]).await;
    assert_eq!(lines, vec![FINISHED; 3]);
    let holds: Vec<(String, String)> =
        sqlx::query_as("SELECT sender, reason FROM pepsi.list_held_message")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        holds,
        [(
            "alice@example.test".to_owned(),
            "header filter 10 (X-Spam-Flag)".to_owned()
        )]
    );
    // The stranger's post (a folded value matched) reaches the two enabled members.
    assert_eq!(rows_at(&db, "deliver").await.len(), 2);
    let bounced: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'bounced'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(bounced, 1, "spam@evil.test's own rule refuses the post");
}

/// A post with a text part, an HTML alternative, a PNG and an executable.
const MIXED: &str = "--mix\r\nContent-Type: multipart/alternative; boundary=alt\r\n\r\n\
    --alt\r\nContent-Type: text/plain\r\n\r\nplain words\r\n\
    --alt\r\nContent-Type: text/html\r\n\r\n<p>html words</p>\r\n--alt--\r\n\
    --mix\r\nContent-Type: image/png; name=chart.png\r\n\r\nPNGDATA\r\n\
    --mix\r\nContent-Type: application/octet-stream\r\n\
    Content-Disposition: attachment; filename=\"setup.EXE\"\r\n\r\nMZPAYLOAD\r\n--mix--\r\n";
const MIXED_FIELDS: &str = "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=mix\r\n";

/// The list's content filter (`list_content_filter`): the members' copies lose the
/// executable and the HTML alternative and keep the text and the image; a post left with
/// nothing is held (the list's `empty_action`), with what was removed as the reason, and
/// the same post approved by a moderator goes out as it came.
#[tokio::test]
async fn content_filters_remove_parts_and_hold_an_emptied_post() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    sqlx::query(
        "INSERT INTO pepsi.list_content_filter (list_id, filter_extensions, \
         collapse_alternatives, empty_action) \
         SELECT list_id, '{exe,bat}', true, 'hold' FROM pepsi.mailing_list",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let post = message_with_body(
        &db,
        "alice@example.test",
        &["team@example.test"],
        MIXED_FIELDS,
        MIXED,
    )
    .await;
    let only_exe = message_with_body(
        &db,
        "alice@example.test",
        &["team@example.test"],
        "MIME-Version: 1.0\r\nContent-Type: application/octet-stream; name=run.bat\r\n\
         X-Tag: only-exe\r\n",
        "@echo off\r\n",
    )
    .await;
    let lines = support::run_ids(STAGE, &s.config, &[post, only_exe]).await;
    assert_eq!(lines, vec![FINISHED; 2]);
    let copies = rows_at(&db, "deliver").await;
    assert_eq!(copies.len(), 2, "the two enabled members get the post");
    for (_, rcpt, headers, body_id) in &copies {
        let text = body(&db, *body_id).await;
        assert!(
            text.contains("plain words") && text.contains("PNGDATA"),
            "{rcpt:?}: {text}"
        );
        assert!(
            !text.contains("MZPAYLOAD"),
            "the executable is removed: {text}"
        );
        assert!(
            !text.contains("html words"),
            "the alternative is collapsed: {text}"
        );
        let headers = String::from_utf8_lossy(headers);
        assert!(headers.contains("multipart/mixed"), "{headers}");
    }
    let holds: Vec<(String, String)> =
        sqlx::query_as("SELECT reason, convert_from(headers, 'UTF8') FROM pepsi.list_held_message")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(holds.len(), 1, "{holds:?}");
    assert_eq!(
        holds[0].0,
        "nothing is left after the list's content filter removed application/octet-stream \
         part \"run.bat\""
    );
    assert!(
        holds[0].1.contains("X-Tag: only-exe"),
        "the post is held whole"
    );

    // Approved by a moderator (the state pepsi-list writes on the row it sends back), the
    // emptied post goes out as it came.
    sqlx::query("DELETE FROM pepsi.workqueue WHERE stage = 'deliver'")
        .execute(&db.pool)
        .await
        .unwrap();
    let list_id: i64 = sqlx::query_scalar("SELECT list_id FROM pepsi.mailing_list")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let approved = message_with_body(
        &db,
        "alice@example.test",
        &["team@example.test"],
        "MIME-Version: 1.0\r\nContent-Type: application/octet-stream; name=run.bat\r\n",
        "@echo approved\r\n",
    )
    .await;
    sqlx::query("UPDATE pepsi.workqueue SET state = $2 WHERE workqueue_id = $1")
        .bind(approved)
        .bind(json!({"list_approval": {
            "list": "team@example.test", "list_id": list_id, "held_id": 1,
            "moderator": "olga@example.test"}}))
        .execute(&db.pool)
        .await
        .unwrap();
    let lines = support::run_ids(STAGE, &s.config, &[approved]).await;
    assert_eq!(lines, vec![FINISHED]);
    let copies = rows_at(&db, "deliver").await;
    assert_eq!(copies.len(), 2);
    assert!(body(&db, copies[0].3).await.contains("@echo approved"));
}

/// (message_id, thread_id, parent_url_id, subject, from_address) of the archived posts.
async fn archived(db: &TestDb) -> Vec<(String, i64, Option<String>, String, String)> {
    sqlx::query_as(
        "SELECT message_id, thread_id, parent_url_id, subject, from_address \
         FROM pepsi.archive_message ORDER BY archive_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Accepted posts are archived as they came (the subject without the list's prefix), a
/// reply in its parent's thread; a pass run again after its commit, and the same post sent
/// again, archive nothing twice.
#[tokio::test]
async fn accepted_posts_are_archived_once_in_their_thread() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let alice = "Alice <alice@example.test>";
    let first = message(&db, alice, &["team@example.test"], "").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[first]).await,
        vec![FINISHED]
    );
    let posts = archived(&db).await;
    assert_eq!(posts.len(), 1, "{posts:?}");
    let (mid, thread, _, subject, from) = posts[0].clone();
    assert_eq!(
        (subject.as_str(), from.as_str()),
        ("lunch", "alice@example.test")
    );
    let refs = format!("In-Reply-To: <{mid}>\r\nReferences: <{mid}>\r\n");
    let reply = message(&db, "carol@remote.test", &["team@example.test"], &refs).await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[reply]).await,
        vec![FINISHED]
    );
    let posts = archived(&db).await;
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert_eq!(posts[1].1, thread, "the reply is in the post's thread");
    assert_eq!(posts[1].2, pepsi_archive::url::url_id(&mid));
    let count: i32 =
        sqlx::query_scalar("SELECT message_count FROM pepsi.archive_thread WHERE thread_id = $1")
            .bind(thread)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(count, 2);

    // The first pass run again after its commit (its row back at the list stage).
    let again = message(&db, alice, &["team@example.test"], "").await;
    sqlx::query("UPDATE pepsi.list_post SET workqueue_id = $1 WHERE workqueue_id = $2")
        .bind(again)
        .bind(first)
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[again]).await,
        vec![FINISHED]
    );
    // The same post sent to the list again: the members get it, the archive has it.
    let resent = message(&db, alice, &["team@example.test"], "").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[resent]).await,
        vec![FINISHED]
    );
    let posts_sent: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.list_post")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(posts_sent, 3);
    assert_eq!(archived(&db).await.len(), 2, "nothing archived twice");
}

/// A list whose archive_policy is none archives nothing, and still sends its posts.
#[tokio::test]
async fn a_list_without_archive_archives_nothing() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    sqlx::query("UPDATE pepsi.mailing_list SET archive_policy = 'none'")
        .execute(&db.pool)
        .await
        .unwrap();
    let id = message(&db, "alice@example.test", &["team@example.test"], "").await;
    assert_eq!(
        support::run_ids(STAGE, &s.config, &[id]).await,
        vec![FINISHED]
    );
    assert_eq!(rows_at(&db, "deliver").await.len(), 2);
    assert!(archived(&db).await.is_empty());
}

/// A header filter whose pattern PostgreSQL takes too long to match (back-references over a
/// long value) holds the post for a moderator once PATTERN_TIMEOUT has passed, naming the
/// option, instead of failing the pass; a short value is matched as usual; a bad value of
/// the option stops the worker with an error naming it.
#[tokio::test]
async fn a_pattern_that_takes_too_long_holds_the_post() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let conf = std::fs::read_to_string(&s.config).unwrap().replace(
        "BOUNCE_STAGE = bounced\n",
        "BOUNCE_STAGE = bounced\nPATTERN_TIMEOUT = 1s\n",
    );
    std::fs::write(&s.config, &conf).unwrap();
    sqlx::query(
        "INSERT INTO pepsi.list_header_filter (list_id, position, header, pattern, action) \
         SELECT list_id, 10, 'X-Long', '^(.*)(.*)\\1\\2$', 'reject' FROM pepsi.mailing_list",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO pepsi.list_ban (list_id, pattern, created_by) VALUES (NULL, 'troll@evil.test', 'test')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let long = format!("X-Long: {}b\r\n", "a".repeat(1999));
    let slow = message(&db, "alice@example.test", &["team@example.test"], &long).await;
    // A banned sender's slow header fields do not hide the ban: refused, not held.
    let banned = message(&db, "troll@evil.test", &["team@example.test"], &long).await;
    let quick = message(
        &db,
        "alice@example.test",
        &["team@example.test"],
        "X-Long: abab\r\n",
    )
    .await;
    let lines = support::run_ids(STAGE, &s.config, &[slow, quick, banned]).await;
    assert_eq!(lines, vec![FINISHED; 3]);
    let holds: Vec<String> = sqlx::query_scalar("SELECT reason FROM pepsi.list_held_message")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        holds,
        ["matching the list's header filter patterns took longer than 1s (PATTERN_TIMEOUT)"]
    );
    // "abab" matches ^(.*)(.*)\1\2$ at once: the filter's reject is a DSN to the sender;
    // the banned sender gets one too.
    let bounced: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'bounced'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(bounced, 2);
    assert!(rows_at(&db, "deliver").await.is_empty());

    std::fs::write(
        &s.config,
        conf.replace("PATTERN_TIMEOUT = 1s", "PATTERN_TIMEOUT = 31s"),
    )
    .unwrap();
    let err = support::worker_start_error(STAGE, &s.config);
    assert!(
        err.contains("PATTERN_TIMEOUT = 31s: expected 1s to 30s"),
        "{err}"
    );
}
