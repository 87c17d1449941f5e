//! `pepsi-stage-secretary worker` against a real database and, for postage, a loopback
//! stand-in for a GNU Taler merchant backend (tests/integration/stage_secretary/merchant.py, a test
//! peer implementing the two endpoints the secretary speaks): who is held, who is asked, how
//! a confirmation by link, by reply or by paid postage releases the held mail, and expiry.

use std::path::PathBuf;

use pepsi_secretary::token::{self, Token};
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;
use crate::support::taler::{Merchant, TOKEN};

const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-secretary");

struct Setup {
    dir: tempfile::TempDir,
    config: PathBuf,
}

/// A secretary stage asking at `challenges`, mail going on to `next`, alice's secretary
/// set with `setting`; `extra` goes into the stage's section.
async fn setup(db: &TestDb, setting: Value, extra: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pepsi.conf");
    std::fs::write(
        &config,
        format!(
            "[database]\nURL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\n\
             SECRETARY_URL = https://mail.example.test\n\n\
             [stage-secretary]\nPROGRAM = pepsi-stage-secretary\nCHALLENGE_STAGE = challenges\n\
             NEXT_STAGE = next\n{extra}\n\n\
             [stage-challenges]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-next]\nPROGRAM = pepsi-stage-discard\n",
            db.url
        ),
    )
    .unwrap();
    sqlx::query("INSERT INTO pepsi.settings (address, name, value) VALUES ($1, 'secretary', $2)")
        .bind("alice@example.test")
        .bind(setting)
        .execute(&db.pool)
        .await
        .unwrap();
    Setup { dir, config }
}

/// DKIM passed for remote.test, as the ingress records it.
fn dkim_pass() -> Value {
    json!({"auth": {"dkim": [{"result": "pass", "domain": "remote.test", "selector": "s"}]}})
}

/// A message from `from` to `rcpt` with `extra` header fields and `state`, at the stage.
async fn message(db: &TestDb, from: &str, rcpt: &[&str], extra: &str, state: Value) -> i64 {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let headers = format!(
        "From: {from}\r\nTo: {}\r\nSubject: note {n}\r\nMessage-ID: <m{n}@remote.test>\r\n{extra}",
        rcpt.join(", ")
    );
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind(from)
        .bind(rcpt.iter().map(|r| r.to_string()).collect::<Vec<_>>())
        .bind(headers.as_bytes())
        .bind(b"Hello.\r\n".as_slice())
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, "secretary").await;
    id
}

async fn run(s: &Setup, ids: &[i64]) {
    support::run_ids(STAGE, &s.config, ids).await;
}

/// (stage, status) of row `id`, or None when it is gone.
async fn at(db: &TestDb, id: i64) -> Option<(String, String)> {
    sqlx::query_as("SELECT stage, status::text FROM pepsi.workqueue WHERE workqueue_id = $1")
        .bind(id)
        .fetch_optional(&db.pool)
        .await
        .unwrap()
}

fn paused() -> Option<(String, String)> {
    Some(("secretary".into(), "paused".into()))
}

fn went_on() -> Option<(String, String)> {
    Some(("next".into(), "pending".into()))
}

