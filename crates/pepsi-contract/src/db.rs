//! Database access shared by every program: connecting from the `[database]` section,
//! waking the dispatcher (`notify_workqueue`) and retrying transient serialization failures.
//!
//! This module and `stage` are the only places in `pepsi-contract` that queue SQL; neither
//! builds SQL text from input.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};

use pepsi_conf::config::Config;

/// The channel the dispatcher LISTENs on for new pending work. A notification's payload is
/// the stage the rows it announces wait at, or empty when they may wait at any stage.
pub const WORKQUEUE_CHANNEL: &str = "workqueue";

/// The stage admitted mail starts at: the default of `pepsi.workqueue.stage`
/// (pepsi-0001.sql), which `workqueue_add` and `workqueue_add_batch` leave in place.
pub const ADMISSION_STAGE: &str = "init";

/// How many times `with_retry` re-ran an operation after a serialization failure or a
/// deadlock, since the process started (the dispatcher reports it in `dispatch_stats`).
pub static SERIALIZATION_RETRIES: AtomicU64 = AtomicU64::new(0);

/// Attempts `with_retry` makes before giving the error back.
const RETRY_ATTEMPTS: u32 = 5;

/// Connection settings from the `[database]` section (a bootstrap section, file only).
#[derive(Debug, Clone)]
pub struct DbOptions {
    pub url: String,
    pub max_connections: u32,
    /// `WORKER_CONNECTIONS`: the pool of a stage worker, which runs one pass at a time.
    pub worker_connections: u32,
    /// `IDLE_CHECK`: a pooled connection idle longer than this is tested with a round trip
    /// before it is used; one in steady use is not.
    pub idle_check: Duration,
    pub connect_timeout: Duration,
    /// `PASS_SYNCHRONOUS_COMMIT`: the `synchronous_commit` of the sessions that move rows
    /// along the queue (the dispatcher's and the stage workers'), `None` for the server's.
    pub pass_synchronous_commit: Option<SynchronousCommit>,
    /// `PASS_PLAN_CACHE_MODE`: the `plan_cache_mode` of the same sessions, `None` for the
    /// server's.
    pub pass_plan_cache_mode: Option<PlanCacheMode>,
    /// The dispatcher epoch the passes' sessions name (`pepsi.epoch`, docs/ha.md): the one
    /// this worker inherited, or the dispatcher's own.
    pub epoch: Option<i64>,
    /// `STATEMENT_TIMEOUT`: how long one statement of a session that moves rows along the
    /// queue (a pass's load and commit, the dispatcher's claim) may run, `None` for no limit.
    pub statement_timeout: Option<Duration>,
    /// `SOCKET_DIR`: where the server's Unix socket is when the URL names no host
    /// ([`SOCKET_DIR`] by default), so the client library never looks in `/tmp`.
    pub socket_dir: std::path::PathBuf,
}

/// A value of PostgreSQL's `synchronous_commit`, as `[database] PASS_SYNCHRONOUS_COMMIT`
/// names it; `server` (no value) leaves the server's setting alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynchronousCommit {
    Off,
    Local,
    RemoteWrite,
    On,
    RemoteApply,
}

impl SynchronousCommit {
    /// The default: a pass's commit does not wait for its WAL flush (docs/stage-contract.md,
    /// "Durability of a pass").
    pub const PASS_DEFAULT: Option<SynchronousCommit> = Some(SynchronousCommit::Off);

    /// Parses an option value: one of PostgreSQL's names, or `server`.
    pub fn parse(value: &str) -> Result<Option<SynchronousCommit>, String> {
        Ok(Some(match value.trim().to_ascii_lowercase().as_str() {
            "server" => return Ok(None),
            "off" => Self::Off,
            "local" => Self::Local,
            "remote_write" => Self::RemoteWrite,
            "on" => Self::On,
            "remote_apply" => Self::RemoteApply,
            other => {
                return Err(format!(
                    "{other:?} is not one of off, local, remote_write, on, remote_apply, server"
                ));
            }
        }))
    }

    /// The name PostgreSQL takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Local => "local",
            Self::RemoteWrite => "remote_write",
            Self::On => "on",
            Self::RemoteApply => "remote_apply",
        }
    }
}

