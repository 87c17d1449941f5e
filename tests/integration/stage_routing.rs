//! pepsi-stage-if, pepsi-stage-if-headers and pepsi-stage-route as worker processes against
//! a real database: branches on state, on local recipients and on a header field; a mixed
//! message split into one row per route with its recipients and dsn entries; unsplit
//! routing; and conditions refused at start.

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;

const IF: &str = env!("CARGO_BIN_EXE_pepsi-stage-if");
const IF_HEADERS: &str = env!("CARGO_BIN_EXE_pepsi-stage-if-headers");
const ROUTE: &str = env!("CARGO_BIN_EXE_pepsi-stage-route");

const GRAPH: &str = "\
[pepsi]
LOCAL_DOMAINS = example.test

[stage-check]
PROGRAM = pepsi-stage-if
CONDITION = state.junk == true or not all_rcpt_local
THEN = quarantine
NEXT_STAGE = local

[stage-subject]
PROGRAM = pepsi-stage-if-headers
CONDITION = header:Subject ~ '(?i)^urgent' and mail_from != 'noreply@example.org'
THEN = vip
ELSE = remote

[stage-route]
PROGRAM = pepsi-stage-route
ROUTE_LOCAL = local
ROUTE_REMOTE = remote
ROUTES = vip.test:vip

[stage-local]
PROGRAM = pepsi-stage-discard
[stage-remote]
PROGRAM = pepsi-stage-discard
[stage-vip]
PROGRAM = pepsi-stage-discard
[stage-quarantine]
PROGRAM = pepsi-stage-discard
";

fn config(db: &TestDb, dir: &tempfile::TempDir, graph: &str) -> std::path::PathBuf {
    let path = dir.path().join("pepsi.conf");
    std::fs::write(&path, format!("[database]\nURL = {}\n{graph}", db.url)).unwrap();
    path
}

/// A message running at `stage`; each recipient's dsn entry carries its address as ORCPT
/// so the lockstep can be checked.
async fn running(
    db: &TestDb,
    stage: &str,
    from: &str,
    rcpt: &[&str],
    subject: &str,
    state: Value,
) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let dsn: Vec<Value> = rcpt
        .iter()
        .map(|r| json!({"notify": ["FAILURE"], "orcpt": format!("rfc822;{r}")}))
        .collect();
    let mut state = state;
    state["dsn"] = json!({"ret": null, "envid": null, "rcpt": dsn});
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add($1, $2, convert_to($3, 'UTF8'), 'body\r\n'::bytea, $4)",
    )
    .bind(from)
    .bind(&rcpt)
    .bind(format!("Subject: {subject}\r\nFrom: <{from}>\r\n"))
    .bind(&state)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    support::claim(&db.pool, id, stage).await;
    id
}

async fn stage_of(db: &TestDb, id: i64) -> (String, String) {
    sqlx::query_as("SELECT stage, status::text FROM pepsi.workqueue WHERE workqueue_id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

async fn run(program: &'static str, cfg: &std::path::Path, ids: &[i64]) -> Vec<String> {
    support::run_ids(program, cfg, ids).await
}

#[tokio::test]
async fn if_branches_on_state_and_on_local_recipients() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir, GRAPH);
    sqlx::query("INSERT INTO pepsi.settings (address, name, value) VALUES ('@hosted.test', 'local_domain', 'true')")
        .execute(&db.pool)
        .await
        .unwrap();
    let s = "a@example.org";
    let junk = running(
        &db,
        "check",
        s,
        &["a@example.test"],
        "x",
        json!({"junk": true}),
    )
    .await;
    let clean_local = running(
        &db,
        "check",
        s,
        &["a@example.test", "b@hosted.test"],
        "x",
        json!({"junk": false}),
    )
    .await;
    let clean_remote = running(
        &db,
        "check",
        s,
        &["a@example.test", "b@elsewhere.test"],
        "x",
        json!({}),
    )
    .await;
    let lines = run(IF, &cfg, &[junk, clean_local, clean_remote]).await;
    assert_eq!(lines, ["0", "0", "0"]);
    let pending = |stage: &str| (stage.to_owned(), "pending".to_owned());
    assert_eq!(stage_of(&db, junk).await, pending("quarantine"));
    // hosted.test is local through the settings layer; ELSE defaults to NEXT_STAGE.
    assert_eq!(stage_of(&db, clean_local).await, pending("local"));
    assert_eq!(stage_of(&db, clean_remote).await, pending("quarantine"));
}

