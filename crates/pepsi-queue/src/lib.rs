//! pepsi-queue: the operator's command-line view of `pepsi.workqueue` and its repairs.
//!
//! `list` and `show` read; `retry`, `hold`, `release`, `delete` and `bounce` act, one row
//! per transaction, each with its `pepsi.event_log` row, and wake the dispatcher once the
//! command's actions have committed. All SQL goes through `pepsi_admin::queue` (this crate
//! issues none); presentation lives in `render`. A running row is never changed unless the
//! operator forces it.

mod render;

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use pepsi_admin::queue::{self, Action, AdminError, Filter, Outcome};
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::{Config, Scope};
use pepsi_contract::audit::Actor;
use pepsi_contract::overlay::DbOverlay;
use serde_json::{Value, json};
use sqlx::PgPool;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "queue",
        exec: "pepsi-queue",
    };
}

/// Exit status of a command that was used wrongly (clap uses the same for its own errors).
const EXIT_USAGE: u8 = 2;

const LONG_ABOUT: &str = "\
Inspect and repair the Pepsi mail queue (pepsi.workqueue).

`list` and `show` only read. `retry`, `hold`, `release`, `delete` and `bounce` change rows:
each row in a transaction of its own that also writes one pepsi.event_log row (action
queue.<command>, the row id, what changed, the database role as actor and the operating-
system user in the detail); once the command's changes have committed, the dispatcher is
woken on the `workqueue` channel.

A row that is running belongs to a stage worker: every action refuses it, naming the row,
unless --force is given. Force only a row whose worker is gone (the dispatcher was killed
and has not restarted, for instance); a live worker would otherwise commit its own outcome
behind the operator's back.

pepsi-queue connects with [database] URL of the configuration as the role named there.
That role needs SELECT on pepsi.workqueue and pepsi.workqueue_body, EXECUTE on the
actions' functions (pepsi.workqueue_retry ...; the pipeline role `pepsi` has them; the
ingress and config roles do not) and INSERT on pepsi.event_log (every role has it).
`bounce` reads [stage-NAME] BOUNCE_STAGE from the configuration file and the global database overlay.

Exit status: 0 when everything asked was done (or there was nothing to do), 1 on an error
or when any row was refused (bad id, running row, not applicable), 2 on a usage error.
See docs/queue.md for the JSON shapes and the hold representation.";

const EXAMPLES: &str = "\
Examples:
  pepsi-queue list                          summary, then the 100 oldest rows
  pepsi-queue list --status failed --json   failed rows for a script
  pepsi-queue list --stage relay --older-than 2h --recipient @example.org
  pepsi-queue show 4711 --body              one message with its state and body
  pepsi-queue retry 4711 4712               retry two rows now
  pepsi-queue retry --all-failed            every failed and timed-out row
  pepsi-queue retry --stage relay           every paused/failed row at stage relay
  pepsi-queue hold 4711 --reason 'abuse report'
  pepsi-queue release 4711
  pepsi-queue delete 4711 --yes
  pepsi-queue bounce 4711 --reason 'mailbox retired'";

