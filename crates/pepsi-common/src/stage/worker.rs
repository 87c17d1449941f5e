//! The worker side of the stage contract: `prepare_on` loads one running row, `run_worker`
//! is the stdin/stdout loop, and `main` is a stage program's whole entry point.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row as _};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use super::commit::commit;
use super::context::{Changes, Outcome, Row};
use super::{Load, Stage, StageContext, StageError, StageSettings};
use crate::cli::{CommonArgs, init_logging, run_async};
use crate::config::{Config, ConfigSource, Scope};

// One prepared statement per Load level, so a stage pulls only the big columns it needs.
const SELECT_METADATA: &str = "SELECT workqueue_id, stage, status::text AS status, mail_from, rcpt_to, state, \
     received_at, auth_user FROM pepsi.workqueue WHERE workqueue_id = $1";
const SELECT_HEADERS: &str = "SELECT workqueue_id, stage, status::text AS status, mail_from, rcpt_to, state, \
     received_at, auth_user, headers FROM pepsi.workqueue WHERE workqueue_id = $1";
const SELECT_FULL: &str = "SELECT w.workqueue_id, w.stage, w.status::text AS status, w.mail_from, w.rcpt_to, \
     w.state, w.received_at, w.auth_user, w.headers, b.body \
     FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) WHERE w.workqueue_id = $1";

/// Loads running row `id` for `program`, refusing a row that is not running or whose
/// stage section runs another program.
pub async fn prepare_on<'a>(
    pool: &'a PgPool,
    program: &str,
    id: i64,
    cfg: &'a Config,
    load: Load,
) -> Result<StageContext<'a>, StageError> {
    let sql = match load {
        Load::Metadata => SELECT_METADATA,
        Load::Headers => SELECT_HEADERS,
        Load::Full => SELECT_FULL,
    };
    let rec = sqlx::query(sql)
        .bind(id)
        .fetch_optional(pool)
        .await?
        .ok_or(StageError::NoSuchRow(id))?;
    let status: String = rec.try_get("status")?;
    if status != "running" {
        return Err(StageError::NotRunning { id, status });
    }
    let row = row_from(&rec, load)?;
    let settings = StageSettings::from_config(cfg, &row.stage)?;
    if !settings.runs(program) {
        return Err(StageError::WrongProgram {
            id,
            stage: row.stage,
            configured: settings.program,
            program: program.to_owned(),
        });
    }
    Ok(StageContext {
        pool,
        cfg,
        load,
        settings,
        row,
        changes: Changes::default(),
        outcome: None,
    })
}

fn row_from(rec: &PgRow, load: Load) -> Result<Row, StageError> {
    let state = match rec.try_get::<Value, _>("state")? {
        Value::Object(m) => m,
        other => {
            return Err(StageError::Invalid(format!(
                "state of the row is not a JSON object: {other}"
            )));
        }
    };
    Ok(Row {
        id: rec.try_get("workqueue_id")?,
        stage: rec.try_get("stage")?,
        mail_from: rec.try_get("mail_from")?,
        rcpt_to: rec.try_get("rcpt_to")?,
        state,
        received_at: rec.try_get::<DateTime<Utc>, _>("received_at")?,
        auth_user: rec.try_get("auth_user")?,
        headers: if load >= Load::Headers {
            Some(rec.try_get("headers")?)
        } else {
            None
        },
        body: if load >= Load::Full {
            Some(rec.try_get("body")?)
        } else {
            None
        },
    })
}

/// What a successful pass reports on its status line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassReport {
    /// The pass ended the message (`finish` or `finish_with`): the row is gone.
    pub finished: bool,
}

/// One pass over row `id`: load, process, commit. When any step fails nothing of the pass
/// is written (fan-out helpers the stage already called have committed their siblings).
pub async fn run_pass<S: Stage>(
    stage: &S,
    pool: &PgPool,
    cfg: &Config,
    id: i64,
) -> Result<PassReport, StageError> {
    let mut ctx = prepare_on(pool, S::PROGRAM, id, cfg, S::LOAD).await?;
    stage.process(&mut ctx).await?;
    let outcome = ctx.outcome.take().ok_or(StageError::NoTerminal)?;
    commit(pool, &ctx.row, &ctx.changes, &outcome).await?;
    Ok(PassReport {
        finished: matches!(outcome, Outcome::Finish | Outcome::FinishWith { .. }),
    })
}

/// The status line for one pass: `0`, `0 {"finished":true}` when the pass ended the
/// message, or `1 {"error": ..., "temporary": ...}`.
pub(crate) fn status_line(result: &Result<PassReport, StageError>) -> String {
    match result {
        Ok(PassReport { finished: false }) => "0\n".to_owned(),
        Ok(PassReport { finished: true }) => "0 {\"finished\":true}\n".to_owned(),
        Err(e) => format!(
            "1 {}\n",
            json!({ "error": e.to_string(), "temporary": e.is_temporary() })
        ),
    }
}

