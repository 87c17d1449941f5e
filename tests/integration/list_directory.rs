//! The list stage's directory of lists (`pepsi_contract::list_directory`) in a worker that
//! lives across changes: a list created while the worker runs is a list for the next
//! message, a deleted one is not, and mail to other addresses goes on untouched. The
//! directory answers "no such list" from memory, so without the `list_changed` notification
//! the second message below would miss the new list.

use std::process::Stdio;
use std::time::Duration;

use pepsi_testkit::TestDb;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::support;

const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-list");

async fn message(db: &TestDb, rcpt: &str) -> i64 {
    let id: i64 = sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5)")
        .bind("alice@example.test")
        .bind(vec![rcpt.to_owned()])
        .bind(format!("From: alice@example.test\r\nTo: {rcpt}\r\nSubject: hello\r\n").as_bytes())
        .bind(b"Hello.\r\n".as_slice())
        .bind(json!({}))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    support::claim(&db.pool, id, "lists").await;
    id
}

async fn count_at(db: &TestDb, stage: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue WHERE stage = $1")
        .bind(stage)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_running_worker_sees_lists_created_and_deleted() {
    let db = TestDb::new().await;
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
    let mut worker = tokio::process::Command::new(STAGE)
        .args(["worker", "-c"])
        .arg(&config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = worker.stdin.take().unwrap();
    let mut answers = BufReader::new(worker.stdout.take().unwrap()).lines();
    let mut pass = async |id: i64| {
        stdin.write_all(format!("{id}\n").as_bytes()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(30), answers.next_line())
            .await
            .expect("the worker answers")
            .unwrap()
            .expect("the worker is running")
    };

    // No list yet: the message goes on (and the worker's directory starts listening).
    pass(message(&db, "news@example.test").await).await;
    assert_eq!(count_at(&db, "next").await, 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Mail to mailboxes keeps going on.
    pass(message(&db, "bob@example.test").await).await;
    assert_eq!(count_at(&db, "next").await, 2);

    // Created while the worker runs: the next message is a post to it.
    let list: i64 = sqlx::query_scalar(
        "INSERT INTO pepsi.mailing_list (address, nonmember_action) \
         VALUES ('news@example.test', 'accept') RETURNING list_id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO pepsi.list_member (list_id, address, role) \
         VALUES ($1, 'carol@remote.test', 'member')",
    )
    .bind(list)
    .execute(&db.pool)
    .await
    .unwrap();
    for sent in 1..=2 {
        let answer = pass(message(&db, "news@example.test").await).await;
        assert!(answer.contains("finished"), "{answer}");
        assert_eq!(
            count_at(&db, "deliver").await,
            sent,
            "post {sent} fanned out"
        );
        assert_eq!(count_at(&db, "next").await, 2);
    }

    // Deleted: mail to the address goes on again, as to any other.
    sqlx::query("DELETE FROM pepsi.mailing_list WHERE list_id = $1")
        .bind(list)
        .execute(&db.pool)
        .await
        .unwrap();
    pass(message(&db, "news@example.test").await).await;
    assert_eq!(count_at(&db, "next").await, 3);
    assert_eq!(count_at(&db, "deliver").await, 2);

    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .expect("the worker ends at end of input")
        .unwrap();
    assert!(status.success(), "{status:?}");
}
