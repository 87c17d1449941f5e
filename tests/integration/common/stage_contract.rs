//! The stage contract against a real PostgreSQL: the exact effect of every terminal and
//! fan-out helper on the row(s), body sharing and copy-on-write, clone tokens, the guards,
//! and the worker's refusals. Each test gets a fresh database. Fusion is off here (the
//! stages of this file share one program); `fusion.rs` tests it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pepsi_conf::config::{Config, StageName};
use pepsi_contract::stage::{
    CloneSpec, FanGroup, FanRecipients, GroupStatus, Load, PassReport, Stage, StageContext,
    StageError, Terminal, Worker,
};
use pepsi_testkit::TestDb;
use serde_json::{Map, Value, json};
use sqlx::{PgPool, Row as _};

const PROGRAM: &str = "test-stage";

/// What a scripted pass does, in order.
#[derive(Clone)]
enum Step {
    Advance,
    AdvanceTo(&'static str),
    Reroute(&'static str, Value),
    Pause(Value, u64),
    PauseWith(Value, u64, Option<Vec<usize>>, Vec<CloneSpec>),
    Fail(Value),
    Finish,
    FinishWith(Vec<CloneSpec>),
    AdvanceOrFinish,
    CompleteSuccess(Vec<usize>),
    Rewrite(Vec<&'static str>, Value),
    SplitOff(Vec<usize>, &'static str),
    SplitOne,
    FanOut(Vec<usize>, Vec<FanGroup>),
    SetHeaders(&'static str),
    SetBody(&'static str),
    SetFrom(&'static str),
    Merge(Value),
    ReadHeaders,
    ReadRaw,
    Inject(&'static str, &'static str),
    ReplaceState(Value),
    ResetReceivedAt,
    /// fetch_body(max) and record what came back ("<none>" when over the limit).
    FetchBody(u64),
}

/// A stage that runs a script; `L` is its Load (0 metadata, 1 headers, 2 full). Its pass
/// returns the last terminal the script made. Clones share what they record.
#[derive(Clone)]
struct Script<const L: u8> {
    steps: Vec<Step>,
    seen: Arc<Mutex<Vec<String>>>,
    ids: Arc<Mutex<Vec<i64>>>,
}

fn script<const L: u8>(steps: Vec<Step>) -> Script<L> {
    Script {
        steps,
        seen: Arc::default(),
        ids: Arc::default(),
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

impl<const L: u8> Stage for Script<L> {
    const PROGRAM: &'static str = PROGRAM;
    const LOAD: Load = match L {
        0 => Load::Metadata,
        1 => Load::Headers,
        _ => Load::Full,
    };

    type Section = ();

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        anyhow::bail!("a scripted stage is made by its test")
    }

    fn section(&self, _cfg: &Config, _name: &StageName) -> anyhow::Result<()> {
        Ok(())
    }

    async fn process(
        &self,
        _section: &(),
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let mut terminal = None;
        for step in self.steps.clone() {
            match step {
                Step::Advance => terminal = Some(ctx.advance()?),
                Step::AdvanceTo(s) => terminal = Some(ctx.advance_to(s)?),
                Step::Reroute(s, v) => terminal = Some(ctx.reroute(s, obj(v))?),
                Step::Pause(v, secs) => {
                    terminal = Some(ctx.pause(obj(v), Duration::from_secs(secs))?)
                }
                Step::PauseWith(v, secs, keep, clones) => {
                    terminal =
                        Some(ctx.pause_with(obj(v), Duration::from_secs(secs), keep, clones)?)
                }
                Step::Fail(v) => terminal = Some(ctx.fail(obj(v))?),
                Step::Finish => terminal = Some(ctx.finish()?),
                Step::FinishWith(c) => terminal = Some(ctx.finish_with(c)?),
                Step::AdvanceOrFinish => terminal = Some(ctx.advance_or_finish()?),
                Step::CompleteSuccess(d) => terminal = Some(ctx.complete_success(&d)?),
                Step::Rewrite(r, v) => {
                    terminal = Some(
                        ctx.rewrite_recipients(r.iter().map(|s| s.to_string()).collect(), obj(v))?,
                    )
                }
                Step::SplitOff(idx, stage) => {
                    let id = ctx.split_off_recipients(&idx, stage).await?;
                    self.ids.lock().unwrap().push(id);
                }
                Step::SplitOne => {
                    let ids = ctx.split_to_one_per_row().await?;
                    self.ids.lock().unwrap().extend(ids);
                }
                Step::FanOut(keep, groups) => {
                    let ids = ctx.fan_out(&keep, &groups).await?;
                    self.ids.lock().unwrap().extend(ids);
                }
                Step::SetHeaders(h) => ctx.set_headers(h.as_bytes().to_vec()),
                Step::SetBody(b) => ctx.set_body(b.as_bytes().to_vec()),
                Step::SetFrom(f) => ctx.set_mail_from(f),
                Step::Merge(v) => ctx.merge_state(obj(v)),
                Step::ReadHeaders => {
                    let h = String::from_utf8_lossy(ctx.headers()?).into_owned();
                    self.seen.lock().unwrap().push(h);
                }
                Step::ReadRaw => {
                    let raw = String::from_utf8_lossy(&ctx.raw_message()?).into_owned();
                    self.seen.lock().unwrap().push(raw);
                }
                Step::ReplaceState(v) => ctx.replace_state(obj(v)),
                Step::ResetReceivedAt => ctx.reset_received_at(),
                Step::FetchBody(max) => {
                    let got = ctx
                        .fetch_body(max)
                        .await?
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                        .unwrap_or_else(|| "<none>".into());
                    self.seen.lock().unwrap().push(got);
                }
                Step::Inject(stage, token) => {
                    let id = ctx
                        .enqueue_new(
                            stage,
                            "",
                            &["bob@example.test".to_string()],
                            b"Subject: reply\r\n\r\nhello\r\n",
                            obj(json!({"auto": true})),
                            Some(token),
                        )
                        .await?;
                    self.ids.lock().unwrap().extend(id);
                }
            }
        }
        terminal.ok_or_else(|| StageError::Invalid("the script made no terminal".into()))
    }
}

struct Env {
    db: TestDb,
    cfg: Config,
}

async fn env() -> Env {
    let db = TestDb::new().await;
    let text = format!(
        "[database]\nURL = {url}\n\n[pepsi]\nALLOW_FUSION = no\n\n\
         [stage-init]\nPROGRAM = /usr/libexec/pepsi/{PROGRAM}\nNEXT_STAGE = next\nBOUNCE_STAGE = bounce\nORIGINATE_SUCCESS_DSN = yes\n\n\
         [stage-next]\nPROGRAM = {PROGRAM}\n\n\
         [stage-bounce]\nPROGRAM = {PROGRAM}\n\n\
         [stage-other]\nPROGRAM = pepsi-stage-something-else\n",
        url = db.url
    );
    let cfg = Config::from_str_named(&text, "stage-test.conf").expect("test config");
    Env { db, cfg }
}

impl Env {
    fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    /// Adds a message and makes it running at `stage`, as the dispatcher would.
    async fn running(&self, stage: &str, rcpt: &[&str], state: Value) -> i64 {
        let id = add(self.pool(), rcpt, state).await;
        sqlx::query(
            "UPDATE pepsi.workqueue SET status = 'running', stage = $2 WHERE workqueue_id = $1",
        )
        .bind(id)
        .bind(stage)
        .execute(self.pool())
        .await
        .unwrap();
        id
    }

    async fn pass<const L: u8>(&self, id: i64, s: &Script<L>) -> Result<PassReport, StageError> {
        Worker::with_stage(s.clone(), self.pool(), &self.cfg, &[])
            .expect("the scripted stage builds")
            .pass(id)
            .await
    }

    async fn row(&self, id: i64) -> Option<RowView> {
        row(self.pool(), id).await
    }

    async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

async fn add(pool: &PgPool, rcpt: &[&str], state: Value) -> i64 {
    let rcpt: Vec<String> = rcpt.iter().map(|s| s.to_string()).collect();
    sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5, NULL, '192.0.2.7')")
        .bind("alice@example.test")
        .bind(&rcpt)
        .bind(b"From: alice@example.test\r\nSubject: hi\r\n".as_slice())
        .bind(b"hello\r\n".as_slice())
        .bind(state)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[derive(Debug)]
#[allow(dead_code)]
struct RowView {
    stage: String,
    status: String,
    mail_from: String,
    rcpt_to: Vec<String>,
    state: Value,
    headers: Vec<u8>,
    body: Vec<u8>,
    body_id: i64,
    /// Seconds from now until `timeout`, when set.
    due_in: Option<f64>,
    /// Seconds since `received_at`.
    age: f64,
    /// `received_at` as seconds since the epoch.
    received: f64,
}

async fn row(pool: &PgPool, id: i64) -> Option<RowView> {
    let r = sqlx::query(
        "SELECT stage, status::text, mail_from, rcpt_to, state, headers, b.body, body_id, \
         extract(epoch FROM timeout - now())::float8, extract(epoch FROM now() - received_at)::float8, extract(epoch FROM received_at)::float8 \
         FROM pepsi.workqueue JOIN pepsi.workqueue_body b USING (body_id) WHERE workqueue_id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .unwrap()?;
    Some(RowView {
        stage: r.get(0),
        status: r.get(1),
        mail_from: r.get(2),
        rcpt_to: r.get(3),
        state: r.get(4),
        headers: r.get(5),
        body: r.get(6),
        body_id: r.get(7),
        due_in: r.get(8),
        age: r.get(9),
        received: r.get(10),
    })
}

fn dsn3() -> Value {
    json!({"keep": 1, "dsn": {"ret": "HDRS", "envid": "E1", "rcpt": [
        {"notify": ["FAILURE"], "orcpt": "rfc822;a@example.test"},
        {"notify": ["SUCCESS", "FAILURE"], "orcpt": "rfc822;b@example.test"},
        {"notify": ["NEVER"], "orcpt": "rfc822;c@example.test"}]}})
}

const ABC: [&str; 3] = ["a@example.test", "b@example.test", "c@example.test"];

#[tokio::test]
async fn advance_moves_to_next_stage_pending_and_keeps_state() {
    let e = env().await;
    let id = e.running("init", &ABC, dsn3()).await;
    let report = e.pass(id, &script::<0>(vec![Step::Advance])).await.unwrap();
    assert!(!report.finished);
    let r = e.row(id).await.unwrap();
    assert_eq!((r.stage.as_str(), r.status.as_str()), ("next", "pending"));
    assert_eq!(r.state, dsn3());
    assert_eq!(r.due_in, None);
}

#[tokio::test]
async fn advance_without_next_stage_fails_and_leaves_row_running() {
    let e = env().await;
    let id = e.running("next", &ABC, json!({})).await;
    let err = e
        .pass(id, &script::<0>(vec![Step::Advance]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StageError::NoNextStage(ref s) if s == "next"),
        "{err}"
    );
    let r = e.row(id).await.unwrap();
    assert_eq!((r.stage.as_str(), r.status.as_str()), ("next", "running"));
}

#[tokio::test]
async fn advance_to_and_reroute_merge_state() {
    let e = env().await;
    let a = e.running("init", &ABC, dsn3()).await;
    e.pass(a, &script::<0>(vec![Step::AdvanceTo("other")]))
        .await
        .unwrap();
    assert_eq!(e.row(a).await.unwrap().stage, "other");

    let b = e.running("init", &ABC, dsn3()).await;
    let bounce = json!({"bounce": {"kind": "permanent", "diagnostic": "550 5.1.1 no such user"}});
    e.pass(
        b,
        &script::<0>(vec![Step::Reroute("bounce", bounce.clone())]),
    )
    .await
    .unwrap();
    let r = e.row(b).await.unwrap();
    assert_eq!((r.stage.as_str(), r.status.as_str()), ("bounce", "pending"));
    assert_eq!(r.state["bounce"], bounce["bounce"]);
    assert_eq!(
        r.state["dsn"],
        dsn3()["dsn"],
        "earlier keys survive a merge"
    );
}

#[tokio::test]
async fn pause_sets_paused_timeout_and_merges_state() {
    let e = env().await;
    let id = e.running("init", &ABC, dsn3()).await;
    let s = script::<0>(vec![
        Step::Merge(json!({"seen": true})),
        Step::Pause(json!({"attempts": 1}), 600),
    ]);
    e.pass(id, &s).await.unwrap();
    let r = e.row(id).await.unwrap();
    assert_eq!((r.stage.as_str(), r.status.as_str()), ("init", "paused"));
    let due = r.due_in.expect("timeout set");
    assert!((590.0..=600.5).contains(&due), "due in {due}s");
    assert_eq!(r.state["attempts"], 1);
    assert_eq!(r.state["seen"], true);
    assert_eq!(r.state["keep"], 1);
}

#[tokio::test]
async fn pause_after_content_change_is_refused_and_row_unchanged() {
    let e = env().await;
    let id = e.running("init", &ABC, json!({})).await;
    let s = script::<0>(vec![
        Step::SetHeaders("X: 1\r\n"),
        Step::Pause(json!({}), 60),
    ]);
    let err = e.pass(id, &s).await.unwrap_err();
    assert!(
        matches!(
            err,
            StageError::ContentWouldBeLost {
                helper: "pause",
                ..
            }
        ),
        "{err}"
    );
    let r = e.row(id).await.unwrap();
    assert_eq!(r.status, "running");
    assert_eq!(r.headers, b"From: alice@example.test\r\nSubject: hi\r\n");
}

#[tokio::test]
async fn pause_with_reduces_recipients_and_spawns_clones_once() {
    let e = env().await;
    let id = e.running("init", &ABC, dsn3()).await;
    let clone = CloneSpec::new("bounce")
        .token(format!("{id}:delay"))
        .recipients(vec![1])
        .mail_from("")
        .state(obj(json!({"bounce": {"kind": "delay"}})));
    let s = script::<0>(vec![Step::PauseWith(
        json!({"attempts": 2}),
        60,
        Some(vec![0, 2]),
        vec![clone.clone()],
    )]);
    e.pass(id, &s).await.unwrap();
    let r = e.row(id).await.unwrap();
    assert_eq!(r.status, "paused");
    assert_eq!(r.rcpt_to, vec![ABC[0], ABC[2]]);
    assert_eq!(
        r.state["dsn"]["rcpt"],
        json!([dsn3()["dsn"]["rcpt"][0], dsn3()["dsn"]["rcpt"][2]])
    );
    assert_eq!(r.state["attempts"], 2);

    let clone_id: i64 =
        sqlx::query_scalar("SELECT workqueue_id FROM pepsi.workqueue WHERE stage = 'bounce'")
            .fetch_one(e.pool())
            .await
            .unwrap();
    let c = e.row(clone_id).await.unwrap();
    assert_eq!((c.status.as_str(), c.mail_from.as_str()), ("pending", ""));
    assert_eq!(c.rcpt_to, vec![ABC[1]]);
    assert_eq!(c.state["dsn"]["rcpt"], json!([dsn3()["dsn"]["rcpt"][1]]));
    assert_eq!(c.state["bounce"]["kind"], "delay");
    assert_eq!(c.body_id, r.body_id, "a clone shares the body");
    assert_eq!(c.headers, r.headers);

    // The retry pass spawns the same delay clone again: the token makes it a no-op.
    sqlx::query("UPDATE pepsi.workqueue SET status = 'running' WHERE workqueue_id = $1")
        .bind(id)
        .execute(e.pool())
        .await
        .unwrap();
    let again = script::<0>(vec![Step::PauseWith(json!({}), 60, None, vec![clone])]);
    e.pass(id, &again).await.unwrap();
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'bounce'")
            .await,
        1
    );
}

#[tokio::test]
async fn fail_marks_failed_with_state() {
    let e = env().await;
    let id = e.running("init", &ABC, json!({})).await;
    e.pass(
        id,
        &script::<0>(vec![Step::Fail(json!({"last_error": "no route"}))]),
    )
    .await
    .unwrap();
    let r = e.row(id).await.unwrap();
    assert_eq!((r.stage.as_str(), r.status.as_str()), ("init", "failed"));
    assert_eq!(r.state["last_error"], "no route");
}

#[tokio::test]
async fn finish_deletes_row_and_its_body() {
    let e = env().await;
    let id = e.running("init", &ABC, json!({})).await;
    let report = e.pass(id, &script::<0>(vec![Step::Finish])).await.unwrap();
    assert!(report.finished, "a finishing pass reports it");
    assert!(e.row(id).await.is_none());
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue_body").await,
        0
    );
}

#[tokio::test]
async fn finish_with_spawns_clones_and_a_repeated_token_spawns_nothing() {
    let e = env().await;
    let first = e.running("init", &ABC, dsn3()).await;
    let clone = CloneSpec::new("bounce")
        .token("msg-1:bounce")
        .recipients(vec![2])
        .state(obj(json!({"bounce": {"kind": "permanent"}})));
    let s = script::<0>(vec![
        Step::Merge(json!({"delivered": [0, 1]})),
        Step::FinishWith(vec![clone.clone()]),
    ]);
    e.pass(first, &s).await.unwrap();
    assert!(e.row(first).await.is_none());
    let clones: Vec<i64> = sqlx::query_scalar("SELECT workqueue_id FROM pepsi.workqueue")
        .fetch_all(e.pool())
        .await
        .unwrap();
    assert_eq!(clones.len(), 1);
    let c = e.row(clones[0]).await.unwrap();
    assert_eq!((c.stage.as_str(), c.status.as_str()), ("bounce", "pending"));
    assert_eq!(c.rcpt_to, vec![ABC[2]]);
    assert_eq!(
        c.state["delivered"],
        json!([0, 1]),
        "the pass's state merge reaches the clone"
    );
    assert_eq!(c.state["bounce"]["kind"], "permanent");

    let second = e.running("init", &ABC, dsn3()).await;
    e.pass(second, &script::<0>(vec![Step::FinishWith(vec![clone])]))
        .await
        .unwrap();
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue WHERE stage = 'bounce'")
            .await,
        1
    );
}

#[tokio::test]
async fn finish_with_after_content_change_is_refused() {
    let e = env().await;
    let id = e.running("init", &ABC, json!({})).await;
    let s = script::<0>(vec![
        Step::SetFrom("x@example.test"),
        Step::FinishWith(vec![CloneSpec::new("bounce")]),
    ]);
    let err = e.pass(id, &s).await.unwrap_err();
    assert!(
        matches!(
            err,
            StageError::ContentWouldBeLost {
                helper: "finish_with",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(e.row(id).await.unwrap().status, "running");
    assert_eq!(e.count("SELECT count(*) FROM pepsi.workqueue").await, 1);
}

#[tokio::test]
async fn advance_or_finish_advances_when_there_is_a_next_stage_else_finishes() {
    let e = env().await;
    let a = e.running("init", &ABC, json!({})).await;
    e.pass(a, &script::<0>(vec![Step::AdvanceOrFinish]))
        .await
        .unwrap();
    assert_eq!(e.row(a).await.unwrap().stage, "next");
    let b = e.running("next", &ABC, json!({})).await;
    e.pass(b, &script::<0>(vec![Step::AdvanceOrFinish]))
        .await
        .unwrap();
    assert!(e.row(b).await.is_none());
}

#[tokio::test]
async fn complete_success_reroutes_the_recipients_that_asked_for_success() {
    let e = env().await;
    let id = e.running("init", &ABC, dsn3()).await;
    e.pass(id, &script::<0>(vec![Step::CompleteSuccess(vec![0, 1, 2])]))
        .await
        .unwrap();
    let r = e.row(id).await.unwrap();
    assert_eq!((r.stage.as_str(), r.status.as_str()), ("bounce", "pending"));
    assert_eq!(r.rcpt_to, vec![ABC[1]], "only b asked for NOTIFY=SUCCESS");
    assert_eq!(r.state["dsn"]["rcpt"], json!([dsn3()["dsn"]["rcpt"][1]]));
    assert_eq!(r.state["dsn"]["envid"], "E1");
    assert_eq!(r.state["bounce"]["kind"], "success");

    // Nobody asked: the gate stays shut and the message simply advances.
    let quiet = e.running("init", &ABC, dsn3()).await;
    e.pass(quiet, &script::<0>(vec![Step::CompleteSuccess(vec![0, 2])]))
        .await
        .unwrap();
    let r = e.row(quiet).await.unwrap();
    assert_eq!((r.stage.as_str(), r.rcpt_to.len()), ("next", 3));
}

#[tokio::test]
async fn rewrite_recipients_replaces_rcpt_and_dsn_and_advances() {
    let e = env().await;
    let id = e.running("init", &ABC, dsn3()).await;
    let dsn = json!({"dsn": {"ret": "HDRS", "envid": "E1", "rcpt": [{"notify": ["FAILURE"]}, {"notify": ["FAILURE"]}]}});
    let s = script::<0>(vec![Step::Rewrite(
        vec!["x@example.test", "y@example.test"],
        dsn.clone(),
    )]);
    e.pass(id, &s).await.unwrap();
    let r = e.row(id).await.unwrap();
    assert_eq!((r.stage.as_str(), r.status.as_str()), ("next", "pending"));
    assert_eq!(r.rcpt_to, vec!["x@example.test", "y@example.test"]);
    assert_eq!(r.state["dsn"], dsn["dsn"]);
}

#[tokio::test]
async fn split_off_recipients_moves_a_subset_to_a_sibling_sharing_the_body() {
    let e = env().await;
    let id = e.running("init", &ABC, dsn3()).await;
    let s = script::<0>(vec![Step::SplitOff(vec![1, 2], "other"), Step::Advance]);
    e.pass(id, &s).await.unwrap();
    let sibling = s.ids.lock().unwrap()[0];
    let r = e.row(id).await.unwrap();
    let o = e.row(sibling).await.unwrap();
    assert_eq!(
        (r.stage.as_str(), r.rcpt_to.clone()),
        ("next", vec![ABC[0].to_string()])
    );
    assert_eq!(r.state["dsn"]["rcpt"], json!([dsn3()["dsn"]["rcpt"][0]]));
    assert_eq!((o.stage.as_str(), o.status.as_str()), ("other", "pending"));
    assert_eq!(o.rcpt_to, vec![ABC[1], ABC[2]]);
    assert_eq!(
        o.state["dsn"]["rcpt"],
        json!([dsn3()["dsn"]["rcpt"][1], dsn3()["dsn"]["rcpt"][2]])
    );
    assert_eq!(o.body_id, r.body_id);
    assert_eq!(o.received, r.received, "same received_at");
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue_body").await,
        1
    );
}

#[tokio::test]
async fn a_message_to_n_recipients_split_n_ways_stores_one_body() {
    let e = env().await;
    let rcpt: Vec<String> = (0..5).map(|i| format!("r{i}@example.test")).collect();
    let refs: Vec<&str> = rcpt.iter().map(String::as_str).collect();
    let id = e.running("init", &refs, json!({})).await;
    let s = script::<0>(vec![Step::SplitOne, Step::Advance]);
    e.pass(id, &s).await.unwrap();
    let ids = s.ids.lock().unwrap().clone();
    assert_eq!(ids.len(), 4);
    for (i, sid) in ids.iter().enumerate() {
        let r = e.row(*sid).await.unwrap();
        assert_eq!(
            (r.stage.as_str(), r.status.as_str()),
            ("init", "pending"),
            "siblings stay at this stage"
        );
        assert_eq!(r.rcpt_to, vec![rcpt[i + 1].clone()]);
    }
    assert_eq!(e.row(id).await.unwrap().rcpt_to, vec![rcpt[0].clone()]);
    assert_eq!(e.count("SELECT count(*) FROM pepsi.workqueue").await, 5);
    assert_eq!(
        e.count("SELECT count(DISTINCT body_id) FROM pepsi.workqueue")
            .await,
        1
    );
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue_body").await,
        1
    );
}

#[tokio::test]
async fn fan_out_creates_pending_retry_and_failed_groups() {
    let e = env().await;
    let id = e.running("init", &ABC, dsn3()).await;
    sqlx::query("UPDATE pepsi.workqueue SET received_at = now() - interval '3 days' WHERE workqueue_id = $1")
        .bind(id)
        .execute(e.pool())
        .await
        .unwrap();
    let forward = FanGroup::new(
        FanRecipients::New {
            rcpt_to: vec!["fwd@elsewhere.test".into()],
            dsn_rcpt: Some(vec![json!({"notify": ["NEVER"]})]),
        },
        "next",
    );
    let mut retry = FanGroup::new(FanRecipients::Indices(vec![1]), "init");
    retry.status = GroupStatus::Retry {
        after: Duration::from_secs(300),
    };
    retry.state = obj(json!({"last_error": "451 4.3.0 try later"}));
    let mut failed = FanGroup::new(FanRecipients::Indices(vec![2]), "init");
    failed.status = GroupStatus::Failed;
    let s = script::<0>(vec![
        Step::FanOut(vec![0], vec![forward, retry, failed]),
        Step::Finish,
    ]);
    e.pass(id, &s).await.unwrap();
    let ids = s.ids.lock().unwrap().clone();
    assert!(e.row(id).await.is_none(), "the row itself finished");

    let f = e.row(ids[0]).await.unwrap();
    assert_eq!((f.stage.as_str(), f.status.as_str()), ("next", "pending"));
    assert_eq!(f.rcpt_to, vec!["fwd@elsewhere.test"]);
    assert_eq!(f.state["dsn"]["rcpt"], json!([{"notify": ["NEVER"]}]));
    assert_eq!(f.state["dsn"]["envid"], "E1");
    assert!(
        f.age < 60.0,
        "a pending group is a new delivery: age {}",
        f.age
    );

    let r = e.row(ids[1]).await.unwrap();
    assert_eq!(
        (r.status.as_str(), r.rcpt_to.clone()),
        ("paused", vec![ABC[1].to_string()])
    );
    assert!((290.0..=300.5).contains(&r.due_in.unwrap()));
    assert_eq!(r.state["last_error"], "451 4.3.0 try later");
    assert!(
        r.age > 3.0 * 86400.0 - 60.0,
        "a retry group keeps received_at"
    );

    let x = e.row(ids[2]).await.unwrap();
    assert_eq!(
        (x.status.as_str(), x.rcpt_to.clone()),
        ("failed", vec![ABC[2].to_string()])
    );
    assert!(
        x.age > 3.0 * 86400.0 - 60.0,
        "a failed group keeps received_at"
    );
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue_body").await,
        1
    );
}

#[tokio::test]
async fn fan_out_after_a_recorded_change_is_refused_and_creates_nothing() {
    let e = env().await;
    for first in [Step::SetHeaders("X: 1\r\n"), Step::Merge(json!({"k": 1}))] {
        let id = e.running("init", &ABC, json!({})).await;
        let s = script::<0>(vec![first, Step::SplitOne, Step::Advance]);
        let err = e.pass(id, &s).await.unwrap_err();
        assert!(
            matches!(err, StageError::ContentWouldBeLost { .. }),
            "{err}"
        );
        let r = e.row(id).await.unwrap();
        assert_eq!((r.status.as_str(), r.rcpt_to.len()), ("running", 3));
    }
    assert_eq!(e.count("SELECT count(*) FROM pepsi.workqueue").await, 2);
}

#[tokio::test]
async fn a_body_rewrite_by_one_sibling_is_invisible_to_the_others() {
    let e = env().await;
    let id = e.running("init", &ABC, json!({})).await;
    let s = script::<0>(vec![Step::SplitOff(vec![2], "next"), Step::Advance]);
    e.pass(id, &s).await.unwrap();
    let sibling = s.ids.lock().unwrap()[0];
    sqlx::query("UPDATE pepsi.workqueue SET status = 'running' WHERE workqueue_id = $1")
        .bind(sibling)
        .execute(e.pool())
        .await
        .unwrap();
    let rewrite = script::<2>(vec![
        Step::SetBody("rewritten\r\n"),
        Step::SetHeaders("X-New: 1\r\n"),
        Step::AdvanceTo("other"),
    ]);
    e.pass(sibling, &rewrite).await.unwrap();
    let a = e.row(id).await.unwrap();
    let b = e.row(sibling).await.unwrap();
    assert_eq!(a.body, b"hello\r\n");
    assert_eq!(a.headers, b"From: alice@example.test\r\nSubject: hi\r\n");
    assert_eq!(b.body, b"rewritten\r\n");
    assert_eq!(b.headers, b"X-New: 1\r\n");
    assert_ne!(a.body_id, b.body_id);
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue_body").await,
        2
    );

    // The body row goes with the last row that uses it.
    sqlx::query("DELETE FROM pepsi.workqueue WHERE workqueue_id = $1")
        .bind(sibling)
        .execute(e.pool())
        .await
        .unwrap();
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue_body").await,
        1
    );
    sqlx::query("DELETE FROM pepsi.workqueue WHERE workqueue_id = $1")
        .bind(id)
        .execute(e.pool())
        .await
        .unwrap();
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue_body").await,
        0
    );
}

#[tokio::test]
async fn a_header_rewrite_keeps_the_body_row() {
    let e = env().await;
    let id = e.running("init", &ABC, json!({})).await;
    let before = e.row(id).await.unwrap().body_id;
    e.pass(
        id,
        &script::<1>(vec![Step::SetHeaders("X: y\r\n"), Step::Advance]),
    )
    .await
    .unwrap();
    let r = e.row(id).await.unwrap();
    assert_eq!(
        (r.headers.as_slice(), r.body_id),
        (b"X: y\r\n".as_slice(), before)
    );
}

#[tokio::test]
async fn reading_more_than_the_declared_load_is_an_error() {
    let e = env().await;
    let id = e.running("init", &ABC, json!({})).await;
    let err = e
        .pass(id, &script::<0>(vec![Step::ReadHeaders, Step::Advance]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StageError::UnderDeclared {
                wanted: "headers",
                declared: Load::Metadata
            }
        ),
        "{err}"
    );
    let err = e
        .pass(id, &script::<1>(vec![Step::ReadRaw, Step::Advance]))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StageError::UnderDeclared {
                wanted: "body",
                declared: Load::Headers
            }
        ),
        "{err}"
    );
    assert_eq!(e.row(id).await.unwrap().status, "running");

    let full = script::<2>(vec![Step::ReadHeaders, Step::ReadRaw, Step::Advance]);
    e.pass(id, &full).await.unwrap();
    let seen = full.seen.lock().unwrap().clone();
    assert_eq!(seen[0], "From: alice@example.test\r\nSubject: hi\r\n");
    assert_eq!(
        seen[1], "From: alice@example.test\r\nSubject: hi\r\n\r\nhello\r\n",
        "raw = headers || CRLF || body"
    );
}

#[tokio::test]
async fn replace_state_assigns_the_whole_state_and_reset_received_at_restarts_the_age() {
    let e = env().await;
    let id = e.running("init", &ABC, dsn3()).await;
    sqlx::query("UPDATE pepsi.workqueue SET received_at = now() - interval '3 days' WHERE workqueue_id = $1")
        .bind(id)
        .execute(e.pool())
        .await
        .unwrap();
    let s = script::<0>(vec![
        Step::ReplaceState(json!({})),
        Step::ResetReceivedAt,
        Step::SetFrom(""),
        Step::Rewrite(vec!["alice@example.test"], json!({})),
    ]);
    e.pass(id, &s).await.unwrap();
    let r = e.row(id).await.unwrap();
    assert_eq!((r.stage.as_str(), r.status.as_str()), ("next", "pending"));
    assert_eq!(r.state, json!({}), "an empty replacement clears the state");
    assert_eq!(
        (r.mail_from.as_str(), r.rcpt_to.clone()),
        ("", vec!["alice@example.test".to_string()])
    );
    assert!(r.age < 3600.0, "received_at restarted, age {}s", r.age);

    let id = e.running("init", &ABC, dsn3()).await;
    let s = script::<0>(vec![
        Step::ReplaceState(json!({"fresh": 1})),
        Step::Merge(json!({"more": 2})),
        Step::Advance,
    ]);
    e.pass(id, &s).await.unwrap();
    assert_eq!(
        e.row(id).await.unwrap().state,
        json!({"fresh": 1, "more": 2})
    );
}

#[tokio::test]
async fn a_replaced_state_is_refused_by_the_helpers_that_can_only_merge() {
    let e = env().await;
    let id = e.running("init", &ABC, dsn3()).await;
    for last in [
        Step::Pause(json!({}), 60),
        Step::FinishWith(vec![CloneSpec::new("bounce")]),
        Step::SplitOff(vec![1], "next"),
    ] {
        let err = e
            .pass(id, &script::<0>(vec![Step::ReplaceState(json!({})), last]))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StageError::ContentWouldBeLost { ref changed, .. } if changed.contains("state")),
            "{err}"
        );
    }
    let r = e.row(id).await.unwrap();
    assert_eq!(
        (r.status.as_str(), r.state.clone(), r.rcpt_to.len()),
        ("running", dsn3(), 3)
    );
}

