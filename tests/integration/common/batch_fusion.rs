//! Batching and fusion under the stage contract, against a real PostgreSQL: a batch with
//! mixed outcomes leaves every row exactly as one-at-a-time passes do; a fused chain leaves
//! its row as the unfused passes do, also when a hop fails half-way or fans out; a stage
//! that needs more than is loaded is not fused; the worker's stdin loop answers a batch in
//! order.

use std::sync::Arc;
use std::time::Duration;

use pepsi_conf::config::{Config, StageName};
use pepsi_contract::stage::fusion::{Registration, register};
use pepsi_contract::stage::{Load, PassReport, Stage, StageContext, StageError, Terminal, Worker};
use pepsi_testkit::TestDb;
use serde_json::{Map, Value, json};
use sqlx::{PgPool, Row as _};

/// A body-free stage whose action per stage comes from the row: `state.do.<stage>` is
/// `advance` (default), `to:<stage>`, `fail`, `pause`, `split` (recipient 1 to stage
/// `other`, then advance), `rewrite`, `from:<address>`, `finish` or `error`. Every pass
/// but a split records `seen.<stage>`.
struct Act;

const ACT: &str = "test-act";

impl Stage for Act {
    const PROGRAM: &'static str = ACT;
    const LOAD: Load = Load::Metadata;
    type Section = ();

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Act)
    }

    fn section(&self, _cfg: &Config, _name: &StageName) -> anyhow::Result<()> {
        Ok(())
    }

    async fn process(&self, _: &(), ctx: &mut StageContext<'_>) -> Result<Terminal, StageError> {
        let stage = ctx.stage().to_owned();
        let action = ctx
            .state()
            .get("do")
            .and_then(|d| d.get(&stage))
            .and_then(Value::as_str)
            .unwrap_or("advance")
            .to_owned();
        let mut seen = ctx
            .state()
            .get("seen")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        seen.insert(stage.clone(), json!(true));
        let mut merge = Map::new();
        merge.insert("seen".into(), Value::Object(seen));
        if action == "split" {
            ctx.split_off_recipients(&[1], "other").await?;
            return ctx.advance();
        }
        match action.as_str() {
            "fail" => ctx.fail(merge),
            "pause" => ctx.pause(merge, Duration::from_secs(600)),
            "finish" => ctx.finish(),
            "error" => Err(StageError::Permanent(format!("{stage} refuses"))),
            "rewrite" => ctx.rewrite_recipients(vec!["new@example.test".into()], merge),
            a => {
                ctx.merge_state(merge);
                if let Some(to) = a.strip_prefix("to:") {
                    ctx.advance_to(to)
                } else {
                    if let Some(from) = a.strip_prefix("from:") {
                        ctx.set_mail_from(from);
                    }
                    ctx.advance()
                }
            }
        }
    }
}

/// A stage that loads the whole message: never fused behind a body-free one.
struct Whole;

impl Stage for Whole {
    const PROGRAM: &'static str = "test-whole";
    const LOAD: Load = Load::Full;
    type Section = ();

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Whole)
    }

    fn section(&self, _cfg: &Config, _name: &StageName) -> anyhow::Result<()> {
        Ok(())
    }

    async fn process(&self, _: &(), ctx: &mut StageContext<'_>) -> Result<Terminal, StageError> {
        ctx.finish()
    }
}

/// A stage that loads the whole message and batches (`BATCH`), as a Maildir delivery does:
/// finishes a row whose body is `body`, pauses one whose state asks for it, fails the rest.
struct Deliver;

