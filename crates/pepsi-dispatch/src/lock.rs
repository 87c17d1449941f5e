//! The dispatcher lock, the epoch and the heartbeat (docs/ha.md).
//!
//! One dispatcher per database holds an advisory lock on a session of its own. Whoever takes
//! the lock registers a new epoch (`pepsi.dispatch_register`), which fences every earlier
//! one: the database then refuses anything an earlier dispatcher or its workers write to a
//! running row. A second dispatcher stands by, trying the lock every LOCK_CHECK_INTERVAL.
//!
//! The lock session is set to die with its heartbeat: the server ends it after
//! LOCK_SESSION_TIMEOUT without a statement (`idle_session_timeout`: a dispatcher hung,
//! stopped or cut off) or when TCP says the peer is gone (keepalives, `tcp_user_timeout`).
//! The holder beats every LOCK_CHECK_INTERVAL; once its heartbeat has failed for
//! LOCK_SESSION_TIMEOUT, or it learns it was fenced or lost the lock, it kills its workers
//! and exits. All of this runs on a thread of its own, so a busy dispatcher loop cannot
//! starve the heartbeat.
//!
//! In MODE shared every dispatcher registers at once (nothing is fenced), holding an
//! advisory lock of its own epoch on its heartbeat session; whichever holds the dispatcher
//! lock is the maintenance leader, and on each heartbeat it fences the members whose lock
//! nobody holds any more (their session is gone). A member whose session is lost exits.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sqlx::{ConnectOptions as _, PgConnection};

use crate::options::Mode;

/// The advisory lock key pair that makes the dispatcher one per database.
pub const LOCK_KEY: (i32, i32) = (0x7065_7073, 1);

/// The pids of this dispatcher's live workers, which the lock thread kills when the
/// dispatcher loses its lock.
pub type WorkerPids = Arc<Mutex<HashSet<u32>>>;

/// Set once the lock is lost for good: the loop writes nothing more about its workers.
static LOST: AtomicBool = AtomicBool::new(false);
/// Set by a clean shutdown just before it records this epoch as stopped: from then on a
/// heartbeat that finds the epoch gone from the members is this process's own doing, not a
/// takeover, and the lock thread beats no more instead of exiting with status 1.
static STOPPING: AtomicBool = AtomicBool::new(false);
/// This dispatcher does the maintenance (always in MODE single, once it holds the lock).
static LEADER: AtomicBool = AtomicBool::new(false);
/// Live dispatchers of this mode, as of the last heartbeat.
static MEMBERS: AtomicUsize = AtomicUsize::new(1);
/// How many of them registered before this one.
static RANK: AtomicUsize = AtomicUsize::new(0);

/// Whether this dispatcher does the maintenance: due requeues, garbage collection, VACUUM,
/// and returning the rows of fenced dispatchers.
pub fn is_leader() -> bool {
    LEADER.load(Ordering::Acquire)
}

/// How many dispatchers share the database (1 in MODE single), and how many of them
/// registered before this one.
pub fn members() -> (usize, usize) {
    (
        MEMBERS.load(Ordering::Acquire).max(1),
        RANK.load(Ordering::Acquire),
    )
}

/// Whether this dispatcher has lost its lock (it is about to exit).
pub fn lost() -> bool {
    LOST.load(Ordering::Acquire)
}

/// Called by a clean shutdown before it records the epoch as stopped (`pepsi.dispatcher.
/// stopped_at`), which ends its membership: the lock thread then stops beating, so the
/// process exits with the shutdown's status and not as a dispatcher that lost its lock.
pub fn stopping() {
    STOPPING.store(true, Ordering::SeqCst);
}

/// What the lock thread needs.
#[derive(Debug, Clone)]
pub struct LockOptions {
    pub url: String,
    /// `[database] SOCKET_DIR`, where a URL without a host finds the server.
    pub socket_dir: std::path::PathBuf,
    pub check: Duration,
    pub session_timeout: Duration,
    pub standby: bool,
    pub mode: Mode,
}

/// What taking the lock gave this dispatcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub epoch: i64,
    /// Earlier epochs whose dispatcher is known to be gone: on this host, its process no
    /// longer exists (so neither do its workers). Their running rows may be taken back now.
    pub gone: Vec<i64>,
}

/// Where this process runs, as `pepsi.dispatcher` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Whereabouts {
    pub host: String,
    pub boot_id: String,
    pub pid: u32,
    pub proc_start: u64,
}