#[tokio::test]
async fn fetch_body_loads_the_body_on_demand_only_within_the_limit() {
    let e = env().await;
    let id = e.running("init", &ABC, json!({})).await;
    let s = script::<1>(vec![
        Step::FetchBody(6),
        Step::FetchBody(7),
        Step::ReadRaw,
        Step::Advance,
    ]);
    e.pass(id, &s).await.unwrap();
    let seen = s.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            "<none>".to_string(),
            "hello\r\n".to_string(),
            "From: alice@example.test\r\nSubject: hi\r\n\r\nhello\r\n".to_string()
        ],
        "a 7-byte body is not sent under a 6-byte limit, is under 7, and then raw_message works"
    );
}

/// A terminal helper only makes a value: one the pass does not return writes nothing, and a
/// pass that fails before returning one leaves the row as it was.
#[tokio::test]
async fn only_the_returned_terminal_counts() {
    let e = env().await;
    let id = e.running("init", &ABC, json!({})).await;
    e.pass(
        id,
        &script::<0>(vec![
            Step::Reroute("bounce", json!({"rerouted": true})),
            Step::Fail(json!({"failed": true})),
            Step::Advance,
        ]),
    )
    .await
    .unwrap();
    let r = e.row(id).await.unwrap();
    assert_eq!(
        (r.stage.as_str(), r.status.as_str(), r.state.clone()),
        ("next", "pending", json!({})),
        "the dropped reroute and fail merged nothing"
    );

    let id = e.running("init", &ABC, json!({})).await;
    let err = e
        .pass(id, &script::<0>(vec![Step::Merge(json!({"k": 1}))]))
        .await
        .unwrap_err();
    assert!(matches!(err, StageError::Invalid(_)), "{err}");
    let r = e.row(id).await.unwrap();
    assert_eq!(
        (r.stage.as_str(), r.status.as_str(), r.state.clone()),
        ("init", "running", json!({}))
    );
}

