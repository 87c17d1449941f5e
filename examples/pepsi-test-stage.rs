//! A stage program for the dispatcher's tests and benchmarks: its behaviour comes from its
//! `[stage-*]` section, and every pass leaves a trace in the row's state, committed with
//! the transition, so a test can tell exactly how often each stage saw each message.
//!
//! Options: `ACTION` = advance (default) | finish | crash | hang | error | pause-once |
//! crash-after-advance (writes the advance to NEXT_STAGE, left running as a worker that hands
//! rows forward commits it, then dies before its status line);
//! `DELAY` (a pause per message); `ONLY_IF_STATE` (apply ACTION only when state has that key,
//! advance otherwise); `PAUSE_FOR` (pause-once). State written: `passes.<stage>` (count),
//! `pid.<stage>`, `at.<stage>` (microseconds since the epoch when the pass ended).
//!
//! It installs itself as a fusion registry, so with `[pepsi] ALLOW_FUSION` on (the default)
//! a chain of its stages runs fused in one pass, as in the unified binary.

use std::process::ExitCode;
use std::time::Duration;

use pepsi_common::config::{Config, ConfigSource};
use pepsi_common::stage::{Load, Stage, StageContext, StageError, Terminal};
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

    fn section(&self, cfg: &Config, name: &str) -> anyhow::Result<Section> {
        let section = cfg.section(&format!("stage-{name}"));
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
                let next = ctx.settings().next_stage.clone().unwrap_or_default();
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

fn main() -> ExitCode {
    // This program is its own multi-call executable: with [pepsi] ALLOW_FUSION on, a pass
    // advancing to another stage of it runs that stage in the same process.
    pepsi_common::stage::fusion::install(
        vec![pepsi_common::stage::fusion::register::<TestStage>()],
    );
    pepsi_common::stage::main::<TestStage>(&SOURCE, "test stage for the dispatcher's tests", "")
}