impl Whereabouts {
    pub fn here() -> Self {
        let pid = std::process::id();
        Self {
            host: read_trimmed("/proc/sys/kernel/hostname"),
            boot_id: process_space(),
            pid,
            proc_start: proc_start(pid).unwrap_or(0),
        }
    }

    /// Whether the dispatcher recorded as `other` is known to be dead: it ran on this boot
    /// of this host in the same pid namespace (so this process sees its pids), and its
    /// process is gone (or the pid now belongs to another process). Where either space is
    /// unknown, nothing is known dead.
    pub fn knows_dead(&self, boot_id: &str, pid: u32, start: u64) -> bool {
        !self.boot_id.is_empty() && boot_id == self.boot_id && proc_start(pid) != Some(start)
    }
}

/// The space this process's pids live in: the kernel's boot id and the pid namespace (two
/// containers on one host share the first, not the second); empty when either is unknown.
/// Recorded as `pepsi.dispatcher.boot_id`.
fn process_space() -> String {
    let boot = read_trimmed("/proc/sys/kernel/random/boot_id");
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    if boot.is_empty() || ns.is_empty() {
        String::new()
    } else {
        format!("{boot} {ns}")
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// A live process's start time in clock ticks since boot (`None` when there is no such
/// process, or only its zombie).
fn proc_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start(&stat)
}

/// The start time field of a `/proc/PID/stat` line; `None` for a zombie.
fn parse_start(stat: &str) -> Option<u64> {
    // The command name is parenthesised and may hold anything: fields follow the last ')'.
    let after = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = after.split(' ').collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    // Field 22 of the line, the 20th after the command name.
    fields.get(19)?.parse().ok()
}

/// Starts the lock thread. The receiver gets the leadership once this dispatcher holds the
/// lock (after standing by as long as another one holds it), or why it cannot.
pub fn spawn(
    options: LockOptions,
    workers: WorkerPids,
) -> anyhow::Result<tokio::sync::oneshot::Receiver<anyhow::Result<Leadership>>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("lock".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(anyhow::anyhow!(
                        "cannot start the lock thread's runtime: {e}"
                    )));
                    return;
                }
            };
            runtime.block_on(async move {
                let acquired = match options.mode {
                    Mode::Single => acquire(&options).await,
                    Mode::Shared => join(&options).await,
                };
                let (conn, leadership) = match acquired {
                    Ok(got) => got,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let epoch = leadership.epoch;
                if tx.send(Ok(leadership)).is_err() {
                    return;
                }
                keep(conn, epoch, &options, &workers).await
            })
        })
        .context("cannot start the lock thread")?;
    Ok(rx)
}

/// The outcome of one try of the lock.
enum Attempt {
    Taken(PgConnection),
    /// Held by another session, described for people.
    Held(String, PgConnection),
}

/// Takes the lock, standing by while another dispatcher holds it (unless `standby` is
/// off), then registers this dispatcher's epoch.
async fn acquire(options: &LockOptions) -> anyhow::Result<(PgConnection, Leadership)> {
    let mut waiting: Option<PgConnection> = None;
    let mut announced = String::new();
    let mut conn = loop {
        let tried = match waiting.take() {
            Some(conn) => try_on(conn).await,
            None => attempt(options).await,
        };
        match tried {
            Ok(Attempt::Taken(mut conn)) => match active_elsewhere(&mut conn, options).await {
                Ok(None) => break conn,
                Ok(Some(epoch)) => {
                    // The holder's session ended (a PostgreSQL restart, a terminated
                    // backend) but its heartbeat is fresh: it is alive and retaking the
                    // lock. Give it back and go on waiting.
                    tracing::debug!(
                        epoch,
                        "the active dispatcher lost its session but beats: waiting"
                    );
                    let _ = sqlx::query("SELECT pg_advisory_unlock($1, $2)")
                        .bind(LOCK_KEY.0)
                        .bind(LOCK_KEY.1)
                        .execute(&mut conn)
                        .await;
                    waiting = Some(conn);
                }
                Err(e) => tracing::warn!(
                    "standing by: cannot read the active dispatcher's heartbeat: {e}"
                ),
            },
            Ok(Attempt::Held(holder, _)) if !options.standby => anyhow::bail!(
                "another dispatcher is already running on this database: {holder}; run exactly \
                 one per system, or set [pepsi-dispatch] STANDBY = yes to wait for it"
            ),
            Ok(Attempt::Held(holder, conn)) => {
                if holder != announced {
                    tracing::info!(
                        "standing by: {holder} is dispatching; taking over when its lock is released"
                    );
                    announced = holder;
                }
                waiting = Some(conn);
            }
            Err(e) if !options.standby => return Err(e),
            Err(e) => tracing::warn!("standing by: cannot try the dispatcher lock: {e:#}"),
        }
        tokio::time::sleep(options.check).await;
    };
    LEADER.store(true, Ordering::Release);
    let leadership = register(&mut conn, Mode::Single).await?;
    Ok((conn, leadership))
}