#[tokio::test]
async fn prepare_refuses_missing_rows_rows_not_running_and_other_programs() {
    let e = env().await;
    let s = script::<0>(vec![Step::Finish]);
    let err = e.pass(999_999, &s).await.unwrap_err();
    assert!(matches!(err, StageError::NoSuchRow(999_999)), "{err}");

    let pending = add(e.pool(), &ABC, json!({})).await;
    let err = e.pass(pending, &s).await.unwrap_err();
    assert!(
        matches!(err, StageError::NotRunning { ref status, .. } if status == "pending"),
        "{err}"
    );

    let other = e.running("other", &ABC, json!({})).await;
    let err = e.pass(other, &s).await.unwrap_err();
    assert!(
        matches!(err, StageError::WrongProgram { ref configured, .. } if configured == "pepsi-stage-something-else"),
        "{err}"
    );

    let nowhere = e.running("no-such-stage", &ABC, json!({})).await;
    let err = e.pass(nowhere, &s).await.unwrap_err();
    assert!(matches!(err, StageError::NoSection { .. }), "{err}");
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue").await,
        3,
        "nothing was finished"
    );
}

#[tokio::test]
async fn enqueue_new_injects_a_split_message_at_most_once_per_token() {
    let e = env().await;
    let a = e.running("init", &ABC, json!({})).await;
    let s = script::<0>(vec![
        Step::Inject("next", "vacation:bob:alice"),
        Step::Advance,
    ]);
    e.pass(a, &s).await.unwrap();
    let injected = s.ids.lock().unwrap().clone();
    assert_eq!(injected.len(), 1);
    let r = e.row(injected[0]).await.unwrap();
    assert_eq!(
        (r.stage.as_str(), r.status.as_str(), r.mail_from.as_str()),
        ("next", "pending", "")
    );
    assert_eq!(r.headers, b"Subject: reply\r\n");
    assert_eq!(r.body, b"hello\r\n");

    let b = e.running("init", &ABC, json!({})).await;
    let again = script::<0>(vec![
        Step::Inject("next", "vacation:bob:alice"),
        Step::Advance,
    ]);
    e.pass(b, &again).await.unwrap();
    assert!(again.ids.lock().unwrap().is_empty(), "the token was used");
}

