//! pepsi-failure-bouncer as a process with the real pepsi-dispatch, the test stage and the
//! real pepsi-stage-bounce: a timed-out row retried and then delivered; a failing row
//! retried ATTEMPTS times and then returned to its sender as a DSN; a null-sender row
//! dropped, never bounced; a poison message (its worker crashes every time) recognised and
//! bounced; each step in event_log.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_testkit::TestDb;
use serde_json::Value;

use crate::support::test_stage;

const BOUNCER: &str = env!("CARGO_BIN_EXE_pepsi-failure-bouncer");
const DISPATCH: &str = env!("CARGO_BIN_EXE_pepsi-dispatch");
const BOUNCE: &str = env!("CARGO_BIN_EXE_pepsi-stage-bounce");

/// `deliver` finishes every message; `broken` refuses every one (the dispatcher fails it),
/// `poison` crashes its worker on every one; both return mail through `bounce`, whose DSNs
/// wait at `outbox` (paused there, so a test can read them). The tests put their rows at
/// these stages themselves: `init`, where new mail enters and without which the dispatcher
/// does not start, has no PROGRAM.
const STAGES: &str = "[stage-init]\n\
                      [stage-deliver]\nPROGRAM = TEST\nACTION = finish\n\
                      [stage-broken]\nPROGRAM = TEST\nACTION = error\nBOUNCE_STAGE = bounce\n\
                      [stage-poison]\nPROGRAM = TEST\nACTION = crash\nBOUNCE_STAGE = bounce\n\
                      [stage-bounce]\nPROGRAM = BOUNCE\nNEXT_STAGE = outbox\nHOSTNAME = mail.example.test\n\
                      [stage-outbox]\nPROGRAM = TEST\nACTION = pause-once\nPAUSE_FOR = 1h\n";