/// An unfenced, running MODE single dispatcher whose heartbeat is younger than
/// LOCK_SESSION_TIMEOUT and that is not known dead: one that may still retake its lock.
async fn active_elsewhere(
    conn: &mut PgConnection,
    options: &LockOptions,
) -> anyhow::Result<Option<i64>> {
    let fresh: Vec<(i64, String, i32, i64)> = sqlx::query_as(
        "SELECT epoch, boot_id, pid, proc_start FROM pepsi.dispatcher \
         WHERE mode = 'single' AND fenced_at IS NULL AND stopped_at IS NULL \
           AND seen_at > now() - make_interval(secs => $1)",
    )
    .bind(options.session_timeout.as_secs_f64())
    .fetch_all(&mut *conn)
    .await?;
    let here = Whereabouts::here();
    Ok(fresh.into_iter().find_map(|(epoch, boot, pid, start)| {
        let dead = here.knows_dead(
            &boot,
            u32::try_from(pid).unwrap_or(0),
            u64::try_from(start).unwrap_or(0),
        );
        (!dead).then_some(epoch)
    }))
}

/// MODE shared: registers at once on a session of its own.
async fn join(options: &LockOptions) -> anyhow::Result<(PgConnection, Leadership)> {
    let mut conn = connect(options).await?;
    let leadership = register(&mut conn, Mode::Shared).await?;
    // Know the other members before the first claim: PARALLELISM_SCOPE = global.
    beat(&mut conn, leadership.epoch).await?;
    Ok((conn, leadership))
}

/// Registers this dispatcher's epoch on `conn` (durably: the fence it sets must survive a
/// server crash) and finds the earlier ones known gone.
async fn register(conn: &mut PgConnection, mode: Mode) -> anyhow::Result<Leadership> {
    let here = Whereabouts::here();
    sqlx::query("SET synchronous_commit = on")
        .execute(&mut *conn)
        .await?;
    let epoch: i64 = sqlx::query_scalar("SELECT pepsi.dispatch_register($1, $2, $3, $4, $5)")
        .bind(&here.host)
        .bind(&here.boot_id)
        .bind(i32::try_from(here.pid).unwrap_or(i32::MAX))
        .bind(i64::try_from(here.proc_start).unwrap_or(0))
        .bind(mode.as_str())
        .fetch_one(&mut *conn)
        .await
        .context("cannot register this dispatcher (is the schema current? run pepsi-setup db)")?;
    sqlx::query("SET synchronous_commit = off")
        .execute(&mut *conn)
        .await?;
    let earlier: Vec<(i64, String, i32, i64)> = sqlx::query_as(
        "SELECT epoch, boot_id, pid, proc_start FROM pepsi.dispatcher \
         WHERE epoch < $1 AND stopped_at IS NULL ORDER BY epoch",
    )
    .bind(epoch)
    .fetch_all(&mut *conn)
    .await?;
    let gone = known_dead(&here, earlier);
    Ok(Leadership { epoch, gone })
}

/// The epochs among `recorded` (epoch, boot id, pid, start) whose process is known dead.
fn known_dead(here: &Whereabouts, recorded: Vec<(i64, String, i32, i64)>) -> Vec<i64> {
    recorded
        .into_iter()
        .filter(|(_, boot, pid, start)| {
            here.knows_dead(
                boot,
                u32::try_from(*pid).unwrap_or(0),
                u64::try_from(*start).unwrap_or(0),
            )
        })
        .map(|(e, ..)| e)
        .collect()
}

/// Connects a lock session and tries the lock once.
async fn attempt(options: &LockOptions) -> anyhow::Result<Attempt> {
    try_on(connect(options).await?).await
}