/// Inspect and repair the Pepsi mail queue.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-queue",
    version,
    about,
    long_about = LONG_ABOUT,
    after_long_help = EXAMPLES
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the queue: counts per stage and status, then the rows, oldest first.
    ///
    /// The summary counts every row matching the filters; the row table shows at most
    /// --limit of them with ID, STAGE, STATUS (held rows show `held`), AGE (since the
    /// message was received), ATTEMPTS (state.attempts), NEXT RETRY (when a paused row is
    /// due; `due` when its time has passed), SENDER, RECIPIENTS (the first, and how many
    /// more) and LAST ERROR (state.dispatch_error, else state.last_error). Filters combine:
    /// a row must match all of them.
    #[command(long_about)]
    List(ListArgs),
    /// Show one message: envelope, status, times, state (pretty JSON) and header block.
    #[command(long_about)]
    Show(ShowArgs),
    /// Make rows pending now at the stage they are at.
    ///
    /// A paused row becomes due now; a failed or timed-out row becomes pending and its
    /// state.dispatch_error moves to state.dispatch_error_history. A pending row is left as
    /// it is (not an error). A held row is refused: release it instead. With --all-failed,
    /// every failed and timed-out row; with --stage, every paused (not held), failed and
    /// timed-out row at that stage; both together, the failed and timed-out rows at that
    /// stage.
    #[command(long_about)]
    Retry(RetryArgs),
    /// Keep rows from being claimed until they are released.
    ///
    /// A held row is status paused with a timeout at 9999-12-31 (the dispatcher never
    /// finds it due) and state.held = {at, by, reason, status, timeout}; `list` shows it as
    /// held. Holding a held row does nothing.
    #[command(long_about)]
    Hold(HoldArgs),
    /// Make held rows pending now at their stage (state.held is removed).
    #[command(long_about)]
    Release(ReleaseArgs),
    /// Remove rows from the queue; a body goes with the last row that uses it.
    ///
    /// Asks for confirmation when standard input is a terminal; otherwise --yes is
    /// required (exit status 2 without it).
    #[command(long_about)]
    Delete(DeleteArgs),
    /// Fail rows back to their sender with a delivery status notification.
    ///
    /// Each row goes pending to the BOUNCE_STAGE of the stage it is at ([stage-NAME]
    /// BOUNCE_STAGE; a row whose stage has none is refused) with state.bounce =
    /// {kind: permanent, diagnostic: REASON, enhanced_status: 5.0.0, stage: NAME}; the
    /// bounce stage writes the DSN. A row with the null sender is refused (a bounce is
    /// never bounced): delete it instead.
    #[command(long_about)]
    Bounce(BounceArgs),
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only rows at this stage
    #[arg(long, value_name = "STAGE")]
    stage: Option<String>,
    /// Only rows with this status: pending, running, paused, held, failed or timeout
    /// (paused excludes held rows)
    #[arg(long, value_name = "STATUS", value_parser = clap::builder::PossibleValuesParser::new(queue::STATUSES))]
    status: Option<String>,
    /// Only rows whose envelope sender contains TEXT (any letter case)
    #[arg(long, value_name = "TEXT")]
    sender: Option<String>,
    /// Only rows with a recipient containing TEXT (any letter case; `@example.org` for a domain)
    #[arg(long, value_name = "TEXT")]
    recipient: Option<String>,
    /// Only rows with a recipient at this domain (exactly, any letter case)
    #[arg(long, value_name = "DOMAIN")]
    domain: Option<String>,
    /// Only rows received at least this long ago (90, 30s, 15m, 2h, 1d, 1h30m)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    older_than: Option<std::time::Duration>,
    /// Show at most N rows (0: all); the summary always counts every matching row
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: u32,
    /// Print one JSON document (see docs/queue.md) instead of tables
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// The row (workqueue_id)
    id: i64,
    /// Print the body too, after the header block (raw bytes; in JSON, as text)
    #[arg(long)]
    body: bool,
    /// Print one JSON object instead
    #[arg(long)]
    json: bool,
}

/// Options every action takes.
#[derive(Debug, Args)]
struct ActionOpts {
    /// Act on running rows too. Only for rows whose worker is gone: a live worker would
    /// commit its outcome over the operator's change
    #[arg(long)]
    force: bool,
    /// Print one JSON document with each row's outcome instead of lines
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RetryArgs {
    /// The rows (workqueue_id)
    #[arg(value_name = "ID", required_unless_present_any = ["all_failed", "stage"], conflicts_with_all = ["all_failed", "stage"])]
    ids: Vec<i64>,
    /// Every failed and timed-out row
    #[arg(long)]
    all_failed: bool,
    /// Every paused (not held), failed and timed-out row at this stage
    #[arg(long, value_name = "STAGE")]
    stage: Option<String>,
    #[command(flatten)]
    opts: ActionOpts,
}

#[derive(Debug, Args)]
struct HoldArgs {
    /// The rows (workqueue_id)
    #[arg(value_name = "ID", required = true)]
    ids: Vec<i64>,
    /// Why, recorded in state.held.reason and the event log
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    #[command(flatten)]
    opts: ActionOpts,
}

#[derive(Debug, Args)]
struct ReleaseArgs {
    /// The rows (workqueue_id)
    #[arg(value_name = "ID", required = true)]
    ids: Vec<i64>,
    /// Print one JSON document with each row's outcome instead of lines
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct DeleteArgs {
    /// The rows (workqueue_id)
    #[arg(value_name = "ID", required = true)]
    ids: Vec<i64>,
    /// Do not ask for confirmation
    #[arg(short = 'y', long)]
    yes: bool,
    #[command(flatten)]
    opts: ActionOpts,
}

#[derive(Debug, Args)]
struct BounceArgs {
    /// The rows (workqueue_id)
    #[arg(value_name = "ID", required = true)]
    ids: Vec<i64>,
    /// The diagnostic the DSN gives the sender
    #[arg(
        long,
        value_name = "TEXT",
        default_value = "the message was returned by the mail system administrator"
    )]
    reason: String,
    #[command(flatten)]
    opts: ActionOpts,
}

fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    pepsi_conf::config::parse_duration(text)
}