/// Reads ids from `input` until EOF, handling each in order and answering each with one
/// status line on `output`. A bad id or a failed pass answers non-zero and the loop goes on.
pub async fn run_worker<S, R, W>(
    stage: &S,
    pool: &PgPool,
    cfg: &Config,
    input: R,
    mut output: W,
) -> anyhow::Result<u64>
where
    S: Stage,
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = input.lines();
    let mut handled = 0u64;
    while let Some(line) = lines.next_line().await? {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let result = match line.parse::<i64>() {
            Ok(id) => run_pass(stage, pool, cfg, id).await,
            Err(_) => Err(StageError::BadId(line.to_owned())),
        };
        if let Err(e) = &result {
            tracing::warn!(program = S::PROGRAM, id = line, "message not handled: {e}");
        }
        output.write_all(status_line(&result).as_bytes()).await?;
        output.flush().await?;
        handled += 1;
    }
    Ok(handled)
}

#[derive(Debug, Parser)]
struct StageCli {
    #[command(flatten)]
    common: CommonArgs,

    #[command(subcommand)]
    command: StageCommand,
}

#[derive(Debug, Subcommand)]
enum StageCommand {
    /// Handle the workqueue ids read from standard input, one per line.
    ///
    /// The dispatcher starts workers and pipelines ids to them; by hand:
    /// `echo <workqueue_id> | PROGRAM worker`. The row must be `running` at a stage whose
    /// section names this program. For each id one status line goes to standard output:
    /// `0` when the message was handled, `1 {"error": "...", "temporary": true|false}`
    /// when it was left untouched. Logs go to standard error. Exits 0 at end of input.
    #[command(long_about)]
    Worker,
}

/// The whole `main` of a stage program: parses `PROGRAM worker [-c FILE] [-L LEVEL]`, loads
/// the configuration (the file plus the database's global overlay), connects and runs the
/// worker loop on stdin/stdout.
pub fn main<S: Stage>(source: &ConfigSource, about: &'static str, stage: S) -> ExitCode {
    run_main(source, about, about, move |_| Ok(stage))
}

/// `main` with a `--help` text of its own (`-h` shows `about`): for a stage with options or
/// behaviour worth a manual page.
pub fn main_with_long_about<S: Stage>(
    source: &ConfigSource,
    about: &'static str,
    long_about: &'static str,
    stage: S,
) -> ExitCode {
    run_main(source, about, long_about, move |_| Ok(stage))
}

/// As `main`, for a stage built from the loaded configuration: `build` runs once at start,
/// before the first id is read, so a stage validates and compiles its sections there (a
/// condition, a route table) and a bad one stops the worker with the error naming it.
pub fn main_with<S, F>(source: &ConfigSource, about: &'static str, build: F) -> ExitCode
where
    S: Stage,
    F: FnOnce(&Config) -> anyhow::Result<S>,
{
    run_main(source, about, about, build)
}

/// `main_with` with a `--help` text of its own (`-h` shows `about`).
pub fn main_with_long_about_built<S, F>(
    source: &ConfigSource,
    about: &'static str,
    long_about: &'static str,
    build: F,
) -> ExitCode
where
    S: Stage,
    F: FnOnce(&Config) -> anyhow::Result<S>,
{
    run_main(source, about, long_about, build)
}

fn run_main<S, F>(
    source: &ConfigSource,
    about: &'static str,
    long_about: &'static str,
    build: F,
) -> ExitCode
where
    S: Stage,
    F: FnOnce(&Config) -> anyhow::Result<S>,
{
    let command = <StageCli as clap::CommandFactory>::command()
        .name(source.exec)
        .about(about)
        .long_about(long_about)
        .version(env!("CARGO_PKG_VERSION"));
    let matches = command.get_matches();
    let cli = match <StageCli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    init_logging(source, &cli.common.log_level);
    run_async(source, async move {
        let StageCommand::Worker = cli.command;
        let file_cfg = cli.common.load_config()?;
        let pool = crate::db::connect(&file_cfg).await?;
        let cfg = file_cfg.with_db_overlay(&pool, &Scope::Global).await?;
        let stage = build(&cfg)?;
        let stdin = tokio::io::BufReader::new(tokio::io::stdin());
        let handled = run_worker(&stage, &pool, &cfg, stdin, tokio::io::stdout()).await?;
        tracing::debug!(program = S::PROGRAM, handled, "end of input");
        Ok(ExitCode::SUCCESS)
    })
}
