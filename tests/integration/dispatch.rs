//! pepsi-dispatch as a process, with real stage worker processes (the `pepsi-test-stage`
//! example) against a real PostgreSQL: throughput without loss, pipelining, elastic pools,
//! recycling, crash and hang recovery, kill -9 and restart, paused rows, fairness,
//! statistics, configuration changes and the one-per-database lock.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_testkit::TestDb;
use serde_json::Value;

use crate::support::{self, Running, test_stage};

/// The dispatcher under test: the one cargo built, or `$PEPSI_BIN_DIR/pepsi-dispatch` (the
/// unified layout's symlink to `pepsi`, which `scripts/test.sh` also runs these tests on).
pub(crate) fn dispatch() -> PathBuf {
    pepsi_testkit::programs::program("pepsi-dispatch", env!("CARGO_BIN_EXE_pepsi-dispatch"))
}

pub(crate) struct Harness {
    pub(crate) db: TestDb,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) config: PathBuf,
}

impl Harness {
    /// `stages` holds the [stage-*] sections (PROGRAM = the test stage is filled in when
    /// the section names none). Fusion is off: each stage runs in its own pool. The stages
    /// end at `done`: unless `stages` has its own, `[stage-done]` is added without PROGRAM,
    /// so no worker takes the rows there and the test counts them (the dispatcher refuses a
    /// NEXT_STAGE that names no section).
    pub(crate) async fn new(stages: &str, dispatch: &str) -> Harness {
        Harness::with_fusion(stages, dispatch, false).await
    }

    /// As `new`, with `[pepsi] ALLOW_FUSION` as given (the test stage registers itself, so
    /// a chain of its stages runs fused in one worker when it is on).
    async fn with_fusion(stages: &str, dispatch: &str, fusion: bool) -> Harness {
        let fusion = if fusion { "yes" } else { "no" };
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pepsi.conf");
        let program = test_stage();
        let mut stages = stages.replace(
            "PROGRAM = test",
            &format!("PROGRAM = {}", program.display()),
        );
        if !stages.contains("[stage-done]") {
            stages.push_str("\n[stage-done]\n");
        }
        std::fs::write(
            &config,
            format!(
                "[database]\nURL = {}\n\n[pepsi]\nALLOW_FUSION = {fusion}\n\n[pepsi-dispatch]\nPOLL_INTERVAL = 200ms\nSTATS_INTERVAL = 1s\nSPAWN_COOLDOWN = 500ms\n{dispatch}\n\n{stages}\n",
                db.url
            ),
        )
        .unwrap();
        Harness { db, dir, config }
    }

    pub(crate) fn start(&self, log: &str) -> Running {
        let log = std::fs::File::create(self.dir.path().join(log)).unwrap();
        Running(
            Command::new(dispatch())
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

    pub(crate) fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    pub(crate) async fn add(&self, n: i64, sender: &str, state: Value) {
        sqlx::query(
            "SELECT pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], 'Subject: x\r\n'::bytea, 'y\r\n'::bytea, $2, $3) \
             FROM generate_series(1, $1)",
        )
        .bind(n)
        .bind(state)
        .bind(sender)
        .execute(&self.db.pool)
        .await
        .unwrap();
    }

    pub(crate) async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    /// Starts the dispatcher (its log in `log`), waits until each of the `rows` rows reached
    /// `done` or ended failed or timed out, and stops it, which must end cleanly.
    async fn run_until_settled(&self, log: &str, rows: i64) {
        let mut d = self.start(log);
        self.wait_for(
            "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done' OR status IN ('failed', 'timeout')",
            rows,
            Duration::from_secs(30),
            &mut d,
        )
        .await;
        assert!(stop(d).success(), "{}", self.log(log));
    }

    /// Each row's stage, status, passes per stage and whether the dispatcher recorded an
    /// error on it, in id order.
    async fn outcomes(&self) -> Vec<(String, String, Value, bool)> {
        sqlx::query_as(
            "SELECT stage, status::text, state->'passes', state ? 'dispatch_error' \
             FROM pepsi.workqueue ORDER BY workqueue_id",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    /// Polls `sql` (a count) until it reaches `want`, failing after `limit`.
    pub(crate) async fn wait_for(&self, sql: &str, want: i64, limit: Duration, child: &mut Child) {
        support::wait_for_count(&self.db.pool, sql, want, limit, child, String::new).await
    }

    pub(crate) async fn states(&self, sql: &str) -> Vec<Value> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }
}

pub(crate) fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

pub(crate) fn stop(mut child: Running) -> std::process::ExitStatus {
    signal(&child, "-TERM");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            Instant::now() < until,
            "dispatcher did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Processes whose parent is `pid`.
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command name: state, ppid, ...
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == pid {
            out.push(p);
        }
    }
    out
}

const CHAIN: &str = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nPARALLELISM = 2\nQUEUE_LIMIT = 8\n\
                     [stage-b]\nPROGRAM = test\nNEXT_STAGE = c\nPARALLELISM = 2\nQUEUE_LIMIT = 8\n\
                     [stage-c]\nPROGRAM = test\nNEXT_STAGE = done\nPARALLELISM = 2\nQUEUE_LIMIT = 8\n";

/// Every row at `done` passed each stage exactly once.
async fn assert_each_stage_once(h: &Harness, n: i64) {
    let states = h
        .states("SELECT state FROM pepsi.workqueue WHERE stage = 'done'")
        .await;
    assert_eq!(states.len() as i64, n);
    for s in states {
        assert_eq!(
            s["passes"],
            serde_json::json!({"init": 1, "b": 1, "c": 1}),
            "{s}"
        );
    }
}

#[tokio::test]
async fn a_chain_of_three_stages_moves_10000_rows_and_statistics_add_up_after_sigterm() {
    let h = Harness::new(CHAIN, "").await;
    h.add(10_000, "sender", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        10_000,
        Duration::from_secs(300),
        &mut d,
    )
    .await;
    assert!(stop(d).success(), "{}", h.log("dispatch.log"));
    assert_each_stage_once(&h, 10_000).await;
    assert_eq!(
        h.count("SELECT count(*) FROM pepsi.workqueue WHERE stage <> 'done'")
            .await,
        0
    );
    let stats: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT stage, messages, kills, crashes FROM pepsi.stage_stats ORDER BY stage",
    )
    .fetch_all(&h.db.pool)
    .await
    .unwrap();
    assert_eq!(
        stats,
        vec![
            ("b".into(), 10_000, 0, 0),
            ("c".into(), 10_000, 0, 0),
            ("init".into(), 10_000, 0, 0)
        ]
    );
    let (stages_total, failed): (i64, i64) =
        sqlx::query_as("SELECT stages_total, messages_failed FROM pepsi.dispatch_stats")
            .fetch_one(&h.db.pool)
            .await
            .unwrap();
    assert_eq!((stages_total, failed), (30_000, 0));
}

#[tokio::test]
async fn kill_9_during_a_run_then_a_restart_loses_nothing() {
    let h = Harness::new(CHAIN, "").await;
    h.add(10_000, "sender", serde_json::json!({})).await;
    let mut d = h.start("first.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        1_000,
        Duration::from_secs(120),
        &mut d,
    )
    .await;
    // Killed while rows are running (a claim in flight or every worker between batches
    // would leave none: the kill then tests less).
    let until = Instant::now() + Duration::from_secs(30);
    while h
        .count("SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'")
        .await
        == 0
        && Instant::now() < until
    {}
    let workers = children(d.id());
    signal(&d, "-KILL");
    d.wait().unwrap();
    // The workers die with their dispatcher (parent-death signal). Once it is dead they
    // are no longer its children, so each is waited for by its own pid.
    let until = Instant::now() + Duration::from_secs(10);
    while workers
        .iter()
        .any(|w| std::path::Path::new(&format!("/proc/{w}")).exists())
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // A statement a process sent just before it died still runs to its end in its
    // server backend (a worker's commit moves rows out of `running`); only once no other
    // session is busy is the count of rows left running final.
    let until = Instant::now() + Duration::from_secs(10);
    while h
        .count(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state <> 'idle'",
        )
        .await
        > 0
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = h
        .count("SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'")
        .await;
    let mut d = h.start("second.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        10_000,
        Duration::from_secs(300),
        &mut d,
    )
    .await;
    assert!(stop(d).success());
    assert_eq!(
        h.log("second.log")
            .contains("rows left running by a previous dispatcher are pending again"),
        left > 0,
        "the restart reports the {left} rows the kill left running"
    );
    assert_each_stage_once(&h, 10_000).await;
}

#[tokio::test]
async fn a_worker_holds_several_ids_at_once_up_to_queue_limit() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\nPARALLELISM = 1\nQUEUE_LIMIT = 4\nDELAY = 300ms\n";
    let h = Harness::new(stages, "").await;
    h.add(8, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'",
        4,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    // The claim commits before the worker it is for has been started.
    let until = Instant::now() + Duration::from_secs(10);
    while children(d.id()).is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        children(d.id()).len(),
        1,
        "one worker holds the four running rows"
    );
    assert!(
        h.count("SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'")
            .await
            <= 4
    );
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        8,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    let pids = h
        .states("SELECT state->'pid'->'init' FROM pepsi.workqueue")
        .await;
    assert_eq!(pids.iter().collect::<HashSet<_>>().len(), 1);
    assert!(stop(d).success());
}