/// Tries the lock once on `conn`.
async fn try_on(mut conn: PgConnection) -> anyhow::Result<Attempt> {
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
        .bind(LOCK_KEY.0)
        .bind(LOCK_KEY.1)
        .fetch_one(&mut conn)
        .await?;
    if got {
        return Ok(Attempt::Taken(conn));
    }
    let holder = holder(&mut conn).await?;
    Ok(Attempt::Held(holder, conn))
}

/// A session whose server side dies with its heartbeat, named so that others can say who
/// holds the lock.
async fn connect(lock: &LockOptions) -> anyhow::Result<PgConnection> {
    let name = session_name();
    let options = pepsi_contract::db::pinned_options(&lock.url, &lock.socket_dir)
        .context("[database] URL is not a PostgreSQL URL")?;
    let timeout_ms = lock.session_timeout.as_millis().to_string();
    // Keepalives: a first probe after 1s of silence, then every second, 2 lost ones end it.
    let options = options.application_name(&name).options([
        ("idle_session_timeout", timeout_ms.as_str()),
        ("tcp_user_timeout", timeout_ms.as_str()),
        ("tcp_keepalives_idle", "1"),
        ("tcp_keepalives_interval", "1"),
        ("tcp_keepalives_count", "2"),
        ("client_connection_check_interval", "1000"),
        ("synchronous_commit", "off"),
    ]);
    tokio::time::timeout(lock.session_timeout, options.connect())
        .await
        .map_err(|_| anyhow::anyhow!("no connection within {:?}", lock.session_timeout))?
        .context("cannot connect to the database")
}

/// The name of this dispatcher's lock session, which a second one shows.
fn session_name() -> String {
    let here = Whereabouts::here();
    format!("pepsi-dispatch {} pid {}", here.host, here.pid)
}

