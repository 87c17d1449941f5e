//! pepsi-failure-bouncer: no message is left stranded in `failed` or `timeout`.
//!
//! Reads: `[pepsi-failure-bouncer]`, the stage graph (file and global overlay) for each
//! stage's BOUNCE_STAGE, and the failed and timed-out rows of `pepsi.workqueue` through
//! `pepsi_admin::queue::failure_candidates`. Writes: one step per row and pass through the
//! stored functions of procedures.sql (THE FAILURE BOUNCER), each with its `event_log` row in
//! the same transaction, then one `workqueue` notification. The decision is `decide`, pure.
//! It never touches a row that is not failed or timed out at the stage it saw, and never
//! sends a notification to the null sender.

pub mod decide;

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use pepsi_admin::queue::{self, FailedRow, FailureStep, Outcome};
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::{Config, Scope};
use pepsi_contract::audit::Actor;
use pepsi_contract::overlay::DbOverlay;
use pepsi_contract::state::{DispatchError, FailedStatus, FailureRecord};
use serde_json::{Value, json};
use sqlx::PgPool;

use decide::{Decision, Failed};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "failure-bouncer",
        exec: "pepsi-failure-bouncer",
    };
}

const SECTION: &str = "pepsi-failure-bouncer";

const LONG_ABOUT: &str = "\
Looks for queue rows that ended failed (a stage reported an error, or its worker crashed) \
or timeout (the worker did not answer within MAX_RUNTIME), and acts on each once it has \
been so for GRACE:

  * it retries the row (pending again at its stage), up to ATTEMPTS times;
  * then returns it to its sender: the row goes to the BOUNCE_STAGE of its stage (else \
[pepsi-failure-bouncer] BOUNCE_STAGE) with a permanent state.bounce, exactly as \
`pepsi-queue bounce` does, and the bounce stage writes the delivery status notification;
  * a row with the null sender is deleted instead (a notification is never sent to <>);
  * a row it cannot return (it failed at the bounce stage itself, or was returned once \
already, or its stage has no bounce stage) is left failed for an operator and marked given \
up, so it is not considered again.

The count is kept in the row's state (state.failure_bouncer), so a restart forgets \
nothing, and a poison message (its worker crashes or hangs on every attempt) is returned \
after ATTEMPTS retries instead of being retried forever. Every step is written to \
pepsi.event_log (failure.retry, failure.bounce, failure.drop, failure.give_up) in the same \
transaction. docs/failure-bouncer.md describes all of it.";

const AFTER_HELP: &str = "\
CONFIGURATION ([pepsi-failure-bouncer]):
  ATTEMPTS      retries before a row is returned (default 3; 0 returns at once)
  GRACE         how long a row stays failed or timed out before each step (default 5m)
  INTERVAL      time between passes without --once (default 1m)
  BOUNCE_STAGE  where rows of a stage without BOUNCE_STAGE are returned through
                (default: bounce, when a [stage-bounce] section exists)
  BATCH         most rows acted on in one pass (default 500)

OUTPUT:
  --once prints what the pass did (one line, or an object with --json); the loop logs.

EXIT STATUS:
  0  the pass (or the loop, until SIGTERM) ran
  1  a configuration or database error

EXAMPLES:
  pepsi-failure-bouncer --once
  pepsi-failure-bouncer --once --json | jq .bounced

SEE ALSO:
  docs/failure-bouncer.md, pepsi-queue(1), pepsi-dispatch(1)";

/// Retries failed and timed-out queue rows, then returns them to their senders.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-failure-bouncer",
    version,
    about = "Retries failed and timed-out queue rows a bounded number of times, then returns them to their senders",
    long_about = LONG_ABOUT,
    after_long_help = AFTER_HELP
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    /// Make one pass and exit (without it: a pass every INTERVAL until SIGTERM)
    #[arg(long)]
    once: bool,

    /// With --once: print the pass's summary as JSON
    #[arg(long, requires = "once")]
    json: bool,
}

