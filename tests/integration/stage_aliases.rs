//! pepsi-stage-aliases as a worker process against a real database: alias-file and
//! settings-layer aliases, catch-alls that spare existing mailboxes, loops, and a message
//! with nothing to expand; `rcpt_to` and `state.dsn.rcpt` always in lockstep.

use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::support;

const ALIASES: &str = env!("CARGO_BIN_EXE_pepsi-stage-aliases");

const ALIAS_FILE: &str = "\
# the test's aliases
team: alice, bob@example.org
loop@example.test: loop@example.test, carol@example.test
ring1@example.test: ring2@example.test
ring2@example.test: ring1@example.test
@catch.test: postmaster@example.test
";

fn config(db: &TestDb, dir: &tempfile::TempDir) -> std::path::PathBuf {
    let aliases = dir.path().join("aliases");
    std::fs::write(&aliases, ALIAS_FILE).unwrap();
    let path = dir.path().join("pepsi.conf");
    std::fs::write(
        &path,
        format!(
            "[database]\nURL = {}\n[pepsi]\nLOCAL_DOMAINS = example.test\nRECIPIENT_DELIMITER = +\n\
             [stage-aliases]\nPROGRAM = pepsi-stage-aliases\nNEXT_STAGE = next\nALIAS_FILE = {}\n\
             [stage-next]\nPROGRAM = pepsi-stage-discard\n",
            db.url,
            aliases.display()
        ),
    )
    .unwrap();
    path
}

/// A message running at stage `aliases` with one dsn entry per recipient: NOTIFY
/// `notify[i]`, ORCPT null.
async fn running(db: &TestDb, rcpt: &[&str], notify: &[Value]) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    let dsn_rcpt: Vec<Value> = notify
        .iter()
        .map(|n| json!({"notify": n, "orcpt": null}))
        .collect();
    let state = json!({"dsn": {"ret": "HDRS", "envid": "env-1", "rcpt": dsn_rcpt}, "keep": 1});
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('sender@example.org', $1, 'Subject: x\r\n'::bytea, 'y\r\n'::bytea, $2)",
    )
    .bind(&rcpt)
    .bind(&state)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE pepsi.workqueue SET status = 'running', stage = 'aliases' WHERE workqueue_id = $1",
    )
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    id
}