impl Stage for Deliver {
    const PROGRAM: &'static str = "test-deliver";
    const LOAD: Load = Load::Full;
    const BATCH: bool = true;
    type Section = ();

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Deliver)
    }

    fn section(&self, _cfg: &Config, _name: &StageName) -> anyhow::Result<()> {
        Ok(())
    }

    async fn process(&self, _: &(), ctx: &mut StageContext<'_>) -> Result<Terminal, StageError> {
        let mut merge = Map::new();
        merge.insert("seen_body".into(), json!(ctx.body()?.len()));
        if ctx.state().get("do").and_then(Value::as_str) == Some("pause") {
            return ctx.pause(merge, Duration::from_secs(600));
        }
        if ctx.body()? == b"body" && ctx.headers()? == b"Subject: t" {
            ctx.finish()
        } else {
            ctx.fail(merge)
        }
    }
}

fn registry() -> Vec<Registration> {
    vec![register::<Act>(), register::<Whole>()]
}

async fn setup(fusion: bool) -> (TestDb, Config) {
    let db = TestDb::new().await;
    let text = format!(
        "[database]\nURL = {}\n[pepsi]\nALLOW_FUSION = {}\n\
         [stage-a]\nPROGRAM = {ACT}\nNEXT_STAGE = b\nQUEUE_LIMIT = 16\n\
         [stage-b]\nPROGRAM = {ACT}\nNEXT_STAGE = c\n\
         [stage-c]\nPROGRAM = test-whole\n\
         [stage-d]\nPROGRAM = test-deliver\nQUEUE_LIMIT = 8\n\
         [stage-e]\nPROGRAM = test-settle\nQUEUE_LIMIT = 8\n\
         [stage-x]\nPROGRAM = {ACT}\nNEXT_STAGE = y\n\
         [stage-y]\nPROGRAM = {ACT}\n\
         [stage-other]\nPROGRAM = {ACT}\nNEXT_STAGE = c\n",
        db.url,
        if fusion { "yes" } else { "no" }
    );
    let cfg = Config::from_str_named(&text, "batch.conf").unwrap();
    (db, cfg)
}

async fn running(pool: &PgPool, stage: &str, state: Value) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('alice@example.test', ARRAY['r0@example.test', 'r1@example.test'], \
           convert_to('Subject: t', 'UTF8'), convert_to('body', 'UTF8'), $1, NULL, '192.0.2.1')",
    )
    .bind(state)
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE pepsi.workqueue SET status = 'running', stage = $2 WHERE workqueue_id = $1",
    )
    .bind(id)
    .bind(stage)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// What a test compares of a row and of the siblings split off it.
async fn view(pool: &PgPool, id: i64) -> Value {
    let rows = sqlx::query(
        "SELECT stage, status::text AS status, mail_from, rcpt_to, state, timeout IS NOT NULL AS timed \
         FROM pepsi.workqueue WHERE workqueue_id = $1 OR body_id = \
              (SELECT body_id FROM pepsi.workqueue WHERE workqueue_id = $1) \
         ORDER BY workqueue_id",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap();
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({
                    "stage": r.get::<String, _>("stage"),
                    "status": r.get::<String, _>("status"),
                    "mail_from": r.get::<String, _>("mail_from"),
                    "rcpt_to": r.get::<Vec<String>, _>("rcpt_to"),
                    "state": r.get::<Value, _>("state"),
                    "timed": r.get::<bool, _>("timed"),
                })
            })
            .collect(),
    )
}

fn outcome(r: &Result<PassReport, StageError>) -> String {
    match r {
        Ok(report) => format!(
            "ok finished={} fused={}",
            report.finished,
            report.fused.len()
        ),
        Err(e) => format!("error {e}"),
    }
}

const MIXED: [&str; 8] = [
    "advance", "to:x", "fail", "pause", "split", "rewrite", "finish", "error",
];

