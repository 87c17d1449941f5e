//! The coordinator's loop: wake on notifications, status lines and timers; requeue paused
//! rows that are due; claim for every stage that may have pending rows and has spare
//! capacity, in one statement; pack the claimed ids onto the fewest workers; pass a row a
//! worker advanced and handed forward (`HAND_FORWARD`) straight to its next stage's pool;
//! recover from crashes and hangs; keep statistics.
//!
//! It never looks at message content: workers record their own outcomes on the row.

use pepsi_contract::telemetry::CountersRecord;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use sqlx::PgPool;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use pepsi_conf::config::{Config, Scope};
use pepsi_contract::overlay::DbOverlay;

use crate::Event;
use crate::claim::{self, Claimed, Forced, Want};
use crate::fair::FairShare;
use crate::lock::{self, Leadership, WorkerPids};
use crate::options::{DispatchOptions, Mode, PoolOptions, local_parallelism, resolve_program};
use crate::stats::Stats;
use crate::status::{self, Status};
use crate::worker::{Assigned, Worker};

/// Pause before a temporarily failed message is tried again.
const TEMPORARY_RETRY_SECS: u32 = 60;

/// One stage's pool state beyond its options.
struct Pool {
    options: PoolOptions,
    program: PathBuf,
    /// No spawning before this (the PROGRAM could not start).
    cooldown_until: Option<Instant>,
    /// The start failure was logged; not again until a start succeeds.
    failure_logged: bool,
    fair: FairShare,
    /// Pending rows may wait at this stage: claim for it when it has room. Set by whatever
    /// may make rows pending (a wake-up, a status line that does not say it left none, a
    /// hand-back, a due requeue, the heartbeat) and by a claim that filled what it asked;
    /// cleared by a claim that found fewer rows than it asked for.
    maybe_pending: bool,
    /// A row handed forward found no room here and went back to pending (or a claimed
    /// suspect found no idle worker): until a claim finds the stage's pending rows
    /// exhausted, every row handed forward goes back to pending too, so none overtakes the
    /// rows already waiting and the workers' room goes to the claims.
    backlog: bool,
    /// Rows handed forward here while no worker had room and none waited here as pending
    /// (`HOLD_FORWARD`): running, claimed by this dispatcher, each given to the next worker
    /// with room, in the order they came, before the stage claims anything.
    held: VecDeque<Assigned>,
}

/// Fewer rows claimed than this since the last VACUUM leave too little behind to start one.
const VACUUM_MIN_ROWS: u64 = 100;

pub struct Dispatcher {
    db: PgPool,
    file_cfg: Config,
    options: DispatchOptions,
    config_path: PathBuf,
    log_level: String,
    own_dir: Option<PathBuf>,
    pools: BTreeMap<String, Pool>,
    workers: HashMap<u64, Worker>,
    next_key: u64,
    events: UnboundedSender<Event>,
    stats: Stats,
    last_heartbeat: Instant,
    last_flush: Instant,
    last_gc: Instant,
    last_vacuum: Instant,
    /// Rows claimed since the last VACUUM began (each leaves dead row versions behind).
    claimed_since_vacuum: u64,
    /// A VACUUM is running on a connection of its own.
    vacuuming: Arc<AtomicBool>,
    /// Whether the role may vacuum the queue tables (asked before the first VACUUM).
    may_vacuum: Option<bool>,
    next_due: Option<Instant>,
    stopping: bool,
    /// Ids whose worker died while holding several: each is sent alone until answered.
    suspects: HashSet<i64>,
    /// Rows handed forward to a stage without room: back to pending, together, before the
    /// next claim.
    overflow: Vec<i64>,
    /// This dispatcher's epoch, and the earlier ones known gone.
    leadership: Leadership,
    /// The pids of live workers, for the lock thread to kill if the lock is lost.
    worker_pids: WorkerPids,
    /// What a changed configuration's stage graph is judged by, as the one at start was.
    tables: &'static pepsi_stage_validate::Tables,
    /// Where the span of a pass cut short goes (`[pepsi-telemetry-client] SOCKET`).
    telemetry: Arc<pepsi_contract::telemetry::Emitter>,
}

/// What the dispatcher keeps of how it was started: the log level its workers get, and the
/// tables a changed configuration's stage graph is judged by.
pub struct Started {
    pub log_level: String,
    pub tables: &'static pepsi_stage_validate::Tables,
}

impl Dispatcher {
    pub fn new(
        db: PgPool,
        file_cfg: Config,
        cfg: &Config,
        started: Started,
        events: UnboundedSender<Event>,
        leadership: Leadership,
        worker_pids: WorkerPids,
    ) -> anyhow::Result<Self> {
        let Started { log_level, tables } = started;
        let options = DispatchOptions::from_config(cfg)?;
        let own_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        let config_path = std::fs::canonicalize(file_cfg.file())
            .unwrap_or_else(|_| file_cfg.file().to_path_buf());
        let now = Instant::now();
        let mut d = Dispatcher {
            db,
            file_cfg,
            options,
            config_path,
            log_level,
            own_dir,
            pools: BTreeMap::new(),
            workers: HashMap::new(),
            next_key: 1,
            events,
            stats: Stats::default(),
            last_heartbeat: now,
            last_flush: now,
            last_gc: now,
            last_vacuum: now,
            claimed_since_vacuum: 0,
            vacuuming: Arc::new(AtomicBool::new(false)),
            may_vacuum: None,
            next_due: Some(now),
            stopping: false,
            suspects: HashSet::new(),
            overflow: Vec::new(),
            leadership,
            worker_pids,
            tables,
            telemetry: Arc::new(pepsi_contract::telemetry::Emitter::from_config(cfg)?),
        };
        d.apply_pools(cfg)?;
        d.wake_all();
        if d.pools.is_empty() {
            anyhow::bail!(
                "{}: no [stage-*] section names a PROGRAM: nothing to dispatch",
                d.config_path.display()
            );
        }
        Ok(d)
    }

