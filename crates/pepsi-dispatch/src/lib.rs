//! pepsi-dispatch: the single coordinator of a Pepsi installation. It claims pending rows of
//! `pepsi.workqueue` for every stage with spare capacity, shares each stage fairly among
//! senders, and feeds the ids to elastic pools of stage worker processes over their stdin.
//!
//! It never reads or changes message content: workers record their own outcomes. Its only
//! forward-progress write is the claim (pending → running); it also requeues paused rows
//! that are due, returns rows it could not hand out, and fails rows whose worker crashed or
//! hung. One is active per database, enforced with an advisory lock; others stand by and
//! take over, fencing the one before (docs/ha.md).

mod claim;
mod dispatcher;
mod fair;
mod interrupted;
mod listen;
mod lock;
mod options;
mod stats;
mod status;
mod worker;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;

use pepsi_conf::cli::{CommonArgs, init_logging};
use pepsi_conf::config::Scope;
use pepsi_contract::db::DbOptions;
use pepsi_contract::overlay::DbOverlay;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "dispatch",
        exec: "pepsi-dispatch",
    };
}

/// What the loop reacts to.
#[derive(Debug)]
pub enum Event {
    /// New pending work may exist (a notification, a reconnection): at the stage named, or
    /// at any stage (`None`).
    Wake(Option<pepsi_conf::config::StageName>),
    /// The configuration overlay changed.
    ConfigChanged,
    /// A worker wrote a status line.
    Line { worker: u64, line: String },
    /// A worker's stdout closed.
    Eof { worker: u64 },
}

/// Claim queued mail and run it through the stage workers.
///
/// pepsi-dispatch reads the configuration file (and the global configuration overlay from the
/// database), then runs until SIGINT or SIGTERM. Every [stage-NAME] section with a PROGRAM is a
/// pool of worker processes started as `PROGRAM worker -c FILE`; the dispatcher claims pending
/// rows at each stage up to the pool's capacity (PARALLELISM × QUEUE_LIMIT) and writes their ids
/// to the workers' stdin.
///
/// [pepsi-dispatch] options: POLL_INTERVAL (heartbeat, 5s), FAIR_HALF_LIFE (60s),
/// FAIR_FIFO_PERCENT (20), FAIR_MAX_SENDERS (256), STATS_INTERVAL (5s),
/// STATS_IDLE_INTERVAL (1s: the least spacing of the flushes made when idle), SPAWN_COOLDOWN (10s),
/// SHUTDOWN_GRACE (10s), GC_INTERVAL (5m), ORPHAN_GRACE (60s), VACUUM_INTERVAL (10s),
/// HAND_FORWARD (yes: a row a worker advances stays running and is handed to the next stage's
/// pool without a claim), HOLD_FORWARD (32: rows handed forward to a stage without room that
/// wait in the dispatcher for its next free worker, per stage, while none waits there as
/// pending; 0 returns each to pending), LIBEXEC_DIR, STANDBY (yes), LOCK_SESSION_TIMEOUT (5s),
/// LOCK_CHECK_INTERVAL (250ms), TAKEOVER_MARGIN (30s), MODE (single | shared),
/// PARALLELISM_SCOPE (host | global, MODE shared).
/// [stage-NAME] options: PROGRAM, PARALLELISM (1), QUEUE_LIMIT (1), MAX_MESSAGES (10000,
/// 0 = never recycle), WORKER_IDLE_TIMEOUT (60s), MAX_RUNTIME (5m).
/// See docs/dispatch.md for what each does.
///
/// It refuses to start (status 1, naming every problem) when the stage graph is broken: a
/// NEXT_STAGE, BOUNCE_STAGE or branch naming a stage without a [stage-NAME] section, a
/// PROGRAM that is no stage program of this Pepsi (pepsi-stage-* misspelt), or no
/// [stage-init], where new mail enters. What looks wrong but works (a stage nothing
/// reaches, a section without PROGRAM, a stage program of the site's own) is logged as a
/// warning. `pepsi-config check` reports the same (docs/routing.md).
///
/// A worker that crashes fails the message it held (state.dispatch_error says why); one that
/// does not answer within MAX_RUNTIME is killed and the message ends as `timeout`. Messages a
/// worker had not started return to pending. On SIGINT/SIGTERM workers finish what they hold
/// (up to SHUTDOWN_GRACE), statistics are written and the dispatcher exits 0.
///
/// One dispatcher is active per database. Another one started meanwhile stands by (STANDBY =
/// yes; with no it exits with status 1 naming the active one) and takes over once the active
/// one's lock session ends: at once when that process dies, within LOCK_SESSION_TIMEOUT when
/// it hangs, is stopped or is cut off. Taking over fences the earlier dispatcher: the database
/// refuses whatever it or its workers still write. A dispatcher whose heartbeat fails for
/// LOCK_SESSION_TIMEOUT, or which finds itself fenced, kills its workers and exits with
/// status 1.
///
/// With MODE = shared, one dispatcher runs on each host and all of them claim, each its own
/// rows, with their own workers (PARALLELISM per host, or shared among the live dispatchers
/// with PARALLELISM_SCOPE = global); the one holding the lock does the maintenance (due
/// requeues, garbage collection, VACUUM) and fences members whose session is gone. See
/// docs/ha.md.
#[derive(Debug, Parser)]
#[command(name = "pepsi-dispatch", version, verbatim_doc_comment)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
}