/// Who holds the lock, for people: the session's name, server pid, address and start.
async fn holder(conn: &mut PgConnection) -> anyhow::Result<String> {
    let holder: Option<(i32, String, Option<String>, String)> = sqlx::query_as(
        "SELECT a.pid, a.application_name, a.client_addr::text, to_char(a.backend_start, 'YYYY-MM-DD HH24:MI:SS TZ') \
         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::int8::oid AND l.objid = $2::int8::oid \
           AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .bind(i64::from(LOCK_KEY.0))
    .bind(i64::from(LOCK_KEY.1))
    .fetch_optional(conn)
    .await?;
    Ok(match holder {
        Some((pid, app, addr, since)) => format!(
            "{} (server backend pid {pid}{}, since {since})",
            if app.is_empty() {
                "unnamed client".to_owned()
            } else {
                app
            },
            addr.map(|a| format!(", from {a}")).unwrap_or_default()
        ),
        None => "another session".to_owned(),
    })
}

/// One heartbeat: false once this epoch has been fenced.
async fn beat(conn: &mut PgConnection, epoch: i64) -> Result<bool, sqlx::Error> {
    let (members, rank): (i32, i32) =
        sqlx::query_as("SELECT members, rank FROM pepsi.dispatch_heartbeat($1)")
            .bind(epoch)
            .fetch_one(conn)
            .await?;
    if members > 0 {
        RANK.store(usize::try_from(rank).unwrap_or(0), Ordering::Release);
        MEMBERS.store(usize::try_from(members).unwrap_or(1), Ordering::Release);
    }
    Ok(members > 0)
}

/// Waits for ever: the lock thread of a dispatcher that is shutting down, whose process
/// exits on its own.
async fn idle() -> ! {
    loop {
        std::future::pending::<()>().await;
    }
}

/// Beats until the lock is lost for good, then kills the workers and exits the process.
async fn keep(
    mut conn: PgConnection,
    epoch: i64,
    options: &LockOptions,
    workers: &WorkerPids,
) -> ! {
    let mut last_ok = Instant::now();
    let mut takeovers = Takeovers::default();
    let mut backend = backend_pid(&mut conn).await;
    loop {
        tokio::time::sleep(options.check).await;
        if STOPPING.load(Ordering::SeqCst) {
            idle().await;
        }
        let left = options.session_timeout.saturating_sub(last_ok.elapsed());
        if left.is_zero() {
            lose(
                workers,
                &format!(
                    "no heartbeat for {:?} (the process was stopped or cut off): the server has \
                     ended the lock session and another dispatcher may have taken over",
                    options.session_timeout
                ),
            );
        }
        match tokio::time::timeout(left, beat(&mut conn, epoch)).await {
            Ok(Ok(true)) => {
                last_ok = Instant::now();
                if options.mode == Mode::Shared {
                    lead(&mut conn, &mut takeovers).await;
                }
                continue;
            }
            // The shutdown recorded this epoch as stopped while the beat ran.
            Ok(Ok(false)) if STOPPING.load(Ordering::SeqCst) => {
                idle().await;
            }
            Ok(Ok(false)) => lose(
                workers,
                &format!("epoch {epoch} was fenced: another dispatcher took over"),
            ),
            Ok(Err(e)) if options.mode == Mode::Shared => lose(
                workers,
                &format!("the session of this dispatcher's membership is lost ({e})"),
            ),
            Err(_) if options.mode == Mode::Shared => lose(
                workers,
                "the heartbeat of this dispatcher's membership got no answer",
            ),
            Ok(Err(e)) => tracing::warn!(
                "the connection holding the dispatcher lock is lost ({e}): taking the lock again"
            ),
            Err(_) => tracing::warn!(
                "the heartbeat on the dispatcher lock got no answer: taking the lock again"
            ),
        }
        // The old session may still hold the lock on the server: it is ended first.
        drop(conn);
        conn = retake(epoch, options, workers, last_ok, backend).await;
        backend = backend_pid(&mut conn).await;
        last_ok = Instant::now();
    }
}

/// Fenced members known dead whose rows are taken back once their workers have ended.
#[derive(Default)]
struct Takeovers {
    due: Vec<(Instant, i64)>,
}

/// MODE shared, after a heartbeat: takes the dispatcher lock (maintenance leadership) when
/// free; as leader, fences the members whose session is gone and takes back the rows of
/// those known dead, waking every dispatcher.
async fn lead(conn: &mut PgConnection, takeovers: &mut Takeovers) {
    if !is_leader() {
        match sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1, $2)")
            .bind(LOCK_KEY.0)
            .bind(LOCK_KEY.1)
            .fetch_one(&mut *conn)
            .await
        {
            Ok(true) => {
                LEADER.store(true, Ordering::Release);
                tracing::info!("this dispatcher leads the maintenance now");
            }
            Ok(false) => return,
            Err(e) => {
                tracing::warn!("cannot try the maintenance lock: {e}");
                return;
            }
        }
    }
    let fenced: Vec<(i64, String, i32, i64)> = match sqlx::query_as(
        "SELECT epoch, boot_id, pid, proc_start FROM pepsi.dispatch_fence_lost()",
    )
    .fetch_all(&mut *conn)
    .await
    {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("cannot fence lost dispatchers: {e}");
            return;
        }
    };
    if !fenced.is_empty() {
        let epochs: Vec<i64> = fenced.iter().map(|f| f.0).collect();
        let dead = known_dead(&Whereabouts::here(), fenced);
        tracing::warn!(
            ?epochs,
            known_dead = ?dead,
            "fenced dispatchers whose session is gone; the rows of those known dead run again \
             at once, the others' after MAX_RUNTIME and TAKEOVER_MARGIN"
        );
        let at = Instant::now() + WORKERS_END_WAIT;
        takeovers.due.extend(dead.into_iter().map(|e| (at, e)));
    }
    let now = Instant::now();
    let due: Vec<i64> = takeovers
        .due
        .iter()
        .filter(|(at, _)| *at <= now)
        .map(|(_, e)| *e)
        .collect();
    if due.is_empty() {
        return;
    }
    let taken: Result<i32, _> = sqlx::query_scalar("SELECT pepsi.dispatch_take_over($1)")
        .bind(&due)
        .fetch_one(&mut *conn)
        .await;
    match taken {
        Ok(n) => {
            takeovers.due.retain(|(_, e)| !due.contains(e));
            tracing::info!(rows = n, epochs = ?due, "rows of dead dispatchers are pending again");
            let _ = sqlx::query("SELECT pg_notify('workqueue', '')")
                .execute(&mut *conn)
                .await;
        }
        Err(e) => tracing::warn!("cannot take back the rows of dead dispatchers: {e}"),
    }
}

/// How long after a dispatcher is known dead its rows are taken back: a set-user-id
/// worker, which the parent-death signal does not reach, notices within its watchdog's
/// period (100 ms) that its dispatcher is gone and ends.
pub const WORKERS_END_WAIT: Duration = Duration::from_millis(500);