/// The challenges queued: (recipients, envelope sender, raw headers).
async fn challenges(db: &TestDb) -> Vec<(Vec<String>, String, String)> {
    let rows: Vec<(Vec<String>, String, Vec<u8>)> = sqlx::query_as(
        "SELECT rcpt_to, mail_from, headers FROM pepsi.workqueue WHERE stage = 'challenges' \
         ORDER BY workqueue_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(r, f, h)| (r, f, String::from_utf8(h).unwrap()))
        .collect()
}

/// The token a challenge carries in its Message-ID.
fn token_of(headers: &str) -> Token {
    let reply = headers.replace("Message-ID:", "In-Reply-To:");
    token::answered_token(reply.as_bytes()).expect("a challenge's Message-ID names its token")
}

/// (reason, status) of the held rows, by queue id.
async fn held(db: &TestDb) -> Vec<(i64, String, String)> {
    sqlx::query_as("SELECT queue_id, reason, status FROM pepsi.secretary_held ORDER BY queue_id")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

async fn whitelisted(db: &TestDb) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT sender, origin FROM pepsi.whitelist WHERE mailbox = 'alice@example.test' \
         ORDER BY sender",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// A stranger whose domain vouched (DKIM pass) is asked once for three messages; the link's
/// confirmation releases all three and whitelists the sender; their next message goes on.
#[tokio::test]
async fn a_stranger_is_asked_once_for_three_messages_and_a_confirmation_releases_all() {
    let db = TestDb::new().await;
    let s = setup(&db, json!({}), "").await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id = message(
            &db,
            "bob@remote.test",
            &["alice@example.test"],
            "",
            dkim_pass(),
        )
        .await;
        run(&s, &[id]).await;
        assert_eq!(at(&db, id).await, paused());
        ids.push(id);
    }
    let asked = challenges(&db).await;
    assert_eq!(
        asked.len(),
        1,
        "one challenge for three messages: {asked:?}"
    );
    let (rcpt, mail_from, headers) = &asked[0];
    assert_eq!(
        (rcpt.as_slice(), mail_from.as_str()),
        (&["bob@remote.test".to_owned()][..], "")
    );
    assert!(
        headers.contains("Auto-Submitted: auto-replied"),
        "{headers}"
    );
    assert!(headers.contains("In-Reply-To: <m"), "{headers}");
    let tok = token_of(headers);
    let body: Vec<u8> = sqlx::query_scalar(
        "SELECT b.body FROM pepsi.workqueue q JOIN pepsi.workqueue_body b USING (body_id) \
         WHERE q.stage = 'challenges'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let body = String::from_utf8(body).unwrap();
    assert!(
        body.contains(&format!(
            "https://mail.example.test/secretary/{}",
            tok.as_str()
        )),
        "{body}"
    );
    assert!(
        !body.contains("Hello."),
        "the held message's body is never quoted: {body}"
    );
    let reasons: Vec<String> = held(&db).await.into_iter().map(|h| h.1).collect();
    assert_eq!(reasons, ["challenged"; 3]);

    // Mail in bob's name that his domain did not vouch for (perhaps forged) is held unasked.
    let forged = message(
        &db,
        "bob@remote.test",
        &["alice@example.test"],
        "",
        json!({"auth": {"spf": {"result": "fail", "domain": "remote.test"}, "dkim": []}}),
    )
    .await;
    run(&s, &[forged]).await;
    assert_eq!(at(&db, forged).await, paused());
    assert_eq!(challenges(&db).await.len(), 1);
    // The link's page confirms (pepsi-httpd calls this function).
    let answer: Value = sqlx::query_scalar("SELECT pepsi.secretary_confirm($1, 'link')")
        .bind(tok.digest())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        (answer["changed"].clone(), answer["released"].clone()),
        (json!(true), json!(3))
    );
    for &id in &ids {
        assert_eq!(
            at(&db, id).await,
            Some(("secretary".into(), "pending".into())),
            "woken"
        );
    }
    for &id in &ids {
        support::claim(&db.pool, id, "secretary").await;
    }
    run(&s, &ids).await;
    for &id in &ids {
        assert_eq!(at(&db, id).await, went_on());
    }
    assert_eq!(
        at(&db, forged).await,
        paused(),
        "a confirmation does not release mail that may be forged"
    );
    assert_eq!(
        whitelisted(&db).await,
        [("bob@remote.test".to_owned(), "confirmed".to_owned())]
    );
    let next = message(
        &db,
        "bob@remote.test",
        &["alice@example.test"],
        "",
        dkim_pass(),
    )
    .await;
    run(&s, &[next]).await;
    assert_eq!(
        at(&db, next).await,
        went_on(),
        "a confirmed sender is trusted"
    );
    assert_eq!(challenges(&db).await.len(), 1);
}

/// A forged sender (SPF fail, no DKIM) draws no challenge, nor does a list's or an automatic
/// message: each is held without a word.
#[tokio::test]
async fn forged_list_and_automatic_mail_draws_no_challenge() {
    let db = TestDb::new().await;
    let s = setup(&db, json!({}), "").await;
    let forged = message(
        &db,
        "ceo@remote.test",
        &["alice@example.test"],
        "",
        json!({"auth": {"spf": {"result": "fail", "domain": "remote.test"}, "dkim": []}}),
    )
    .await;
    let auto = message(
        &db,
        "bob@remote.test",
        &["alice@example.test"],
        "Auto-Submitted: auto-generated\r\n",
        dkim_pass(),
    )
    .await;
    let list = message(
        &db,
        "bob@remote.test",
        &["alice@example.test"],
        "List-Id: <team.remote.test>\r\n",
        dkim_pass(),
    )
    .await;
    run(&s, &[forged, auto, list]).await;
    for id in [forged, auto, list] {
        assert_eq!(at(&db, id).await, paused(), "{id}");
    }
    assert!(
        challenges(&db).await.is_empty(),
        "{:?}",
        challenges(&db).await
    );
    assert_eq!(
        held(&db).await,
        [
            (forged, "unauthenticated".to_owned(), "held".to_owned()),
            (auto, "automated".to_owned(), "held".to_owned()),
            (list, "automated".to_owned(), "held".to_owned()),
        ]
    );
}

/// A reply that names the challenge confirms: it goes on itself and the mail the sender was
/// asked about is released; an automatic reply (a vacation notice) confirms nothing and,
/// held as automatic mail, is not released with the rest.
#[tokio::test]
async fn a_reply_to_the_challenge_confirms_and_an_automatic_one_does_not() {
    let db = TestDb::new().await;
    let s = setup(&db, json!({}), "").await;
    let first = message(
        &db,
        "bob@remote.test",
        &["alice@example.test"],
        "",
        dkim_pass(),
    )
    .await;
    run(&s, &[first]).await;
    let tok = token_of(&challenges(&db).await[0].2);
    let refers = format!(
        "In-Reply-To: <secretary.{}@mx.example.test>\r\n",
        tok.as_str()
    );
    let vacation = message(
        &db,
        "bob@remote.test",
        &["alice@example.test"],
        &format!("{refers}Auto-Submitted: auto-replied\r\n"),
        dkim_pass(),
    )
    .await;
    run(&s, &[vacation]).await;
    assert_eq!(
        at(&db, vacation).await,
        paused(),
        "an automatic reply is held"
    );
    assert!(whitelisted(&db).await.is_empty());
    // Another sender quoting the token confirms nothing either.
    let other = message(
        &db,
        "eve@remote.test",
        &["alice@example.test"],
        &refers,
        dkim_pass(),
    )
    .await;
    run(&s, &[other]).await;
    assert!(whitelisted(&db).await.is_empty());
    let reply = message(
        &db,
        "bob@remote.test",
        &["alice@example.test"],
        &refers,
        dkim_pass(),
    )
    .await;
    run(&s, &[reply]).await;
    assert_eq!(
        at(&db, reply).await,
        went_on(),
        "the reply itself is delivered"
    );
    assert_eq!(
        whitelisted(&db).await,
        [("bob@remote.test".to_owned(), "confirmed".to_owned())]
    );
    let statuses: Vec<(i64, String)> = held(&db).await.into_iter().map(|h| (h.0, h.2)).collect();
    assert!(
        statuses.contains(&(first, "released".to_owned())),
        "{statuses:?}"
    );
    // Automatic mail in bob's name is not released by his confirmation: it proves nothing
    // of who sent it, and stays for the owner.
    assert!(
        statuses.contains(&(vacation, "held".to_owned())),
        "{statuses:?}"
    );
}

/// A message to a mailbox with a secretary and to one without: the other recipient's copy
/// goes on at once, the held one is a row of its own.
#[tokio::test]
async fn only_the_recipient_with_a_secretary_waits() {
    let db = TestDb::new().await;
    let s = setup(&db, json!({}), "").await;
    let id = message(
        &db,
        "bob@remote.test",
        &["carol@example.test", "alice@example.test"],
        "",
        dkim_pass(),
    )
    .await;
    run(&s, &[id]).await;
    let rows: Vec<(Vec<String>, String, String)> = sqlx::query_as(
        "SELECT rcpt_to, stage, status::text FROM pepsi.workqueue \
         WHERE stage <> 'challenges' ORDER BY workqueue_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        rows[0],
        (
            vec!["carol@example.test".to_owned()],
            "next".into(),
            "pending".into()
        )
    );
    assert_eq!(rows[1].0, ["alice@example.test"]);
    assert_eq!(rows[1].1, "secretary");
    let split: Vec<i64> =
        sqlx::query_scalar("SELECT workqueue_id FROM pepsi.workqueue WHERE stage = 'secretary'")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    for &id in &split {
        support::claim(&db.pool, id, "secretary").await;
    }
    run(&s, &split).await;
    assert_eq!(at(&db, split[0]).await, paused());
    assert_eq!(challenges(&db).await.len(), 1);
}

/// Postage: the challenge carries the order's taler://pay/ URI; once the order is paid the
/// held mail is released and the sender whitelisted as paid. An unpaid order's mail expires.
#[tokio::test]
async fn paid_postage_releases_the_mail_and_unpaid_mail_expires() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let merchant = Merchant::start(dir.path());
    let s = setup(
        &db,
        json!({"postage": "KUDOS:0.5"}),
        &format!(
            "TALER_MERCHANT_URL = http://127.0.0.1:{}/\nTALER_MERCHANT_TOKEN = {TOKEN}\n\
             POSTAGE_POLL = 1s",
            merchant.port
        ),
    )
    .await;
    let id = message(
        &db,
        "bob@remote.test",
        &["alice@example.test"],
        "",
        dkim_pass(),
    )
    .await;
    run(&s, &[id]).await;
    assert_eq!(at(&db, id).await, paused());
    let headers = &challenges(&db).await[0].2;
    let uri = format!(
        "X-Pepsi-Postage: taler://pay/127.0.0.1:{}/o-1/",
        merchant.port
    );
    assert!(headers.contains(&uri), "{headers}");
    let order: (Option<String>, Option<String>) =
        sqlx::query_as("SELECT order_id, amount FROM pepsi.secretary_challenge")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(order, (Some("o-1".into()), Some("KUDOS:0.5".into())));
    let log = std::fs::read_to_string(&merchant.log).unwrap();
    assert!(
        log.contains("POST /private/orders") && log.contains("\"amount\":\"KUDOS:0.5\""),
        "{log}"
    );
    // Not paid yet: the wake-up asks and the mail waits on.
    support::claim(&db.pool, id, "secretary").await;
    run(&s, &[id]).await;
    assert_eq!(at(&db, id).await, paused());
    merchant.pay("o-1");
    support::claim(&db.pool, id, "secretary").await;
    run(&s, &[id]).await;
    assert_eq!(
        at(&db, id).await,
        went_on(),
        "paid postage releases the mail"
    );
    assert_eq!(
        whitelisted(&db).await,
        [("bob@remote.test".to_owned(), "paid".to_owned())]
    );
    // Carol's message: its order is never paid, and the mail expires.
    let unpaid = message(
        &db,
        "carol@remote.test",
        &["alice@example.test"],
        "",
        dkim_pass(),
    )
    .await;
    run(&s, &[unpaid]).await;
    assert_eq!(at(&db, unpaid).await, paused());
    sqlx::query("UPDATE pepsi.secretary_held SET expires_at = now() - interval '1 second' WHERE queue_id = $1")
        .bind(unpaid)
        .execute(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, unpaid, "secretary").await;
    run(&s, &[unpaid]).await;
    assert_eq!(at(&db, unpaid).await, None, "expired mail is gone");
    let status: String =
        sqlx::query_scalar("SELECT status FROM pepsi.secretary_held WHERE queue_id = $1")
            .bind(unpaid)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(status, "expired");
    drop(s.dir);
}