/// One SELECT and one UPDATE for a batch of body-free passes with every kind of outcome:
/// two different advance targets, a fail, a pause, a fan-out, a rewrite, a finish and an
/// error leave each row (and its siblings) exactly as passes one at a time do.
#[tokio::test]
async fn a_batch_with_mixed_outcomes_ends_each_row_as_one_at_a_time() {
    let (db, cfg) = setup(false).await;
    let pool = &db.pool;
    let mut batch = Vec::new();
    let mut single = Vec::new();
    for action in MIXED {
        let state = json!({ "do": { "a": action } });
        batch.push(running(pool, "a", state.clone()).await);
        single.push(running(pool, "a", state).await);
    }
    let worker = Worker::with_stage(Act, pool, &cfg, &[]).unwrap();
    let batched = worker.pass_batch(&batch).await;
    let mut one_by_one = Vec::new();
    for &id in &single {
        one_by_one.push(worker.pass(id).await);
    }
    for (i, action) in MIXED.iter().enumerate() {
        assert_eq!(
            outcome(&batched[i]),
            outcome(&one_by_one[i]),
            "{action}: the pass reports alike"
        );
        let (b, s) = (view(pool, batch[i]).await, view(pool, single[i]).await);
        assert_eq!(b, s, "{action}: the rows end alike");
    }
    // The expected ends, so that "alike" is not "alike and wrong".
    let end = |v: Value| (v[0]["stage"].clone(), v[0]["status"].clone());
    let ends: Vec<(Value, Value)> = {
        let mut out = Vec::new();
        for &id in &batch {
            out.push(end(view(pool, id).await));
        }
        out
    };
    let want = [
        ("b", "pending"),
        ("x", "pending"),
        ("a", "failed"),
        ("a", "paused"),
        ("b", "pending"),
        ("b", "pending"),
        ("", ""),
        ("a", "running"),
    ];
    for (i, (stage, status)) in want.iter().enumerate() {
        if stage.is_empty() {
            assert_eq!(view(pool, batch[i]).await, json!([]), "finished: gone");
        } else {
            assert_eq!(ends[i], (json!(stage), json!(status)), "{}", MIXED[i]);
        }
    }
    let split = view(pool, batch[4]).await;
    assert_eq!(
        split.as_array().unwrap().len(),
        2,
        "a sibling was split off"
    );
}

/// A batch row taken back by the dispatcher before the batch's commit is reported as not
/// running, and nothing is written to it; the other rows of the batch commit.
#[tokio::test]
async fn a_row_taken_back_during_a_batch_is_reported_and_left_alone() {
    let (db, cfg) = setup(false).await;
    let pool = &db.pool;
    let a = running(pool, "a", json!({})).await;
    let b = running(pool, "a", json!({})).await;
    sqlx::query("UPDATE pepsi.workqueue SET status = 'pending' WHERE workqueue_id = $1")
        .bind(b)
        .execute(pool)
        .await
        .unwrap();
    let worker = Worker::with_stage(Act, pool, &cfg, &[]).unwrap();
    let results = worker.pass_batch(&[a, b]).await;
    assert!(results[0].is_ok());
    assert!(
        matches!(results[1], Err(StageError::NotRunning { .. })),
        "{}",
        outcome(&results[1])
    );
    assert_eq!(view(pool, b).await[0]["stage"], "a");
    assert_eq!(view(pool, b).await[0]["status"], "pending");
    assert_eq!(view(pool, a).await[0]["stage"], "b");
}

