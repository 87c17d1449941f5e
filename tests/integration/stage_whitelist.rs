//! pepsi-stage-check-whitelist as a worker process against a real PostgreSQL: the verdict in
//! state for each recipient (an address entry, a domain entry, a stranger, no From:), and
//! learning from authenticated mail (never over an owner's entry; off with LEARN = no).

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;

const STAGE: &str = env!("CARGO_BIN_EXE_pepsi-stage-check-whitelist");

async fn running(db: &TestDb, from: &str, rcpt: &[&str], headers: &str, auth: Option<&str>) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add($1, $2, $3::bytea, 'y\r\n'::bytea, '{}', $4)",
    )
    .bind(from)
    .bind(&rcpt)
    .bind(headers.as_bytes())
    .bind(auth)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE pepsi.workqueue SET status = 'running', stage = 'whitelist' WHERE workqueue_id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    id
}

fn config(db: &TestDb, dir: &tempfile::TempDir, extra: &str) -> std::path::PathBuf {
    let path = dir.path().join("pepsi.conf");
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n[pepsi]\nRECIPIENT_DELIMITER = +\n[stage-whitelist]\nPROGRAM = pepsi-stage-check-whitelist\nNEXT_STAGE = done\n{extra}",
            db.url
        ),
    )
    .unwrap();
    path
}

async fn state(db: &TestDb, id: i64) -> (String, String, Value) {
    sqlx::query_as(
        "SELECT stage, status::text, state->'whitelist' FROM pepsi.workqueue WHERE workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

async fn entries(db: &TestDb) -> Vec<(String, String, String)> {
    sqlx::query_as("SELECT mailbox, sender, origin FROM pepsi.whitelist ORDER BY mailbox, sender")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn recipients_trusting_the_sender_are_recorded_and_sent_mail_teaches_the_sender() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    sqlx::query(
        "INSERT INTO pepsi.whitelist (mailbox, sender, origin) VALUES \
         ('alice@example.test', 'bob@example.org', 'owner'), \
         ('carol@example.test', '@example.org', 'owner')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let known = running(
        &db,
        "bounces@lists.example.org",
        &[
            "Alice+news@example.test",
            "carol@example.test",
            "dave@example.test",
        ],
        "From: Bob <Bob@Example.org>\r\nSubject: hi\r\n",
        None,
    )
    .await;
    let stranger = running(
        &db,
        "eve@evil.test",
        &["alice@example.test"],
        "From: eve@evil.test\r\n",
        None,
    )
    .await;
    let both = running(
        &db,
        "bob@example.org",
        &["alice@example.test", "carol@example.test"],
        "From: bob@example.org\r\n",
        None,
    )
    .await;
    let nameless = running(
        &db,
        "x@example.org",
        &["alice@example.test"],
        "Subject: no from\r\n",
        None,
    )
    .await;
    let sent = running(
        &db,
        "alice@example.test",
        &["zed@example.net", "Bob@Example.org", "alice@example.test"],
        "From: alice@example.test\r\n",
        Some("alice@example.test"),
    )
    .await;
    let cfg = config(&db, &dir, "");
    let lines = support::run_ids(STAGE, &cfg, &[known, stranger, both, nameless, sent]).await;
    assert_eq!(lines, ["0"; 5]);

    let done = |v: Value| ("done".to_owned(), "pending".to_owned(), v);
    assert_eq!(
        state(&db, known).await,
        done(
            json!({"sender": "bob@example.org", "trusted": ["alice@example.test", "carol@example.test"], "all": false})
        )
    );
    assert_eq!(
        state(&db, stranger).await,
        done(json!({"sender": "eve@evil.test", "trusted": [], "all": false}))
    );
    assert_eq!(
        state(&db, both).await,
        done(
            json!({"sender": "bob@example.org", "trusted": ["alice@example.test", "carol@example.test"], "all": true})
        )
    );
    assert_eq!(state(&db, nameless).await, done(json!({})));
    assert_eq!(
        state(&db, sent).await,
        done(json!({"learned": 2, "sender": "alice@example.test", "trusted": [], "all": false}))
    );
    // Learnt: zed; bob stays the owner's entry; alice never trusts herself by learning.
    assert_eq!(
        entries(&db).await,
        [
            (
                "alice@example.test".into(),
                "bob@example.org".into(),
                "owner".into()
            ),
            (
                "alice@example.test".into(),
                "zed@example.net".into(),
                "sent".into()
            ),
            (
                "carol@example.test".into(),
                "@example.org".into(),
                "owner".into()
            ),
        ]
    );

    // LEARN = no: authenticated mail is checked, nothing is learnt.
    let db2 = TestDb::new().await;
    let dir2 = tempfile::tempdir().unwrap();
    let quiet = running(
        &db2,
        "alice@example.test",
        &["zed@example.net"],
        "From: alice@example.test\r\n",
        Some("alice@example.test"),
    )
    .await;
    let cfg = config(&db2, &dir2, "LEARN = no\n");
    assert_eq!(support::run_ids(STAGE, &cfg, &[quiet]).await, ["0"]);
    assert_eq!(
        state(&db2, quiet).await,
        done(json!({"sender": "alice@example.test", "trusted": [], "all": false}))
    );
    assert!(entries(&db2).await.is_empty());
}

/// Security review #11: learning is keyed on the login, not the envelope sender: a logged-in
/// user writing with another user's address in MAIL FROM (a listener with
/// `SENDER_LOGIN_BINDING = no`) adds the recipients to its own list, never to the other's.
#[tokio::test]
async fn a_login_sending_as_another_user_teaches_only_its_own_whitelist() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let forged = running(
        &db,
        "Alice+x@example.test",
        &["evil@evil.test"],
        "From: alice@example.test\r\n",
        Some("mallory@example.test"),
    )
    .await;
    let cfg = config(&db, &dir, "");
    assert_eq!(support::run_ids(STAGE, &cfg, &[forged]).await, ["0"]);
    assert_eq!(
        entries(&db).await,
        [(
            "mallory@example.test".into(),
            "evil@evil.test".into(),
            "sent".into()
        )],
        "alice's list is untouched"
    );
    let (_, _, record) = state(&db, forged).await;
    assert_eq!(record["learned"], 1, "{record}");
}