/// A value of PostgreSQL's `plan_cache_mode`, as `[database] PASS_PLAN_CACHE_MODE` names it;
/// `server` (no value) leaves the server's setting alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanCacheMode {
    Auto,
    ForceGenericPlan,
    ForceCustomPlan,
}

impl PlanCacheMode {
    /// The default: a pass's prepared statements keep one generic plan. Under `auto` the
    /// server plans the batch load (`workqueue_id = ANY($1)`) and a round's lookups afresh on
    /// most executions, since a custom plan for a short array always looks cheaper than the
    /// generic one, which costs more CPU than it saves (docs/perf.md, 2026-12-07).
    pub const PASS_DEFAULT: Option<PlanCacheMode> = Some(PlanCacheMode::ForceGenericPlan);

    /// Parses an option value: one of PostgreSQL's names, or `server`.
    pub fn parse(value: &str) -> Result<Option<PlanCacheMode>, String> {
        Ok(Some(match value.trim().to_ascii_lowercase().as_str() {
            "server" => return Ok(None),
            "auto" => Self::Auto,
            "force_generic_plan" => Self::ForceGenericPlan,
            "force_custom_plan" => Self::ForceCustomPlan,
            other => {
                return Err(format!(
                    "{other:?} is not one of auto, force_generic_plan, force_custom_plan, server"
                ));
            }
        }))
    }

    /// The name PostgreSQL takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::ForceGenericPlan => "force_generic_plan",
            Self::ForceCustomPlan => "force_custom_plan",
        }
    }
}

impl DbOptions {
    /// Reads `[database] URL`, `MAX_CONNECTIONS` (default 4), `WORKER_CONNECTIONS` (2),
    /// `IDLE_CHECK` (1 s), `CONNECT_TIMEOUT` (10 s), `PASS_SYNCHRONOUS_COMMIT` (`off`),
    /// `PASS_PLAN_CACHE_MODE` (`force_generic_plan`), `STATEMENT_TIMEOUT` (60 s) and
    /// `SOCKET_DIR` ([`SOCKET_DIR`]).
    pub fn from_config(cfg: &Config) -> anyhow::Result<Self> {
        let section = cfg.section("database");
        let worker_connections = section
            .number_opt("WORKER_CONNECTIONS")?
            .unwrap_or(DEFAULT_WORKER_CONNECTIONS);
        if !(1..=MAX_WORKER_CONNECTIONS).contains(&worker_connections) {
            anyhow::bail!(
                "[database] WORKER_CONNECTIONS = {worker_connections}: must be 1 to {MAX_WORKER_CONNECTIONS}"
            );
        }
        let idle_check = section
            .duration_opt("IDLE_CHECK")?
            .unwrap_or(DEFAULT_IDLE_CHECK);
        if idle_check > MAX_IDLE_CHECK {
            anyhow::bail!(
                "[database] IDLE_CHECK = {idle_check:?}: must be at most {MAX_IDLE_CHECK:?}"
            );
        }
        Ok(Self {
            worker_connections,
            idle_check,
            pass_synchronous_commit: section
                .parse_opt("PASS_SYNCHRONOUS_COMMIT", SynchronousCommit::parse)?
                .unwrap_or(SynchronousCommit::PASS_DEFAULT),
            pass_plan_cache_mode: section
                .parse_opt("PASS_PLAN_CACHE_MODE", PlanCacheMode::parse)?
                .unwrap_or(PlanCacheMode::PASS_DEFAULT),
            url: section.string("URL")?,
            max_connections: section.number_opt("MAX_CONNECTIONS")?.unwrap_or(4),
            connect_timeout: section
                .duration_opt("CONNECT_TIMEOUT")?
                .unwrap_or(Duration::from_secs(10)),
            epoch: crate::epoch::inherited().epoch,
            socket_dir: socket_dir(cfg)?,
            statement_timeout: statement_timeout(cfg)?,
        })
    }

    /// The settings of a stage worker: its pool holds `WORKER_CONNECTIONS`. A worker runs one
    /// pass at a time, but a connection goes back to the pool in a task of its own, so a
    /// larger pool opens another connection whenever a statement starts before the last
    /// one's is back, and every worker ends up holding `MAX_CONNECTIONS` backends.
    pub fn for_worker(mut self) -> Self {
        self.max_connections = self.worker_connections;
        self
    }