/// `[pepsi-failure-bouncer]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub attempts: u32,
    pub grace: Duration,
    pub interval: Duration,
    /// Where a stage without BOUNCE_STAGE returns mail; None when there is nowhere.
    pub bounce_stage: Option<String>,
    pub batch: i64,
}

impl Options {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Options> {
        let s = cfg.section(SECTION);
        let bounce_stage = match s.string_opt("BOUNCE_STAGE")? {
            Some(stage) => {
                if cfg.stage(&stage).is_none() {
                    anyhow::bail!(
                        "[{SECTION}] BOUNCE_STAGE = {stage}, but there is no [stage-{stage}] section"
                    );
                }
                Some(stage)
            }
            None => cfg.has_section("stage-bounce").then(|| "bounce".to_owned()),
        };
        let settings = Options {
            attempts: s.number_opt("ATTEMPTS")?.unwrap_or(3),
            grace: s.duration_opt("GRACE")?.unwrap_or(Duration::from_secs(300)),
            interval: s
                .duration_opt("INTERVAL")?
                .unwrap_or(Duration::from_secs(60)),
            bounce_stage,
            batch: s.number_opt("BATCH")?.unwrap_or(500),
        };
        if settings.attempts > 100 {
            anyhow::bail!("[{SECTION}] ATTEMPTS = {}: at most 100", settings.attempts);
        }
        if settings.interval.is_zero() || settings.batch < 1 {
            anyhow::bail!("[{SECTION}] INTERVAL and BATCH must be more than 0");
        }
        Ok(settings)
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Pass {
    pub retried: usize,
    pub bounced: usize,
    pub dropped: usize,
    pub given_up: usize,
    /// Rows someone else changed between the look and the step.
    pub skipped: usize,
    pub errors: usize,
}

/// The command line of `pepsi-failure-bouncer` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-failure-bouncer` binary.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        let settings = Options::from_config(&cfg)?;
        let pool = pepsi_contract::db::connect(&cfg).await?;
        let actor = Actor::local(constants::CONFIG_SOURCE.exec);
        if cli.once {
            let pass = pass(&pool, &cfg, &settings, &actor).await?;
            let mut out = std::io::stdout().lock();
            if cli.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&pass)?)?;
            } else {
                writeln!(
                    out,
                    "retried {}, bounced {}, dropped {}, given up {}, skipped {}, errors {}",
                    pass.retried,
                    pass.bounced,
                    pass.dropped,
                    pass.given_up,
                    pass.skipped,
                    pass.errors
                )?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        tracing::info!(attempts = settings.attempts, grace = ?settings.grace, interval = ?settings.interval, "started");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            match pass(&pool, &cfg, &settings, &actor).await {
                Ok(p) if p != Pass::default() => tracing::info!(?p, "pass done"),
                Ok(_) => {}
                Err(e) => tracing::warn!("pass failed: {e:#}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(settings.interval) => {}
                _ = term.recv() => return Ok(ExitCode::SUCCESS),
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            }
        }
    })
}

/// One pass: every candidate row, one step each.
pub async fn pass(
    pool: &PgPool,
    file_cfg: &Config,
    options: &Options,
    actor: &Actor,
) -> anyhow::Result<Pass> {
    let rows = queue::failure_candidates(pool, options.grace, options.batch)
        .await
        .context("cannot read the failed rows")?;
    let mut pass = Pass::default();
    if rows.is_empty() {
        return Ok(pass);
    }
    // The stage graph as the workers see it, read again each pass so a change applies.
    let cfg = file_cfg
        .with_db_overlay(pool, &Scope::Global)
        .await
        .context("cannot read the configuration overlay")?;
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut woke = false;
    for row in &rows {
        let (step, detail) = plan(row, &cfg, options, &now);
        match queue::apply_failure_step(pool, actor, row, &step, detail.clone()).await {
            Ok(Outcome::Changed(_)) => {
                let what = step.name();
                match step {
                    FailureStep::Retry { .. } => {
                        pass.retried += 1;
                        woke = true;
                        tracing::info!(id = row.id, stage = %row.stage, ?detail, "{what}");
                    }
                    FailureStep::Bounce { .. } => {
                        pass.bounced += 1;
                        woke = true;
                        tracing::warn!(id = row.id, stage = %row.stage, ?detail, "{what}: returned to {}", row.mail_from);
                    }
                    FailureStep::Drop => {
                        pass.dropped += 1;
                        tracing::warn!(id = row.id, stage = %row.stage, ?detail, "{what}: the null sender, deleted");
                    }
                    FailureStep::GiveUp { .. } => {
                        pass.given_up += 1;
                        tracing::error!(id = row.id, stage = %row.stage, ?detail, "{what}: left for an operator");
                    }
                }
            }
            Ok(Outcome::Unchanged(note)) => {
                pass.skipped += 1;
                tracing::debug!(id = row.id, "{note}");
            }
            Err(e) => {
                pass.errors += 1;
                tracing::error!(id = row.id, "cannot act on the failed row: {e}");
            }
        }
    }
    if woke && let Err(e) = queue::notify(pool).await {
        tracing::warn!("cannot wake the dispatcher: {e}");
    }
    Ok(pass)
}