    fn apply_pools(&mut self, cfg: &Config) -> anyhow::Result<()> {
        let now = Instant::now();
        let mut pools = BTreeMap::new();
        for options in PoolOptions::all(cfg)? {
            let program = resolve_program(
                &options.program,
                self.options.libexec_dir.as_deref(),
                self.own_dir.as_deref(),
            );
            let (fair, held) = match self.pools.remove(&options.stage) {
                Some(old) => (old.fair, old.held),
                None => (
                    FairShare::new(self.options.fair_half_life, now),
                    VecDeque::new(),
                ),
            };
            pools.insert(
                options.stage.clone(),
                Pool {
                    options,
                    program,
                    cooldown_until: None,
                    failure_logged: false,
                    fair,
                    maybe_pending: true,
                    backlog: true,
                    held,
                },
            );
        }
        // A stage no longer in the configuration: what waited for its workers goes back to
        // pending there, for whichever configuration runs it again.
        for old in std::mem::replace(&mut self.pools, pools).into_values() {
            self.overflow.extend(old.held.into_iter().map(|a| a.id));
        }
        Ok(())
    }

    /// Something may have made rows pending at any stage.
    fn wake_all(&mut self) {
        for pool in self.pools.values_mut() {
            pool.maybe_pending = true;
        }
    }

    /// Rows may have become pending at `stage` alone (a wake-up naming it). A stage without
    /// a pool of that name (in any letter case) is answered as a wake-up naming none.
    fn wake(&mut self, stage: &pepsi_conf::config::StageName) {
        match self
            .pools
            .iter_mut()
            .find(|(name, _)| name.eq_ignore_ascii_case(stage))
        {
            Some((_, pool)) => pool.maybe_pending = true,
            None => self.wake_all(),
        }
    }

    fn wants_claim(&self) -> bool {
        self.pools.values().any(|p| p.maybe_pending)
    }

    /// Runs until SIGINT/SIGTERM.
    pub async fn run(&mut self, mut rx: UnboundedReceiver<Event>) -> anyhow::Result<()> {
        let mut sigterm =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
        if !self.leadership.gone.is_empty() {
            // Their workers end within a watchdog period of their dispatcher (docs/ha.md).
            tokio::time::sleep(lock::WORKERS_END_WAIT).await;
        }
        let orphans = claim::take_over(&self.db, &self.leadership.gone).await?;
        if orphans > 0 {
            tracing::info!(
                rows = orphans,
                "rows left running by a previous dispatcher are pending again"
            );
        }
        tracing::info!(
            stages = ?self.pools.keys().collect::<Vec<_>>(),
            config = %self.config_path.display(),
            "dispatching"
        );
        loop {
            let deadline = self.next_deadline();
            tokio::select! {
                ev = rx.recv() => {
                    if let Some(ev) = ev { self.handle(ev).await; }
                    while let Ok(ev) = rx.try_recv() { self.handle(ev).await; }
                }
                _ = tokio::time::sleep_until(deadline.into()) => {}
                _ = sigterm.recv() => { tracing::info!("SIGTERM: stopping"); break; }
                _ = sigint.recv() => { tracing::info!("SIGINT: stopping"); break; }
            }
            self.housekeeping().await;
            self.feed_held().await;
            if !self.overflow.is_empty() {
                let back = std::mem::take(&mut self.overflow);
                self.hand_back("", &back).await;
            }
            if self.wants_claim() {
                self.claim_round().await;
            }
            // After the claim, so that a status line or a wake-up is answered by a claim
            // without first waiting for a statistics commit.
            self.bookkeeping().await;
        }
        self.shutdown(&mut rx).await
    }

    fn next_deadline(&self) -> Instant {
        let mut at = self.last_heartbeat + self.options.poll_interval;
        if !self.stats.is_empty() {
            // An idle pipeline's statistics (and a kill or crash) go out once
            // STATS_IDLE_INTERVAL has passed.
            at = at.min(self.last_flush + self.options.stats_idle_interval);
        }
        if let Some(due) = self.next_due {
            at = at.min(due);
        }
        for w in self.workers.values() {
            let pool = self.pools.get(&w.stage);
            if let (Some(started), Some(pool)) = (w.head_started, pool) {
                at = at.min(started + pool.options.max_runtime);
            }
            if w.inflight.is_empty()
                && !w.retiring
                && let Some(pool) = pool
            {
                at = at.min(w.idle_since + pool.options.idle_timeout);
            }
        }
        at.max(Instant::now() + Duration::from_millis(1))
    }

    async fn handle(&mut self, ev: Event) {
        match ev {
            Event::Wake(None) => self.wake_all(),
            Event::Wake(Some(stage)) => self.wake(&stage),
            Event::ConfigChanged => self.reload().await,
            Event::Line { worker, line } => self.answered(worker, &line).await,
            Event::Eof { worker } => self.exited(worker).await,
        }
    }

