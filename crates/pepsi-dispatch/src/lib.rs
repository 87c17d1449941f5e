//! pepsi-dispatch: the single coordinator of a Pepsi installation. It claims pending rows of
//! `pepsi.workqueue` for every stage with spare capacity, shares each stage fairly among
//! senders, and feeds the ids to elastic pools of stage worker processes over their stdin.
//!
//! It never reads or changes message content: workers record their own outcomes. Its only
//! forward-progress write is the claim (pending → running); it also requeues paused rows
//! that are due, returns rows it could not hand out, and fails rows whose worker crashed or
//! hung. One per database, enforced with an advisory lock.

mod claim;
mod dispatcher;
mod fair;
mod listen;
mod settings;
mod stats;
mod status;
mod worker;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use sqlx::{ConnectOptions as _, Connection as _, PgConnection};

use pepsi_common::cli::{CommonArgs, init_logging};
use pepsi_common::config::Scope;
use pepsi_common::db::DbSettings;

pub mod constants {
    use pepsi_common::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "dispatch",
        exec: "pepsi-dispatch",
    };
}

/// The advisory lock key pair that makes the dispatcher one per database.
const LOCK_KEY: (i32, i32) = (0x7065_7073, 1);

/// What the loop reacts to.
#[derive(Debug)]
pub enum Event {
    /// New pending work may exist (a notification, a reconnection).
    Wake,
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
/// FAIR_FIFO_PERCENT (20), FAIR_MAX_SENDERS (256), STATS_INTERVAL (60s),
/// STATS_IDLE_INTERVAL (1s: the least spacing of the flushes made when idle), SPAWN_COOLDOWN (10s),
/// SHUTDOWN_GRACE (10s), GC_INTERVAL (5m), ORPHAN_GRACE (60s), LOCK_CHECK_INTERVAL (1s),
/// VACUUM_INTERVAL (10s), HAND_FORWARD (yes: a row a worker advances stays running and is
/// handed to the next stage's pool without a claim), LIBEXEC_DIR.
/// [stage-NAME] options: PROGRAM, PARALLELISM (1), QUEUE_LIMIT (1), MAX_MESSAGES (10000,
/// 0 = never recycle), WORKER_IDLE_TIMEOUT (60s), MAX_RUNTIME (5m).
/// See docs/dispatch.md for what each does.
///
/// A worker that crashes fails the message it held (state.dispatch_error says why); one that
/// does not answer within MAX_RUNTIME is killed and the message ends as `timeout`. Messages a
/// worker had not started return to pending. On SIGINT/SIGTERM workers finish what they hold
/// (up to SHUTDOWN_GRACE), statistics are written and the dispatcher exits 0. Only one
/// dispatcher may run per database: a second one exits with status 1 naming the first.
#[derive(Debug, Parser)]
#[command(name = "pepsi-dispatch", version, verbatim_doc_comment)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
}

/// Entry point of the `pepsi-dispatch` binary.
/// What the dispatcher parses from the configuration at start: its own section and every
/// stage's pool options. pepsi-config checks a candidate configuration with it.
pub fn check_config(cfg: &pepsi_common::config::Config) -> anyhow::Result<()> {
    settings::DispatchSettings::from_config(cfg)?;
    settings::PoolSettings::all(cfg)?;
    Ok(())
}

/// The command line of `pepsi-dispatch` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

pub fn run() -> ExitCode {
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
    match runtime.block_on(main(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pepsi-dispatch: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn main(cli: Cli) -> anyhow::Result<()> {
    let file_cfg = cli.common.load_config()?;
    let db_settings = DbSettings::from_config(&file_cfg)?;
    let lock = take_lock(&db_settings.url).await?;
    let db = db_settings.connect_for_passes().await?;
    let cfg = file_cfg.with_db_overlay(&db, &Scope::Global).await?;
    let every = settings::DispatchSettings::from_config(&cfg)?.lock_check_interval;
    tokio::spawn(keep_lock(lock, db_settings.url.clone(), every));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut dispatcher = dispatcher::Dispatcher::new(
        db.clone(),
        file_cfg,
        &cfg,
        cli.common.log_level.clone(),
        tx.clone(),
    )?;
    tokio::spawn(listen::run(db.clone(), tx));
    dispatcher.run(rx).await
}

/// Checks the connection holding the dispatcher lock every `every`. The lock lives as long
/// as that server session: when the session is gone (PostgreSQL restarted, the backend was
/// terminated) the lock is taken again on a new connection. When another dispatcher holds
/// it by then, this process exits at once: its workers die with it (parent-death signal),
/// and the rows they held are returned by the other dispatcher (ORPHAN_GRACE).
async fn keep_lock(mut conn: PgConnection, url: String, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        let alive = sqlx::query("SELECT 1").execute(&mut conn).await;
        let Err(e) = alive else { continue };
        tracing::warn!(
            "the connection holding the dispatcher lock is lost ({e}): taking the lock again"
        );
        loop {
            match take_lock(&url).await {
                Ok(fresh) => {
                    tracing::info!("dispatcher lock taken again");
                    conn = fresh;
                    break;
                }
                Err(e) if e.to_string().contains("another dispatcher") => {
                    tracing::error!(
                        "lost the dispatcher lock to another dispatcher, exiting: {e:#}"
                    );
                    eprintln!("pepsi-dispatch: lost the dispatcher lock: {e:#}");
                    std::process::exit(1);
                }
                Err(e) => {
                    // The server is not back yet: nobody else can take the lock meanwhile
                    // either, so keep trying.
                    tracing::warn!("cannot take the dispatcher lock again yet: {e:#}");
                    tokio::time::sleep(every).await;
                }
            }
        }
    }
}

/// Holds the dispatcher lock for the life of the process on a connection of its own, named
/// so that a second dispatcher can say who holds it.
async fn take_lock(url: &str) -> anyhow::Result<PgConnection> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name = format!("pepsi-dispatch {} pid {}", host.trim(), std::process::id());
    let options: sqlx::postgres::PgConnectOptions = url
        .parse()
        .context("[database] URL is not a PostgreSQL URL")?;
    let mut conn = options
        .application_name(&name)
        .connect()
        .await
        .context("cannot connect to the database")?;
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
        .bind(LOCK_KEY.0)
        .bind(LOCK_KEY.1)
        .fetch_one(&mut conn)
        .await?;
    if got {
        return Ok(conn);
    }
    let holder: Option<(i32, String, Option<String>, String)> = sqlx::query_as(
        "SELECT a.pid, a.application_name, a.client_addr::text, to_char(a.backend_start, 'YYYY-MM-DD HH24:MI:SS TZ') \
         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::int8::oid AND l.objid = $2::int8::oid \
           AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .bind(i64::from(LOCK_KEY.0))
    .bind(i64::from(LOCK_KEY.1))
    .fetch_optional(&mut conn)
    .await?;
    conn.close().await.ok();
    match holder {
        Some((pid, app, addr, since)) => anyhow::bail!(
            "another dispatcher is already running on this database: {} (server backend pid {pid}{}, since {since}); run exactly one per system",
            if app.is_empty() {
                "unnamed client".to_owned()
            } else {
                app
            },
            addr.map(|a| format!(", from {a}")).unwrap_or_default()
        ),
        None => anyhow::bail!(
            "another dispatcher is already running on this database; run exactly one per system"
        ),
    }
}