async fn fetch(db: &TestDb, id: i64) -> (String, String, Vec<String>, Value) {
    sqlx::query_as(
        "SELECT stage, status::text, rcpt_to, state FROM pepsi.workqueue WHERE workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

async fn run(cfg: std::path::PathBuf, ids: &[i64]) -> Vec<String> {
    support::run_ids(ALIASES, &cfg, ids).await
}

#[tokio::test]
async fn aliases_expand_with_dsn_entries_in_lockstep() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    sqlx::query(
        "INSERT INTO pepsi.settings (address, name, value) VALUES \
         ('sales@example.test', 'alias', '[\"x@example.org\", \"y@example.org\"]'), \
         ('@db.test', 'catchall', '\"z@example.test\"'), \
         ('@db.test', 'local_domain', 'true')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO pepsi.mailbox_account (address) VALUES ('real@catch.test')")
        .execute(&db.pool)
        .await
        .unwrap();

    let failure = json!(["FAILURE", "DELAY"]);
    let never = json!(["NEVER"]);
    let file_alias = running(
        &db,
        &["Team@Example.test", "dave@example.test"],
        &[failure.clone(), never.clone()],
    )
    .await;
    let catchall = running(
        &db,
        &["real@catch.test", "nobody@catch.test"],
        &[never.clone(), failure.clone()],
    )
    .await;
    let settings = running(
        &db,
        &["Sales+q@example.test", "any@db.test"],
        &[failure.clone(), never.clone()],
    )
    .await;
    let loops = running(
        &db,
        &["loop@example.test", "ring1@example.test"],
        &[failure.clone(), never.clone()],
    )
    .await;
    let unchanged = running(
        &db,
        &["dave@example.test", "x@remote.test"],
        &[failure.clone(), never.clone()],
    )
    .await;

    let lines = run(cfg, &[file_alias, catchall, settings, loops, unchanged]).await;
    assert_eq!(lines, ["0", "0", "0", "0", "0"]);

    let entry = |notify: &Value, orcpt: Value| json!({"notify": notify, "orcpt": orcpt});
    let check = |(stage, status, rcpt, state): (String, String, Vec<String>, Value),
                 want_rcpt: &[&str],
                 want_dsn: Vec<Value>| {
        assert_eq!((stage.as_str(), status.as_str()), ("next", "pending"));
        assert_eq!(rcpt, want_rcpt);
        assert_eq!(
            state["dsn"]["rcpt"],
            Value::Array(want_dsn),
            "{want_rcpt:?}"
        );
        assert_eq!(state["dsn"]["envid"], "env-1");
        assert_eq!(state["keep"], 1, "other state keys survive");
    };

    // A bare alias-file name in a local domain, its targets qualified with that domain; the
    // expanded entries inherit NOTIFY and take the alias as ORCPT.
    check(
        fetch(&db, file_alias).await,
        &["alice@example.test", "bob@example.org", "dave@example.test"],
        vec![
            entry(&failure, json!("rfc822;Team@Example.test")),
            entry(&failure, json!("rfc822;Team@Example.test")),
            entry(&never, Value::Null),
        ],
    );
    // The catch-all spares the existing mailbox.
    check(
        fetch(&db, catchall).await,
        &["real@catch.test", "postmaster@example.test"],
        vec![
            entry(&never, Value::Null),
            entry(&failure, json!("rfc822;nobody@catch.test")),
        ],
    );
    // Settings-layer alias (found without the +q extension) and settings-layer catch-all.
    check(
        fetch(&db, settings).await,
        &["x@example.org", "y@example.org", "z@example.test"],
        vec![
            entry(&failure, json!("rfc822;Sales+q@example.test")),
            entry(&failure, json!("rfc822;Sales+q@example.test")),
            entry(&never, json!("rfc822;any@db.test")),
        ],
    );
    // `loop: loop, carol` delivers to both; the ring1/ring2 cycle ends at ring1, once.
    check(
        fetch(&db, loops).await,
        &[
            "loop@example.test",
            "carol@example.test",
            "ring1@example.test",
        ],
        vec![
            entry(&failure, Value::Null),
            entry(&failure, json!("rfc822;loop@example.test")),
            entry(&never, Value::Null),
        ],
    );
    // Nothing to expand: advanced as it was.
    check(
        fetch(&db, unchanged).await,
        &["dave@example.test", "x@remote.test"],
        vec![entry(&failure, Value::Null), entry(&never, Value::Null)],
    );
}

#[tokio::test]
async fn a_bad_alias_file_stops_the_worker_naming_the_line() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    std::fs::write(dir.path().join("aliases"), "ok: a\nlog: |/usr/bin/logger\n").unwrap();
    let out = std::process::Command::new(ALIASES)
        .args(["worker", "-c"])
        .arg(&cfg)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("aliases:2: target \"|/usr/bin/logger\""),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

/// A round of messages to the same alias is expanded alike (the stage keeps the round's
/// answers until its commit), and what a round learnt is not kept: an alias changed after
/// a round's commit applies to the very next message the same worker takes.
#[tokio::test]
async fn a_round_shares_its_lookups_and_the_next_round_reads_the_settings_afresh() {
    use std::io::{BufRead, BufReader, Write};
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&db, &dir);
    sqlx::query(
        "INSERT INTO pepsi.settings (address, name, value) \
         VALUES ('sales@example.test', 'alias', '[\"x@example.org\"]')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let null = || json!(null);
    let mut round = Vec::new();
    for _ in 0..3 {
        round.push(running(&db, &["sales@example.test"], &[null()]).await);
    }
    let later = running(&db, &["sales@example.test"], &[null()]).await;
    let mut worker = std::process::Command::new(ALIASES)
        .args(["worker", "-c"])
        .arg(&cfg)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = worker.stdin.take().unwrap();
    let mut stdout = BufReader::new(worker.stdout.take().unwrap());
    let ids: String = round.iter().map(|id| format!("{id}\n")).collect();
    stdin.write_all(ids.as_bytes()).unwrap();
    stdin.flush().unwrap();
    for _ in &round {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "0\n");
    }
    for &id in &round {
        assert_eq!(fetch(&db, id).await.2, ["x@example.org"]);
    }
    sqlx::query(
        "UPDATE pepsi.settings SET value = '[\"y@example.org\"]' \
         WHERE address = 'sales@example.test' AND name = 'alias'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    writeln!(stdin, "{later}").unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "0\n");
    assert_eq!(fetch(&db, later).await.2, ["y@example.org"]);
    drop(stdin);
    assert!(worker.wait().unwrap().success());
}