    /// The same settings with the passes' sessions naming `epoch`.
    pub fn with_epoch(mut self, epoch: i64) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// The server settings of a session that moves rows along the queue.
    fn pass_options(&self, mut options: PgConnectOptions) -> PgConnectOptions {
        if let Some(level) = self.pass_synchronous_commit {
            options = options.options([("synchronous_commit", level.as_str())]);
        }
        if let Some(mode) = self.pass_plan_cache_mode {
            options = options.options([("plan_cache_mode", mode.as_str())]);
        }
        if let Some(epoch) = self.epoch {
            options = options.options([("pepsi.epoch", epoch.to_string())]);
        }
        if let Some(limit) = self.statement_timeout {
            options = options.options([("statement_timeout", limit.as_millis().to_string())]);
        }
        options
    }

    /// Opens a pool; sessions run READ COMMITTED (at most one writer touches a queue row).
    pub async fn connect(&self) -> anyhow::Result<PgPool> {
        self.connect_with(self.options()?).await
    }

    /// Opens a pool as the database role `user`, whatever the URL names: for a setuid
    /// program, which connects by peer authentication as the account its bit makes it
    /// (a URL without a user would otherwise name the account that started it).
    pub async fn connect_as(&self, user: &str) -> anyhow::Result<PgPool> {
        self.connect_with(self.options()?.username(user)).await
    }

    /// `connect_as` for a command-line program any local user runs through a set-user-id
    /// bit: one connection, and server-side limits on every statement, lock wait, and idle
    /// time inside and outside a transaction, so a caller who stops the process (they may
    /// signal it) can neither hold locks the pipeline waits on nor keep sessions open.
    ///
    /// A URL that names no host is pinned to `SOCKET_DIR`, as for every program
    /// ([`DbOptions::options`]).
    pub async fn connect_for_caller(&self, user: &str) -> anyhow::Result<PgPool> {
        let options = self.options()?.username(user).options([
            ("statement_timeout", "30s"),
            ("lock_timeout", "5s"),
            ("idle_in_transaction_session_timeout", "10s"),
            ("idle_session_timeout", "60s"),
        ]);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(self.connect_timeout)
            .connect_with(options.application_name(&session_name()))
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to the database: {e}"))?;
        Ok(pool)
    }

    /// Opens the pool of a program that moves rows along the queue (the dispatcher, a stage
    /// worker): its sessions commit with `PASS_SYNCHRONOUS_COMMIT` and name the dispatcher
    /// epoch they act for. Every other program's writes (the ingress's admission above all)
    /// keep the server's setting.
    pub async fn connect_for_passes(&self) -> anyhow::Result<PgPool> {
        let options = self.pass_options(self.options()?);
        self.connect_with(options).await
    }

    /// `connect_for_passes` as the database role `user` (a set-user-id stage worker).
    pub async fn connect_for_passes_as(&self, user: &str) -> anyhow::Result<PgPool> {
        let options = self.options()?.username(user);
        self.connect_with(self.pass_options(options)).await
    }

    /// The connection options of the URL, a URL that names no host pinned to `SOCKET_DIR`:
    /// the client library would otherwise look for a socket in `/tmp` too, where any local
    /// user can put one of their own while the server is down (its socket file gone), and
    /// receive what this program sends (security review 2026-12-04 #3).
    pub fn options(&self) -> anyhow::Result<PgConnectOptions> {
        pinned_options(&self.url, &self.socket_dir)
            .map_err(|e| anyhow::anyhow!("[database] URL is not a PostgreSQL URL: {e}"))
    }

    async fn connect_with(&self, options: PgConnectOptions) -> anyhow::Result<PgPool> {
        let idle_check = self.idle_check;
        let pool = PgPoolOptions::new()
            .max_connections(self.max_connections.max(1))
            .acquire_timeout(self.connect_timeout)
            // The pool's own test pings every connection it hands out, one round trip to
            // the server for each statement; only one that sat idle is tested here (the
            // pool still tests each on its way back). A connection that broke while in use
            // fails its statement, which every caller treats as temporary.
            .test_before_acquire(false)
            .before_acquire(move |conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= idle_check {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options.application_name(&session_name()))
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to the database: {e}"))?;
        Ok(pool)
    }
}

/// The `application_name` of a program's sessions: `<program> pid <pid>` (as the
/// dispatcher's lock session names itself), so `pg_stat_activity` tells which process holds
/// which backend. The program is the name it was started by (a unified binary's link name).
pub fn session_name() -> String {
    let program = std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "pepsi".to_owned());
    // PostgreSQL keeps 63 bytes of it; the pid part takes at most 14.
    let program: String = program.chars().take(40).collect();
    format!("{program} pid {}", std::process::id())
}