/// A stage that loads the whole message and opts into batching gets each row's headers and
/// body from the batch's one SELECT; its finishes delete their rows (and release the shared
/// body) in the batch's one statement, beside a pause; a row taken back before that
/// statement is reported and kept.
#[tokio::test]
async fn a_whole_message_batch_finishes_in_one_statement_like_one_at_a_time() {
    let (db, cfg) = setup(false).await;
    let pool = &db.pool;
    let states = [json!({}), json!({"do": "pause"}), json!({}), json!({})];
    let mut batch = Vec::new();
    let mut single = Vec::new();
    for state in &states {
        batch.push(running(pool, "d", state.clone()).await);
        single.push(running(pool, "d", state.clone()).await);
    }
    // The last row of the batch is taken back by the dispatcher before the batch commits.
    let taken = batch[3];
    sqlx::query("UPDATE pepsi.workqueue SET status = 'pending' WHERE workqueue_id = $1")
        .bind(taken)
        .execute(pool)
        .await
        .unwrap();
    let worker = Worker::with_stage(Deliver, pool, &cfg, &[]).unwrap();
    let batched = worker.pass_batch(&batch).await;
    for (i, &id) in single.iter().enumerate().take(3) {
        let alone = worker.pass(id).await;
        assert_eq!(
            outcome(&batched[i]),
            outcome(&alone),
            "row {i}: reports alike"
        );
        assert_eq!(
            view(pool, batch[i]).await,
            view(pool, id).await,
            "row {i}: ends alike"
        );
    }
    assert_eq!(outcome(&batched[0]), "ok finished=true fused=0");
    assert_eq!(
        view(pool, batch[0]).await,
        json!([]),
        "a finished row is gone"
    );
    let paused = view(pool, batch[1]).await;
    assert_eq!(paused[0]["status"], "paused");
    assert_eq!(paused[0]["state"]["seen_body"], 4, "the body was loaded");
    assert!(
        matches!(batched[3], Err(StageError::NotRunning { .. })),
        "{}",
        outcome(&batched[3])
    );
    assert_eq!(
        view(pool, taken).await[0]["status"],
        "pending",
        "kept as it was"
    );
    let orphans: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.workqueue_body b \
         WHERE NOT EXISTS (SELECT 1 FROM pepsi.workqueue w WHERE w.body_id = b.body_id)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(orphans, 0, "finished rows released their bodies");
}

/// The stdin loop: ids already waiting are handled as one batch, answered one status line
/// each, in order, a bad id included.
#[tokio::test]
async fn the_worker_loop_answers_a_batch_line_by_line_in_order() {
    let (db, cfg) = setup(false).await;
    let pool = &db.pool;
    let ok = running(pool, "a", json!({})).await;
    let bad = running(pool, "a", json!({"do": {"a": "error"}})).await;
    let done = running(pool, "a", json!({"do": {"a": "finish"}})).await;
    let input = format!("{ok}\nnot-a-number\n{bad}\n{done}\n");
    let mut out = Vec::new();
    let worker = Worker::with_stage(Act, pool, &cfg, &[]).unwrap();
    let n = worker
        .run(tokio::io::BufReader::new(input.as_bytes()), &mut out)
        .await
        .unwrap();
    assert_eq!(n, 4);
    let lines: Vec<String> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0], "0");
    assert!(lines[1].starts_with("1 ") && lines[1].contains("not a number"));
    assert!(lines[2].starts_with("1 ") && lines[2].contains("a refuses"));
    assert_eq!(lines[3], r#"0 {"finished":true}"#);
}

/// Runs row `id` (at stage `a`) through the pipeline one stage per pass, as the dispatcher
/// would without fusion, until it leaves the body-free stages or a pass fails.
async fn unfused(pool: &PgPool, cfg: &Config, id: i64) -> Result<(), StageError> {
    let worker = Worker::with_stage(Act, pool, cfg, &[]).unwrap();
    loop {
        worker.pass(id).await?;
        let (stage, status): (String, String) = sqlx::query_as(
            "SELECT stage, status::text FROM pepsi.workqueue WHERE workqueue_id = $1",
        )
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
        if status != "pending" || stage == "c" {
            return Ok(());
        }
        sqlx::query("UPDATE pepsi.workqueue SET status = 'running' WHERE workqueue_id = $1")
            .bind(id)
            .execute(pool)
            .await
            .unwrap();
    }
}

