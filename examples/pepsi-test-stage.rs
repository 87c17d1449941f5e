//! A stage program for the dispatcher's tests and benchmarks: its behaviour comes from its
//! `[stage-*]` section, and every pass leaves a trace in the row's state, committed with
//! the transition, so a test can tell exactly how often each stage saw each message.
//!
//! Options: `ACTION` = advance (default) | finish | crash | hang | error | pause-once;
//! `DELAY` (a pause per message); `ONLY_IF_STATE` (apply ACTION only when state has that key,
//! advance otherwise); `PAUSE_FOR` (pause-once). State written: `passes.<stage>` (count),
//! `pid.<stage>`, `at.<stage>` (microseconds since the epoch when the pass ended).

use std::process::ExitCode;
use std::time::Duration;

use pepsi_common::config::ConfigSource;
use pepsi_common::stage::{Load, Stage, StageContext, StageError};
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

impl Stage for TestStage {
    const PROGRAM: &'static str = "pepsi-test-stage";
    const LOAD: Load = Load::Metadata;

    async fn process(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        let section = ctx.section();
        let stage = ctx.stage().to_owned();
        let mut action = section
            .string_opt("ACTION")?
            .unwrap_or_else(|| "advance".into());
        if let Some(key) = section.string_opt("ONLY_IF_STATE")?
            && !ctx.state().contains_key(&key)
        {
            action = "advance".into();
        }
        if let Some(delay) = section.duration_opt("DELAY")? {
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
        match action.as_str() {
            "advance" => {
                ctx.merge_state(merge);
                ctx.advance()
            }
            "finish" => ctx.finish(),
            "crash" => std::process::abort(),
            "hang" => loop {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            },
            "error" => Err(StageError::Permanent(format!(
                "stage {stage} refuses message {}",
                ctx.id()
            ))),
            "pause-once" => {
                let first = !ctx.state().contains_key("paused_once");
                if first {
                    let after = section
                        .duration_opt("PAUSE_FOR")?
                        .unwrap_or(Duration::from_secs(1));
                    merge.insert("paused_once".into(), json!(now));
                    ctx.pause(merge, after)
                } else {
                    ctx.merge_state(merge);
                    ctx.advance()
                }
            }
            other => Err(StageError::Invalid(format!(
                "[stage-{stage}] ACTION = {other:?}: unknown action"
            ))),
        }
    }
}

fn main() -> ExitCode {
    pepsi_common::stage::main(&SOURCE, "test stage for the dispatcher's tests", TestStage)
}