/// `[database] WORKER_CONNECTIONS` when nothing sets it: one for the pass, one while the
/// last statement's connection is on its way back to the pool.
pub const DEFAULT_WORKER_CONNECTIONS: u32 = 2;

/// The largest `[database] WORKER_CONNECTIONS`.
pub const MAX_WORKER_CONNECTIONS: u32 = 64;

/// `[database] IDLE_CHECK` when nothing sets it.
pub const DEFAULT_IDLE_CHECK: Duration = Duration::from_secs(1);

/// The largest `[database] IDLE_CHECK`.
pub const MAX_IDLE_CHECK: Duration = Duration::from_secs(3600);

/// Where a program looks for the server's socket when the URL names no host and
/// `[database] SOCKET_DIR` says nothing: Debian's PostgreSQL socket directory, writable by
/// root and postgres alone.
pub const SOCKET_DIR: &str = "/var/run/postgresql";

/// `[database] SOCKET_DIR`, [`SOCKET_DIR`] by default; an absolute path.
pub fn socket_dir(cfg: &Config) -> anyhow::Result<std::path::PathBuf> {
    let dir = cfg
        .section("database")
        .path_opt("SOCKET_DIR")?
        .unwrap_or_else(|| std::path::PathBuf::from(SOCKET_DIR));
    if !dir.is_absolute() {
        anyhow::bail!(
            "[database] SOCKET_DIR = {}: must be an absolute path",
            dir.display()
        );
    }
    Ok(dir)
}

/// `[database] STATEMENT_TIMEOUT` when nothing sets it.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);

/// How much longer than `STATEMENT_TIMEOUT` the client waits for an answer before it gives
/// up on its own: the server cancels the statement first when it still answers at all.
pub const CLIENT_TIMEOUT_GRACE: Duration = Duration::from_secs(5);

/// `[database] STATEMENT_TIMEOUT` ([`DEFAULT_STATEMENT_TIMEOUT`]; `0`: no limit): how long
/// a statement of the dispatcher or of a stage worker's pass may run. A primary that stops
/// answering without closing the connection, or a lock a stray session holds, would
/// otherwise hold a worker (and its row) or the dispatcher's claim forever.
pub fn statement_timeout(cfg: &Config) -> anyhow::Result<Option<Duration>> {
    let limit = cfg
        .section("database")
        .duration_opt("STATEMENT_TIMEOUT")?
        .unwrap_or(DEFAULT_STATEMENT_TIMEOUT);
    Ok((!limit.is_zero()).then_some(limit))
}

/// Runs `op` (database work that the server bounds with `statement_timeout`), giving up on
/// the client side `CLIENT_TIMEOUT_GRACE` after `limit`: a server that never answers (a
/// primary gone silent, a network that drops everything) cannot hold the caller. The error is
/// an I/O timeout (in the caller's error type), which every caller treats as a temporary
/// failure.
pub async fn bounded<T, E, F>(limit: Option<Duration>, op: F) -> Result<T, E>
where
    E: From<sqlx::Error>,
    F: Future<Output = Result<T, E>>,
{
    let Some(limit) = limit else {
        return op.await;
    };
    let total = limit + CLIENT_TIMEOUT_GRACE;
    match tokio::time::timeout(total, op).await {
        Ok(result) => result,
        Err(_) => Err(E::from(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the database did not answer within {total:?} ([database] STATEMENT_TIMEOUT {limit:?} and {CLIENT_TIMEOUT_GRACE:?})"
            ),
        )))),
    }
}

/// Parses `url`, pinning a URL that names no host ([`url_names_host`]) to `socket_dir`.
pub fn pinned_options(
    url: &str,
    socket_dir: &std::path::Path,
) -> Result<PgConnectOptions, sqlx::Error> {
    let options: PgConnectOptions = url.parse()?;
    Ok(if url_names_host(url) {
        options
    } else {
        options.host(&socket_dir.to_string_lossy())
    })
}

