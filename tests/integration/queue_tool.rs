//! pepsi-queue as a process against a real PostgreSQL: list (tables, JSON, filters), show,
//! retry, hold and release, delete, bounce, refusing running rows, the event_log row and the
//! dispatcher notification of every action, the roles it may run as, and — with the real
//! pepsi-dispatch and the test stage — that a held row is never claimed until released.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pepsi_testkit::TestDb;
use serde_json::{Value, json};
use sqlx::postgres::PgListener;

use crate::support::{self, Run, Running, test_stage};

const QUEUE: &str = env!("CARGO_BIN_EXE_pepsi-queue");
const DISPATCH: &str = env!("CARGO_BIN_EXE_pepsi-dispatch");

/// The stage graph of these tests: init has no BOUNCE_STAGE, relay bounces to bounce; the
/// messages init advances wait at `done`, which no worker serves (no PROGRAM).
const STAGES: &str = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\n\
                      [stage-relay]\nPROGRAM = test\nBOUNCE_STAGE = bounce\n\
                      [stage-bounce]\nPROGRAM = test\n\
                      [stage-done]\n";

struct Harness {
    db: TestDb,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Harness {
    async fn new(extra: &str) -> Harness {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pepsi.conf");
        let stages = STAGES.replace(
            "PROGRAM = test",
            &format!("PROGRAM = {}", test_stage().display()),
        );
        std::fs::write(
            &config,
            format!(
                "[database]\nURL = {}\n\n[pepsi-dispatch]\nPOLL_INTERVAL = 200ms\n{extra}\n\n{stages}\n",
                db.url
            ),
        )
        .unwrap();
        Harness { db, dir, config }
    }

    fn run_with(&self, config: &Path, args: &[&str]) -> Run {
        let out = Command::new(QUEUE)
            .arg("-c")
            .arg(config)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        Run::of(out)
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_with(&self.config, args)
    }

    /// Runs a command that must succeed.
    fn ok(&self, args: &[&str]) -> Run {
        let r = self.run(args);
        assert_eq!(r.code, 0, "pepsi-queue {args:?}: {r:?}");
        r
    }

    /// A message from `from` to `rcpt`, then set to `stage`/`status` with `state` and a
    /// timeout `timeout_secs` from now; received `age_secs` ago.
    #[allow(clippy::too_many_arguments)]
    async fn add(
        &self,
        stage: &str,
        status: &str,
        from: &str,
        rcpt: &[&str],
        state: Value,
        timeout_secs: Option<f64>,
        age_secs: f64,
    ) -> i64 {
        let id: i64 = sqlx::query_scalar(
            "SELECT pepsi.workqueue_add($1, $2, 'Subject: hello\r\nFrom: a@example.test\r\n'::bytea, \
             'the body line\r\n'::bytea, $3)",
        )
        .bind(from)
        .bind(rcpt.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .bind(&state)
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE pepsi.workqueue SET stage = $2, status = $3::pepsi.workqueue_status, \
             timeout = now() + make_interval(secs => $4), received_at = now() - make_interval(secs => $5) \
             WHERE workqueue_id = $1",
        )
        .bind(id)
        .bind(stage)
        .bind(status)
        .bind(timeout_secs)
        .bind(age_secs)
        .execute(&self.db.pool)
        .await
        .unwrap();
        id
    }

    async fn row(&self, id: i64) -> Option<Value> {
        sqlx::query_scalar(
            "SELECT jsonb_build_object('stage', stage, 'status', status, 'state', state, \
             'timeout', timeout, 'year', CASE WHEN isfinite(timeout) THEN extract(year FROM timeout)::int END) \
             FROM pepsi.workqueue WHERE workqueue_id = $1",
        )
        .bind(id)
        .fetch_optional(&self.db.pool)
        .await
        .unwrap()
    }

    async fn events(&self) -> Vec<Value> {
        sqlx::query_scalar(
            "SELECT jsonb_build_object('action', action, 'id', workqueue_id, 'actor', actor, \
             'detail', detail, 'me', current_user::text) FROM pepsi.event_log ORDER BY event_id",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    fn start_dispatcher(&self) -> Running {
        let log = std::fs::File::create(self.dir.path().join("dispatch.log")).unwrap();
        Running(
            Command::new(DISPATCH)
                .arg("-c")
                .arg(&self.config)
                .args(["-L", "debug"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    }

    /// Polls `sql` (a count) until it reaches `want`, failing after `limit`.
    async fn wait_for(&self, sql: &str, want: i64, limit: Duration, child: &mut Child) {
        let log = self.dir.path().join("dispatch.log");
        support::wait_for_count(&self.db.pool, sql, want, limit, child, || {
            format!(
                "dispatcher log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })
        .await
    }
}

/// Notifications on `workqueue` received so far: a sentinel sent now arrives after every
/// notification committed before it, so counting up to it needs no waiting on a clock.
async fn drain_notifications(h: &Harness, listener: &mut PgListener) -> usize {
    sqlx::query("SELECT pg_notify('workqueue', 'sentinel')")
        .execute(&h.db.pool)
        .await
        .unwrap();
    let mut n = 0;
    loop {
        let note = tokio::time::timeout(Duration::from_secs(30), listener.recv())
            .await
            .expect("the sentinel notification arrives")
            .unwrap();
        if note.payload() == "sentinel" {
            return n;
        }
        n += 1;
    }
}

fn ids(doc: &Value) -> Vec<i64> {
    doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}

#[tokio::test]
async fn list_shows_a_summary_then_the_rows_and_filters_them() {
    let h = Harness::new("").await;
    let fresh = h
        .add(
            "init",
            "pending",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            60.0,
        )
        .await;
    let failed = h
        .add(
            "init",
            "failed",
            "Carol@Example.NET",
            &["d@example.net"],
            json!({"dispatch_error": "stage init crashed"}),
            None,
            120.0,
        )
        .await;
    let paused = h
        .add(
            "relay",
            "paused",
            "a@example.test",
            &["x@example.org", "y@example.com"],
            json!({"attempts": 3, "last_error": "451 4.7.1 try again later"}),
            Some(3600.0),
            3.0 * 3600.0,
        )
        .await;
    let running = h
        .add(
            "relay",
            "running",
            "a@example.test",
            &["r@example.com"],
            json!({}),
            None,
            30.0,
        )
        .await;
    let held = h
        .add(
            "relay",
            "pending",
            "a@example.test",
            &["h@example.com"],
            json!({}),
            None,
            20.0,
        )
        .await;
    h.ok(&["hold", &held.to_string()]);
    let timeout = h
        .add(
            "bounce",
            "timeout",
            "",
            &["t@example.com"],
            json!({}),
            None,
            10.0,
        )
        .await;

    let table = h.ok(&["list"]).stdout;
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("STAGE") && lines[0].contains("HELD"),
        "{table}"
    );
    let relay = lines.iter().find(|l| l.starts_with("relay")).unwrap();
    let cells: Vec<&str> = relay.split_whitespace().collect();
    // STAGE PENDING RUNNING PAUSED HELD FAILED TIMEOUT TOTAL
    assert_eq!(
        cells,
        ["relay", "0", "1", "1", "1", "0", "0", "3"],
        "{table}"
    );
    let total = lines.iter().find(|l| l.starts_with("total")).unwrap();
    assert!(total.ends_with(" 6"), "{table}");
    let row_line = |id: i64| {
        lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
            .unwrap_or_else(|| panic!("no line for row {id}:\n{table}"))
            .to_string()
    };
    let p = row_line(paused);
    assert!(
        p.contains("paused")
            && p.contains("3h00m")
            && p.contains("in ")
            && p.contains("(+1)")
            && p.contains("451 4.7.1"),
        "{p}"
    );
    assert!(row_line(held).contains("held"), "{table}");
    assert!(row_line(failed).contains("stage init crashed"), "{table}");
    assert!(row_line(timeout).contains("<>"), "{table}");

    let doc = h.ok(&["list", "--json"]).json();
    assert_eq!(doc["summary"]["total"], 6);
    assert_eq!(doc["summary"]["stages"]["relay"]["held"], 1);
    assert_eq!(doc["summary"]["stages"]["init"]["failed"], 1);
    assert_eq!(doc["truncated"], false);
    // Oldest first.
    assert_eq!(
        ids(&doc),
        vec![paused, failed, fresh, running, held, timeout]
    );
    let rows = doc["rows"].as_array().unwrap();
    let p = &rows[0];
    assert_eq!(p["attempts"], 3);
    assert_eq!(p["last_error"], "451 4.7.1 try again later");
    assert!(p["next_retry"].is_string(), "{p}");
    assert!(p["age_seconds"].as_i64().unwrap() >= 3 * 3600, "{p}");
    let hr = &rows[4];
    assert_eq!(
        (
            hr["status"].as_str(),
            hr["held"].as_bool(),
            hr["display_status"].as_str()
        ),
        (Some("paused"), Some(true), Some("held"))
    );
    assert!(hr["next_retry"].is_null(), "a held row is never due: {hr}");
    assert_eq!(rows[1]["dispatch_error"], "stage init crashed");

    let filtered = |args: &[&str]| {
        let mut a = vec!["list", "--json"];
        a.extend_from_slice(args);
        ids(&h.ok(&a).json())
    };
    assert_eq!(filtered(&["--stage", "relay"]), vec![paused, running, held]);
    assert_eq!(filtered(&["--status", "held"]), vec![held]);
    assert_eq!(filtered(&["--status", "paused"]), vec![paused]);
    assert_eq!(filtered(&["--sender", "carol@example.net"]), vec![failed]);
    assert_eq!(
        filtered(&["--recipient", "@EXAMPLE.org"]),
        vec![paused, fresh]
    );
    assert_eq!(filtered(&["--older-than", "1h"]), vec![paused]);
    assert_eq!(
        filtered(&["--stage", "relay", "--status", "running"]),
        vec![running]
    );
    let limited = h.ok(&["list", "--json", "--limit", "2"]).json();
    assert_eq!(ids(&limited), vec![paused, failed]);
    assert_eq!(
        (
            limited["truncated"].as_bool(),
            limited["summary"]["total"].as_i64()
        ),
        (Some(true), Some(6))
    );
    assert!(
        h.ok(&["list", "--limit", "2"])
            .stdout
            .contains("(2 of 6 rows shown")
    );
    assert_eq!(
        h.ok(&["list", "--stage", "nowhere"]).stdout,
        "no rows match\n"
    );

    let bad = h.run(&["list", "--status", "stuck"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("stuck"), "{bad:?}");
    let bad = h.run(&["list", "--older-than", "soon"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("soon"), "{bad:?}");
}

#[tokio::test]
async fn show_prints_the_envelope_state_and_headers_and_the_body_on_request() {
    let h = Harness::new("").await;
    let id = h
        .add(
            "relay",
            "paused",
            "a@example.test",
            &["b@example.org", "c@example.org"],
            json!({"attempts": 2, "dsn": {"ret": "HDRS"}}),
            Some(600.0),
            5.0,
        )
        .await;
    let text = h.ok(&["show", &id.to_string()]).stdout;
    assert!(text.starts_with(&format!("row {id}\n")), "{text}");
    for want in [
        "stage:          relay",
        "status:         paused",
        "<a@example.test>",
        "b@example.org, c@example.org",
        "\"ret\": \"HDRS\"",
        "Subject: hello",
        "attempts:       2",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    assert!(!text.contains("the body line"), "{text}");
    let with_body = h.ok(&["show", &id.to_string(), "--body"]).stdout;
    assert!(
        with_body.ends_with("body:\nthe body line\r\n"),
        "{with_body}"
    );

    let doc = h.ok(&["show", &id.to_string(), "--json"]).json();
    assert_eq!(doc["id"], id);
    assert_eq!(doc["state"]["dsn"]["ret"], "HDRS");
    assert_eq!(doc["rcpt_to"], json!(["b@example.org", "c@example.org"]));
    assert_eq!(doc["headers"], "Subject: hello\r\nFrom: a@example.test\r\n");
    assert_eq!(doc["body"], Value::Null);
    assert_eq!(doc["body_size"], 15);
    let doc = h.ok(&["show", &id.to_string(), "--json", "--body"]).json();
    assert_eq!(doc["body"], "the body line\r\n");

    let missing = h.run(&["show", "999999"]);
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(missing.stderr.contains("999999"), "{missing:?}");
    let bad = h.run(&["show", "abc"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("abc"), "{bad:?}");
}

#[tokio::test]
async fn every_action_changes_its_row_writes_one_event_and_wakes_the_dispatcher() {
    let h = Harness::new("").await;
    let mut listener = PgListener::connect_with(&h.db.pool).await.unwrap();
    listener.listen("workqueue").await.unwrap();
    let s = |id: i64| id.to_string();

    let failed = h
        .add(
            "relay",
            "failed",
            "a@example.test",
            &["b@example.org"],
            json!({"dispatch_error": "killed by signal 6"}),
            None,
            1.0,
        )
        .await;
    let paused = h
        .add(
            "relay",
            "paused",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            Some(3600.0),
            1.0,
        )
        .await;
    let pending = h
        .add(
            "init",
            "pending",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    let gone = h
        .add(
            "init",
            "failed",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    let bounced = h
        .add(
            "relay",
            "paused",
            "a@example.test",
            &["b@example.org"],
            json!({"attempts": 7}),
            Some(60.0),
            1.0,
        )
        .await;
    let at_init = h
        .add(
            "init",
            "failed",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    let null_sender = h
        .add(
            "relay",
            "failed",
            "",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;

    // retry a failed row: pending, its dispatch_error kept in the history.
    let r = h.ok(&["retry", &s(failed)]);
    assert_eq!(
        r.stdout,
        format!("{failed}: retried (failed at stage relay, now pending)\n")
    );
    let row = h.row(failed).await.unwrap();
    assert_eq!(
        (row["stage"].as_str(), row["status"].as_str()),
        (Some("relay"), Some("pending"))
    );
    assert!(row["state"].get("dispatch_error").is_none(), "{row}");
    assert_eq!(
        row["state"]["dispatch_error_history"][0]["error"],
        "killed by signal 6"
    );
    assert_eq!(
        row["state"]["dispatch_error_history"][0]["status"],
        "failed"
    );
    // retry a paused row: due now.
    h.ok(&["retry", &s(paused)]);
    let row = h.row(paused).await.unwrap();
    assert_eq!(row["status"], "pending");
    assert!(row["timeout"].is_null(), "{row}");
    // retry a pending row: nothing to do, not an error, no event.
    let r = h.ok(&["retry", &s(pending)]);
    assert!(r.stdout.contains("already pending"), "{r:?}");

    // hold, then release.
    h.ok(&["hold", &s(pending), "--reason", "abuse report"]);
    let row = h.row(pending).await.unwrap();
    assert_eq!(row["status"], "paused");
    assert_eq!(row["year"], 9999);
    assert_eq!(row["state"]["held"]["reason"], "abuse report");
    assert_eq!(row["state"]["held"]["status"], "pending");
    let again = h.ok(&["hold", &s(pending)]);
    assert!(again.stdout.contains("already held"), "{again:?}");
    let refused = h.run(&["retry", &s(pending)]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(
        refused.stderr.contains(&format!("row {pending} is held")),
        "{refused:?}"
    );
    h.ok(&["release", &s(pending)]);
    let row = h.row(pending).await.unwrap();
    assert_eq!(row["status"], "pending");
    assert!(
        row["timeout"].is_null() && row["state"].get("held").is_none(),
        "{row}"
    );

    // delete: refused without --yes when stdin is not a terminal, then done with it.
    let body_id: i64 =
        sqlx::query_scalar("SELECT body_id FROM pepsi.workqueue WHERE workqueue_id = $1")
            .bind(gone)
            .fetch_one(&h.db.pool)
            .await
            .unwrap();
    let no = h.run(&["delete", &s(gone)]);
    assert_eq!(no.code, 2, "{no:?}");
    assert!(
        no.stderr.contains("--yes") && no.stderr.contains(&s(gone)),
        "{no:?}"
    );
    assert!(h.row(gone).await.is_some());
    h.ok(&["delete", "--yes", &s(gone)]);
    assert!(h.row(gone).await.is_none());
    let bodies: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue_body WHERE body_id = $1")
            .bind(body_id)
            .fetch_one(&h.db.pool)
            .await
            .unwrap();
    assert_eq!(bodies, 0, "the body goes with its last row");

    // bounce: to the stage's BOUNCE_STAGE with a permanent state.bounce.
    let r = h.ok(&["bounce", &s(bounced), "--reason", "mailbox retired"]);
    assert_eq!(
        r.stdout,
        format!("{bounced}: bounced (from stage relay to bounce, pending)\n")
    );
    let row = h.row(bounced).await.unwrap();
    assert_eq!(
        (row["stage"].as_str(), row["status"].as_str()),
        (Some("bounce"), Some("pending"))
    );
    assert_eq!(
        row["state"]["bounce"],
        json!({"kind": "permanent", "diagnostic": "mailbox retired", "enhanced_status": "5.0.0", "stage": "relay"})
    );
    assert_eq!(
        row["state"]["attempts"], 7,
        "the rest of the state survives"
    );
    let r = h.run(&["bounce", &s(at_init)]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr
            .contains(&format!("row {at_init} is at stage init"))
            && r.stderr.contains("BOUNCE_STAGE"),
        "{r:?}"
    );
    let r = h.run(&["bounce", &s(null_sender)]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("null sender"), "{r:?}");
    assert_eq!(h.row(null_sender).await.unwrap()["stage"], "relay");
    let r = h.run(&["release", "424242"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("no queue row 424242"), "{r:?}");

    // One event per change, none for what changed nothing or was refused.
    let events = h.events().await;
    let got: Vec<(String, i64)> = events
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["id"].as_i64().unwrap(),
            )
        })
        .collect();
    let want = [
        ("queue.retry", failed),
        ("queue.retry", paused),
        ("queue.hold", pending),
        ("queue.release", pending),
        ("queue.delete", gone),
        ("queue.bounce", bounced),
    ]
    .map(|(a, id)| (a.to_owned(), id));
    assert_eq!(got, want);
    for e in &events {
        assert_eq!(
            e["actor"], e["me"],
            "actor defaults to the database role: {e}"
        );
        assert_eq!(e["detail"]["tool"], "pepsi-queue", "{e}");
        assert!(e["detail"]["os_uid"].is_u64(), "{e}");
        assert_eq!(e["detail"]["force"], false, "{e}");
    }
    assert_eq!(events[0]["detail"]["dispatch_error"], "killed by signal 6");
    assert_eq!(events[4]["detail"]["mail_from"], "a@example.test");
    assert_eq!(
        events[5]["detail"]["bounce"]["diagnostic"],
        "mailbox retired"
    );

    // One notification per command that changed something.
    assert_eq!(drain_notifications(&h, &mut listener).await, 6);
    h.ok(&["list"]);
    h.ok(&["show", &s(failed)]);
    assert_eq!(
        drain_notifications(&h, &mut listener).await,
        0,
        "reading notifies nobody"
    );
}

#[tokio::test]
async fn a_running_row_is_refused_unless_forced() {
    let h = Harness::new("").await;
    let s = |id: i64| id.to_string();
    let running = h
        .add(
            "relay",
            "running",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    let failed = h
        .add(
            "relay",
            "failed",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    for args in [
        vec!["retry", "RUN"],
        vec!["hold", "RUN"],
        vec!["delete", "--yes", "RUN"],
        vec!["bounce", "RUN"],
    ] {
        let args: Vec<String> = args.iter().map(|a| a.replace("RUN", &s(running))).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = h.run(&args);
        assert_eq!(r.code, 1, "{args:?}: {r:?}");
        assert!(
            r.stderr
                .contains(&format!("row {running} is running at stage relay"))
                && r.stderr.contains("--force"),
            "{args:?}: {r:?}"
        );
        assert_eq!(
            h.row(running).await.unwrap()["status"],
            "running",
            "{args:?}"
        );
    }
    // The other rows of the same command are still done; the exit status says one failed.
    let r = h.run(&["retry", &s(running), &s(failed), "--json"]);
    assert_eq!(r.code, 1, "{r:?}");
    let doc = r.json();
    assert_eq!(doc["changed"], 1);
    assert_eq!(doc["results"][0]["outcome"], "running");
    assert_eq!(doc["results"][1]["outcome"], "changed");
    assert_eq!(h.row(failed).await.unwrap()["status"], "pending");
    assert_eq!(h.events().await.len(), 1);
    // Forced: the worker is gone.
    h.ok(&["retry", "--force", &s(running)]);
    assert_eq!(h.row(running).await.unwrap()["status"], "pending");
    let events = h.events().await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["detail"]["force"], true);
    assert_eq!(events[1]["detail"]["from_status"], "running");
}

#[tokio::test]
async fn bulk_retry_takes_failed_rows_or_a_stage_and_leaves_held_rows_alone() {
    let h = Harness::new("").await;
    let f1 = h
        .add(
            "relay",
            "failed",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    let t1 = h
        .add(
            "init",
            "timeout",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    let p1 = h
        .add(
            "relay",
            "paused",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            Some(600.0),
            1.0,
        )
        .await;
    let held = h
        .add(
            "relay",
            "pending",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    h.ok(&["hold", &held.to_string()]);
    let p2 = h
        .add(
            "init",
            "paused",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            Some(600.0),
            1.0,
        )
        .await;

    let doc = h.ok(&["retry", "--all-failed", "--json"]).json();
    assert_eq!(doc["changed"], 2);
    for (id, want) in [
        (f1, "pending"),
        (t1, "pending"),
        (p1, "paused"),
        (held, "paused"),
        (p2, "paused"),
    ] {
        assert_eq!(h.row(id).await.unwrap()["status"], want, "row {id}");
    }
    let r = h.ok(&["retry", "--stage", "relay"]);
    assert_eq!(
        r.stdout,
        format!("{p1}: retried (paused at stage relay, now pending)\n")
    );
    assert_eq!(
        h.row(held).await.unwrap()["state"]["held"]["status"],
        "pending"
    );
    assert_eq!(h.row(p2).await.unwrap()["status"], "paused");
    assert_eq!(
        h.ok(&["retry", "--all-failed"]).stdout,
        "no rows to retry\n"
    );
    let r = h.run(&["retry"]);
    assert_eq!(r.code, 2, "{r:?}");
    let r = h.run(&["retry", "--all-failed", &f1.to_string()]);
    assert_eq!(r.code, 2, "{r:?}");
}

#[tokio::test]
async fn the_dispatcher_never_claims_a_held_row_and_runs_it_once_released() {
    // A heartbeat far away: the paused row comes back by its due time alone, and the released
    // row by the notification pepsi-queue sends.
    let h = Harness::new("POLL_INTERVAL = 1h").await;
    let held = h
        .add(
            "init",
            "pending",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    h.ok(&["hold", &held.to_string()]);
    let free = h
        .add(
            "init",
            "pending",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    // A paused row coming due beside the held one: the held row's far-future timeout must not
    // hide it from the dispatcher's next-due time.
    let due = h
        .add(
            "init",
            "paused",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            Some(1.0),
            1.0,
        )
        .await;
    let mut d = h.start_dispatcher();
    h.wait_for(
        &format!("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done' AND workqueue_id IN ({free}, {due})"),
        2,
        Duration::from_secs(60),
        &mut d.0,
    )
    .await;
    let row = h.row(held).await.unwrap();
    assert_eq!(
        (row["stage"].as_str(), row["status"].as_str()),
        (Some("init"), Some("paused")),
        "{row}"
    );
    assert!(
        row["state"].get("passes").is_none(),
        "the test stage never saw it: {row}"
    );
    h.ok(&["release", &held.to_string()]);
    h.wait_for(
        &format!(
            "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done' AND workqueue_id = {held}"
        ),
        1,
        Duration::from_secs(60),
        &mut d.0,
    )
    .await;
    assert_eq!(h.row(held).await.unwrap()["state"]["passes"]["init"], 1);
}

#[tokio::test]
async fn a_paused_row_with_an_infinite_timeout_does_not_break_the_dispatchers_due_time() {
    // `infinity - now()` raises before PostgreSQL 17 and is an infinite interval from 17 on
    // (which Duration::from_secs_f64 panics on): the next-due query must skip such a row.
    // The query runs at start-up, before the first claim, so by the time the pending row is
    // done it has run.
    let h = Harness::new("").await;
    let forever = h
        .add(
            "init",
            "paused",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    sqlx::query("UPDATE pepsi.workqueue SET timeout = 'infinity' WHERE workqueue_id = $1")
        .bind(forever)
        .execute(&h.db.pool)
        .await
        .unwrap();
    let pending = h
        .add(
            "init",
            "pending",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    let mut d = h.start_dispatcher();
    h.wait_for(
        &format!(
            "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done' AND workqueue_id = {pending}"
        ),
        1,
        Duration::from_secs(60),
        &mut d.0,
    )
    .await;
    assert!(
        d.0.try_wait().unwrap().is_none(),
        "the dispatcher is still running"
    );
    let log = std::fs::read_to_string(h.dir.path().join("dispatch.log")).unwrap();
    assert!(!log.contains("cannot read the next due time"), "{log}");
    assert_eq!(h.row(forever).await.unwrap()["status"], "paused");
}

/// `url` with its user replaced by `user`.
fn url_as(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let host_start = match rest.find('@') {
        Some(at) if at < rest.find('/').unwrap_or(rest.len()) => at + 1,
        _ => 0,
    };
    format!("{scheme}://{user}@{}", &rest[host_start..])
}

#[tokio::test]
async fn the_pipeline_role_may_run_every_action_and_the_ingress_role_is_told_why_not() {
    let h = Harness::new("").await;
    let id = h
        .add(
            "relay",
            "failed",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    let other = h
        .add(
            "relay",
            "failed",
            "a@example.test",
            &["b@example.org"],
            json!({}),
            None,
            1.0,
        )
        .await;
    let write = |user: &str| {
        let path = h.dir.path().join(format!("as-{user}.conf"));
        let text = std::fs::read_to_string(&h.config)
            .unwrap()
            .replace(&h.db.url, &url_as(&h.db.url, user));
        std::fs::write(&path, text).unwrap();
        path
    };
    let pipeline = write("pepsi");
    let s = id.to_string();
    for args in [
        vec!["list"],
        vec!["show", &s, "--body"],
        vec!["retry", &s],
        vec!["hold", &s],
        vec!["release", &s],
        vec!["bounce", &s],
        vec!["delete", "--yes", &s],
    ] {
        let r = h.run_with(&pipeline, &args);
        assert_eq!(r.code, 0, "as pepsi, {args:?}: {r:?}");
    }
    let events = h.events().await;
    assert_eq!(events.len(), 5);
    assert!(events.iter().all(|e| e["actor"] == "pepsi"), "{events:?}");

    let ingress = write("pepsi-ingress");
    let r = h.run_with(&ingress, &["retry", &other.to_string()]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("pipeline role") && r.stderr.contains(&format!("row {other}")),
        "{r:?}"
    );
    assert_eq!(h.row(other).await.unwrap()["status"], "failed");
}

#[test]
fn help_is_a_manual_page_with_examples() {
    let out = Command::new(QUEUE).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "Exit status",
        "--force",
        "Examples:",
        "pepsi-queue retry --all-failed",
        "list",
        "bounce",
    ] {
        assert!(text.contains(want), "{want:?} missing from --help:\n{text}");
    }
    let out = Command::new(QUEUE).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
