//! The mail log under the stage contract, against a real PostgreSQL: the entries a stage
//! attaches to its terminal are written by the pass's own commit — finish, advance, pause,
//! fail, the clone-spawning finish, and a batch's one statement alike — one row per entry,
//! only for a row the commit actually wrote, and none where MAIL_LOG is off.

use std::time::Duration;

use pepsi_conf::config::{Config, StageName};
use pepsi_contract::mail_log::Event;
use pepsi_contract::stage::{CloneSpec, Load, Stage, StageContext, StageError, Terminal, Worker};
use pepsi_testkit::TestDb;
use serde_json::{Map, Value, json};
use sqlx::PgPool;

/// A body-free (so batching) stage: `state.do` is `finish`, `advance`, `pause`, `fail`,
/// `finish_with` or `quiet` (finish without an entry); every outcome but `quiet` carries one
/// `dropped` entry for the first recipient, with `detail.how` = the action.
struct Logger;

impl Stage for Logger {
    const PROGRAM: &'static str = "test-logger";
    const LOAD: Load = Load::Metadata;
    type Section = ();

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Logger)
    }

    fn section(&self, _cfg: &Config, _name: &StageName) -> anyhow::Result<()> {
        Ok(())
    }

    async fn process(&self, _: &(), ctx: &mut StageContext<'_>) -> Result<Terminal, StageError> {
        let action = ctx
            .state()
            .get("do")
            .and_then(Value::as_str)
            .unwrap_or("finish")
            .to_owned();
        let entry = ctx.log_entry(
            Event::Dropped,
            vec![ctx.rcpt_to()[0].clone()],
            json!({"how": action}),
        );
        let t = match action.as_str() {
            "advance" => ctx.advance()?,
            "pause" => ctx.pause(Map::new(), Duration::from_secs(600))?,
            "fail" => ctx.fail(Map::new())?,
            "finish_with" => ctx.finish_with(vec![CloneSpec::new("b").recipients(vec![1])])?,
            "quiet" => return ctx.finish(),
            _ => ctx.finish()?,
        };
        Ok(t.log([entry]))
    }
}

async fn setup(extra: &str) -> (TestDb, Config) {
    let db = TestDb::new().await;
    let text = format!(
        "[database]\nURL = {}\n{extra}\n[stage-a]\nPROGRAM = test-logger\nNEXT_STAGE = b\nQUEUE_LIMIT = 16\n\
         [stage-b]\nPROGRAM = test-logger\n[stage-q]\nPROGRAM = test-logger\nMAIL_LOG = no\n",
        db.url
    );
    (db, Config::from_str_named(&text, "log.conf").unwrap())
}

async fn running(pool: &PgPool, stage: &str, action: &str) -> i64 {
    let id: i64 = sqlx::query_scalar(
        "SELECT pepsi.workqueue_add('alice@example.test', ARRAY['r0@example.test', 'r1@example.test'], \
           convert_to('Subject: t', 'UTF8'), convert_to('body', 'UTF8'), $1, NULL, '192.0.2.1')",
    )
    .bind(json!({ "do": action }))
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

/// (workqueue_id, stage, event, mail_from, rcpt_to, detail.how) of every row.
async fn logged(pool: &PgPool) -> Vec<(i64, String, String, String, Vec<String>, String)> {
    sqlx::query_as(
        "SELECT workqueue_id, stage, event, mail_from, rcpt_to, detail ->> 'how' FROM pepsi.mail_log ORDER BY workqueue_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

const ACTIONS: [&str; 6] = ["finish", "advance", "pause", "fail", "finish_with", "quiet"];

fn expected(ids: &[i64]) -> Vec<(i64, String, String, String, Vec<String>, String)> {
    ids.iter()
        .zip(ACTIONS)
        .filter(|(_, a)| *a != "quiet")
        .map(|(id, a)| {
            (
                *id,
                "a".into(),
                "dropped".into(),
                "alice@example.test".into(),
                vec!["r0@example.test".into()],
                a.into(),
            )
        })
        .collect()
}

#[tokio::test]
async fn every_terminal_writes_its_entries_in_its_own_commit_one_at_a_time() {
    let (db, cfg) = setup("").await;
    let pool = &db.pool;
    let worker = Worker::with_stage(Logger, pool, &cfg, &[]).unwrap();
    let mut ids = Vec::new();
    for action in ACTIONS {
        let id = running(pool, "a", action).await;
        worker.pass(id).await.unwrap();
        ids.push(id);
    }
    assert_eq!(logged(pool).await, expected(&ids));
}

#[tokio::test]
async fn a_batch_writes_the_entries_of_the_rows_it_committed() {
    let (db, cfg) = setup("").await;
    let pool = &db.pool;
    let worker = Worker::with_stage(Logger, pool, &cfg, &[]).unwrap();
    let mut ids = Vec::new();
    for action in ACTIONS {
        ids.push(running(pool, "a", action).await);
    }
    // A row taken back by the dispatcher before the commit: its pass fails, no entry.
    let gone = running(pool, "a", "finish").await;
    let mut batch = ids.clone();
    batch.push(gone);
    sqlx::query("UPDATE pepsi.workqueue SET status = 'pending' WHERE workqueue_id = $1")
        .bind(gone)
        .execute(pool)
        .await
        .unwrap();
    let results = worker.pass_batch(&batch).await;
    assert!(
        results[..ids.len()].iter().all(Result::is_ok),
        "{results:?}"
    );
    assert!(results[ids.len()].is_err());
    assert_eq!(logged(pool).await, expected(&ids));
}

#[tokio::test]
async fn mail_log_off_writes_nothing_globally_or_per_stage() {
    let (db, cfg) = setup("[pepsi]\nMAIL_LOG = no\n").await;
    let pool = &db.pool;
    let worker = Worker::with_stage(Logger, pool, &cfg, &[]).unwrap();
    let id = running(pool, "a", "finish").await;
    worker.pass(id).await.unwrap();
    assert!(logged(pool).await.is_empty());
    let (db, cfg) = setup("").await;
    let pool = &db.pool;
    let worker = Worker::with_stage(Logger, pool, &cfg, &[]).unwrap();
    let quiet = running(pool, "q", "finish").await;
    let loud = running(pool, "a", "finish").await;
    worker.pass(quiet).await.unwrap();
    worker.pass(loud).await.unwrap();
    let rows = logged(pool).await;
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![loud],
        "[stage-q] MAIL_LOG = no"
    );
}