/// A row left `running` while the dispatcher lives, held by none of its workers (a hand-back
/// it could not write, a claim whose reply was lost), returns to pending on a heartbeat once
/// ORPHAN_GRACE has passed, and flows on; a running row changed more recently is left alone.
#[tokio::test]
async fn a_running_row_no_worker_holds_is_returned_and_flows_on() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\n";
    let h = Harness::new(stages, "ORPHAN_GRACE = 30s\n").await;
    h.add(1, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        1,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    // Running in one transaction, so no claim ever sees them pending: one unchanged for an
    // hour, one just now (within the grace).
    for age_secs in [3600.0_f64, 0.0] {
        let mut tx = h.db.pool.begin().await.unwrap();
        let id: i64 = sqlx::query_scalar(
            "SELECT pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], \
               'Subject: x\r\n'::bytea, 'y\r\n'::bytea, '{}', 'orphan')",
        )
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        sqlx::query(
            "UPDATE pepsi.workqueue SET status = 'running', \
               updated_at = now() - make_interval(secs => $2) WHERE workqueue_id = $1",
        )
        .bind(id)
        .bind(age_secs)
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        2,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    // Several heartbeats later the fresh one is still running, as nothing may have been
    // done with it yet.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        h.count("SELECT count(*) FROM pepsi.workqueue WHERE status = 'running' AND stage = 'init'")
            .await,
        1
    );
    assert!(stop(d).success());
    assert!(
        h.log("dispatch.log").contains("returned to pending"),
        "{}",
        h.log("dispatch.log")
    );
}

/// Under a backlog a busy worker is refilled once half its queue has drained, a claim's
/// worth at once, not one claim per answered id.
#[tokio::test]
async fn a_busy_worker_is_refilled_at_half_its_queue_not_per_message() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\nPARALLELISM = 1\nQUEUE_LIMIT = 4\nDELAY = 100ms\n";
    let h = Harness::new(stages, "").await;
    h.add(16, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        16,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    assert!(stop(d).success());
    let claims: Vec<usize> = h
        .log("dispatch.log")
        .lines()
        .filter(|l| l.contains("claimed") && l.contains("stage=init"))
        .filter_map(|l| {
            l.split("rows=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(
        claims.iter().sum::<usize>(),
        16,
        "every row claimed once: {claims:?}"
    );
    assert_eq!(claims[0], 4, "an idle pool is filled at once: {claims:?}");
    // The last claim may take fewer: only what was left.
    assert!(
        claims.len() <= 7 && claims[1..claims.len() - 1].iter().all(|&n| n >= 2),
        "refills of half a queue, not one id each: {claims:?}"
    );
}

#[tokio::test]
async fn a_pool_grows_to_parallelism_under_load_and_shrinks_when_idle() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\nPARALLELISM = 3\nQUEUE_LIMIT = 2\n\
                  DELAY = 50ms\nWORKER_IDLE_TIMEOUT = 1s\n";
    let h = Harness::new(stages, "").await;
    h.add(60, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    let mut most = 0;
    let until = Instant::now() + Duration::from_secs(60);
    while h
        .count("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'")
        .await
        < 60
    {
        most = most.max(children(d.id()).len());
        assert!(Instant::now() < until, "rows did not complete");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(most, 3, "the pool grew to PARALLELISM and no further");
    let pids = h
        .states("SELECT state->'pid'->'init' FROM pepsi.workqueue")
        .await;
    assert_eq!(pids.iter().collect::<HashSet<_>>().len(), 3);
    let until = Instant::now() + Duration::from_secs(10);
    while !children(d.id()).is_empty() {
        assert!(Instant::now() < until, "idle workers were not reaped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(d.try_wait().unwrap().is_none());
    assert!(stop(d).success());
}

#[tokio::test]
async fn max_messages_recycles_a_worker() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\nPARALLELISM = 1\nQUEUE_LIMIT = 1\nMAX_MESSAGES = 5\n";
    let h = Harness::new(stages, "").await;
    h.add(20, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        20,
        Duration::from_secs(60),
        &mut d,
    )
    .await;
    let mut per_pid: HashMap<String, usize> = HashMap::new();
    for p in h
        .states("SELECT state->'pid'->'init' FROM pepsi.workqueue")
        .await
    {
        *per_pid.entry(p.to_string()).or_default() += 1;
    }
    assert_eq!(per_pid.len(), 4, "{per_pid:?}");
    assert!(per_pid.values().all(|&n| n == 5), "{per_pid:?}");
    assert!(stop(d).success());
}

#[tokio::test]
async fn a_crashing_and_a_hanging_stage_fail_their_message_and_the_rest_flows() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nACTION = crash\nONLY_IF_STATE = crash\nQUEUE_LIMIT = 4\n\
                  [stage-b]\nPROGRAM = test\nNEXT_STAGE = done\nACTION = hang\nONLY_IF_STATE = hang\nMAX_RUNTIME = 1s\nQUEUE_LIMIT = 4\n";
    let h = Harness::new(stages, "").await;
    h.add(10, "s", serde_json::json!({})).await;
    h.add(1, "s", serde_json::json!({"crash": true})).await;
    h.add(1, "s", serde_json::json!({"hang": true})).await;
    h.add(10, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        20,
        Duration::from_secs(60),
        &mut d,
    )
    .await;
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE status IN ('failed', 'timeout')",
        2,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    let crashed = h.states("SELECT state || jsonb_build_object('status', status) FROM pepsi.workqueue WHERE state ? 'crash'").await;
    assert_eq!(crashed[0]["status"], "failed");
    let why = crashed[0]["dispatch_error"].as_str().unwrap();
    assert!(
        why.contains("killed by signal 6") && why.contains("stage init"),
        "{why}"
    );
    let hung = h.states("SELECT state || jsonb_build_object('status', status) FROM pepsi.workqueue WHERE state ? 'hang'").await;
    assert_eq!(hung[0]["status"], "timeout");
    assert!(
        hung[0]["dispatch_error"]
            .as_str()
            .unwrap()
            .contains("MAX_RUNTIME"),
        "{}",
        hung[0]
    );
    // Later rows still went through, on replacement workers.
    h.add(5, "s", serde_json::json!({})).await;
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        25,
        Duration::from_secs(60),
        &mut d,
    )
    .await;
    assert!(stop(d).success());
    let (crashes, kills): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT crashes FROM pepsi.stage_stats WHERE stage = 'init'), (SELECT kills FROM pepsi.stage_stats WHERE stage = 'b')",
    )
    .fetch_one(&h.db.pool)
    .await
    .unwrap();
    // A worker that died holding several ids (they batch) ran each again alone before the
    // culprit was named: one or two deaths each, and only the culprits failed.
    assert!((1..=2).contains(&crashes), "crashes at init: {crashes}");
    assert!((1..=2).contains(&kills), "kills at b: {kills}");
    let failed: i64 = h
        .count("SELECT messages_failed FROM pepsi.dispatch_stats")
        .await;
    assert_eq!(failed, 2);
}