#[tokio::test]
async fn if_headers_branches_on_a_header_field() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir, GRAPH);
    let urgent = running(
        &db,
        "subject",
        "a@example.org",
        &["x@example.test"],
        "URGENT: call me",
        json!({}),
    )
    .await;
    let calm = running(
        &db,
        "subject",
        "a@example.org",
        &["x@example.test"],
        "weekly report",
        json!({}),
    )
    .await;
    let robot = running(
        &db,
        "subject",
        "noreply@example.org",
        &["x@example.test"],
        "urgent",
        json!({}),
    )
    .await;
    let lines = run(IF_HEADERS, &cfg, &[urgent, calm, robot]).await;
    assert_eq!(lines, ["0", "0", "0"]);
    assert_eq!(stage_of(&db, urgent).await.0, "vip");
    assert_eq!(stage_of(&db, calm).await.0, "remote");
    assert_eq!(stage_of(&db, robot).await.0, "remote");
}

#[tokio::test]
async fn route_splits_a_mixed_message_one_row_per_route() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir, GRAPH);
    sqlx::query("INSERT INTO pepsi.settings (address, name, value) VALUES ('@hosted.test', 'local_domain', 'true')")
        .execute(&db.pool)
        .await
        .unwrap();
    let rcpt = [
        "a@example.test",
        "b@remote.org",
        "c@Hosted.test",
        "d@vip.test",
        "e@other.org",
    ];
    let mixed = running(
        &db,
        "route",
        "s@example.org",
        &rcpt,
        "x",
        json!({"junk": false}),
    )
    .await;
    let remote_only = running(
        &db,
        "route",
        "s@example.org",
        &["x@remote.org", "y@other.org"],
        "x",
        json!({}),
    )
    .await;
    let lines = run(ROUTE, &cfg, &[mixed, remote_only]).await;
    assert_eq!(lines, ["0", "0"]);

    let rows: Vec<(i64, String, String, Vec<String>, Value, i64)> = sqlx::query_as(
        "SELECT workqueue_id, stage, status::text, rcpt_to, state, body_id FROM pepsi.workqueue \
         WHERE workqueue_id <> $1 ORDER BY workqueue_id",
    )
    .bind(remote_only)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let by_stage = |stage: &str| {
        rows.iter()
            .find(|r| r.1 == stage)
            .unwrap_or_else(|| panic!("no row at {stage}: {rows:?}"))
    };
    assert_eq!(rows.len(), 3, "{rows:?}");
    for (stage, want) in [
        ("local", vec!["a@example.test", "c@Hosted.test"]),
        ("remote", vec!["b@remote.org", "e@other.org"]),
        ("vip", vec!["d@vip.test"]),
    ] {
        let (_, _, status, rcpt_to, state, _) = by_stage(stage);
        assert_eq!(status, "pending", "{stage}");
        assert_eq!(rcpt_to, &want, "{stage}");
        let orcpts: Vec<String> = want.iter().map(|r| format!("rfc822;{r}")).collect();
        let got: Vec<&str> = state["dsn"]["rcpt"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["orcpt"].as_str().unwrap())
            .collect();
        assert_eq!(got, orcpts, "dsn.rcpt of {stage}");
        assert_eq!(state["junk"], false, "state copied to {stage}");
    }
    assert_eq!(
        by_stage("local").0,
        mixed,
        "the first recipient's route keeps the row"
    );
    assert!(rows.iter().all(|r| r.5 == rows[0].5), "one shared body");

    assert_eq!(
        stage_of(&db, remote_only).await,
        ("remote".to_owned(), "pending".to_owned())
    );
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(total, 4, "the unsplit message stays one row");
}

#[tokio::test]
async fn bad_conditions_stop_the_worker_at_start() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    for (program, graph, needle) in [
        (
            IF,
            GRAPH.replace(
                "PROGRAM = pepsi-stage-if-headers",
                "PROGRAM = pepsi-stage-if",
            ),
            "CONDITION reads a header field: the stage needs PROGRAM = pepsi-stage-if-headers",
        ),
        (
            IF,
            GRAPH.replace("state.junk == true or", "state.junk == or"),
            "[stage-check] CONDITION = \"state.junk == or not all_rcpt_local\": expected a condition (at column 15: expected mail_from",
        ),
    ] {
        let cfg = config(&db, &dir, &graph);
        let out = std::process::Command::new(program)
            .args(["worker", "-c"])
            .arg(&cfg)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{stderr}");
    }
}
