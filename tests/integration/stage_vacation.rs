//! `pepsi-stage-vacation worker` against a real database: an automatic reply whose pass is
//! redone after a crash (the claim or the queued reply committed, the pass's own commit
//! lost) goes out exactly once.

use std::path::PathBuf;

use pepsi_testkit::TestDb;
use serde_json::json;

use crate::support;

const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-vacation");

const HEADERS: &str = "From: bob@remote.test\r\nTo: alice@example.test\r\nSubject: lunch?\r\n\
                       Message-ID: <v1@remote.test>\r\n";

struct Setup {
    _dir: tempfile::TempDir,
    config: PathBuf,
}

/// A vacation stage replying at `replies`, the message going on to `next`, and alice's
/// automatic reply set.
async fn setup(db: &TestDb) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pepsi.conf");
    std::fs::write(
        &config,
        format!(
            "[database]\nURL = {}\n\n[pepsi]\nHOSTNAME = mx.example.test\n\n\
             [stage-vacation]\nPROGRAM = pepsi-stage-vacation\nREPLY_STAGE = replies\n\
             NEXT_STAGE = next\n\n\
             [stage-replies]\nPROGRAM = pepsi-stage-discard\n\n\
             [stage-next]\nPROGRAM = pepsi-stage-discard\n",
            db.url
        ),
    )
    .unwrap();
    sqlx::query("INSERT INTO pepsi.settings (address, name, value) VALUES ($1, 'vacation', $2)")
        .bind("alice@example.test")
        .bind(json!({"text": "Away.", "days": 7}))
        .execute(&db.pool)
        .await
        .unwrap();
    Setup { _dir: dir, config }
}

/// bob's message to alice, running at the vacation stage.
async fn message(db: &TestDb) -> i64 {
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind("bob@remote.test")
        .bind(vec!["alice@example.test".to_owned()])
        .bind(HEADERS.as_bytes())
        .bind(b"Are you free?\r\n".as_slice())
        .bind(json!({}))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, "vacation").await;
    id
}

/// The replies queued: (recipients, envelope sender).
async fn replies(db: &TestDb) -> Vec<(Vec<String>, String)> {
    sqlx::query_as(
        "SELECT rcpt_to, mail_from FROM pepsi.workqueue WHERE stage = 'replies' \
         ORDER BY workqueue_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Row `id` went on to the next stage.
async fn assert_went_on(db: &TestDb, id: i64) {
    let at: (String, String) =
        sqlx::query_as("SELECT stage, status::text FROM pepsi.workqueue WHERE workqueue_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(at, ("next".to_owned(), "pending".to_owned()));
}

fn one_reply_to_bob() -> Vec<(Vec<String>, String)> {
    vec![(vec!["bob@remote.test".to_owned()], String::new())]
}

/// A worker killed after the reply was queued and before the pass committed: the pass
/// redone (the row running at the stage again, its state as before) queues no second reply.
#[tokio::test]
async fn a_vacation_pass_redone_after_its_reply_was_queued_sends_no_second_reply() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let id = message(&db).await;
    assert_eq!(support::run_ids(STAGE, &s.config, &[id]).await, vec!["0"]);
    assert_went_on(&db, id).await;
    assert_eq!(replies(&db).await, one_reply_to_bob());
    // The pass's commit lost: the row is back where the crash left it.
    sqlx::query(
        "UPDATE pepsi.workqueue SET stage = 'vacation', status = 'running', state = '{}' \
         WHERE workqueue_id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    let lines = support::run_ids(STAGE, &s.config, &[id]).await;
    assert_eq!(lines, vec!["0"]);
    assert_went_on(&db, id).await;
    assert_eq!(replies(&db).await, one_reply_to_bob(), "still one reply");
}

/// A worker killed between the durable claim and queueing the reply: the pass redone is
/// granted its own claim again and queues the reply (not lost), once; another message from
/// the same sender within the period gets none.
#[tokio::test]
async fn a_vacation_pass_redone_after_its_claim_alone_committed_still_replies_once() {
    let db = TestDb::new().await;
    let s = setup(&db).await;
    let id = message(&db).await;
    // What the claim left: the pair answered, for this row.
    sqlx::query(
        "SELECT pepsi.autoreply_claim('alice@example.test', 'bob@remote.test', $1, '7 days')",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    assert!(replies(&db).await.is_empty());
    let lines = support::run_ids(STAGE, &s.config, &[id]).await;
    assert_eq!(lines, vec!["0"]);
    assert_went_on(&db, id).await;
    assert_eq!(
        replies(&db).await,
        one_reply_to_bob(),
        "the reply is not lost"
    );
    let state: serde_json::Value =
        sqlx::query_scalar("SELECT state FROM pepsi.workqueue WHERE workqueue_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(state["vacation"]["replied"], json!(["alice@example.test"]));
    // A second message from bob within the period: answered already.
    let again = message(&db).await;
    let lines = support::run_ids(STAGE, &s.config, &[again]).await;
    assert_eq!(lines, vec!["0"]);
    assert_eq!(replies(&db).await, one_reply_to_bob());
}