/// Whether a PostgreSQL URL names where the server is: a host in its authority, or a
/// `host=` / `hostaddr=` parameter.
pub fn url_names_host(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (authority, query) = match rest.split_once('/') {
        Some((a, path)) => (a, path.split_once('?').map_or("", |(_, q)| q)),
        None => (
            rest.split_once('?').map_or(rest, |(a, _)| a),
            rest.split_once('?').map_or("", |(_, q)| q),
        ),
    };
    // Not an address: a URL's `user:password@host`.
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = host.split(':').next().unwrap_or("");
    !host.is_empty()
        || query
            .split('&')
            .any(|p| p.starts_with("host=") || p.starts_with("hostaddr="))
}

/// Connects with the `[database]` section of `cfg`.
pub async fn connect(cfg: &Config) -> anyhow::Result<PgPool> {
    DbOptions::from_config(cfg)?.connect().await
}

/// Connects with the `[database]` section of `cfg` for a one-shot command-line tool: a pool of
/// one connection, which each statement takes in turn. A larger pool opens a second
/// connection (with its TLS handshake) whenever a statement starts before the last one's
/// connection is back, which is most of such a tool's time on a short command.
pub async fn connect_single(cfg: &Config) -> anyhow::Result<PgPool> {
    let mut options = DbOptions::from_config(cfg)?;
    options.max_connections = 1;
    options.connect().await
}

/// Connects with the `[database]` section of `cfg` for a program that moves rows along the
/// queue (`DbOptions::connect_for_passes`).
pub async fn connect_for_passes(cfg: &Config) -> anyhow::Result<PgPool> {
    DbOptions::from_config(cfg)?.connect_for_passes().await
}

/// A LISTEN session on the server `pool` reaches, on a connection of its own outside the
/// pool: a listener holds its connection for as long as it lives, and one taken from the
/// pool would leave a stage worker's pool (`WORKER_CONNECTIONS`, 1 on a small host) with
/// nothing for its passes. It reconnects through its own one-connection pool.
pub async fn listener(pool: &PgPool) -> Result<sqlx::postgres::PgListener, sqlx::Error> {
    let own = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(pool.options().get_acquire_timeout())
        .connect_lazy_with((*pool.connect_options()).clone());
    sqlx::postgres::PgListener::connect_with(&own).await
}

/// Wakes the dispatcher. Call it after the transaction that made rows pending has committed,
/// from writers outside the dispatcher's loop only (the contract in procedures.sql).
pub async fn notify_workqueue<'e, E>(executor: E) -> Result<(), sqlx::Error>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(WORKQUEUE_CHANNEL)
        .execute(executor)
        .await?;
    Ok(())
}

/// Wakes the dispatcher in a transaction of its own that does not wait for a WAL flush: the
/// rows it announces have committed already, and a wake-up needs no durability (one lost in a
/// crash is made good by the dispatcher's start-up claim). One round trip: `set_config(…,
/// true)` applies to the statement's own implicit transaction, so its commit is asynchronous.
/// PostgreSQL already commits a transaction whose only WAL is its commit record (a bare
/// NOTIFY's) without waiting for the flush; the setting states it rather than relying on it.
/// Takes the pool, not an executor, so it can never run inside (and weaken) a caller's write
/// transaction.
///
/// `stage` names the stage every announced row waits at, so the dispatcher claims for that
/// stage alone (`None`: any stage may have rows).
pub async fn wake_dispatcher(pool: &PgPool, stage: Option<&str>) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)")
        .bind(WORKQUEUE_CHANNEL)
        .bind(stage.unwrap_or(""))
        .execute(pool)
        .await?;
    Ok(())
}

/// True for the transient errors a retry cures: serialization failure (40001) and
/// deadlock (40P01).
pub fn is_serialization_failure(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("40001" | "40P01")),
        _ => false,
    }
}

/// Runs `op` and re-runs it, with a short growing pause, when it fails with a
/// serialization failure or a deadlock; any other error, or the last attempt's, is returned.
pub async fn with_retry<T, F, Fut>(mut op: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut attempt = 0;
    loop {
        match op().await {
            Err(e) if attempt + 1 < RETRY_ATTEMPTS && is_serialization_failure(&e) => {
                attempt += 1;
                SERIALIZATION_RETRIES.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(attempt, "retrying after a transient database failure: {e}");
                tokio::time::sleep(Duration::from_millis(5 << attempt)).await;
            }
            other => return other,
        }
    }
}