/// The command line of `pepsi-queue` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-queue` binary.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        let pool = pepsi_contract::db::connect(&cfg).await?;
        match cli.command {
            Command::List(a) => list(&pool, a).await,
            Command::Show(a) => show(&pool, a).await,
            Command::Retry(a) => retry(&pool, a).await,
            Command::Hold(a) => {
                let action = Action::Hold { reason: a.reason };
                let plan = a.ids.iter().map(|id| (*id, Ok(action.clone()))).collect();
                act(&pool, plan, &a.opts, Bulk::No).await
            }
            Command::Release(a) => {
                let plan = a.ids.iter().map(|id| (*id, Ok(Action::Release))).collect();
                let opts = ActionOpts {
                    force: false,
                    json: a.json,
                };
                act(&pool, plan, &opts, Bulk::No).await
            }
            Command::Delete(a) => delete(&pool, a).await,
            Command::Bounce(a) => bounce(&pool, &cfg, a).await,
        }
    })
}

async fn list(pool: &PgPool, a: ListArgs) -> anyhow::Result<ExitCode> {
    let filter = Filter {
        stage: a.stage,
        status: a.status,
        sender: a.sender,
        recipient: a.recipient,
        domain: a.domain,
        older_than: a.older_than,
    };
    let limit = (a.limit > 0).then_some(i64::from(a.limit));
    let counts = queue::summary(pool, &filter)
        .await
        .map_err(explain_db)
        .context("cannot count the queue")?;
    let rows = queue::list(pool, &filter, limit.unwrap_or(i64::MAX))
        .await
        .map_err(explain_db)
        .context("cannot read the queue")?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&render::list_json(&counts, &rows, limit))?
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let total: i64 = counts.iter().map(|c| c.2).sum();
    if total == 0 {
        writeln!(out, "no rows match")?;
        return Ok(ExitCode::SUCCESS);
    }
    write!(out, "{}", render::summary_table(&counts))?;
    writeln!(out)?;
    write!(out, "{}", render::rows_table(&rows, chrono::Utc::now()))?;
    if (rows.len() as i64) < total {
        writeln!(
            out,
            "({} of {total} rows shown; --limit 0 shows all)",
            rows.len()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn show(pool: &PgPool, a: ShowArgs) -> anyhow::Result<ExitCode> {
    let Some(m) = queue::show(pool, a.id, a.body)
        .await
        .map_err(explain_db)
        .with_context(|| format!("cannot read row {}", a.id))?
    else {
        eprintln!("pepsi-queue: there is no queue row {}", a.id);
        return Ok(ExitCode::from(1));
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&render::show_json(&m))?
        )?;
    } else {
        write!(out, "{}", render::show_text(&m, chrono::Utc::now()))?;
        if let Some(body) = &m.body {
            writeln!(out, "body:")?;
            out.write_all(body)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn retry(pool: &PgPool, a: RetryArgs) -> anyhow::Result<ExitCode> {
    if a.ids.is_empty() {
        let ids = queue::retry_candidates(pool, a.stage.as_deref(), a.all_failed)
            .await
            .map_err(explain_db)
            .context("cannot select the rows to retry")?;
        let plan = ids.into_iter().map(|id| (id, Ok(Action::Retry))).collect();
        return act(pool, plan, &a.opts, Bulk::Yes).await;
    }
    let plan = a.ids.iter().map(|id| (*id, Ok(Action::Retry))).collect();
    act(pool, plan, &a.opts, Bulk::No).await
}

async fn delete(pool: &PgPool, a: DeleteArgs) -> anyhow::Result<ExitCode> {
    if !a.yes {
        if !std::io::stdin().is_terminal() {
            eprintln!(
                "pepsi-queue: delete needs --yes when standard input is not a terminal (rows {})",
                join_ids(&a.ids)
            );
            return Ok(ExitCode::from(EXIT_USAGE));
        }
        eprint!(
            "delete {} row{} ({})? [y/N] ",
            a.ids.len(),
            if a.ids.len() == 1 { "" } else { "s" },
            join_ids(&a.ids)
        );
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            eprintln!("pepsi-queue: nothing deleted");
            return Ok(ExitCode::from(1));
        }
    }
    let plan = a.ids.iter().map(|id| (*id, Ok(Action::Delete))).collect();
    act(pool, plan, &a.opts, Bulk::No).await
}

async fn bounce(pool: &PgPool, file_cfg: &Config, a: BounceArgs) -> anyhow::Result<ExitCode> {
    // The stage graph as the workers see it: the file and the global overlay.
    let cfg = file_cfg
        .with_db_overlay(pool, &Scope::Global)
        .await
        .context("cannot read the configuration overlay")?;
    let mut plan = Vec::new();
    for &id in &a.ids {
        let step = match queue::stage_of(pool, id)
            .await
            .map_err(explain_db)
            .with_context(|| format!("cannot read row {id}"))?
        {
            None => Err(AdminError::NotFound(id)),
            Some((stage, _)) => {
                queue::bounce_target(&cfg, id, &stage).map(|bounce_stage| Action::Bounce {
                    stage,
                    bounce_stage,
                    reason: a.reason.clone(),
                })
            }
        };
        plan.push((id, step));
    }
    act(pool, plan, &a.opts, Bulk::No).await
}

/// Whether a refusal is expected in the selection (a bulk retry races the pipeline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bulk {
    Yes,
    No,
}

/// Applies each planned action, reports each row, wakes the dispatcher when anything
/// changed; exit 1 when any row was refused or failed.
async fn act(
    pool: &PgPool,
    plan: Vec<(i64, Result<Action, AdminError>)>,
    opts: &ActionOpts,
    bulk: Bulk,
) -> anyhow::Result<ExitCode> {
    let actor = Actor::local(constants::CONFIG_SOURCE.exec);
    let total = plan.len();
    let progress = bulk == Bulk::Yes && total >= 200 && std::io::stderr().is_terminal();
    let mut results = Vec::new();
    let (mut changed, mut failed) = (0usize, 0usize);
    let mut name = None;
    for (n, (id, step)) in plan.into_iter().enumerate() {
        if progress && n % 100 == 0 {
            eprint!("\r{n}/{total}");
        }
        let outcome = match step {
            Ok(action) => {
                name = Some(action.name());
                queue::apply(pool, &actor, id, &action, opts.force)
                    .await
                    .map(|o| (action.name(), o))
            }
            Err(e) => Err(e),
        };
        let entry = match outcome {
            Ok((action, Outcome::Changed(report))) => {
                changed += 1;
                if !opts.json {
                    println!("{}", render::changed_line(action, id, &report));
                }
                let mut detail = report;
                if let Value::Object(m) = &mut detail {
                    m.remove("changed");
                }
                json!({"id": id, "outcome": "changed", "detail": detail})
            }
            Ok((_, Outcome::Unchanged(note))) => {
                if !opts.json {
                    println!("{id}: {note}");
                }
                json!({"id": id, "outcome": "unchanged", "note": note})
            }
            // A bulk selection races the pipeline: a row that went running or away since
            // it was selected is skipped, not an error.
            Err(AdminError::Running { .. } | AdminError::NotFound(_)) if bulk == Bulk::Yes => {
                let message = format!("row {id} skipped: changed since it was selected");
                if !opts.json {
                    println!("{id}: {message}");
                }
                json!({"id": id, "outcome": "skipped", "note": message})
            }
            Err(e) => {
                failed += 1;
                let (kind, text) = describe_error(&e);
                eprintln!("pepsi-queue: {text}");
                json!({"id": id, "outcome": kind, "error": text})
            }
        };
        results.push(entry);
    }
    if progress {
        eprint!("\r");
    }
    if changed > 0 {
        queue::notify(pool)
            .await
            .map_err(explain_db)
            .context("the changes are committed, but the dispatcher could not be woken (it will see them at its next heartbeat)")?;
    }
    if opts.json {
        let doc = json!({
            "action": name,
            "changed": changed,
            "errors": failed,
            "results": results,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else if bulk == Bulk::Yes && total == 0 {
        println!("no rows to retry");
    }
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The outcome kind (`not_found`, `running`, `refused`, `error`) and the message for people.
fn describe_error(e: &AdminError) -> (&'static str, String) {
    match e {
        AdminError::NotFound(id) => ("not_found", format!("there is no queue row {id}")),
        AdminError::Running { message, .. } => (
            "running",
            format!("{message}; not changed (use --force only if that worker is gone)"),
        ),
        AdminError::Refused { message, .. } => ("refused", message.clone()),
        AdminError::Database { .. } if e.is_permission_denied() => (
            "error",
            format!(
                "{e:#}: the role in [database] URL may not do this; pepsi-queue needs the pipeline role (see docs/queue.md)"
            ),
        ),
        AdminError::Database { id, source } => ("error", format!("row {id}: {source}")),
    }
}

/// A database error on a read, with the privilege hint when the role lacks one.
fn explain_db(e: sqlx::Error) -> anyhow::Error {
    let denied = matches!(&e, sqlx::Error::Database(d) if d.code().as_deref() == Some("42501"));
    let err = anyhow::Error::new(e);
    if denied {
        err.context("the role in [database] URL lacks a privilege pepsi-queue needs (use the pipeline role; see docs/queue.md)")
    } else {
        err
    }
}

fn join_ids(ids: &[i64]) -> String {
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}