/// Takes the lock again on a new session before LOCK_SESSION_TIMEOUT has passed since the
/// last heartbeat, as long as this epoch is not fenced; otherwise loses it.
async fn retake(
    epoch: i64,
    options: &LockOptions,
    workers: &WorkerPids,
    last_ok: Instant,
    old_backend: Option<i32>,
) -> PgConnection {
    let mut held_by: Option<String> = None;
    loop {
        let left = options.session_timeout.saturating_sub(last_ok.elapsed());
        if left.is_zero() {
            lose(
                workers,
                &match &held_by {
                    Some(holder) => {
                        format!("lost the dispatcher lock to another dispatcher: {holder}")
                    }
                    None => format!(
                        "the dispatcher lock could not be taken again within {:?}",
                        options.session_timeout
                    ),
                },
            );
        }
        let attempt = async {
            let mut conn = connect(options).await?;
            if let Some(old) = old_backend {
                // Our own old session, if the server still has it, holds the lock (checked
                // by its name: the pid may belong to another session by now).
                sqlx::query(
                    "SELECT pg_terminate_backend(pid, 1000) FROM pg_stat_activity \
                     WHERE pid = $1 AND application_name = $2",
                )
                .bind(old)
                .bind(session_name())
                .execute(&mut conn)
                .await?;
            }
            try_on(conn).await
        };
        match tokio::time::timeout(left, attempt).await {
            Ok(Ok(Attempt::Taken(mut conn))) => match beat(&mut conn, epoch).await {
                Ok(true) => {
                    tracing::info!("dispatcher lock taken again");
                    return conn;
                }
                Ok(false) => lose(
                    workers,
                    &format!(
                        "lost the dispatcher lock to another dispatcher: epoch {epoch} was fenced"
                    ),
                ),
                Err(e) => tracing::warn!("cannot take the dispatcher lock again yet: {e}"),
            },
            Ok(Ok(Attempt::Held(holder, mut conn))) => {
                // Another session holds it: lost for good once this epoch is fenced (a
                // standby took over); until the deadline it may be a session of ours
                // that the server has not ended yet.
                if fenced(&mut conn, epoch).await.unwrap_or(false) {
                    lose(
                        workers,
                        &format!("lost the dispatcher lock to another dispatcher: {holder}"),
                    );
                }
                held_by = Some(holder);
            }
            Ok(Err(e)) => tracing::warn!("cannot take the dispatcher lock again yet: {e:#}"),
            Err(_) => {}
        }
        tokio::time::sleep(options.check).await;
    }
}

/// The server process of `conn`'s session.
async fn backend_pid(conn: &mut PgConnection) -> Option<i32> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .ok()
}

/// Whether `epoch` has been fenced.
async fn fenced(conn: &mut PgConnection, epoch: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pepsi.epoch_fenced($1)")
        .bind(epoch)
        .fetch_one(conn)
        .await
}

/// Kills every worker at once and exits: nothing they still do may count, and a dispatcher
/// that took over (or will) handles their rows.
fn lose(workers: &WorkerPids, why: &str) -> ! {
    LOST.store(true, Ordering::Release);
    let pids: Vec<u32> = workers
        .lock()
        .map(|w| w.iter().copied().collect())
        .unwrap_or_default();
    for pid in &pids {
        if let Ok(pid) = libc::pid_t::try_from(*pid) {
            // SAFETY: a signal to a child this process started and has not reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    tracing::error!(workers = pids.len(), "{why}: workers killed, exiting");
    eprintln!(
        "pepsi-dispatch: {why}: {} workers killed, exiting",
        pids.len()
    );
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_read_after_the_command_name() {
        let line =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start(line), Some(987_654));
        let zombie = "4242 (x) Z 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 0 0";
        assert_eq!(parse_start(zombie), None);
        assert_eq!(parse_start("garbage"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_pid_with_another_start_is_not() {
        let here = Whereabouts::here();
        assert!(here.proc_start > 0);
        assert!(!here.knows_dead(&here.boot_id, here.pid, here.proc_start));
        assert!(here.knows_dead(&here.boot_id, here.pid, here.proc_start + 1));
        // Another host's (or boot's) dispatcher is never known dead.
        assert!(!here.knows_dead("another boot", 999_999_999, 1));
    }
}