#[tokio::test]
async fn a_stage_error_fails_the_message_with_the_reason() {
    let stages =
        "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\nACTION = error\nONLY_IF_STATE = bad\n";
    let h = Harness::new(stages, "").await;
    h.add(1, "s", serde_json::json!({"bad": 1})).await;
    h.add(3, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        3,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE status = 'failed'",
        1,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    let s = h
        .states("SELECT state FROM pepsi.workqueue WHERE status = 'failed'")
        .await;
    assert!(
        s[0]["dispatch_error"]
            .as_str()
            .unwrap()
            .contains("refuses message"),
        "{}",
        s[0]
    );
    assert!(stop(d).success());
}

#[tokio::test]
async fn paused_rows_run_again_when_due_and_not_before() {
    let stages =
        "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\nACTION = pause-once\nPAUSE_FOR = 2s\n";
    let h = Harness::new(stages, "").await;
    h.add(3, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE status = 'paused'",
        3,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        3,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    for s in h.states("SELECT state FROM pepsi.workqueue").await {
        let paused = s["paused_once"].as_i64().unwrap();
        let resumed = s["at"]["init"].as_i64().unwrap();
        assert!(
            resumed - paused >= 2_000_000,
            "ran again after {} µs: {s}",
            resumed - paused
        );
    }
    assert!(stop(d).success());
}

#[tokio::test]
async fn a_late_sender_is_not_stuck_behind_another_senders_backlog() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\nPARALLELISM = 1\nQUEUE_LIMIT = 1\nDELAY = 2ms\n";
    let h = Harness::new(stages, "").await;
    h.add(2_000, "bulk", serde_json::json!({"sender": "bulk"}))
        .await;
    h.add(10, "late", serde_json::json!({"sender": "late"}))
        .await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done' AND auth_user = 'late'",
        10,
        Duration::from_secs(120),
        &mut d,
    )
    .await;
    let bulk_done = h
        .count("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done' AND auth_user = 'bulk'")
        .await;
    assert!(
        bulk_done < 1_000,
        "the late sender waited for {bulk_done} of the bulk sender's messages"
    );
    assert!(stop(d).success());
}