    /// The configuration overlay changed: re-read it and retire every worker, so their
    /// replacements start with the new values.
    async fn reload(&mut self) {
        let fresh = match Config::load(&self.config_path) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(
                    "configuration changed but cannot be re-read, keeping the old one: {e}"
                );
                return;
            }
        };
        let cfg = match fresh.with_db_overlay(&self.db, &Scope::Global).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(
                    "configuration overlay cannot be read, keeping the old configuration: {e}"
                );
                return;
            }
        };
        // A graph that would strand mail is not taken up; the running one stays.
        if let Err(e) = crate::check_graph(&cfg, self.tables) {
            tracing::error!("configuration changed but is invalid, keeping the old one: {e:#}");
            return;
        }
        match DispatchOptions::from_config(&cfg)
            .map_err(anyhow::Error::from)
            .and_then(|s| {
                self.options = s;
                self.apply_pools(&cfg)
            }) {
            Ok(()) => {
                self.file_cfg = fresh;
                for w in self.workers.values_mut() {
                    w.retire();
                }
                tracing::info!(
                    workers = self.workers.len(),
                    "configuration changed: workers retired"
                );
                self.wake_all();
            }
            Err(e) => {
                tracing::error!("configuration changed but is invalid, keeping the old one: {e:#}")
            }
        }
    }

    async fn answered(&mut self, key: u64, line: &str) {
        let now = Instant::now();
        let Some(w) = self.workers.get_mut(&key) else {
            return;
        };
        let Some(row) = w.inflight.pop_front() else {
            tracing::warn!(stage = %w.stage, pid = w.pid, line, "worker answered without a message; stopping it");
            let _ = w.child.start_kill();
            return;
        };
        self.suspects.remove(&row.id);
        let took = w.head_started.map(|s| now - s).unwrap_or_default();
        w.head_started = if w.inflight.is_empty() {
            None
        } else {
            Some(now)
        };
        w.answered += 1;
        if w.inflight.is_empty() {
            w.idle_since = now;
        }
        let stage = w.stage.clone();
        let pid = w.pid;
        if let Some(max) = self.pools.get(&stage).map(|p| p.options.max_messages)
            && max > 0
            && w.handed >= max
            && !w.retiring
        {
            tracing::debug!(stage = %stage, pid, handled = w.handed, "MAX_MESSAGES reached: recycling the worker");
            w.retire();
        }
        if let Some(pool) = self.pools.get_mut(&stage) {
            pool.fair.charge(&row.sender, took, now);
        }
        match status::parse(line) {
            Status::Done {
                finished,
                fused,
                handed,
                settled,
            } => {
                self.stats.pass(&stage, took, finished);
                for (s, ms) in fused {
                    self.stats.fused(&s, ms);
                }
                if let Some(next) = handed {
                    self.forward(
                        &next,
                        Assigned {
                            id: row.id,
                            sender: row.sender,
                        },
                    )
                    .await;
                }
                if !settled {
                    self.wake_all();
                }
            }
            Status::Failed {
                error,
                temporary,
                misplaced,
            } => {
                let reason = format!("stage {stage} (pid {pid}): {error}");
                let forced = if temporary {
                    Forced::Retry(TEMPORARY_RETRY_SECS)
                } else {
                    Forced::Failed
                };
                tracing::warn!(id = row.id, stage = %stage, temporary, misplaced, "message not handled: {error}");
                if self.held_elsewhere(row.id) {
                    // Claimed again and given to another worker while this one ran (its
                    // claim lost with an asynchronous commit when PostgreSQL restarted):
                    // that worker's pass concludes the row, this one's failure is not its.
                    self.suspects.remove(&row.id);
                    tracing::info!(
                        id = row.id,
                        stage = %stage,
                        "another worker holds the message: left to it"
                    );
                } else if misplaced {
                    self.return_misplaced(row.id, &stage, forced, &reason).await;
                } else {
                    self.force(row.id, &stage, forced, &reason).await;
                }
                self.wake_all();
            }
        }
    }

    /// A row a worker advanced and left running at `stage`: to a worker of that stage with
    /// room (starting one if the pool may). A stage without room waits in `held`, behind
    /// the rows already there, while it has fewer than `HOLD_FORWARD` and no row waits
    /// there as pending (`backlog`). Otherwise it goes back to pending, to be claimed in
    /// its turn; so does a row for a stage without a pool or one whose program cannot
    /// start now, and every row while stopping.
    async fn forward(&mut self, stage: &str, row: Assigned) {
        let hold = self.options.hold_forward;
        let now = Instant::now();
        let target = match self.pools.get(stage) {
            Some(pool) if !self.stopping && !pool.backlog && pool.held.is_empty() => {
                self.place(stage, false)
            }
            _ => None,
        };
        match (target, self.pools.get_mut(stage)) {
            (Some(key), _) => {
                tracing::trace!(stage, id = row.id, "handed forward");
                self.give(key, stage, row, now).await;
            }
            (None, Some(pool))
                if !self.stopping
                    && !pool.backlog
                    && pool.held.len() < hold
                    && pool.cooldown_until.is_none_or(|c| now >= c) =>
            {
                tracing::debug!(
                    stage,
                    id = row.id,
                    held = pool.held.len() + 1,
                    "handed forward to a stage without room: held"
                );
                pool.held.push_back(row);
            }
            (None, Some(pool)) if !self.stopping => {
                tracing::debug!(
                    stage,
                    id = row.id,
                    "handed forward to a stage without room: pending"
                );
                pool.maybe_pending = true;
                pool.backlog = true;
                self.overflow.push(row.id);
            }
            (None, _) => self.hand_back(stage, &[row.id]).await,
        }
    }

    /// Gives the rows each stage holds (`held`) to its workers with room, oldest first,
    /// starting workers as the pool may. A stage whose program cannot start now returns
    /// what it holds to pending, where the claims take it once the program starts.
    async fn feed_held(&mut self) {
        if self.stopping {
            return;
        }
        let stages: Vec<String> = self
            .pools
            .iter()
            .filter(|(_, p)| !p.held.is_empty())
            .map(|(s, _)| s.clone())
            .collect();
        for stage in stages {
            let now = Instant::now();
            while !self.pools[&stage].held.is_empty() {
                let Some(key) = self.place(&stage, false) else {
                    break;
                };
                let pool = self.pools.get_mut(&stage).expect("stage exists");
                let row = pool.held.pop_front().expect("not empty");
                tracing::trace!(stage = %stage, id = row.id, "held row handed forward");
                self.give(key, &stage, row, now).await;
            }
            let pool = self.pools.get_mut(&stage).expect("stage exists");
            if !pool.held.is_empty() && pool.cooldown_until.is_some_and(|c| now < c) {
                self.overflow.extend(pool.held.drain(..).map(|a| a.id));
                pool.maybe_pending = true;
                pool.backlog = true;
            }
        }
    }

    /// The ids every stage holds for its workers (`held`).
    fn held_ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.pools
            .values()
            .flat_map(|p| p.held.iter().map(|a| a.id))
    }

    /// The stage a repair must still find the rows at: only when another worker holds one
    /// of them (a pass committed its advance and the row was claimed again before its
    /// worker's answer was read). Otherwise the row is this dispatcher's to repair wherever
    /// its pass left it (a fused chain moves the row's stage as it goes).
    fn stage_guard<'s>(&self, stage: &'s str, ids: &[i64]) -> Option<&'s str> {
        let held = self
            .workers
            .values()
            .any(|w| w.inflight.iter().any(|a| ids.contains(&a.id)));
        held.then_some(stage)
    }

    /// Whether a worker holds `id` (in its queue, the one that answered for it excluded, as
    /// its answer has been taken off), it waits for one (`held`), or it waits to go back to
    /// pending (`overflow`).
    fn held_elsewhere(&self, id: i64) -> bool {
        self.overflow.contains(&id)
            || self.held_ids().any(|h| h == id)
            || self
                .workers
                .values()
                .any(|w| w.inflight.iter().any(|a| a.id == id))
    }

    /// A row whose worker answered that it was not as handed (`misplaced`: gone, not
    /// running for this epoch, or at a stage of another program), held by no other worker.
    /// Still running at the worker's own stage it ends as `forced` (the worker's
    /// configuration names another program for that stage: a real error). Running anywhere
    /// else it goes back to pending there, to run again from what was stored: PostgreSQL
    /// lost, in a crash, the asynchronous commit of the advance that handed it to this
    /// stage, or answered a commit it had made only after restarting. Not running, it is
    /// left as it is.
    async fn return_misplaced(&mut self, id: i64, stage: &str, forced: Forced, reason: &str) {
        self.suspects.remove(&id);
        match claim::force(&self.db, id, Some(stage), forced, reason).await {
            Ok(true) if forced != Forced::Retry(TEMPORARY_RETRY_SECS) => self.stats.failed(),
            Ok(true) => {}
            Ok(false) => match claim::hand_back(&self.db, None, &[id]).await {
                Ok(n) if n > 0 => tracing::info!(
                    id,
                    stage,
                    "the message was not where its worker was handed it: pending at the stage the database has"
                ),
                Ok(_) => {}
                Err(e) => tracing::error!(id, "cannot return the message to pending: {e}"),
            },
            Err(e) => tracing::error!(id, stage, "cannot record the failure of the message: {e}"),
        }
        if let Forced::Retry(secs) = forced {
            let due = Instant::now() + Duration::from_secs(u64::from(secs));
            self.next_due = Some(self.next_due.map_or(due, |d| d.min(due)));
        }
    }

    async fn force(&mut self, id: i64, stage: &str, forced: Forced, reason: &str) {
        self.suspects.remove(&id);
        let guard = self.stage_guard(stage, &[id]);
        match claim::force(&self.db, id, guard, forced, reason).await {
            Ok(true) if forced != Forced::Retry(TEMPORARY_RETRY_SECS) => self.stats.failed(),
            Ok(_) => {}
            Err(e) => tracing::error!(id, stage, "cannot record the failure of the message: {e}"),
        }
        if let Forced::Retry(secs) = forced {
            let due = Instant::now() + Duration::from_secs(u64::from(secs));
            self.next_due = Some(self.next_due.map_or(due, |d| d.min(due)));
        }
    }

    /// Ends `id` as `forced` after its worker died, or was killed, holding it alone: unless
    /// the pass had already moved it on. A row found running at a stage other than the
    /// worker's (handed forward by a commit whose status line never came, or flushed there by
    /// a fused chain) goes back to pending there, to run again from what was stored.
    ///
    /// `cut`, the pass as the dispatcher saw it run, is told to the telemetry client only
    /// when the row is found still running there: a pass that had committed before its worker
    /// went was not cut short.
    async fn end_lost_pass(
        &mut self,
        id: i64,
        stage: &str,
        forced: Forced,
        reason: &str,
        cut: Option<crate::interrupted::Interrupted>,
    ) {
        if self.held_elsewhere(id) {
            // Another worker holds it: it moved on and was taken again (or claimed again
            // after PostgreSQL lost this worker's claim in a crash); nothing to end.
            self.suspects.remove(&id);
            self.wake_all();
            return;
        }
        self.suspects.remove(&id);
        match claim::force(&self.db, id, Some(stage), forced, reason).await {
            Ok(true) => {
                self.stats.failed();
                if let Some(cut) = cut {
                    crate::interrupted::report(&self.db, &self.telemetry, cut);
                }
            }
            Ok(false) => match claim::hand_back(&self.db, None, &[id]).await {
                Ok(n) if n > 0 => tracing::info!(
                    id,
                    stage,
                    "the message had moved on to its next stage before its worker ended: pending there"
                ),
                Ok(_) => {}
                Err(e) => tracing::error!(id, "cannot return the message to pending: {e}"),
            },
            Err(e) => tracing::error!(id, stage, "cannot record the failure of the message: {e}"),
        }
        self.wake_all();
    }

    /// A worker's stdout closed: it exited, or is about to.
    async fn exited(&mut self, key: u64) {
        if lock::lost() {
            // The lock thread killed every worker and is ending the process: the rows they
            // held are for the dispatcher that takes over.
            return;
        }
        let Some(mut w) = self.workers.remove(&key) else {
            return;
        };
        let status = match tokio::time::timeout(Duration::from_secs(5), w.child.wait()).await {
            Ok(Ok(s)) => Some(s),
            _ => {
                let _ = w.child.kill().await;
                None
            }
        };
        self.forget_pid(w.pid);
        let described = match status {
            Some(s) => describe(s),
            None => "closed its output and did not exit".to_owned(),
        };
        let stage = w.stage.clone();
        let rest: Vec<i64> = w.inflight.iter().map(|a| a.id).collect();
        if w.killed {
            // Killed for a hung message, already ended as `timeout`: the rest never started.
            self.hand_back(&stage, &rest).await;
            return;
        }
        let could_not_start = w.answered == 0 && status.is_some_and(|s| s.code() == Some(1));
        let own_limit =
            status.and_then(|s| s.code()) == Some(pepsi_contract::epoch::PASS_LIMIT_EXIT);
        if rest.is_empty() {
            if !w.retiring || !status.is_some_and(|s| s.success()) {
                tracing::warn!(stage = %stage, pid = w.pid, "worker {described}");
                // Between two messages too, a worker that dies unasked is a crash (a kill -9
                // of an idle worker counted nowhere before).
                if own_limit {
                    self.stats.kill(&stage);
                } else if !could_not_start {
                    self.stats.crash(&stage);
                }
            } else {
                tracing::debug!(stage = %stage, pid = w.pid, "worker stopped");
            }
            self.wake_all();
            return;
        }
        if could_not_start {
            // It exited with the error status before answering anything: the program cannot
            // start (configuration, database). Hold the stage off and keep its messages.
            if let Some(pool) = self.pools.get_mut(&stage) {
                pool.cooldown_until = Some(Instant::now() + self.options.spawn_cooldown);
                if !pool.failure_logged {
                    tracing::error!(stage = %stage, program = %pool.program.display(),
                        "stage program {described} before handling anything; holding the stage off for {:?} (see its error above)",
                        self.options.spawn_cooldown);
                    pool.failure_logged = true;
                }
            }
            self.hand_back(&stage, &rest).await;
            return;
        }
        if own_limit {
            // Its own watchdog ended the pass past MAX_RUNTIME: a kill, as when this
            // dispatcher kills it.
            self.stats.kill(&stage);
        } else {
            self.stats.crash(&stage);
        }
        if rest.len() > 1 && !self.suspects.contains(&rest[0]) {
            // A worker may work on several of its ids at once (a body-free stage batches):
            // which one killed it is not known. None is failed; each runs again alone, so
            // the next crash names it.
            tracing::error!(stage = %stage, pid = w.pid, ids = ?rest,
                "worker {described} while holding several messages; each runs again alone");
            self.suspects.extend(rest.iter().copied());
            if let Some(started) = w.head_started {
                // The one it was surely on: the head of its queue.
                crate::interrupted::report(
                    &self.db,
                    &self.telemetry,
                    crate::interrupted::Interrupted {
                        id: rest[0],
                        stage: stage.clone(),
                        program: self.program_of(&stage),
                        pid: w.pid,
                        started,
                        reason: format!("worker {described} while holding several messages"),
                    },
                );
            }
            self.hand_back(&stage, &rest).await;
            return;
        }
        let head = rest[0];
        let program = self.program_of(&stage);
        let reason = format!(
            "worker {program} (pid {}) of stage {stage} {described} while handling the message",
            w.pid
        );
        let forced = if own_limit {
            // It ended the pass itself past MAX_RUNTIME (its watchdog): a timeout, as when
            // this dispatcher kills it.
            Forced::Timeout
        } else {
            Forced::Failed
        };
        tracing::error!(id = head, stage = %stage, pid = w.pid, "worker {described} while handling a message");
        let cut = w
            .head_started
            .map(|started| crate::interrupted::Interrupted {
                id: head,
                stage: stage.clone(),
                program: program.clone(),
                pid: w.pid,
                started,
                reason: reason.clone(),
            });
        self.end_lost_pass(head, &stage, forced, &reason, cut).await;
        self.hand_back(&stage, &rest[1..]).await;
    }

    /// The program a stage's pool runs (empty when the stage has no pool now).
    fn program_of(&self, stage: &str) -> String {
        self.pools
            .get(stage)
            .map(|p| p.options.program.clone())
            .unwrap_or_default()
    }

    async fn hand_back(&mut self, stage: &str, ids: &[i64]) {
        if ids.is_empty() {
            return;
        }
        let guard = self.stage_guard(stage, ids);
        if let Err(e) = claim::hand_back(&self.db, guard, ids).await {
            tracing::error!(
                stage,
                "cannot return {} messages to pending: {e}",
                ids.len()
            );
        }
        self.wake_all();
    }

    async fn housekeeping(&mut self) {
        let now = Instant::now();
        // Hung messages: kill the worker; the message ends as `timeout`.
        let mut hung = Vec::new();
        let mut killed_holding: Vec<(String, Vec<i64>)> = Vec::new();
        for w in self.workers.values_mut() {
            let Some(pool) = self.pools.get(&w.stage) else {
                continue;
            };
            if let Some(started) = w.head_started {
                let ambiguous = w.inflight.len() > 1
                    && w.inflight
                        .front()
                        .is_some_and(|a| !self.suspects.contains(&a.id));
                if now >= started + pool.options.max_runtime && ambiguous {
                    // As for a crash: the worker may be on any of the ids it holds.
                    let _ = w.child.start_kill();
                    w.retire();
                    w.killed = true;
                    w.head_started = None;
                    let ids: Vec<i64> = w.inflight.iter().map(|a| a.id).collect();
                    tracing::error!(stage = %w.stage, pid = w.pid, ?ids, limit = ?pool.options.max_runtime,
                        "no answer within MAX_RUNTIME while holding several messages: worker killed; each runs again alone");
                    killed_holding.push((w.stage.clone(), ids));
                } else if now >= started + pool.options.max_runtime
                    && let Some(row) = w.inflight.pop_front()
                {
                    let _ = w.child.start_kill();
                    w.retire();
                    w.killed = true;
                    w.head_started = None;
                    let cut = crate::interrupted::Interrupted {
                        id: row.id,
                        stage: w.stage.clone(),
                        program: pool.options.program.clone(),
                        pid: w.pid,
                        started,
                        reason: format!(
                            "no answer within MAX_RUNTIME {:?}; worker killed",
                            pool.options.max_runtime
                        ),
                    };
                    hung.push((
                        row.id,
                        w.stage.clone(),
                        w.pid,
                        pool.options.max_runtime,
                        cut,
                    ));
                }
            } else if w.inflight.is_empty()
                && !w.retiring
                && now >= w.idle_since + pool.options.idle_timeout
            {
                tracing::debug!(stage = %w.stage, pid = w.pid, "worker idle: stopping it");
                w.retire();
            }
        }
        for (stage, ids) in killed_holding {
            self.stats.kill(&stage);
            self.suspects.extend(ids);
        }
        for (id, stage, pid, limit, cut) in hung {
            tracing::error!(id, stage = %stage, pid, "no answer within MAX_RUNTIME {limit:?}: worker killed");
            self.stats.kill(&stage);
            let reason = format!(
                "no answer from stage {stage} (pid {pid}) within MAX_RUNTIME {limit:?}; worker killed"
            );
            self.end_lost_pass(id, &stage, Forced::Timeout, &reason, Some(cut))
                .await;
        }
        if now >= self.last_heartbeat + self.options.poll_interval {
            self.last_heartbeat = now;
            self.wake_all();
            self.next_due = Some(now);
            self.reconcile().await;
        }
        if self.next_due.is_some_and(|d| now >= d) && !lock::is_leader() {
            // MODE shared: the leader requeues what is due, for every dispatcher.
            self.next_due = None;
        }
        if self.next_due.is_some_and(|d| now >= d) {
            match claim::requeue_due(&self.db).await {
                Ok(n) if n > 0 => self.wake_all(),
                Ok(_) => {}
                Err(e) => tracing::warn!("cannot requeue paused messages: {e}"),
            }
            self.next_due = match claim::next_due(&self.db).await {
                Ok(Some(secs)) => Some(Instant::now() + Duration::from_secs_f64(secs.max(0.0))),
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!("cannot read the next due time: {e}");
                    None
                }
            };
        }
    }

    /// Running rows that no worker holds (and that have not changed for ORPHAN_GRACE) become
    /// pending again: nothing else would ever move them while this dispatcher lives.
    async fn reconcile(&mut self) {
        if self.stopping {
            return;
        }
        let held: Vec<i64> = self
            .workers
            .values()
            .flat_map(|w| w.inflight.iter().map(|a| a.id))
            .chain(self.held_ids())
            .collect();
        let longest = self
            .pools
            .values()
            .map(|p| p.options.max_runtime)
            .max()
            .unwrap_or(pepsi_contract::stage::DEFAULT_MAX_RUNTIME);
        let fenced_after = lock::is_leader().then_some(longest + self.options.takeover_margin);
        match claim::reconcile(&self.db, &held, self.options.orphan_grace, fenced_after).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(
                    rows = n,
                    "running rows no worker held returned to pending (a write the dispatcher \
                     could not make, a claim whose reply was lost, or rows of a dispatcher \
                     this one took over from)"
                );
                self.wake_all();
            }
            Err(e) => tracing::warn!("cannot reconcile running rows: {e}"),
        }
    }

    /// What can wait until the round's claim has gone out: statistics and garbage collection.
    async fn bookkeeping(&mut self) {
        let now = Instant::now();
        let idle = self.workers.values().all(|w| w.inflight.is_empty());
        // A kill or a crash goes out as soon as an idle pipeline's would: the pipeline page
        // and /metrics show it at once, and a dispatcher killed soon after does not lose it.
        let due = if idle || self.stats.has_failures() {
            self.options.stats_idle_interval
        } else {
            self.options.stats_interval
        };
        if !self.stats.is_empty() && now >= self.last_flush + due {
            let counters = if self.telemetry.is_on() {
                self.stats.counters()
            } else {
                Vec::new()
            };
            match self.stats.flush(&self.db).await {
                Ok(()) => {
                    self.last_flush = now;
                    self.telemetry.emit_counters(&CountersRecord {
                        program: "pepsi-dispatch".into(),
                        pid: std::process::id(),
                        counters,
                    });
                }
                Err(e) => tracing::warn!("cannot write statistics (kept for the next flush): {e}"),
            }
        }
        if now >= self.last_gc + self.options.gc_interval && lock::is_leader() {
            self.last_gc = now;
            match claim::gc(&self.db).await {
                Ok((bodies, tokens, replies)) if bodies + tokens + replies > 0 => {
                    tracing::info!(
                        bodies,
                        tokens,
                        replies,
                        "swept orphaned bodies, expired clone tokens and automatic-reply records"
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("garbage collection failed: {e}"),
            }
            match claim::mail_log_expire(&self.db, self.options.mail_log_retention).await {
                Ok(n) if n > 0 => tracing::info!(rows = n, "expired mail log rows"),
                Ok(_) => {}
                Err(e) => tracing::warn!("cannot expire the mail log: {e}"),
            }
        }
        self.vacuum(now).await;
    }

    /// Starts a VACUUM of the queue tables when VACUUM_INTERVAL has passed and rows have
    /// moved since the last one, unless one still runs. It runs beside the dispatcher on a
    /// pooled connection: VACUUM takes no lock a claim or a stage waits for.
    async fn vacuum(&mut self, now: Instant) {
        let interval = self.options.vacuum_interval;
        if interval.is_zero()
            || !lock::is_leader()
            || self.stopping
            || now < self.last_vacuum + interval
            || self.claimed_since_vacuum < VACUUM_MIN_ROWS
            || self.may_vacuum == Some(false)
        {
            return;
        }
        if self.may_vacuum.is_none() {
            match claim::can_vacuum(&self.db).await {
                Ok(may) => {
                    if !may {
                        tracing::info!(
                            "VACUUM_INTERVAL: this role may not vacuum pepsi.workqueue and \
                             pepsi.workqueue_body (not their owner; on PostgreSQL 17 grant it \
                             MAINTAIN): left to autovacuum"
                        );
                    }
                    self.may_vacuum = Some(may);
                    if !may {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!("cannot tell whether this role may vacuum the queue: {e}");
                    self.last_vacuum = now;
                    return;
                }
            }
        }
        if self.vacuuming.swap(true, Ordering::AcqRel) {
            return;
        }
        self.last_vacuum = now;
        let rows = std::mem::take(&mut self.claimed_since_vacuum);
        let db = self.db.clone();
        let running = self.vacuuming.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            match claim::vacuum(&db).await {
                Ok(()) => tracing::debug!(
                    claimed = rows,
                    ms = started.elapsed().as_millis() as u64,
                    "queue tables vacuumed"
                ),
                Err(e) => tracing::warn!("cannot vacuum the queue tables: {e}"),
            }
            running.store(false, Ordering::Release);
        });
    }

    /// Free slots of a pool: room on its live workers plus workers it may still start.
    /// The ids stage `stage` may take this round: the room of its workers and of those it may
    /// still start. While every worker it has is more than half full and none may start, it
    /// takes none: a worker holding ids has work queued, so refilling it waits until half its
    /// queue has drained and then takes a claim's worth at once (one claim and, for a
    /// batching stage, one batch per half queue under a backlog instead of one per id). An
    /// idle or half-empty worker, or a worker still to start, is served at once.
    fn capacity(&self, stage: &str, pool: &Pool, now: Instant) -> usize {
        let s = &pool.options;
        let mine: Vec<&Worker> = self.workers.values().filter(|w| w.stage == stage).collect();
        let active: Vec<&&Worker> = mine.iter().filter(|w| !w.retiring).collect();
        let room: usize = active.iter().map(|w| room(w, s)).sum();
        let may_start = pool.cooldown_until.is_none_or(|c| now >= c);
        let spawnable = if may_start {
            self.parallelism(s).saturating_sub(mine.len())
        } else {
            0
        };
        let low_water = s.queue_limit / 2;
        if spawnable == 0 && active.iter().all(|w| w.inflight.len() > low_water) {
            return 0;
        }
        room + spawnable
            * s.queue_limit.min(if s.max_messages == 0 {
                usize::MAX
            } else {
                s.max_messages as usize
            })
    }

    async fn claim_round(&mut self) {
        if self.stopping {
            return;
        }
        let now = Instant::now();
        let mut wants = Vec::new();
        let mut leads = Vec::new();
        let stages: Vec<String> = self.pools.keys().cloned().collect();
        for stage in &stages {
            if !self.pools[stage].maybe_pending || !self.pools[stage].held.is_empty() {
                // Rows held for the stage's workers go first: they came before anything a
                // claim could find there now.
                continue;
            }
            let capacity = self.capacity(stage, &self.pools[stage], now);
            let percent = self.options.fair_fifo_percent;
            let pool = self.pools.get_mut(stage).expect("stage exists");
            pool.fair.settle(now);
            if capacity == 0 {
                continue;
            }
            let (n_fifo, n_fair) = pool.fair.split_slots(capacity, percent);
            leads.extend(
                pool.fair
                    .leads()
                    .map(|(k, l)| (stage.clone(), k.to_owned(), l)),
            );
            wants.push(Want {
                stage: stage.clone(),
                n_fifo: n_fifo as i32,
                n_fair: n_fair as i32,
                cost: pool.fair.cost(),
            });
        }
        if wants.is_empty() {
            return;
        }
        // STATEMENT_TIMEOUT bounds the claim on the server (a connection option) and, a
        // little later, here: a primary that stops answering cannot hold the claim forever.
        let limit = pepsi_contract::db::statement_timeout(&self.file_cfg)
            .unwrap_or(Some(pepsi_contract::db::DEFAULT_STATEMENT_TIMEOUT));
        let claimed = pepsi_contract::db::bounded(
            limit,
            claim::claim(
                &self.db,
                &wants,
                &leads,
                i64::from(self.options.fair_max_senders),
            ),
        )
        .await;
        let mut result = match claimed {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("claim failed: {e}");
                return;
            }
        };
        let mut senders_seen: HashMap<&str, u32> = HashMap::new();
        for (stage, sender) in &result.waiting {
            *senders_seen.entry(stage.as_str()).or_default() += 1;
            if let Some(pool) = self.pools.get_mut(stage) {
                pool.fair.waiting(sender, now);
            }
        }
        // A claim that ranked as many senders as it may can have left rows of the others.
        let ranked_all: Vec<String> = senders_seen
            .into_iter()
            .filter(|(_, n)| *n >= self.options.fair_max_senders)
            .map(|(s, _)| s.to_owned())
            .collect();
        let claimed = std::mem::take(&mut result.rows);
        self.claimed_since_vacuum += claimed.len() as u64;
        let mut by_stage: BTreeMap<String, Vec<Claimed>> = BTreeMap::new();
        for c in claimed {
            by_stage.entry(c.stage.clone()).or_default().push(c);
        }
        for want in &wants {
            let got = by_stage.get(&want.stage).map_or(0, Vec::len);
            if let Some(pool) = self.pools.get_mut(&want.stage) {
                // A full claim: more may be waiting. Otherwise the stage had no more.
                pool.maybe_pending = got >= (want.n_fifo + want.n_fair) as usize
                    || ranked_all.contains(&want.stage)
                    || result.contended.contains(&want.stage);
                pool.backlog &= pool.maybe_pending;
            }
        }
        for (stage, rows) in by_stage {
            tracing::debug!(stage = %stage, rows = rows.len(), "claimed");
            self.assign(&stage, rows).await;
        }
    }

    /// Packs claimed rows onto the busiest workers with room, starting workers as needed;
    /// rows that find no worker go back to pending.
    async fn assign(&mut self, stage: &str, mut rows: Vec<Claimed>) {
        // Suspects first: one that finds no idle worker hands the rest back with it, so the
        // workers drain and it runs alone on the next round.
        rows.sort_by_key(|r| !self.suspects.contains(&r.workqueue_id));
        rows.reverse();
        let now = Instant::now();
        while let Some(row) = rows.pop() {
            let alone = self.suspects.contains(&row.workqueue_id);
            let Some(key) = self.place(stage, alone) else {
                if alone && let Some(pool) = self.pools.get_mut(stage) {
                    // Let the workers drain: rows handed forward wait as pending meanwhile.
                    pool.backlog = true;
                }
                let mut back: Vec<i64> = rows.iter().map(|r| r.workqueue_id).collect();
                back.push(row.workqueue_id);
                self.hand_back(stage, &back).await;
                return;
            };
            let assigned = Assigned {
                id: row.workqueue_id,
                sender: row.sender_key.clone(),
            };
            self.give(key, stage, assigned, now).await;
        }
    }

    /// The worker of `stage` the next id goes to: the busiest with room, or a new one;
    /// `None` when the stage has no room. A suspect (`alone`: its worker died holding several
    /// ids) goes to a worker holding nothing, and nothing joins it there.
    fn place(&mut self, stage: &str, alone: bool) -> Option<u64> {
        let options = &self.pools.get(stage)?.options;
        let suspects = &self.suspects;
        let target = self
            .workers
            .values()
            .filter(|w| w.stage == stage && !w.retiring && room(w, options) > 0)
            .filter(|w| {
                if alone {
                    w.inflight.is_empty()
                } else {
                    !w.inflight.iter().any(|a| suspects.contains(&a.id))
                }
            })
            .max_by_key(|w| (w.inflight.len(), std::cmp::Reverse(w.key)))
            .map(|w| w.key);
        target.or_else(|| self.start_worker(stage))
    }

    /// Writes `row` to worker `key`; a worker that cannot take it is retired and the row
    /// goes back to pending.
    async fn give(&mut self, key: u64, stage: &str, row: Assigned, now: Instant) {
        let w = self.workers.get_mut(&key).expect("worker exists");
        let id = row.id;
        if let Err(e) = w.hand(row, now).await {
            tracing::warn!(
                stage,
                pid = w.pid,
                "cannot write to worker: {e}; returning the message"
            );
            w.retire();
            self.hand_back(stage, &[id]).await;
        }
    }

    fn start_worker(&mut self, stage: &str) -> Option<u64> {
        let now = Instant::now();
        let running = self.workers.values().filter(|w| w.stage == stage).count();
        let parallelism = self.parallelism(&self.pools.get(stage)?.options);
        let pool = self.pools.get_mut(stage)?;
        if running >= parallelism || pool.cooldown_until.is_some_and(|c| now < c) {
            return None;
        }
        let key = self.next_key;
        self.next_key += 1;
        let spawned = Worker::spawn(
            key,
            stage,
            &pool.program,
            &self.config_path,
            &self.log_level,
            crate::worker::Inherit {
                hand_forward: self.options.hand_forward,
                epoch: self.leadership.epoch,
                pass_limit: pool.options.max_runtime,
            },
            self.events.clone(),
        );
        match spawned {
            Ok(w) => {
                tracing::debug!(stage, pid = w.pid, workers = running + 1, "worker started");
                if let Ok(mut pids) = self.worker_pids.lock() {
                    pids.insert(w.pid);
                }
                pool.cooldown_until = None;
                pool.failure_logged = false;
                self.workers.insert(key, w);
                Some(key)
            }
            Err(e) => {
                pool.cooldown_until = Some(now + self.options.spawn_cooldown);
                if !pool.failure_logged {
                    tracing::error!(stage, program = %pool.program.display(),
                        "cannot start the stage program: {e}; holding the stage off for {:?}", self.options.spawn_cooldown);
                    pool.failure_logged = true;
                }
                None
            }
        }
    }

    /// Stops claiming, lets workers finish what they hold within SHUTDOWN_GRACE, kills the
    /// rest and returns their messages to pending, then writes the statistics.
    async fn shutdown(&mut self, rx: &mut UnboundedReceiver<Event>) -> anyhow::Result<()> {
        self.stopping = true;
        for w in self.workers.values_mut() {
            w.retire();
        }
        // What waited for a worker will not get one from this dispatcher: pending again at
        // once, for the next.
        let mut back = std::mem::take(&mut self.overflow);
        back.extend(
            self.pools
                .values_mut()
                .flat_map(|p| p.held.drain(..).map(|a| a.id)),
        );
        self.hand_back("", &back).await;
        let until = Instant::now() + self.options.shutdown_grace;
        while !self.workers.is_empty() {
            match tokio::time::timeout_at(until.into(), rx.recv()).await {
                Ok(Some(ev @ (Event::Line { .. } | Event::Eof { .. }))) => self.handle(ev).await,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        let back = std::mem::take(&mut self.overflow);
        self.hand_back("", &back).await;
        let left: Vec<u64> = self.workers.keys().copied().collect();
        for key in left {
            if let Some(mut w) = self.workers.remove(&key) {
                let _ = w.child.kill().await;
                self.forget_pid(w.pid);
                let ids: Vec<i64> = w.inflight.iter().map(|a| a.id).collect();
                tracing::warn!(stage = %w.stage, pid = w.pid, held = ids.len(), "worker killed at shutdown");
                self.hand_back(&w.stage.clone(), &ids).await;
            }
        }
        self.stats
            .flush(&self.db)
            .await
            .context("cannot write the final statistics")?;
        if self.workers.is_empty() {
            lock::stopping();
            if let Err(e) = claim::stopped(&self.db, self.leadership.epoch).await {
                tracing::warn!("cannot record that this dispatcher stopped: {e}");
            }
        }
        tracing::info!("stopped");
        Ok(())
    }

    /// The workers `pool` may run on this host (PARALLELISM_SCOPE in MODE shared).
    fn parallelism(&self, pool: &PoolOptions) -> usize {
        let members = match self.options.mode {
            Mode::Single => (1, 0),
            Mode::Shared => lock::members(),
        };
        local_parallelism(pool.parallelism, self.options.parallelism_scope, members)
    }

    /// A worker was reaped: the lock thread must not signal its pid any more.
    fn forget_pid(&self, pid: u32) {
        if let Ok(mut pids) = self.worker_pids.lock() {
            pids.remove(&pid);
        }
    }
}

/// Ids a worker can still take: its QUEUE_LIMIT less what it holds, within MAX_MESSAGES.
fn room(w: &Worker, s: &PoolOptions) -> usize {
    let by_queue = s.queue_limit.saturating_sub(w.inflight.len());
    if s.max_messages == 0 {
        return by_queue;
    }
    by_queue.min(s.max_messages.saturating_sub(w.handed) as usize)
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "exited".to_owned(),
    }
}