// ----- admission -----------------------------------------------------------------------
// One `pepsi.workqueue_add` call per message, all recipients in one row, in one transaction.
// The function never notifies (see the contract at the top of procedures.sql): the ingress
// wakes the dispatcher out of band once the rows commit. When `admit` returns Ok the row has
// committed and the 250 may go out.

/// The message as it is stored.
#[derive(Debug)]
pub struct Admission<'a> {
    /// Empty for the null reverse path.
    pub mail_from: &'a str,
    pub rcpt_to: &'a [String],
    /// The header block, prepended fields included; raw = headers || CRLF || body.
    pub headers: &'a [u8],
    pub body: &'a [u8],
    pub state: &'a serde_json::Value,
    pub auth_user: Option<&'a str>,
    pub client_addr: std::net::IpAddr,
}

/// Stores the message and returns its `workqueue_id`, after commit. With `wake` (the stage
/// the row waits at) the same statement notifies the dispatcher, delivered at its commit:
/// only for a message stored while no other admission commits (a queued NOTIFY holds a
/// database-wide lock until commit; `wake_dispatcher`).
pub async fn admit(
    pool: &PgPool,
    msg: &Admission<'_>,
    wake: Option<&str>,
) -> Result<i64, sqlx::Error> {
    with_retry(|| async {
        // A single statement in autocommit is its own transaction: the body row and the
        // queue row commit together or not at all, and so does the wake-up it may carry.
        let sql = match wake {
            None => "SELECT pepsi.workqueue_add($1, $2, $3, $4, $5, $6, $7::inet)",
            Some(_) => {
                "SELECT pepsi.workqueue_add($1, $2, $3, $4, $5, $6, $7::inet), pg_notify($8, $9)"
            }
        };
        let query = sqlx::query_scalar(sql)
            .bind(msg.mail_from)
            .bind(msg.rcpt_to)
            .bind(msg.headers)
            .bind(msg.body)
            .bind(msg.state)
            .bind(msg.auth_user)
            .bind(msg.client_addr.to_string());
        match wake {
            None => query,
            Some(stage) => query.bind(WORKQUEUE_CHANNEL).bind(stage),
        }
        .fetch_one(pool)
        .await
    })
    .await
}

/// Stores several messages with one `pepsi.workqueue_add_batch` call, in one transaction,
/// and returns their ids in order, after commit: all of them or (on an error) none.
pub async fn admit_batch(pool: &PgPool, msgs: &[Admission<'_>]) -> Result<Vec<i64>, sqlx::Error> {
    let mail_from: Vec<&str> = msgs.iter().map(|m| m.mail_from).collect();
    let rcpt_to: Vec<&str> = msgs
        .iter()
        .flat_map(|m| m.rcpt_to.iter().map(String::as_str))
        .collect();
    let rcpt_count: Vec<i32> = msgs
        .iter()
        .map(|m| i32::try_from(m.rcpt_to.len()).unwrap_or(i32::MAX))
        .collect();
    let headers: Vec<&[u8]> = msgs.iter().map(|m| m.headers).collect();
    let body: Vec<&[u8]> = msgs.iter().map(|m| m.body).collect();
    let state: Vec<serde_json::Value> = msgs.iter().map(|m| m.state.clone()).collect();
    let auth_user: Vec<Option<&str>> = msgs.iter().map(|m| m.auth_user).collect();
    let client_addr: Vec<String> = msgs.iter().map(|m| m.client_addr.to_string()).collect();
    with_retry(|| async {
        sqlx::query_scalar(
            "SELECT pepsi.workqueue_add_batch($1, $2, $3, $4, $5, $6, $7, $8::inet[])",
        )
        .bind(&mail_from)
        .bind(&rcpt_to)
        .bind(&rcpt_count)
        .bind(&headers)
        .bind(&body)
        .bind(&state)
        .bind(&auth_user)
        .bind(&client_addr)
        .fetch_one(pool)
        .await
    })
    .await
}

// ----- local submission ----------------------------------------------------------------
// pepsi-sendmail's one statement: `pepsi.sendmail_submit`, the SECURITY DEFINER function the
// sendmail role may execute and nothing else (procedures.sql, LOCAL SUBMISSION). The
// function validates what it is given and stores the row as the ingress does; it never
// notifies, so the caller wakes the dispatcher after it returns (`notify_workqueue`).

/// A message handed over by pepsi-sendmail, directly or from its drop directory.
#[derive(Debug)]
pub struct LocalSubmission<'a> {
    /// Empty for the null sender.
    pub mail_from: &'a str,
    pub rcpt_to: &'a [String],
    pub headers: &'a [u8],
    pub body: &'a [u8],
    /// `state.dsn` as the program read it from `-N`, `-R`, `-V` (or `MAIL`/`RCPT`
    /// parameters under `-bs`).
    pub dsn: &'a crate::state::Dsn,
    pub uid: u32,
    pub user: Option<&'a str>,
    pub via: crate::state::SubmissionVia,
    /// `sendmail:<spool file name>` for the pickup (at most once); None when direct.
    pub token: Option<&'a str>,
}