#[tokio::test]
async fn a_configuration_change_retires_workers_and_replacements_use_it() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\n";
    let h = Harness::new(stages, "").await;
    h.add(3, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        3,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    sqlx::query("INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'stage-init', 'ACTION', 'finish')")
        .execute(&h.db.pool)
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !h
        .log("dispatch.log")
        .contains("configuration changed: workers retired")
    {
        assert!(
            Instant::now() < until,
            "no reaction to config_changed: {}",
            h.log("dispatch.log")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.add(4, "s", serde_json::json!({})).await;
    h.wait_for(
        "SELECT 7 - count(*) FROM pepsi.workqueue",
        4,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    assert_eq!(
        h.count("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'")
            .await,
        3
    );
    assert!(stop(d).success());
}

/// A change whose stage graph is broken (written to the overlay behind pepsi-config's back)
/// is not taken up: the running graph stays, and new mail still gets through it.
#[tokio::test]
async fn a_configuration_change_that_breaks_the_stage_graph_keeps_the_running_one() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\n";
    let h = Harness::new(stages, "").await;
    h.add(3, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        3,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    sqlx::query("INSERT INTO pepsi.config_override (scope, section, option, value) VALUES ('global', 'stage-init', 'NEXT_STAGE', 'nowhere')")
        .execute(&h.db.pool)
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !h
        .log("dispatch.log")
        .contains("configuration changed but is invalid, keeping the old one")
    {
        assert!(
            Instant::now() < until,
            "no refusal of the broken graph: {}",
            h.log("dispatch.log")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = h.log("dispatch.log");
    assert!(
        log.contains("[stage-init] NEXT_STAGE = nowhere: no [stage-nowhere] section"),
        "{log}"
    );
    assert!(
        !log.contains("configuration changed: workers retired"),
        "{log}"
    );
    h.add(2, "s", serde_json::json!({})).await;
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        5,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    assert!(stop(d).success());
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

/// A stage graph with an edge to no stage, or a PROGRAM no stage program has, would strand
/// every message sent there: the dispatcher refuses to start (status 1), naming every
/// error, and claims nothing; what is only odd (a stage nothing reaches) is logged.
#[tokio::test]
async fn a_broken_stage_graph_stops_the_dispatcher_naming_every_error() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = whitelsit\n\
                  [stage-whitelist]\nPROGRAM = pepsi-stage-check-whitelsit\nNEXT_STAGE = done\n";
    let h = Harness::new(stages, "").await;
    h.add(1, "s", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = d.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < until,
            "still running: {}",
            h.log("dispatch.log")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = h.log("dispatch.log");
    assert_eq!(status.code(), Some(1), "{log}");
    for needle in [
        "the configuration's stage graph is broken",
        "[stage-init] NEXT_STAGE = whitelsit: no [stage-whitelsit] section (did you mean \
         whitelist?)",
        "[stage-whitelist] PROGRAM = pepsi-stage-check-whitelsit: this Pepsi has no stage \
         program pepsi-stage-check-whitelsit (did you mean pepsi-stage-check-whitelist?)",
        // A warning, logged: nothing refuses it.
        "[stage-whitelist] is reached from [stage-init] by no NEXT_STAGE",
    ] {
        assert!(log.contains(needle), "{needle}: {log}");
    }
    assert_eq!(
        h.count("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'init' AND status = 'pending'")
            .await,
        1,
        "nothing was claimed"
    );
}

#[tokio::test]
async fn a_program_that_cannot_start_is_held_off_and_logged_once() {
    // The test stage where it is not installed (a PROGRAM no stage program of this Pepsi
    // has, pepsi-stage-missing, the dispatcher would refuse to start with).
    let stages = "[stage-init]\nPROGRAM = /nonexistent/pepsi-test-stage\n[stage-ok]\nPROGRAM = test\nNEXT_STAGE = done\n";
    let h = Harness::new(stages, "").await;
    h.add(2, "s", serde_json::json!({})).await;
    sqlx::query("UPDATE pepsi.workqueue SET stage = 'ok' WHERE workqueue_id = (SELECT min(workqueue_id) FROM pepsi.workqueue)")
        .execute(&h.db.pool)
        .await
        .unwrap();
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        1,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = h.log("dispatch.log");
    assert_eq!(
        log.matches("cannot start the stage program").count(),
        1,
        "{log}"
    );
    // Every SPAWN_COOLDOWN the dispatcher claims the row again, fails to start the program
    // and hands the row back: between the two it is `running`. It must come back to pending
    // at `init` each time, never fail and never move on.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (stage, status): (String, String) = sqlx::query_as(
            "SELECT stage, status::text FROM pepsi.workqueue WHERE workqueue_id = (SELECT max(workqueue_id) FROM pepsi.workqueue)",
        )
        .fetch_one(&h.db.pool)
        .await
        .unwrap();
        assert!(
            stage == "init" && matches!(status.as_str(), "pending" | "running"),
            "the held-off row ended at {stage}/{status}"
        );
        if status == "pending" {
            break;
        }
        assert!(Instant::now() < until, "the held-off row stayed running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stop(d).success());
}

#[test]
fn help_documents_the_options() {
    let out = Command::new(dispatch()).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for option in [
        "POLL_INTERVAL",
        "FAIR_HALF_LIFE",
        "FAIR_FIFO_PERCENT",
        "PARALLELISM",
        "QUEUE_LIMIT",
        "MAX_MESSAGES",
        "WORKER_IDLE_TIMEOUT",
        "MAX_RUNTIME",
        "HAND_FORWARD",
        "HOLD_FORWARD",
        "STANDBY",
        "LOCK_SESSION_TIMEOUT",
        "TAKEOVER_MARGIN",
        "MODE",
        "PARALLELISM_SCOPE",
        "--config",
    ] {
        assert!(help.contains(option), "--help lacks {option}: {help}");
    }
}

#[tokio::test]
async fn a_lost_listen_connection_is_restored_and_notifications_wake_the_dispatcher_again() {
    let h = Harness::new(
        "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\n",
        "POLL_INTERVAL = 1h\n",
    )
    .await;
    let mut d = h.start("dispatch.log");
    h.add(1, "s", serde_json::json!({})).await;
    pepsi_contract::db::notify_workqueue(&h.db.pool)
        .await
        .unwrap();
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        1,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    let killed: i64 = h
        .count("SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%') t")
        .await;
    assert_eq!(killed, 1, "one LISTEN connection");
    let until = Instant::now() + Duration::from_secs(20);
    while !h.log("dispatch.log").contains("reconnecting") {
        assert!(Instant::now() < until, "{}", h.log("dispatch.log"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Wait for the new LISTEN, then a notification must wake it (the heartbeat is an hour).
    h.wait_for(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
        1,
        Duration::from_secs(20),
        &mut d,
    )
    .await;
    h.add(1, "s", serde_json::json!({})).await;
    pepsi_contract::db::notify_workqueue(&h.db.pool)
        .await
        .unwrap();
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        2,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    assert!(stop(d).success());
}

/// A wake-up naming a stage makes the dispatcher claim for that stage alone: the ingress's
/// wake-ups name `init`, and a row pending elsewhere waits for a wake-up that names its
/// stage (in any letter case), names none, or names a stage without a pool.
#[tokio::test]
async fn a_wake_up_naming_a_stage_claims_for_that_stage_alone() {
    let h = Harness::new(
        "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\n\
         [stage-other]\nPROGRAM = test\nNEXT_STAGE = done\n",
        "POLL_INTERVAL = 1h\n",
    )
    .await;
    let mut d = h.start("dispatch.log");
    // The claim that follows the LISTEN is over before the rows exist.
    h.wait_for(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
        1,
        Duration::from_secs(20),
        &mut d,
    )
    .await;
    let until = Instant::now() + Duration::from_secs(20);
    while !h.log("dispatch.log").contains("dispatching") {
        assert!(Instant::now() < until, "{}", h.log("dispatch.log"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_other = async |n: i64| {
        let mut tx = h.db.pool.begin().await.unwrap();
        sqlx::query(
            "SELECT pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], 'Subject: x\r\n'::bytea, 'y\r\n'::bytea) \
             FROM generate_series(1, $1)",
        )
        .bind(n)
        .execute(&mut *tx)
        .await
        .unwrap();
        sqlx::query("UPDATE pepsi.workqueue SET stage = 'other' WHERE stage = 'init'")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    };
    let done = "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'";
    let wake = async |stage: Option<&str>| {
        pepsi_contract::db::wake_dispatcher(&h.db.pool, stage)
            .await
            .unwrap()
    };
    h.add(1, "s", serde_json::json!({})).await;
    wake(Some(pepsi_contract::db::ADMISSION_STAGE)).await;
    h.wait_for(done, 1, Duration::from_secs(30), &mut d).await;
    // Once the pass's status line has been answered (it wakes every stage: its row went on
    // to pending at `done`), a wake-up naming `init` leaves a new row at `other` pending ...
    tokio::time::sleep(Duration::from_millis(500)).await;
    at_other(1).await;
    wake(Some("init")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        h.count(
            "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'other' AND status = 'pending'"
        )
        .await,
        1,
        "{}",
        h.log("dispatch.log")
    );
    // ... and one naming its stage, in any letter case, takes it
    wake(Some("OTHER")).await;
    h.wait_for(done, 2, Duration::from_secs(30), &mut d).await;
    // a wake-up naming a stage without a pool, or none, wakes every stage
    for (scope, want) in [(Some("no-such-stage"), 3), (None, 4)] {
        at_other(1).await;
        wake(scope).await;
        h.wait_for(done, want, Duration::from_secs(30), &mut d)
            .await;
    }
    assert!(stop(d).success(), "{}", h.log("dispatch.log"));
}

/// Fusion (§22.5): with ALLOW_FUSION on, a chain of stages of one registered program runs in
/// the worker of its first stage, every hop of it counted in stage_stats from the status
/// line, and each message passes each stage once.
#[tokio::test]
async fn a_fused_chain_runs_in_one_worker_and_stage_stats_count_every_hop() {
    let h = Harness::with_fusion(CHAIN, "", true).await;
    h.add(500, "sender", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        500,
        Duration::from_secs(120),
        &mut d,
    )
    .await;
    assert!(stop(d).success(), "{}", h.log("dispatch.log"));
    assert_each_stage_once(&h, 500).await;
    for s in h
        .states("SELECT state FROM pepsi.workqueue WHERE stage = 'done'")
        .await
    {
        assert_eq!(s["pid"]["init"], s["pid"]["b"], "b fused into init: {s}");
        assert_eq!(s["pid"]["init"], s["pid"]["c"], "c fused into init: {s}");
    }
    let stats: Vec<(String, i64)> =
        sqlx::query_as("SELECT stage, messages FROM pepsi.stage_stats ORDER BY stage")
            .fetch_all(&h.db.pool)
            .await
            .unwrap();
    assert_eq!(
        stats,
        vec![("b".into(), 500), ("c".into(), 500), ("init".into(), 500)]
    );
    let stages_total: i64 = h
        .count("SELECT stages_total FROM pepsi.dispatch_stats")
        .await;
    assert_eq!(stages_total, 1500, "fused hops count as stage passes");
}

/// The rows a chain leaves when its second stage fails or its worker dies there, with
/// fusion `on` or off, as (stage, status, passes, has dispatch_error).
async fn chain_outcome(b_action: &str, fusion: bool) -> Vec<(String, String, Value, bool)> {
    // A short MAX_RUNTIME only where a hang is wanted: a worker's start counts against it.
    let limit = if b_action == "hang" { "2s" } else { "5m" };
    let stages = format!(
        "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nQUEUE_LIMIT = 1\nMAX_RUNTIME = {limit}\n\
         [stage-b]\nPROGRAM = test\nNEXT_STAGE = done\nACTION = {b_action}\nONLY_IF_STATE = bad\nQUEUE_LIMIT = 1\nMAX_RUNTIME = {limit}\n"
    );
    let h = Harness::with_fusion(&stages, "", fusion).await;
    h.add(1, "s", serde_json::json!({"bad": true})).await;
    let mut d = h.start("dispatch.log");

    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE status IN ('failed', 'timeout')",
        1,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    assert!(stop(d).success(), "{}", h.log("dispatch.log"));
    sqlx::query_as(
        "SELECT stage, status::text, COALESCE(state->'passes', 'null'::jsonb), state ? 'dispatch_error' \
         FROM pepsi.workqueue",
    )
    .fetch_all(&h.db.pool)
    .await
    .unwrap()
}

/// A fused hop that fails leaves the row exactly where the unfused pipeline does: the
/// earlier hops written, failed at the failing stage.
#[tokio::test]
async fn a_fused_chain_failing_half_way_leaves_the_row_where_the_unfused_pipeline_does() {
    let unfused = chain_outcome("error", false).await;
    let fused = chain_outcome("error", true).await;
    assert_eq!(
        unfused,
        vec![(
            "b".to_owned(),
            "failed".to_owned(),
            serde_json::json!({"init": 1}),
            true
        )]
    );
    assert_eq!(fused, unfused);
}

/// A worker killed in the middle of a fused chain (a crash in its second stage, or a hang
/// there past MAX_RUNTIME, which for a fused pass is that of the worker's own stage) leaves the row as a worker killed during the chain's first
/// stage leaves it unfused: failed (or timed out) at that stage with none of the chain's
/// writes, never half a chain.
#[tokio::test]
async fn a_worker_killed_in_the_middle_of_a_fused_chain_leaves_no_half_written_row() {
    for (action, status) in [("crash", "failed"), ("hang", "timeout")] {
        let fused = chain_outcome(action, true).await;
        assert_eq!(
            fused,
            vec![("init".to_owned(), status.to_owned(), Value::Null, true)],
            "{action}"
        );
        // The same kill in the unfused first stage: the same row.
        let limit = if action == "hang" { "2s" } else { "5m" };
        let stages = format!(
            "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nACTION = {action}\nONLY_IF_STATE = bad\nQUEUE_LIMIT = 1\nMAX_RUNTIME = {limit}\n\
             [stage-b]\nPROGRAM = test\nNEXT_STAGE = done\n"
        );
        let h = Harness::new(&stages, "").await;
        h.add(1, "s", serde_json::json!({"bad": true})).await;
        let mut d = h.start("dispatch.log");
        h.wait_for(
            "SELECT count(*) FROM pepsi.workqueue WHERE status IN ('failed', 'timeout')",
            1,
            Duration::from_secs(30),
            &mut d,
        )
        .await;
        assert!(stop(d).success());
        let unfused: Vec<(String, String, Value, bool)> = sqlx::query_as(
            "SELECT stage, status::text, COALESCE(state->'passes', 'null'::jsonb), state ? 'dispatch_error' \
             FROM pepsi.workqueue",
        )
        .fetch_all(&h.db.pool)
        .await
        .unwrap();
        assert_eq!(fused, unfused, "{action}");
    }
}

/// How many times pepsi.workqueue was vacuumed by hand (not by autovacuum) in `h`'s database.
async fn vacuums(h: &Harness) -> i64 {
    h.count(
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'pepsi.workqueue'::regclass",
    )
    .await
}

#[tokio::test]
async fn the_dispatcher_vacuums_the_queue_while_rows_move_unless_told_not_to() {
    let h = Harness::new(CHAIN, "VACUUM_INTERVAL = 500ms").await;
    h.add(600, "sender", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        600,
        Duration::from_secs(120),
        &mut d,
    )
    .await;
    // The claims of the run (1,800 rows) are more than enough to start one.
    let until = Instant::now() + Duration::from_secs(30);
    while vacuums(&h).await == 0 {
        assert!(
            Instant::now() < until,
            "no VACUUM of pepsi.workqueue within 30 s; log:\n{}",
            h.log("dispatch.log")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(stop(d).success());
    assert!(h.log("dispatch.log").contains("queue tables vacuumed"));

    let off = Harness::new(CHAIN, "VACUUM_INTERVAL = 0").await;
    off.add(600, "sender", serde_json::json!({})).await;
    let mut d = off.start("dispatch.log");
    off.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        600,
        Duration::from_secs(120),
        &mut d,
    )
    .await;
    // Several heartbeats (200 ms) after the last row moved: any VACUUM would have started.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(stop(d).success());
    assert_eq!(
        vacuums(&off).await,
        0,
        "VACUUM_INTERVAL = 0 vacuums nothing"
    );
    assert!(!off.log("dispatch.log").contains("queue tables vacuumed"));
}

#[tokio::test]
async fn a_lost_lock_is_taken_again_and_lost_for_good_to_another_dispatcher_it_exits() {
    use sqlx::Connection as _;
    const TERMINATE: &str = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
        WHERE datname = current_database() \
          AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                      AND classid = 1885696115::int8::oid AND objid = 1::int8::oid)";
    let h = Harness::new(CHAIN, "LOCK_CHECK_INTERVAL = 200ms").await;
    let mut d = h.start("dispatch.log");
    let until = Instant::now() + Duration::from_secs(30);
    while !h.log("dispatch.log").contains("dispatching") {
        assert!(Instant::now() < until, "{}", h.log("dispatch.log"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The session holding the lock ends (as in a PostgreSQL restart): taken again, and the
    // dispatcher goes on working.
    assert_eq!(h.count(TERMINATE).await, 1);
    let until = Instant::now() + Duration::from_secs(30);
    while !h
        .log("dispatch.log")
        .contains("dispatcher lock taken again")
    {
        assert!(Instant::now() < until, "{}", h.log("dispatch.log"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.add(20, "sender", serde_json::json!({})).await;
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        20,
        Duration::from_secs(60),
        &mut d,
    )
    .await;

    // Ended again, and another session takes the lock first: this dispatcher exits.
    let mut other = sqlx::PgConnection::connect(&h.db.url).await.unwrap();
    let ended: i64 = sqlx::query_scalar(TERMINATE)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert_eq!(ended, 1);
    sqlx::query("SELECT pg_advisory_lock(1885696115, 1)")
        .execute(&mut other)
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = d.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < until,
            "still running: {}",
            h.log("dispatch.log")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success());
    assert!(
        h.log("dispatch.log")
            .contains("lost the dispatcher lock to another dispatcher"),
        "{}",
        h.log("dispatch.log")
    );
}

/// The rows of each stage the dispatcher's claims took, summed from its debug log.
fn claimed_at(h: &Harness, log: &str, stage: &str) -> usize {
    let tag = format!("stage={stage} ");
    h.log(log)
        .lines()
        .filter(|l| l.contains(" claimed ") && l.contains(&tag))
        .filter_map(|l| {
            l.split("rows=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum()
}

/// HAND_FORWARD (the default): a worker's advance leaves the row running at the next stage
/// and says so on its status line, and the dispatcher gives it to that stage's pool without
/// a claim. Only the first stage is ever claimed; every row passes each stage once and
/// stage_stats count every pass. With HAND_FORWARD = no every stage is claimed again.
#[tokio::test]
async fn an_advanced_row_is_handed_to_the_next_stage_without_a_claim() {
    for (hand_forward, claims_later) in [("yes", false), ("no", true)] {
        let h = Harness::new(CHAIN, &format!("HAND_FORWARD = {hand_forward}")).await;
        // Fewer rows than b and c can hold (PARALLELISM 2 x QUEUE_LIMIT 8): none waits.
        h.add(12, "sender", serde_json::json!({})).await;
        let mut d = h.start("dispatch.log");
        h.wait_for(
            "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
            12,
            Duration::from_secs(60),
            &mut d,
        )
        .await;
        assert!(stop(d).success(), "{}", h.log("dispatch.log"));
        assert_each_stage_once(&h, 12).await;
        assert_eq!(claimed_at(&h, "dispatch.log", "init"), 12, "{hand_forward}");
        for stage in ["b", "c"] {
            let claimed = claimed_at(&h, "dispatch.log", stage);
            if claims_later {
                assert_eq!(claimed, 12, "HAND_FORWARD = no claims at {stage}");
            } else {
                assert_eq!(claimed, 0, "rows were handed to {stage}, not claimed");
            }
        }
        // `done` has no pool: the last advance leaves its rows pending, as before.
        assert_eq!(
            h.count("SELECT count(*) FROM pepsi.workqueue WHERE status = 'pending'")
                .await,
            12
        );
        let stats: Vec<(String, i64)> =
            sqlx::query_as("SELECT stage, messages FROM pepsi.stage_stats ORDER BY stage")
                .fetch_all(&h.db.pool)
                .await
                .unwrap();
        assert_eq!(
            stats,
            vec![("b".into(), 12), ("c".into(), 12), ("init".into(), 12)]
        );
    }
}

/// Rows handed forward to a stage whose workers have no room wait in the dispatcher, at
/// most HOLD_FORWARD a stage, and each goes to the next worker with room without a claim.
/// With HOLD_FORWARD = 0 they go back to pending, and so do the ones after them until the
/// backlog has been claimed: none waits behind later arrivals. Either way none is lost or
/// run twice.
#[tokio::test]
async fn rows_handed_to_a_full_stage_wait_their_turn_and_none_is_lost() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nPARALLELISM = 2\nQUEUE_LIMIT = 8\n\
                  [stage-b]\nPROGRAM = test\nNEXT_STAGE = c\nPARALLELISM = 1\nQUEUE_LIMIT = 2\nDELAY = 20ms\n\
                  [stage-c]\nPROGRAM = test\nNEXT_STAGE = done\nPARALLELISM = 2\nQUEUE_LIMIT = 8\n";
    for hold in [0, 100] {
        let h = Harness::new(stages, &format!("HOLD_FORWARD = {hold}\n")).await;
        h.add(60, "sender", serde_json::json!({})).await;
        let mut d = h.start("dispatch.log");
        h.wait_for(
            "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
            60,
            Duration::from_secs(60),
            &mut d,
        )
        .await;
        assert!(stop(d).success(), "{}", h.log("dispatch.log"));
        assert_each_stage_once(&h, 60).await;
        let log = h.log("dispatch.log");
        let without_room = |stage: &str, outcome: &str| {
            // The field is the stage's text as given, written `stage=b` or `stage="b"`.
            let tags = [format!("stage={stage} "), format!("stage=\"{stage}\"")];
            let what = format!("handed forward to a stage without room: {outcome}");
            log.lines()
                .filter(|l| l.contains(what.as_str()))
                .filter(|l| tags.iter().any(|t| l.contains(t.as_str())))
                .count()
        };
        if hold == 0 {
            assert!(
                without_room("b", "pending") > 0,
                "b (2 ids at most) cannot hold 60 rows at once"
            );
            assert_eq!(without_room("b", "held"), 0, "HOLD_FORWARD = 0 holds none");
        } else {
            assert!(
                without_room("b", "held") > 0,
                "b (2 ids at most) cannot take 60 rows at once: {log}"
            );
            assert_eq!(
                without_room("b", "pending"),
                0,
                "100 may wait: none went back"
            );
        }
        // c has room for 16 and is fed by b alone, but a loaded machine can starve its two
        // workers long enough to fill them: whatever went back to pending there is claimed
        // once too, and a held row never.
        for stage in ["b", "c"] {
            assert_eq!(
                claimed_at(&h, "dispatch.log", stage),
                without_room(stage, "pending"),
                "HOLD_FORWARD = {hold}: every row that went back to pending at {stage} was claimed once"
            );
        }
    }
}

/// Rows waiting in the dispatcher for a worker when it stops go back to pending at their
/// stage at once (not after the grace the workers get), and the next dispatcher runs each
/// there once.
#[tokio::test]
async fn rows_held_for_a_worker_are_pending_again_when_the_dispatcher_stops() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nPARALLELISM = 2\nQUEUE_LIMIT = 8\n\
                  [stage-b]\nPROGRAM = test\nNEXT_STAGE = c\nPARALLELISM = 1\nQUEUE_LIMIT = 1\nDELAY = 300ms\n\
                  [stage-c]\nPROGRAM = test\nNEXT_STAGE = done\n";
    let h = Harness::new(stages, "HOLD_FORWARD = 100\n").await;
    h.add(12, "sender", serde_json::json!({})).await;
    let mut d = h.start("dispatch.log");
    let until = Instant::now() + Duration::from_secs(30);
    while h
        .log("dispatch.log")
        .matches("handed forward to a stage without room: held")
        .count()
        < 5
    {
        assert!(
            Instant::now() < until,
            "no rows held: {}",
            h.log("dispatch.log")
        );
        assert!(d.try_wait().unwrap().is_none(), "{}", h.log("dispatch.log"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stop(d).success(), "{}", h.log("dispatch.log"));
    assert_eq!(
        h.count("SELECT count(*) FROM pepsi.workqueue WHERE status = 'running'")
            .await,
        0,
        "nothing is left running: {}",
        h.log("dispatch.log")
    );
    assert_eq!(h.count("SELECT count(*) FROM pepsi.workqueue").await, 12);
    let waiting = h
        .count("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'b' AND status = 'pending'")
        .await;
    assert!(waiting >= 3, "held rows are pending at b again: {waiting}");

    let mut d = h.start("dispatch-2.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        12,
        Duration::from_secs(60),
        &mut d,
    )
    .await;
    assert!(stop(d).success(), "{}", h.log("dispatch-2.log"));
    assert_each_stage_once(&h, 12).await;
}

/// A worker that dies after its commit handed its one row forward, before the status line
/// saying so, does not fail the message: the dispatcher finds the row running at the next
/// stage, returns it to pending there, and it flows on. A crash before any commit still
/// fails it at the worker's own stage.
#[tokio::test]
async fn a_worker_dying_after_handing_its_row_forward_does_not_fail_the_message() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nACTION = crash-after-advance\nONLY_IF_STATE = bad\nQUEUE_LIMIT = 1\n\
                  [stage-b]\nPROGRAM = test\nNEXT_STAGE = done\nQUEUE_LIMIT = 1\n";
    let h = Harness::new(stages, "").await;
    h.add(1, "s", serde_json::json!({"bad": true})).await;
    let mut d = h.start("dispatch.log");
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        1,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    assert!(stop(d).success(), "{}", h.log("dispatch.log"));
    let rows = h.outcomes().await;
    assert_eq!(
        rows,
        vec![(
            "done".to_owned(),
            "pending".to_owned(),
            serde_json::json!({"init": 1, "b": 1}),
            false
        )]
    );
    assert!(
        h.log("dispatch.log")
            .contains("had moved on to its next stage before its worker ended"),
        "{}",
        h.log("dispatch.log")
    );
}

/// Going idle writes the statistics only once STATS_IDLE_INTERVAL has passed since the last
/// write (a light load falls idle after nearly every message); they are all there at the
/// next write, and at shutdown.
#[tokio::test]
async fn an_idle_pipeline_writes_its_statistics_at_most_once_per_stats_idle_interval() {
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\n";
    for (spacing, written_while_running) in [("1h", false), ("300ms", true)] {
        // STATS_INTERVAL as long, so no write while busy gets in the way.
        let h = Harness::new(
            stages,
            &format!("STATS_IDLE_INTERVAL = {spacing}\nSTATS_INTERVAL = {spacing}"),
        )
        .await;
        let mut d = h.start("dispatch.log");
        for n in 1..=3 {
            h.add(1, "s", serde_json::json!({})).await;
            h.wait_for(
                "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
                n,
                Duration::from_secs(30),
                &mut d,
            )
            .await;
        }
        // Well past the 300ms spacing and the 200ms heartbeat, far short of an hour.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let seen = h
            .count("SELECT COALESCE(sum(messages), 0)::int8 FROM pepsi.stage_stats")
            .await;
        assert_eq!(
            seen,
            if written_while_running { 3 } else { 0 },
            "STATS_IDLE_INTERVAL = {spacing}"
        );
        assert!(stop(d).success(), "{}", h.log("dispatch.log"));
        assert_eq!(
            h.count("SELECT COALESCE(sum(messages), 0)::int8 FROM pepsi.stage_stats")
                .await,
            3,
            "written at shutdown"
        );
    }
}

/// Issue 34 item 4: `[database] STATEMENT_TIMEOUT` bounds the dispatcher's claim: while a
/// session holds a lock on the queue (as a primary that stops answering would hold it), the
/// claim gives up after the timeout and the dispatcher goes on; once the lock is released
/// the waiting row is claimed and moves on.
#[tokio::test]
async fn a_claim_held_by_a_lock_on_the_queue_gives_up_after_statement_timeout_and_recovers() {
    let h = Harness::new(
        "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\n",
        "POLL_INTERVAL = 1h\n",
    )
    .await;
    let text = std::fs::read_to_string(&h.config).unwrap();
    std::fs::write(
        &h.config,
        text.replacen("[database]\n", "[database]\nSTATEMENT_TIMEOUT = 2s\n", 1),
    )
    .unwrap();
    let mut d = h.start("dispatch.log");
    let until = Instant::now() + Duration::from_secs(30);
    // Its first claim (of an empty queue) is over.
    while !h.log("dispatch.log").contains("pepsi.dispatch_claim(") {
        assert!(Instant::now() < until, "{}", h.log("dispatch.log"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A row the dispatcher hears of only by notification (the heartbeat is an hour).
    h.add(1, "s", serde_json::json!({})).await;
    let mut locker = h.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE pepsi.workqueue IN EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    let started = Instant::now();
    pepsi_contract::db::notify_workqueue(&h.db.pool)
        .await
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while !h.log("dispatch.log").contains("claim failed") {
        assert!(
            Instant::now() < until,
            "the claim never gave up: {}",
            h.log("dispatch.log")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert!(
        h.log("dispatch.log").contains("statement timeout"),
        "{}",
        h.log("dispatch.log")
    );
    assert_eq!(
        h.count("SELECT count(*) FROM pepsi.workqueue WHERE status = 'pending'")
            .await,
        1
    );
    locker.rollback().await.unwrap();
    pepsi_contract::db::notify_workqueue(&h.db.pool)
        .await
        .unwrap();
    h.wait_for(
        "SELECT count(*) FROM pepsi.workqueue WHERE stage = 'done'",
        1,
        Duration::from_secs(30),
        &mut d,
    )
    .await;
    assert!(stop(d).success());
}

/// A worker whose claim PostgreSQL lost in a crash answers that its row is no longer running
/// while the dispatcher has already claimed the row again for another worker: that answer
/// must not fail the row the other worker holds (the chaos run's "no longer running" rows
/// failed at `local`).
#[tokio::test]
async fn a_lost_claims_answer_does_not_fail_the_row_another_worker_holds() {
    // b's first pass of the message loses its claim; DELAY keeps the second worker's pass
    // going while the first one's answer is read.
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nQUEUE_LIMIT = 1\n\
                  [stage-b]\nPROGRAM = test\nNEXT_STAGE = done\nACTION = lose-claim-once\nDELAY = 1s\nPARALLELISM = 2\nQUEUE_LIMIT = 1\n";
    let h = Harness::new(stages, "").await;
    h.add(1, "s", serde_json::json!({})).await;
    h.run_until_settled("dispatch.log", 1).await;
    let rows: Vec<(String, String, Value, bool, bool)> = sqlx::query_as(
        "SELECT stage, status::text, state->'passes', state ? 'claim_lost', state ? 'dispatch_error' \
         FROM pepsi.workqueue",
    )
    .fetch_all(&h.db.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![(
            "done".to_owned(),
            "pending".to_owned(),
            serde_json::json!({"init": 1, "b": 1}),
            true,
            false
        )],
        "{}",
        h.log("dispatch.log")
    );
    assert!(
        h.log("dispatch.log")
            .contains("another worker holds the message: left to it"),
        "{}",
        h.log("dispatch.log")
    );
}

/// A row handed forward whose advance PostgreSQL then lost (an asynchronous commit, gone in
/// a crash: the row is back at the stage before, running) reaches a worker of a program that
/// does not run that stage: the row goes back to pending at the stage the database has and
/// runs again from there, never failed (the chaos run's rows failed at `init` "whose PROGRAM
/// is pepsi-stage-srs, not pepsi-stage-aliases").
#[tokio::test]
async fn a_row_whose_handed_advance_was_lost_runs_again_at_its_stored_stage_not_failed() {
    use std::os::unix::fs::PermissionsExt as _;
    let tools = tempfile::tempdir().unwrap();
    // The test stage under a second PROGRAM name, and b's PROGRAM: a wrapper that, on the
    // first id of each message, sets the row back to `init` (what the database holds after
    // losing the advance) before the real worker loads it.
    let bin = tools.path().join("bin");
    let wrap = tools.path().join("wrap");
    let marks = tools.path().join("marks");
    for dir in [&bin, &wrap, &marks] {
        std::fs::create_dir(dir).unwrap();
    }
    let real = bin.join("pepsi-test-stage-other");
    std::os::unix::fs::symlink(test_stage(), &real).unwrap();
    let wrapper = wrap.join("pepsi-test-stage-other");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/bash\n\
             # worker -c CONFIG -L LEVEL, one id at a time, each to a worker of its own\n\
             unset PEPSI_DISPATCH_PID\n\
             url=$(sed -n 's/^URL = //p' \"$3\" | head -n 1)\n\
             while IFS= read -r id; do\n\
               if mkdir '{marks}'/\"$id\" 2>/dev/null; then\n\
                 psql -qAtX \"$url\" -c \"UPDATE pepsi.workqueue SET stage = 'init' WHERE workqueue_id = $id\" >/dev/null || exit 1\n\
               fi\n\
               echo \"$id\" | '{real}' \"$@\" || exit 1\n\
             done\n",
            marks = marks.display(),
            real = real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let stages = format!(
        "[stage-init]\nPROGRAM = test\nNEXT_STAGE = b\nQUEUE_LIMIT = 1\n\
         [stage-b]\nPROGRAM = {}\nNEXT_STAGE = done\nQUEUE_LIMIT = 1\n",
        wrapper.display()
    );
    let h = Harness::new(&stages, "").await;
    h.add(1, "s", serde_json::json!({})).await;
    h.run_until_settled("dispatch.log", 1).await;
    let rows = h.outcomes().await;
    // init ran twice: once before the lost advance, once from the stage the database had.
    assert_eq!(
        rows,
        vec![(
            "done".to_owned(),
            "pending".to_owned(),
            serde_json::json!({"init": 2, "b": 1}),
            false
        )],
        "{}",
        h.log("dispatch.log")
    );
    let log = h.log("dispatch.log");
    assert!(
        log.contains("whose PROGRAM is") && log.contains("not pepsi-test-stage-other"),
        "b's worker saw the row at init: {log}"
    );
    assert!(
        log.contains("the message was not where its worker was handed it"),
        "{log}"
    );
}

/// The spans a batching worker hands to the telemetry client: one per pass, in the row's own
/// trace (`state.trace`, else the row's id-derived one), each covering its own pass and not
/// its round-mates' (a round's passes run one after the other, so their spans do not
/// overlap), each hung under the ingress's span the row names.
#[tokio::test]
async fn each_pass_of_a_batched_round_is_its_own_span_in_its_rows_trace() {
    use pepsi_contract::telemetry::{Datagram, SpanId, SpanOutcome, TraceId};
    let spans_dir = tempfile::tempdir().unwrap();
    let socket = spans_dir.path().join("telemetry.sock");
    let client = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let stages = "[stage-init]\nPROGRAM = test\nNEXT_STAGE = done\nPARALLELISM = 1\nQUEUE_LIMIT = 4\nDELAY = 100ms\n";
    let h = Harness::new(
        stages,
        &format!(
            "\n[pepsi-telemetry-client]\nSOCKET = {}\n",
            socket.display()
        ),
    )
    .await;
    let trace = TraceId::parse("0af7651916cd43dd8448eb211c80319c").unwrap();
    let root = SpanId::parse("b7ad6b7169203331").unwrap();
    h.add(
        2,
        "s",
        serde_json::json!({"trace": {"trace_id": trace.to_string(), "span_id": root.to_string()}}),
    )
    .await;
    h.add(2, "s", serde_json::json!({})).await;
    h.run_until_settled("dispatch.log", 4).await;

    // Every process's connection (the worker's, the dispatcher's counters), each read to
    // its end: they all exited when the dispatcher stopped.
    client.set_nonblocking(true).unwrap();
    let mut spans = Vec::new();
    while let Ok((mut sender, _)) = client.accept() {
        sender.set_nonblocking(false).unwrap();
        sender
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        while let Some(datagram) = pepsi_contract::telemetry::wire::read_frame(&mut sender).unwrap()
        {
            if let Ok(Datagram::Span(span)) = Datagram::decode(&datagram) {
                spans.push(*span);
            }
        }
    }
    assert_eq!(spans.len(), 4, "{spans:#?}\n{}", h.log("dispatch.log"));
    let ids: HashSet<i64> = spans.iter().filter_map(|s| s.queue_id).collect();
    assert_eq!(ids.len(), 4, "one span per row: {spans:#?}");
    for s in &spans {
        assert_eq!(s.stage.as_deref(), Some("init"));
        assert_eq!(s.outcome, SpanOutcome::Advanced);
        assert_eq!(s.next_stage.as_deref(), Some("done"));
        assert!(s.end_ns >= s.start_ns);
        let id = s.queue_id.unwrap();
        if s.trace_id == trace {
            assert_eq!(s.parent, Some(root), "{s:?}");
        } else {
            assert_eq!(s.trace_id, TraceId::of_row(id), "{s:?}");
            assert_eq!(s.parent, None, "{s:?}");
        }
    }
    assert_eq!(spans.iter().filter(|s| s.trace_id == trace).count(), 2);
    spans.sort_by_key(|s| s.start_ns);
    for pair in spans.windows(2) {
        assert!(
            pair[0].end_ns <= pair[1].start_ns,
            "one pass's span reaches into the next one's: {pair:#?}"
        );
    }
}