#[tokio::test]
async fn concurrent_passes_on_different_rows_do_not_interfere() {
    let e = env().await;
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(e.running("init", &ABC, dsn3()).await);
    }
    let advance = script::<2>(vec![Step::SetBody("new body\r\n"), Step::Advance]);
    let pause = script::<0>(vec![
        Step::SplitOne,
        Step::Pause(json!({"attempts": 1}), 60),
    ]);
    let tasks = ids.iter().enumerate().map(|(i, &id)| {
        let e = &e;
        let (advance, pause) = (&advance, &pause);
        async move {
            if i % 2 == 0 {
                e.pass(id, advance).await
            } else {
                e.pass(id, pause).await
            }
        }
    });
    for r in futures_join_all(tasks).await {
        r.unwrap();
    }
    for (i, &id) in ids.iter().enumerate() {
        let r = e.row(id).await.unwrap();
        if i % 2 == 0 {
            assert_eq!(
                (r.stage.as_str(), r.status.as_str(), r.body.as_slice()),
                ("next", "pending", b"new body\r\n".as_slice())
            );
            assert_eq!(r.rcpt_to.len(), 3);
        } else {
            assert_eq!(
                (r.status.as_str(), r.rcpt_to.len(), r.body.as_slice()),
                ("paused", 1, b"hello\r\n".as_slice())
            );
        }
    }
    // 20 rewritten rows own a body each; 20 paused rows share theirs with 2 siblings each.
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue").await,
        40 + 20 * 2
    );
    assert_eq!(
        e.count("SELECT count(*) FROM pepsi.workqueue_body").await,
        40
    );
}

/// Runs futures concurrently on this task (no extra dependency for join_all).
async fn futures_join_all<F: std::future::Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut set = Vec::new();
    for f in futures {
        set.push(Box::pin(f));
    }
    let mut out: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.unwrap()).collect()
}
