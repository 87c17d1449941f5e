//! pepsi-stage-count as a worker process against the real migadu_counters binary and a private
//! redis-server: authenticated mail counts as outgoing for the sender and incoming for hosted
//! recipients, other mail as incoming; the message always advances, even with the service down.

use std::time::Duration;

use migadu_counters_testkit::{
    Daemon, DaemonSetup, RedisServer, TEST_TOKEN, free_port, wait_until,
};
use pepsi_testkit::TestDb;

use crate::support;

const COUNT: &str = env!("CARGO_BIN_EXE_pepsi-stage-count");
const COUNTERS: &str = env!("CARGO_BIN_EXE_migadu_counters");

fn key(level: &str, id: &str, flow: &str) -> String {
    format!(
        "cnt/{level}/{id}/d/{}/{flow}",
        chrono::Utc::now().date_naive().format("%Y-%m-%d")
    )
}

async fn running(db: &TestDb, rcpt: &[&str], auth_user: Option<&str>) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('alice@example.test', $1, 'Subject: x\r\n'::bytea, 'y\r\n'::bytea, '{}', $2)",
    )
    .bind(&rcpt)
    .bind(auth_user)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE pepsi.workqueue SET status = 'running', stage = 'count' WHERE workqueue_id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    id
}

fn worker(config: &std::path::Path, ids: &[i64]) -> Vec<String> {
    let input: String = ids.iter().map(|i| format!("{i}\n")).collect();
    support::stage_worker(COUNT, config, &input)
}

fn config(db: &TestDb, dir: &tempfile::TempDir, url: &str) -> std::path::PathBuf {
    let path = dir.path().join("pepsi.conf");
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n[stage-count]\nPROGRAM = pepsi-stage-count\nNEXT_STAGE = done\nURL = {url}\nAUTH_TOKEN = {TEST_TOKEN}\nTIMEOUT = 1s\n",
            db.url
        ),
    )
    .unwrap();
    path
}

async fn stages(db: &TestDb) -> Vec<(String, String)> {
    sqlx::query_as("SELECT stage, status::text FROM pepsi.workqueue ORDER BY workqueue_id")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn every_recipient_is_counted_and_the_message_advances() {
    let redis = RedisServer::start();
    let daemon = Daemon::start(
        COUNTERS,
        DaemonSetup {
            redis: &redis.addr(),
            rows: &[("example.test", "42|A/o=100,D/i=100")],
            ..Default::default()
        },
    );
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir, &format!("http://{}", daemon.api));
    let submitted = running(
        &db,
        &["bob@example.test", "someone@gmail.test"],
        Some("alice@example.test"),
    )
    .await;
    let inbound = running(&db, &["bob@example.test"], None).await;
    let lines = tokio::task::spawn_blocking(move || worker(&cfg, &[submitted, inbound]))
        .await
        .unwrap();
    assert_eq!(lines, vec!["0", "0"]);
    assert_eq!(
        stages(&db).await,
        vec![("done".into(), "pending".into()); 2]
    );
    // Counting is asynchronous behind the service's 202.
    let settled = wait_until(Duration::from_secs(10), || {
        redis.get(&key("A", "alice@example.test", "o")) == Some(2)
            && redis.get(&key("A", "bob@example.test", "i")) == Some(2)
    });
    assert!(
        settled,
        "alice out {:?}, bob in {:?}",
        redis.get(&key("A", "alice@example.test", "o")),
        redis.get(&key("A", "bob@example.test", "i"))
    );
    assert_eq!(redis.get(&key("O", "42", "o")), Some(2));
    assert_eq!(redis.get(&key("D", "example.test", "i")), Some(2));
}

#[tokio::test]
async fn the_message_advances_when_the_counting_service_is_down() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir, &format!("http://127.0.0.1:{}", free_port()));
    let id = running(&db, &["bob@example.test"], Some("alice@example.test")).await;
    let lines = tokio::task::spawn_blocking(move || worker(&cfg, &[id]))
        .await
        .unwrap();
    assert_eq!(lines, vec!["0"]);
    assert_eq!(stages(&db).await, vec![("done".into(), "pending".into())]);
}