/// The step for one row and the event_log detail that explains it.
fn plan(row: &FailedRow, cfg: &Config, options: &Options, now: &str) -> (FailureStep, Value) {
    let state = row.state.as_object().cloned().unwrap_or_default();
    let record = FailureRecord::from_state(&state).unwrap_or_else(|e| {
        tracing::warn!(
            id = row.id,
            "a malformed failure_bouncer record is started afresh: {e}"
        );
        None
    });
    // Any other shape is no error text (SQL writes a string).
    let dispatch_error = DispatchError::from_state(&state).ok().flatten();
    let dispatch_error = dispatch_error.as_ref().map(|e| e.0.as_str());
    let status = FailedStatus::of_row(&row.status);
    let failed = Failed {
        stage: &row.stage,
        status,
        mail_from: &row.mail_from,
        dispatch_error,
        record,
    };
    let target = queue::bounce_stage_of(cfg, &row.stage).or_else(|why| {
        options
            .bounce_stage
            .clone()
            .ok_or_else(|| format!("{why}, and [{SECTION}] BOUNCE_STAGE names none"))
    });
    let decision = decide::decide(&failed, options.attempts, target, now);
    let record = decision.record();
    let mut detail = json!({
        "attempt": record.retries + 1,
        "attempts": options.attempts,
        "kind": decide::classify(status, dispatch_error).as_str(),
        "poison": decide::is_poison(record),
        "dispatch_error": dispatch_error,
        "mail_from": row.mail_from,
    });
    let record_value = record.to_value();
    let step = match decision {
        Decision::Retry { .. } => {
            detail["attempt"] = json!(record.retries);
            FailureStep::Retry {
                record: record_value,
            }
        }
        Decision::Bounce {
            bounce_stage,
            reason,
            ..
        } => {
            detail["reason"] = json!(reason);
            FailureStep::Bounce {
                bounce_stage,
                reason,
                record: record_value,
            }
        }
        Decision::Drop { .. } => FailureStep::Drop,
        Decision::GiveUp { ref record } => {
            detail["reason"] = json!(record.given_up);
            FailureStep::GiveUp {
                record: record_value,
            }
        }
    };
    (step, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_and_their_refusals() {
        let cfg = |t: &str| Config::from_str_named(t, "test.conf").unwrap();
        let s = Options::from_config(&cfg("[stage-bounce]\nPROGRAM = x\n")).unwrap();
        assert_eq!(
            s,
            Options {
                attempts: 3,
                grace: Duration::from_secs(300),
                interval: Duration::from_secs(60),
                bounce_stage: Some("bounce".into()),
                batch: 500,
            }
        );
        assert_eq!(Options::from_config(&cfg("")).unwrap().bounce_stage, None);
        let err = Options::from_config(&cfg("[pepsi-failure-bouncer]\nBOUNCE_STAGE = dsn\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no [stage-dsn] section"), "{err}");
        let err = Options::from_config(&cfg("[pepsi-failure-bouncer]\nATTEMPTS = many\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("ATTEMPTS"), "{err}");
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}
