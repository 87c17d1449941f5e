//! A stage program for the dispatcher's tests and benchmarks: its behaviour comes from its
//! `[stage-*]` section, and every pass leaves a trace in the row's state, committed with
//! the transition, so a test can tell exactly how often each stage saw each message.
//!
//! Options: `ACTION` = advance (default) | finish | crash | hang | error | pause-once |
//! crash-after-advance (writes the advance to NEXT_STAGE, left running as a worker that hands
//! rows forward commits it, then dies before its status line) | lose-claim-once (the first
//! pass of a message sets its row pending, as PostgreSQL losing the claim's asynchronous
//! commit in a crash does, waits until the dispatcher has claimed it again for another
//! worker, and answers what a worker whose commit then found the row not running answers);
//! `DELAY` (a pause per message); `ONLY_IF_STATE` (apply ACTION only when state has that key,
//! advance otherwise); `PAUSE_FOR` (pause-once). State written: `passes.<stage>` (count),
//! `pid.<stage>`, `at.<stage>` (microseconds since the epoch when the pass ended).
//!
//! Run as `pepsi-test-stage-other` (a link of that name) it is the same stage under that
//! PROGRAM name: a second program for the tests that need two.
//!
//! It installs itself as a fusion registry, so with `[pepsi] ALLOW_FUSION` on (the default)
//! a chain of its stages runs fused in one pass, as in the unified binary.

use std::process::ExitCode;
use std::time::Duration;

use pepsi_conf::config::{Config, ConfigSource, StageName};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use serde_json::{Map, Value, json};

const SOURCE: ConfigSource = ConfigSource {
    project: "pepsi",
    component: "test-stage",
    exec: "pepsi-test-stage",
};

struct TestStage;

fn bump(ctx: &StageContext<'_>, key: &str, stage: &str, value: Value) -> Value {
    let mut map = ctx
        .state()
        .get(key)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let v = match value {
        Value::Null => json!(map.get(stage).and_then(Value::as_i64).unwrap_or(0) + 1),
        other => other,
    };
    map.insert(stage.to_owned(), v);
    Value::Object(map)
}

/// One `[stage-*]` section of the test stage.
struct Section {
    action: String,
    only_if_state: Option<String>,
    delay: Option<Duration>,
    pause_for: Duration,
}

impl Stage for TestStage {
    const PROGRAM: &'static str = "pepsi-test-stage";
    const LOAD: Load = Load::Metadata;
    type Section = Section;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(TestStage)
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Section> {
        let section = cfg.stage_section_named(name);
        let action = section
            .choice_opt(
                "ACTION",
                &[
                    "advance",
                    "finish",
                    "crash",
                    "hang",
                    "error",
                    "pause-once",
                    "crash-after-advance",
                    "lose-claim-once",
                ],
            )?
            .unwrap_or_else(|| "advance".to_owned());
        Ok(Section {
            action,
            only_if_state: section.string_opt("ONLY_IF_STATE")?,
            delay: section.duration_opt("DELAY")?,
            pause_for: section
                .duration_opt("PAUSE_FOR")?
                .unwrap_or(Duration::from_secs(1)),
        })
    }

    async fn process(
        &self,
        section: &Section,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let stage = ctx.stage().to_owned();
        let mut action = section.action.as_str();
        if let Some(key) = &section.only_if_state
            && !ctx.state().contains_key(key)
        {
            action = "advance";
        }
        if let Some(delay) = section.delay {
            tokio::time::sleep(delay).await;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        let mut merge = Map::new();
        merge.insert("passes".into(), bump(ctx, "passes", &stage, Value::Null));
        merge.insert(
            "pid".into(),
            bump(ctx, "pid", &stage, json!(std::process::id())),
        );
        merge.insert("at".into(), bump(ctx, "at", &stage, json!(now)));
        match action {
            "finish" => ctx.finish(),
            "crash" => std::process::abort(),
            "crash-after-advance" => {
                let next = ctx.options().next_stage.clone().unwrap_or_default();
                sqlx::query(
                    "UPDATE pepsi.workqueue SET stage = $2, state = state || $3, updated_at = now() \
                     WHERE workqueue_id = $1 AND status = 'running'",
                )
                .bind(ctx.id())
                .bind(next)
                .bind(Value::Object(merge))
                .execute(ctx.pool())
                .await?;
                std::process::abort()
            }
            "lose-claim-once" if !ctx.state().contains_key("claim_lost") => {
                let id = ctx.id();
                sqlx::query(
                    "UPDATE pepsi.workqueue SET status = 'pending', \
                     state = state || jsonb_build_object('claim_lost', $2::bigint), updated_at = now() \
                     WHERE workqueue_id = $1 AND status = 'running'",
                )
                .bind(id)
                .bind(i64::from(std::process::id()))
                .execute(ctx.pool())
                .await?;
                let until = std::time::Instant::now() + Duration::from_secs(30);
                loop {
                    let status: Option<String> = sqlx::query_scalar(
                        "SELECT status::text FROM pepsi.workqueue WHERE workqueue_id = $1",
                    )
                    .bind(id)
                    .fetch_optional(ctx.pool())
                    .await?;
                    if status.as_deref() != Some("pending") || std::time::Instant::now() > until {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(StageError::NotRunning {
                    id,
                    status: "no longer running (taken back by the dispatcher or deleted)".into(),
                })
            }
            "hang" => loop {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            },
            "error" => Err(StageError::Permanent(format!(
                "stage {stage} refuses message {}",
                ctx.id()
            ))),
            "pause-once" if !ctx.state().contains_key("paused_once") => {
                merge.insert("paused_once".into(), json!(now));
                ctx.pause(merge, section.pause_for)
            }
            _ => {
                ctx.merge_state(merge);
                ctx.advance()
            }
        }
    }
}

/// The test stage under a second PROGRAM name (`pepsi-test-stage-other`).
struct OtherStage(TestStage);

impl Stage for OtherStage {
    const PROGRAM: &'static str = "pepsi-test-stage-other";
    const LOAD: Load = Load::Metadata;
    type Section = Section;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(OtherStage(TestStage::build(cfg)?))
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Section> {
        self.0.section(cfg, name)
    }

    async fn process(
        &self,
        section: &Section,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        self.0.process(section, ctx).await
    }
}

fn main() -> ExitCode {
    // This program is its own multi-call executable: with [pepsi] ALLOW_FUSION on, a pass
    // advancing to another stage of it runs that stage in the same process.
    pepsi_contract::stage::fusion::install(vec![
        pepsi_contract::stage::fusion::register::<TestStage>(),
        pepsi_contract::stage::fusion::register::<OtherStage>(),
    ]);
    let called = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&called)
        .file_name()
        .is_some_and(|n| n == OtherStage::PROGRAM)
    {
        const OTHER: ConfigSource = ConfigSource {
            project: "pepsi",
            component: "test-stage-other",
            exec: "pepsi-test-stage-other",
        };
        return pepsi_contract::stage::main::<OtherStage>(
            &OTHER,
            "test stage for the dispatcher's tests (second program)",
            "",
        );
    }
    pepsi_contract::stage::main::<TestStage>(&SOURCE, "test stage for the dispatcher's tests", "")
}