/// What the dispatcher parses from the configuration at start: its own section and every
/// stage's pool options. pepsi-config checks a candidate configuration with it.
pub fn check_config(cfg: &pepsi_conf::config::Config) -> anyhow::Result<()> {
    options::DispatchOptions::from_config(cfg)?;
    options::PoolOptions::all(cfg)?;
    Ok(())
}

/// The command line of `pepsi-dispatch` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-dispatch` binary: runs the dispatcher with the process's
/// arguments; the stage graph is judged at start by `tables` (the root package's
/// `pepsi::programs::GRAPH_VALIDATION`).
pub fn run(tables: &'static pepsi_stage_validate::Tables) -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    // One thread: the loop is sequential, and workers' parent-death signal is tied to the
    // thread that started them, which must live as long as the process.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pepsi-dispatch: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(main(cli, tables)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pepsi-dispatch: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn main(cli: Cli, tables: &'static pepsi_stage_validate::Tables) -> anyhow::Result<()> {
    let file_cfg = cli.common.load_config()?;
    let db_settings = DbOptions::from_config(&file_cfg)?;
    // Everything is checked before standing by: a standby with a broken configuration
    // would only fail when it is needed.
    let settings = {
        let db = db_settings.connect().await?;
        let cfg = file_cfg.with_db_overlay(&db, &Scope::Global).await?;
        check_config(&cfg)?;
        check_graph(&cfg, tables)?;
        db.close().await;
        options::DispatchOptions::from_config(&cfg)?
    };
    let workers = lock::WorkerPids::default();
    let leadership = lock::spawn(
        lock::LockOptions {
            url: db_settings.url.clone(),
            socket_dir: db_settings.socket_dir.clone(),
            check: settings.lock_check_interval,
            session_timeout: settings.lock_session_timeout,
            standby: settings.standby,
            mode: settings.mode,
        },
        workers.clone(),
    )?;
    let leadership = tokio::select! {
        got = leadership => got.context("the lock thread ended")??,
        _ = stop_signal() => {
            tracing::info!("stopped while standing by");
            return Ok(());
        }
    };
    tracing::info!(
        epoch = leadership.epoch,
        gone = ?leadership.gone,
        "dispatcher lock taken"
    );
    let db = db_settings
        .with_epoch(leadership.epoch)
        .connect_for_passes()
        .await?;
    let cfg = file_cfg.with_db_overlay(&db, &Scope::Global).await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut dispatcher = dispatcher::Dispatcher::new(
        db.clone(),
        file_cfg,
        &cfg,
        dispatcher::Started {
            log_level: cli.common.log_level.clone(),
            tables,
        },
        tx.clone(),
        leadership,
        workers,
    )?;
    tokio::spawn(listen::run(db.clone(), tx));
    dispatcher.run(rx).await
}

/// The stage graph of `cfg` by `tables`: its warnings logged, an error naming every one of
/// its errors. A graph with an edge to no stage would strand every message sent along it.
pub(crate) fn check_graph(
    cfg: &pepsi_conf::config::Config,
    tables: &pepsi_stage_validate::Tables,
) -> anyhow::Result<()> {
    let report = pepsi_stage_validate::validate(cfg, tables);
    for w in report.warnings() {
        tracing::warn!("{w}");
    }
    let errors: Vec<String> = report.errors().map(|e| format!("\n  {e}")).collect();
    anyhow::ensure!(
        errors.is_empty(),
        "{}: the configuration's stage graph is broken ({}; `pepsi-config check` lists \
         the same):{}",
        cfg.file().display(),
        report.summary(),
        errors.concat()
    );
    Ok(())
}

/// SIGINT or SIGTERM.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