struct Harness {
    db: TestDb,
    dir: tempfile::TempDir,
    config: PathBuf,
    dispatcher: Option<Child>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(mut c) = self.dispatcher.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Harness {
    async fn new(attempts: u32) -> Harness {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pepsi.conf");
        let stages = STAGES
            .replace(
                "PROGRAM = TEST",
                &format!("PROGRAM = {}", test_stage().display()),
            )
            .replace("PROGRAM = BOUNCE", &format!("PROGRAM = {BOUNCE}"));
        std::fs::write(
            &config,
            format!(
                "[database]\nURL = {}\n\n[pepsi-dispatch]\nPOLL_INTERVAL = 200ms\n\n\
                 [pepsi-failure-bouncer]\nATTEMPTS = {attempts}\nGRACE = 0s\n\n{stages}\n",
                db.url
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("dispatch.log")).unwrap();
        let dispatcher = Command::new(DISPATCH)
            .arg("-c")
            .arg(&config)
            .args(["-L", "debug"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Harness {
            db,
            dir,
            config,
            dispatcher: Some(dispatcher),
        }
    }

    /// A message from `from` to `rcpt@example.org`, pending at `stage`.
    async fn add(&self, stage: &str, from: &str) -> i64 {
        let id: i64 = sqlx::query_scalar(
            "SELECT pepsi.workqueue_add($1, ARRAY['rcpt@example.org'], \
             'From: sender@example.test\r\nSubject: the original\r\nMessage-ID: <orig@example.test>\r\n'::bytea, \
             'the body\r\n'::bytea, '{\"dsn\": {\"ret\": null, \"envid\": null, \"rcpt\": [{\"notify\": null, \"orcpt\": null}]}}')",
        )
        .bind(from)
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        sqlx::query("UPDATE pepsi.workqueue SET stage = $2 WHERE workqueue_id = $1")
            .bind(id)
            .bind(stage)
            .execute(&self.db.pool)
            .await
            .unwrap();
        sqlx::query("SELECT pg_notify('workqueue', '')")
            .execute(&self.db.pool)
            .await
            .unwrap();
        id
    }

    /// (stage, status, mail_from, rcpt_to, state) of row `id`, None once it is gone.
    async fn row(&self, id: i64) -> Option<(String, String, String, Vec<String>, Value)> {
        sqlx::query_as(
            "SELECT stage, status::text, mail_from, rcpt_to, state FROM pepsi.workqueue \
             WHERE workqueue_id = $1",
        )
        .bind(id)
        .fetch_optional(&self.db.pool)
        .await
        .unwrap()
    }

    /// Waits until row `id` is `status` (None: gone).
    async fn wait(
        &self,
        id: i64,
        status: Option<&str>,
    ) -> Option<(String, String, String, Vec<String>, Value)> {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let row = self.row(id).await;
            if row.as_ref().map(|r| r.1.as_str()) == status {
                return row;
            }
            assert!(
                Instant::now() < until,
                "row {id} is {row:?}, not {status:?}\n{}",
                std::fs::read_to_string(self.dir.path().join("dispatch.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One `--once --json` pass; returns its summary.
    fn pass(&self) -> Value {
        let out = Command::new(BOUNCER)
            .arg("-c")
            .arg(&self.config)
            .args(["--once", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pepsi-failure-bouncer: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// (action, detail) of row `id`'s event_log entries, oldest first.
    async fn events(&self, id: i64) -> Vec<(String, Value)> {
        sqlx::query_as(
            "SELECT action, detail FROM pepsi.event_log WHERE workqueue_id = $1 ORDER BY event_id",
        )
        .bind(id)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }
}

fn counts(pass: &Value) -> [i64; 4] {
    ["retried", "bounced", "dropped", "given_up"].map(|k| pass[k].as_i64().unwrap())
}

#[tokio::test]
async fn a_timed_out_row_is_retried_and_then_delivered() {
    let h = Harness::new(3).await;
    let id = h.add("deliver", "sender@example.test").await;
    h.wait(id, None).await;
    // Now one that timed out, as the dispatcher leaves a row whose worker did not answer.
    let id = h.add("nowhere", "sender@example.test").await;
    sqlx::query(
        "UPDATE pepsi.workqueue SET stage = 'deliver', status = 'timeout', \
         state = state || '{\"dispatch_error\": \"stage deliver: no answer within MAX_RUNTIME 30s\"}' \
         WHERE workqueue_id = $1",
    )
    .bind(id)
    .execute(&h.db.pool)
    .await
    .unwrap();
    assert_eq!(counts(&h.pass()), [1, 0, 0, 0]);
    h.wait(id, None).await;
    let events = h.events(id).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "failure.retry");
    assert_eq!(events[0].1["kind"], "timeout");
    assert_eq!(events[0].1["attempt"], 1);
    assert_eq!(events[0].1["tool"], "pepsi-failure-bouncer");
    // Nothing left to do.
    assert_eq!(counts(&h.pass()), [0, 0, 0, 0]);
}

#[tokio::test]
async fn a_failing_row_is_retried_attempts_times_then_returned_as_a_dsn() {
    let h = Harness::new(2).await;
    let id = h.add("broken", "sender@example.test").await;
    for attempt in 1..=2 {
        h.wait(id, Some("failed")).await;
        assert_eq!(counts(&h.pass()), [1, 0, 0, 0], "retry {attempt}");
        let (_, _, _, _, state) = h.row(id).await.unwrap();
        assert_eq!(state["failure_bouncer"]["retries"], attempt);
    }
    let (_, _, _, _, state) = h.wait(id, Some("failed")).await.unwrap();
    assert_eq!(
        state["failure_bouncer"]["failures"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(counts(&h.pass()), [0, 1, 0, 0]);
    // The bounce stage turns the row into the DSN, to the sender, from the null sender.
    let (stage, _, from, rcpt, state) = h.wait(id, Some("paused")).await.unwrap();
    assert_eq!((stage.as_str(), from.as_str()), ("outbox", ""));
    assert_eq!(rcpt, ["sender@example.test"]);
    assert!(
        state.get("failure_bouncer").is_none(),
        "a DSN starts afresh: {state}"
    );
    let headers: Vec<u8> =
        sqlx::query_scalar("SELECT headers FROM pepsi.workqueue WHERE workqueue_id = $1")
            .bind(id)
            .fetch_one(&h.db.pool)
            .await
            .unwrap();
    let headers = String::from_utf8(headers).unwrap();
    assert!(
        headers.contains("Subject: Undelivered Mail Returned to Sender"),
        "{headers}"
    );
    assert!(headers.contains("multipart/report"), "{headers}");
    let body: Vec<u8> = sqlx::query_scalar(
        "SELECT b.body FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) \
         WHERE w.workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&h.db.pool)
    .await
    .unwrap();
    let body = String::from_utf8_lossy(&body);
    // The diagnostic, folded by the bounce stage: the stage and the attempts (2 retries).
    assert!(
        body.contains("could not be processed at an internal step"),
        "{body}"
    );
    assert!(body.contains("(broken) after 3 attempts"), "{body}");
    assert!(
        body.contains("Final-Recipient: rfc822; rcpt@example.org"),
        "{body}"
    );
    let events = h.events(id).await;
    let actions: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        actions,
        ["failure.retry", "failure.retry", "failure.bounce"]
    );
    assert_eq!(events[2].1["to_stage"], "bounce");
    assert_eq!(events[2].1["kind"], "error");
    assert_eq!(events[2].1["poison"], false);
    // The DSN itself is never considered again by the bouncer.
    assert_eq!(counts(&h.pass()), [0, 0, 0, 0]);
}

#[tokio::test]
async fn a_null_sender_row_is_dropped_never_bounced() {
    let h = Harness::new(1).await;
    let id = h.add("broken", "").await;
    h.wait(id, Some("failed")).await;
    assert_eq!(counts(&h.pass()), [1, 0, 0, 0]);
    h.wait(id, Some("failed")).await;
    assert_eq!(counts(&h.pass()), [0, 0, 1, 0]);
    assert!(h.row(id).await.is_none());
    let events = h.events(id).await;
    let actions: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(actions, ["failure.retry", "failure.drop"]);
    assert_eq!(events[1].1["mail_from"], "");
    assert_eq!(
        events[1].1["rcpt_to"],
        serde_json::json!(["rcpt@example.org"])
    );
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue")
        .fetch_one(&h.db.pool)
        .await
        .unwrap();
    assert_eq!(queued, 0, "no DSN to <>");
}

#[tokio::test]
async fn a_poison_message_is_recognised_and_bounced_not_retried_forever() {
    let h = Harness::new(2).await;
    let id = h.add("poison", "sender@example.test").await;
    for _ in 0..2 {
        let (_, _, _, _, state) = h.wait(id, Some("failed")).await.unwrap();
        let error = state["dispatch_error"].as_str().unwrap();
        assert!(error.ends_with("while handling the message"), "{error}");
        assert_eq!(counts(&h.pass()), [1, 0, 0, 0]);
    }
    h.wait(id, Some("failed")).await;
    assert_eq!(counts(&h.pass()), [0, 1, 0, 0]);
    let (stage, _, from, rcpt, _) = h.wait(id, Some("paused")).await.unwrap();
    assert_eq!((stage.as_str(), from.as_str()), ("outbox", ""));
    assert_eq!(rcpt, ["sender@example.test"]);
    let events = h.events(id).await;
    let bounce = &events.last().unwrap().1;
    assert_eq!(events.last().unwrap().0, "failure.bounce");
    assert_eq!(bounce["poison"], true, "{bounce}");
    assert_eq!(bounce["kind"], "crash");
    assert!(
        bounce["reason"]
            .as_str()
            .unwrap()
            .starts_with("the mail system could not process this message"),
        "{bounce}"
    );
}