/// A fused chain a → b stops before c (Load::Full) and ends the row where the unfused passes
/// do; with a change in a, a failure in b, a fan-out in b, or a batch of such rows.
#[tokio::test]
async fn fused_chains_end_rows_where_unfused_passes_do() {
    let (db_f, cfg_f) = setup(true).await;
    let (db_u, cfg_u) = setup(false).await;
    let reg = registry();
    let cases = [
        json!({}),
        json!({"do": {"a": "from:forwarder@example.test"}}),
        json!({"do": {"a": "from:forwarder@example.test", "b": "error"}}),
        json!({"do": {"a": "rewrite", "b": "fail"}}),
        json!({"do": {"a": "to:x", "x": "pause"}}),
        json!({"do": {"a": "from:f@example.test", "b": "split"}}),
    ];
    let fused_worker = Worker::with_stage(Act, &db_f.pool, &cfg_f, &reg).unwrap();
    let mut fused_ids = Vec::new();
    for case in &cases {
        fused_ids.push(running(&db_f.pool, "a", case.clone()).await);
    }
    // The first three one at a time, the rest as one batch.
    let mut fused_results = Vec::new();
    for &id in &fused_ids[..3] {
        fused_results.push(fused_worker.pass(id).await);
    }
    fused_results.extend(fused_worker.pass_batch(&fused_ids[3..]).await);
    for (i, case) in cases.iter().enumerate() {
        let u = running(&db_u.pool, "a", case.clone()).await;
        let unfused_result = unfused(&db_u.pool, &cfg_u, u).await;
        assert_eq!(
            fused_results[i].is_ok(),
            unfused_result.is_ok(),
            "{case}: {}",
            outcome(&fused_results[i])
        );
        let (f, un) = (
            view(&db_f.pool, fused_ids[i]).await,
            view(&db_u.pool, u).await,
        );
        assert_eq!(f, un, "{case}");
    }
    // The plain chain was fused: a pass reporting b, stopping before c.
    let report = fused_results[0].as_ref().unwrap();
    assert_eq!(
        report
            .fused
            .iter()
            .map(|h| h.stage.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    assert_eq!(view(&db_f.pool, fused_ids[0]).await[0]["stage"], "c");
}

/// Without the registry (a per-program build) nothing is fused, ALLOW_FUSION or not.
#[tokio::test]
async fn nothing_is_fused_without_a_registry() {
    let (db, cfg) = setup(true).await;
    let id = running(&db.pool, "a", json!({})).await;
    let worker = Worker::with_stage(Act, &db.pool, &cfg, &[]).unwrap();
    let report = worker.pass(id).await.unwrap();
    assert!(report.fused.is_empty());
    assert_eq!(view(&db.pool, id).await[0]["stage"], "b");
}

/// A body-free stage whose pass waits, for a row with `state.wait`, until the table
/// `gate_open` has a row: a pass as slow as the test wants.
struct Gate;

impl Stage for Gate {
    const PROGRAM: &'static str = "test-gate";
    const LOAD: Load = Load::Metadata;
    type Section = ();

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Gate)
    }

    fn section(&self, _cfg: &Config, _name: &StageName) -> anyhow::Result<()> {
        Ok(())
    }

    async fn process(&self, _: &(), ctx: &mut StageContext<'_>) -> Result<Terminal, StageError> {
        if ctx.state().get("wait").is_some() {
            for _ in 0..6000 {
                let open: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM gate_open)")
                    .fetch_one(ctx.pool())
                    .await?;
                if open {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        ctx.finish()
    }
}

/// A batch round is answered (and committed) as far as it got once ROUND_TIME has passed:
/// the answer for a fast pass never waits for a slow pass after it in the same round.
#[tokio::test]
async fn a_round_cut_by_round_time_answers_what_is_done_before_the_slow_pass_ends() {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let db = TestDb::new().await;
    let pool = &db.pool;
    sqlx::query("CREATE TABLE gate_open (x int)")
        .execute(pool)
        .await
        .unwrap();
    let cfg = Config::from_str_named(
        &format!(
            "[database]\nURL = {}\n[stage-g]\nPROGRAM = test-gate\nQUEUE_LIMIT = 8\nROUND_TIME = 0s\n",
            db.url
        ),
        "gate.conf",
    )
    .unwrap();
    let fast = running(pool, "g", json!({})).await;
    let slow = running(pool, "g", json!({"wait": true})).await;
    let after = running(pool, "g", json!({})).await;
    let (mut to_worker, from_test) = tokio::io::duplex(4096);
    let (worker_out, from_worker) = tokio::io::duplex(4096);
    // All three ids are waiting before the worker reads: one round.
    to_worker
        .write_all(format!("{fast}\n{slow}\n{after}\n").as_bytes())
        .await
        .unwrap();
    drop(to_worker);
    let worker = Worker::with_stage(Gate, pool, &cfg, &[]).unwrap();
    let run = worker.run(tokio::io::BufReader::new(from_test), worker_out);
    let test = async {
        let mut lines = tokio::io::BufReader::new(from_worker).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the fast pass is answered while the slow one still waits")
            .unwrap()
            .unwrap();
        assert_eq!(first, r#"0 {"finished":true}"#);
        let left: Vec<i64> =
            sqlx::query_scalar("SELECT workqueue_id FROM pepsi.workqueue ORDER BY workqueue_id")
                .fetch_all(pool)
                .await
                .unwrap();
        assert_eq!(left, [slow, after], "the answered pass is committed");
        sqlx::query("INSERT INTO gate_open VALUES (1)")
            .execute(pool)
            .await
            .unwrap();
        let mut rest = Vec::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            rest.push(line);
        }
        assert_eq!(rest, [r#"0 {"finished":true}"#, r#"0 {"finished":true}"#]);
    };
    let (handled, ()) = tokio::join!(run, test);
    assert_eq!(handled.unwrap(), 3);
}

/// A batching stage that does something outside the database in each pass (it notes the
/// row as "written") and makes it durable in `before_commit`, which checks that none of the
/// rows it settles has been committed yet and can be told to fail.
struct Settle {
    pool: PgPool,
    written: std::sync::Mutex<Vec<i64>>,
    /// Each call of `before_commit`: the rows it settled.
    calls: Arc<std::sync::Mutex<Vec<Vec<i64>>>>,
    fail: bool,
}

impl Settle {
    fn new(pool: &PgPool, fail: bool) -> (Settle, Arc<std::sync::Mutex<Vec<Vec<i64>>>>) {
        let calls = Arc::default();
        let stage = Settle {
            pool: pool.clone(),
            written: Default::default(),
            calls: Arc::clone(&calls),
            fail,
        };
        (stage, calls)
    }
}

impl Stage for Settle {
    const PROGRAM: &'static str = "test-settle";
    const LOAD: Load = Load::Full;
    const BATCH: bool = true;
    type Section = ();

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        anyhow::bail!("made by the test")
    }

    fn section(&self, _cfg: &Config, _name: &StageName) -> anyhow::Result<()> {
        Ok(())
    }

    async fn process(&self, _: &(), ctx: &mut StageContext<'_>) -> Result<Terminal, StageError> {
        self.written.lock().unwrap().push(ctx.id());
        match ctx.state().get("do").and_then(Value::as_str) {
            // A body change is committed on its own, not in the round's statement.
            Some("rewrite") => {
                ctx.set_body(b"new body".to_vec());
                ctx.advance_to("c")
            }
            _ => ctx.finish(),
        }
    }

    async fn before_commit(&self) -> Result<(), StageError> {
        let rows = std::mem::take(&mut *self.written.lock().unwrap());
        let committed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM unnest($1::int8[]) AS i(id) WHERE NOT EXISTS \
             (SELECT 1 FROM pepsi.workqueue w WHERE w.workqueue_id = i.id \
              AND w.status = 'running' AND w.rcpt_to[1] = 'r0@example.test')",
        )
        .bind(&rows)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        assert_eq!(
            committed, 0,
            "rows {rows:?} committed before they were settled"
        );
        self.calls.lock().unwrap().push(rows);
        if self.fail {
            return Err(StageError::Temporary("the disk refused the sync".into()));
        }
        Ok(())
    }
}

/// `before_commit` runs before every commit of a pass: once for a batch round's shared
/// statement, once before a pass committed on its own, once for a single pass; nothing is
/// committed before it, and when it fails nothing it would have covered is committed.
#[tokio::test]
async fn what_a_round_did_outside_the_database_is_settled_before_its_commit() {
    let (db, cfg) = setup(false).await;
    let pool = &db.pool;
    let mut batch = Vec::new();
    for state in [json!({}), json!({}), json!({"do": "rewrite"}), json!({})] {
        batch.push(running(pool, "e", state).await);
    }
    let (stage, calls) = Settle::new(pool, false);
    let worker = Worker::with_stage(stage, pool, &cfg, &[]).unwrap();
    let answers = worker.pass_batch(&batch).await;
    assert_eq!(
        answers.iter().map(outcome).collect::<Vec<_>>(),
        [
            "ok finished=true fused=0",
            "ok finished=true fused=0",
            "ok finished=false fused=0",
            "ok finished=true fused=0"
        ]
    );
    for id in [batch[0], batch[1], batch[3]] {
        assert_eq!(view(pool, id).await, json!([]), "row {id} finished");
    }
    let rewritten = view(pool, batch[2]).await;
    assert_eq!(
        (&rewritten[0]["stage"], &rewritten[0]["status"]),
        (&json!("c"), &json!("pending"))
    );
    let single = running(pool, "e", json!({})).await;
    assert!(worker.pass(single).await.is_ok());
    assert_eq!(
        *calls.lock().unwrap(),
        [
            vec![batch[0], batch[1], batch[2]],
            vec![batch[3]],
            vec![single]
        ],
        "before the pass committed alone (the two before it waiting), before the round's \
         statement, before a single pass"
    );
    drop(worker);

    // The same with a failing sync: every pass of the round is answered with its error
    // and left running as it was; the round stops at the pass committed on its own.
    let (stage, calls) = Settle::new(pool, true);
    let mut failing = Vec::new();
    for state in [json!({}), json!({}), json!({"do": "rewrite"}), json!({})] {
        failing.push(running(pool, "e", state).await);
    }
    let worker = Worker::with_stage(stage, pool, &cfg, &[]).unwrap();
    let answers = worker.pass_batch(&failing).await;
    assert_eq!(answers.len(), 3, "the round stops at the failed sync");
    for (i, a) in answers.iter().enumerate() {
        let e = a.as_ref().expect_err("nothing is done");
        assert!(
            e.is_temporary() && e.to_string().contains("the disk refused the sync"),
            "pass {i}: {e}"
        );
    }
    for &id in &failing {
        let row = view(pool, id).await;
        assert_eq!(
            (&row[0]["status"], &row[0]["rcpt_to"][0]),
            (&json!("running"), &json!("r0@example.test")),
            "row {id} left as it was"
        );
    }
    let single = running(pool, "e", json!({})).await;
    assert!(worker.pass(single).await.is_err());
    assert_eq!(view(pool, single).await[0]["status"], "running");
    assert_eq!(
        *calls.lock().unwrap(),
        [vec![failing[0], failing[1], failing[2]], vec![single]]
    );
}

/// `[stage-*] LOAD`: a body-free first stage that loads the whole row fuses the delivery
/// that needs it (one SELECT and one statement for a round of such chains, rows finished);
/// without LOAD, or with fusion off, the chain stops where the delivery's Load begins. A
/// batching worker never fuses a stage that does not batch (`test-whole`), loaded or not,
/// and a LOAD that is no Load or less than the program needs stops the worker at start.
#[tokio::test]
async fn a_chain_loading_the_body_up_front_fuses_the_delivery_that_needs_it() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let conf = |fusion: &str, load: &str, b_next: &str| {
        let text = format!(
            "[database]\nURL = {}\n[pepsi]\nALLOW_FUSION = {fusion}\n\
             [stage-a]\nPROGRAM = {ACT}\nNEXT_STAGE = b\nQUEUE_LIMIT = 8\n{load}\n\
             [stage-b]\nPROGRAM = {ACT}\nNEXT_STAGE = {b_next}\n\
             [stage-c]\nPROGRAM = test-whole\n\
             [stage-d]\nPROGRAM = test-deliver\n",
            db.url
        );
        Config::from_str_named(&text, "load.conf").unwrap()
    };
    let reg = vec![
        register::<Act>(),
        register::<Whole>(),
        register::<Deliver>(),
    ];
    let stages = |r: &Result<PassReport, StageError>| -> Vec<String> {
        r.as_ref()
            .map(|p| p.fused.iter().map(|h| h.stage.clone()).collect())
            .unwrap_or_else(|e| vec![format!("error {e}")])
    };

    // Loaded up front: a → b → d in one pass, for a round of three rows as for one.
    let cfg = conf("yes", "LOAD = full", "d");
    let worker = Worker::with_stage(Act, pool, &cfg, &reg).unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(running(pool, "a", json!({})).await);
    }
    let round = worker.pass_batch(&ids).await;
    for (r, &id) in round.iter().zip(&ids) {
        assert_eq!(stages(r), ["b", "d"], "{}", outcome(r));
        assert!(r.as_ref().unwrap().finished, "d finished the row");
        assert_eq!(view(pool, id).await, json!([]), "the row is gone");
    }
    let one = running(pool, "a", json!({})).await;
    assert_eq!(stages(&worker.pass(one).await), ["b", "d"]);
    assert_eq!(view(pool, one).await, json!([]));

    // Not loaded, or not fused: the chain stops before d, the row pending there.
    for (fusion, load, fused) in [("yes", "", vec!["b"]), ("no", "LOAD = full", vec![])] {
        let cfg = conf(fusion, load, "d");
        let worker = Worker::with_stage(Act, pool, &cfg, &reg).unwrap();
        let id = running(pool, "a", json!({})).await;
        let r = worker.pass(id).await;
        assert_eq!(stages(&r), fused, "fusion {fusion}, {load:?}");
        let row = view(pool, id).await;
        let at = if fused.is_empty() { "b" } else { "d" };
        assert_eq!(
            (row[0]["stage"].as_str(), row[0]["status"].as_str()),
            (Some(at), Some("pending")),
            "fusion {fusion}, {load:?}"
        );
    }

    // Loaded, but c does not batch: a batching worker stops before it.
    let cfg = conf("yes", "LOAD = full", "c");
    let worker = Worker::with_stage(Act, pool, &cfg, &reg).unwrap();
    let id = running(pool, "a", json!({})).await;
    assert_eq!(stages(&worker.pass(id).await), ["b"]);
    assert_eq!(view(pool, id).await[0]["stage"], "c");

    // Bad values stop the worker (and pepsi-config's check) naming the option.
    let err = |cfg: &Config| match Worker::with_stage(Act, pool, cfg, &reg) {
        Ok(_) => panic!("a worker started with a bad LOAD"),
        Err(e) => format!("{e:#}"),
    };
    let bad = conf("yes", "LOAD = everything", "d");
    let e = err(&bad);
    assert!(
        e.contains("load.conf:") && e.contains("LOAD") && e.contains("metadata, headers or full"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        pepsi_contract::stage::check_config::<Act>(&bad).unwrap_err()
    );
    assert!(e.contains("metadata, headers or full"), "{e}");
    let less = Config::from_str_named(
        &format!(
            "[database]\nURL = {}\n[stage-d]\nPROGRAM = test-deliver\nLOAD = headers\n",
            db.url
        ),
        "less.conf",
    )
    .unwrap();
    let e = match Worker::with_stage(Deliver, pool, &less, &reg) {
        Ok(_) => panic!("a worker started loading less than its stage needs"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        e.contains("less.conf:") && e.contains("at least full"),
        "{e}"
    );
}