/// Stores the message; returns its `workqueue_id`, or None when `token` was used before
/// (the message was stored already). A refusal of the function (the message or envelope is
/// invalid) is a database error with SQLSTATE 22023 or 54000.
pub async fn sendmail_submit<'e, E>(
    executor: E,
    msg: &LocalSubmission<'_>,
) -> Result<Option<i64>, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    sqlx::query_scalar("SELECT pepsi.sendmail_submit($1, $2, $3, $4, $5, $6, $7, $8, $9)")
        .bind(msg.mail_from)
        .bind(msg.rcpt_to)
        .bind(msg.headers)
        .bind(msg.body)
        .bind(msg.dsn.to_value())
        .bind(i64::from(msg.uid))
        .bind(msg.user)
        .bind(msg.via.as_str())
        .bind(msg.token)
        .fetch_one(executor)
        .await
}

/// True when `err` is `pepsi.sendmail_submit` refusing what it was given (an invalid
/// envelope or message, 22023; too large, 54000), as opposed to a database that could not
/// be reached or is misconfigured.
pub fn is_submission_refused(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("22023" | "54000")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_that_name_their_host_are_told_apart() {
        for (url, named) in [
            ("postgres:///pepsi", false),
            ("postgresql://pepsi@/pepsi", false),
            ("postgres:///pepsi?sslmode=disable", false),
            ("postgres://localhost/pepsi", true),
            ("postgres://pepsi@127.0.0.1:5432/pepsi", true),
            ("postgres:///pepsi?host=/run/postgresql", true),
            ("postgres://[::1]/pepsi", true),
        ] {
            assert_eq!(url_names_host(url), named, "{url}");
        }
    }

    fn options_of(database: &str) -> Result<DbOptions, String> {
        let text = format!("[database]\nURL = postgres:///pepsi\n{database}\n");
        let cfg = Config::from_str_named(&text, "t.conf").map_err(|e| e.to_string())?;
        DbOptions::from_config(&cfg).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn a_worker_pool_is_sized_by_worker_connections_and_idle_connections_are_checked() {
        let o = options_of("").unwrap();
        assert_eq!(o.max_connections, 4);
        assert_eq!(o.idle_check, DEFAULT_IDLE_CHECK);
        assert_eq!(o.for_worker().max_connections, DEFAULT_WORKER_CONNECTIONS);
        let o = options_of("MAX_CONNECTIONS = 8\nWORKER_CONNECTIONS = 1\nIDLE_CHECK = 0").unwrap();
        assert_eq!(o.idle_check, Duration::ZERO);
        assert_eq!(o.max_connections, 8);
        assert_eq!(o.for_worker().max_connections, 1);
    }

    #[test]
    fn pool_options_out_of_range_are_refused_naming_the_option() {
        for (line, names) in [
            (
                "WORKER_CONNECTIONS = 0",
                "WORKER_CONNECTIONS = 0: must be 1 to 64",
            ),
            (
                "WORKER_CONNECTIONS = 65",
                "WORKER_CONNECTIONS = 65: must be 1 to 64",
            ),
            ("WORKER_CONNECTIONS = many", "WORKER_CONNECTIONS"),
            (
                "IDLE_CHECK = 2h",
                "IDLE_CHECK = 7200s: must be at most 3600s",
            ),
            ("IDLE_CHECK = soon", "IDLE_CHECK"),
        ] {
            let err = options_of(line).expect_err(line);
            assert!(err.contains(names), "{line}: {err}");
        }
    }
}
