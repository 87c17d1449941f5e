//! The worker side of the stage contract: a [`Worker`] holds a stage built once at start,
//! loads running rows, runs a pass (fusing registered successors into it), commits it and
//! answers with status lines; `main` is a stage program's whole entry point.
//!
//! A batching worker (every body-free `Load::Metadata` stage, and the stages that opt in
//! with `Stage::BATCH`) takes the ids already waiting on stdin each round (up to the largest
//! QUEUE_LIMIT of its stages, never waiting for more), loads them in one SELECT, runs each
//! pass, and commits the deferred advances, pauses, fails and finishes in one statement.
//! The protocol stays one status line per id, in order.

use std::cell::RefCell;
use std::collections::HashMap;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use serde::Serialize;
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row as _};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use super::commit::{Deferred, commit, commit_many};
use super::context::{Changes, Outcome, Row};
use super::fusion::{Built, DynStage, Registration};
use super::scope::ScopedOverrides;
use super::trace::{Hop, PassTrace, context_of};
use super::{Load, Stage, StageContext, StageError, StageOptions, program_name};
use crate::telemetry::Emitter;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async_current_thread};
use pepsi_conf::config::{Config, ConfigSource, Scope};

// One prepared statement per Load level, so a stage pulls only the big columns it needs. A
// running row this session may not change (claimed by another dispatcher epoch, or by one
// since fenced: docs/ha.md) loads as not running, so no pass starts on it.
macro_rules! status_col {
    ($q:literal) => {
        concat!(
            "CASE WHEN ",
            $q,
            "status = 'running' AND NOT COALESCE(",
            claim_held_many!($q, "claim_epoch"),
            ", false) THEN 'claimed by another dispatcher epoch (or a fenced one)' \
             ELSE ",
            $q,
            "status::text END AS status"
        )
    };
}
const SELECT_METADATA: &str = concat!(
    "SELECT workqueue_id, stage, ",
    status_col!(""),
    ", mail_from, rcpt_to, state, received_at, updated_at, auth_user FROM pepsi.workqueue WHERE workqueue_id = $1"
);
const SELECT_HEADERS: &str = concat!(
    "SELECT workqueue_id, stage, ",
    status_col!(""),
    ", mail_from, rcpt_to, state, received_at, updated_at, auth_user, headers FROM pepsi.workqueue WHERE workqueue_id = $1"
);
const SELECT_FULL: &str = concat!(
    "SELECT w.workqueue_id, w.stage, ",
    status_col!("w."),
    ", w.mail_from, w.rcpt_to, w.state, w.received_at, w.updated_at, w.auth_user, w.headers, b.body \
     FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) WHERE w.workqueue_id = $1"
);
// The same for a batch.
const SELECT_METADATA_MANY: &str = concat!(
    "SELECT workqueue_id, stage, ",
    status_col!(""),
    ", mail_from, rcpt_to, state, received_at, updated_at, auth_user FROM pepsi.workqueue WHERE workqueue_id = ANY($1)"
);
const SELECT_HEADERS_MANY: &str = concat!(
    "SELECT workqueue_id, stage, ",
    status_col!(""),
    ", mail_from, rcpt_to, state, received_at, updated_at, auth_user, headers FROM pepsi.workqueue WHERE workqueue_id = ANY($1)"
);
const SELECT_FULL_MANY: &str = concat!(
    "SELECT w.workqueue_id, w.stage, ",
    status_col!("w."),
    ", w.mail_from, w.rcpt_to, w.state, w.received_at, w.updated_at, w.auth_user, w.headers, b.body \
     FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) WHERE w.workqueue_id = ANY($1)"
);

/// A fused chain stops after this many hops and commits; the rest runs in later passes.
const MAX_FUSED_HOPS: usize = 16;

/// A stage fused into a pass, as reported on the status line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FusedHop {
    pub stage: String,
    pub ms: f64,
}

/// What a successful pass reports on its status line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PassReport {
    /// The pass ended the message (`finish` or `finish_with`): the row is gone.
    pub finished: bool,
    /// The stages fused into the pass, in order.
    pub fused: Vec<FusedHop>,
    /// The row advanced and was left running at this stage, for the dispatcher to pass on
    /// (`PEPSI_HAND_FORWARD`).
    pub handed: Option<String>,
    /// The pass left no pending row anywhere: it finished, paused, failed or handed the row
    /// forward, and made no rows of its own (reported only with `PEPSI_HAND_FORWARD`).
    pub settled: bool,
}

#[derive(Serialize)]
struct DoneReport<'r> {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    finished: bool,
    #[serde(skip_serializing_if = "<[FusedHop]>::is_empty")]
    fused: &'r [FusedHop],
    #[serde(skip_serializing_if = "Option::is_none")]
    handed: Option<&'r str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    settled: bool,
}

#[derive(Serialize)]
struct FailedReport {
    error: String,
    temporary: bool,
    /// `StageError::is_misplaced`: the dispatcher returns the row rather than fail it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    misplaced: bool,
}

/// The status line for one pass: `0`, `0 {"finished":true,"fused":[...],"handed":...,
/// "settled":true}`, or
/// `1 {"error": ..., "temporary": ..., "misplaced": true}` (`misplaced` only when true).
pub(crate) fn status_line(result: &Result<PassReport, StageError>) -> String {
    match result {
        Ok(report)
            if !report.finished
                && report.fused.is_empty()
                && report.handed.is_none()
                && !report.settled =>
        {
            "0\n".to_owned()
        }
        Ok(report) => {
            let json = serde_json::to_string(&DoneReport {
                finished: report.finished,
                fused: &report.fused,
                handed: report.handed.as_deref(),
                settled: report.settled,
            })
            .unwrap_or_default();
            format!("0 {json}\n")
        }
        Err(e) => {
            let json = serde_json::to_string(&FailedReport {
                error: e.to_string(),
                temporary: e.is_temporary(),
                misplaced: e.is_misplaced(),
            })
            .unwrap_or_default();
            format!("1 {json}\n")
        }
    }
}

/// How long a batch round runs at most before its passes so far are committed and answered
/// (`[stage-*] ROUND_TIME`, the shortest of the program's sections).
pub const DEFAULT_ROUND_TIME: Duration = Duration::from_secs(1);

/// A stage built for one worker process, with everything a pass needs: the pool, the
/// configuration, every stage section's options, and the stages it may fuse.
pub struct Worker<'a> {
    pool: &'a PgPool,
    cfg: &'a Config,
    own: Rc<dyn DynStage>,
    /// What a pass loads: the stage's own Load, or more where a section's `LOAD` asks for
    /// it (with fusion on), so its chain can fuse successors that need more.
    load: Load,
    options: HashMap<String, StageOptions>,
    /// The stages an advance hands its row forward to (see `HAND_FORWARD_ENV`).
    handable: Rc<std::collections::HashSet<String>>,
    fusion: bool,
    registry: &'a [Registration],
    /// Registered stages built on first use (`None`: building failed; not fused into).
    fusable: RefCell<HashMap<&'static str, Option<Rc<dyn DynStage>>>>,
    batch_limit: usize,
    /// How long a batch round may run before what it has done is committed and answered.
    round_time: Duration,
    /// The domain and address overrides fused stages are built with too.
    scoped: ScopedOverrides,
    /// `[database] STATEMENT_TIMEOUT`: a pass's load and commit give up on the client side
    /// shortly after it, as a temporary failure (`crate::db::bounded`).
    statement_timeout: Option<Duration>,
    /// Where each settled pass's spans go (`[pepsi-telemetry-client] SOCKET`); off when no
    /// client is configured, and then no span is built.
    telemetry: Emitter,
}

impl<'a> Worker<'a> {
    /// Builds `S` from `cfg` (the program-wide part and every section that runs it): the
    /// error names what was wrong. Fuses through the installed registry when `[pepsi]
    /// ALLOW_FUSION` is on (the default).
    pub fn new<S: Stage>(pool: &'a PgPool, cfg: &'a Config) -> anyhow::Result<Self> {
        let stage = S::build(cfg)?;
        Self::with_stage(stage, pool, cfg, super::fusion::installed())
    }

    /// As `new`, for a stage value already made (tests), fusing through `registry`.
    pub fn with_stage<S: Stage>(
        stage: S,
        pool: &'a PgPool,
        cfg: &'a Config,
        registry: &'a [Registration],
    ) -> anyhow::Result<Self> {
        Self::with_scopes(stage, pool, cfg, registry, ScopedOverrides::default())
    }

    /// As `with_stage`, with sections also parsed for every domain and address that has
    /// overrides of its own (`scope`): a pass uses the variant of its message's scope.
    pub fn with_scopes<S: Stage>(
        stage: S,
        pool: &'a PgPool,
        cfg: &'a Config,
        registry: &'a [Registration],
        scoped: ScopedOverrides,
    ) -> anyhow::Result<Self> {
        let mut batch_limit = 1usize;
        for name in StageOptions::stages_of(cfg, S::PROGRAM) {
            let limit = cfg
                .stage_section_named(&name)
                .parse_opt("QUEUE_LIMIT", |v| {
                    v.parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| "a positive whole number".to_owned())
                })?
                .unwrap_or(1);
            batch_limit = batch_limit.max(limit);
        }
        let mut round_time = DEFAULT_ROUND_TIME;
        for name in StageOptions::stages_of(cfg, S::PROGRAM) {
            if let Some(t) = cfg.stage_section_named(&name).duration_opt("ROUND_TIME")? {
                round_time = round_time.min(t);
            }
        }
        let built = Built::from_stage(stage, cfg, &scoped)?;
        let fusion = cfg
            .section("pepsi")
            .bool_opt("ALLOW_FUSION")?
            .unwrap_or(true);
        // LOAD is for fusion only: without it (or without a registry, in a per-program
        // build) a pass loads what its stage needs.
        let mut load = S::LOAD;
        for name in StageOptions::stages_of(cfg, S::PROGRAM) {
            if let Some(more) = Load::configured(cfg, &name, S::LOAD)?
                && fusion
                && !registry.is_empty()
            {
                load = load.max(more);
            }
        }
        let statement_timeout = crate::db::statement_timeout(cfg)?;
        let options = StageOptions::all(cfg);
        let handable = if super::hands_forward() {
            options.keys().cloned().collect()
        } else {
            Default::default()
        };
        Ok(Self {
            pool,
            cfg,
            own: Rc::new(built),
            load,
            options,
            handable: Rc::new(handable),
            fusion,
            registry,
            fusable: RefCell::new(HashMap::new()),
            batch_limit: batch_limit.min(1024),
            round_time,
            scoped,
            statement_timeout,
            telemetry: Emitter::from_config(cfg)?,
        })
    }

    /// `op`, given up on the client side shortly after STATEMENT_TIMEOUT (`db::bounded`): a
    /// database that never answers makes the pass a temporary failure (the row is retried),
    /// not a worker held forever. The server cancels a statement at STATEMENT_TIMEOUT itself
    /// when it still answers (a connection option of every pass's session).
    async fn bounded<T>(
        &self,
        op: impl std::future::Future<Output = Result<T, StageError>>,
    ) -> Result<T, StageError> {
        crate::db::bounded(self.statement_timeout, op).await
    }

    /// One pass over row `id`: load, process (and fuse), commit. When a step fails nothing
    /// of the pass is written (fan-out helpers the stage already called have committed
    /// their siblings; a fused hop that fails leaves the earlier hops written, as the
    /// unfused pipeline would).
    pub async fn pass(&self, id: i64) -> Result<PassReport, StageError> {
        let started = SystemTime::now();
        let load = self.load;
        let sql = match load {
            Load::Metadata => SELECT_METADATA,
            Load::Headers => SELECT_HEADERS,
            Load::Full => SELECT_FULL,
        };
        let rec = self
            .bounded(async { Ok(sqlx::query(sql).bind(id).fetch_optional(self.pool).await?) })
            .await?
            .ok_or(StageError::NoSuchRow(id))?;
        let mut ctx = self.context(id, &rec, load)?;
        let context = self.telemetry.is_on().then(|| context_of(&ctx)).flatten();
        let mut hops = Vec::new();
        let result = async {
            let (outcome, fused) = self.chain(&mut ctx, &mut hops).await?;
            self.before_commit().await?;
            self.bounded(commit(&mut ctx, &outcome)).await?;
            Ok((report(&ctx, &outcome, fused), outcome))
        }
        .await;
        if self.telemetry.is_on() {
            PassTrace::of(
                &ctx,
                context,
                claimed_at(&rec),
                started,
                hops,
                result.as_ref().map(|(_, o)| o),
            )
            .emit(&self.telemetry, self.own.program());
        }
        result.map(|(report, _)| report)
    }

    /// `Stage::before_commit` of this worker's stage and of every stage fused into it so far.
    async fn before_commit(&self) -> Result<(), StageError> {
        self.own.before_commit().await?;
        let fused: Vec<Rc<dyn DynStage>> =
            self.fusable.borrow().values().flatten().cloned().collect();
        for stage in fused {
            stage.before_commit().await?;
        }
        Ok(())
    }

    /// Passes over every id of `batch`: one SELECT for the batch, one statement for the
    /// deferred outcomes; one result per id, in order.
    pub async fn pass_batch(&self, batch: &[i64]) -> Vec<Result<PassReport, StageError>> {
        self.pass_round(batch, None).await
    }

    /// As `pass_batch`, stopping before the next pass once `until` has passed: the answers
    /// cover the first ids only (at least one), the rest are for another round. A batch of
    /// slow passes (a delivery waiting on its peer) is thus committed and answered every
    /// ROUND_TIME, never held back until its slowest pass, and the dispatcher hears from
    /// the worker long before MAX_RUNTIME.
    pub async fn pass_round(
        &self,
        batch: &[i64],
        until: Option<Instant>,
    ) -> Vec<Result<PassReport, StageError>> {
        let load = self.load;
        let sql = match load {
            Load::Metadata => SELECT_METADATA_MANY,
            Load::Headers => SELECT_HEADERS_MANY,
            Load::Full => SELECT_FULL_MANY,
        };
        let loaded = self
            .bounded(async { Ok(sqlx::query(sql).bind(batch).fetch_all(self.pool).await?) })
            .await;
        let rows = match loaded {
            Ok(rows) => rows,
            Err(e) => {
                return batch.iter().map(|_| Err(shared_error(&e))).collect();
            }
        };
        let mut by_id: HashMap<i64, PgRow> = HashMap::with_capacity(rows.len());
        for rec in rows {
            if let Ok(id) = rec.try_get::<i64, _>("workqueue_id") {
                by_id.insert(id, rec);
            }
        }
        let mut results: Vec<Option<Result<PassReport, StageError>>> = Vec::new();
        // The spans of each pass so far, by slot, handed over once its commit is known.
        let mut traces: Vec<Option<PassTrace>> = Vec::new();
        let tracing_on = self.telemetry.is_on();
        let mut deferred: Vec<(usize, PassReport)> = Vec::new();
        let mut rows: Vec<Deferred> = Vec::new();
        // A failed `before_commit`: the round stops, and nothing it did is committed.
        let mut unsettled: Option<StageError> = None;
        for &id in batch {
            if !results.is_empty() && until.is_some_and(|t| Instant::now() >= t) {
                break;
            }
            let started = SystemTime::now();
            let mut trace = None;
            let result = async {
                let rec = by_id.get(&id).ok_or(StageError::NoSuchRow(id))?;
                let mut ctx = self.context(id, rec, load)?;
                let context = tracing_on.then(|| context_of(&ctx)).flatten();
                let mut hops = Vec::new();
                let chained = self.chain(&mut ctx, &mut hops).await;
                if tracing_on {
                    trace = Some(PassTrace::of(
                        &ctx,
                        context,
                        claimed_at(rec),
                        started,
                        hops,
                        chained.as_ref().map(|(o, _)| o),
                    ));
                }
                let (outcome, fused) = chained?;
                let report = report(&ctx, &outcome, fused);
                Ok(match Deferred::of(&ctx, &outcome) {
                    Some(row) => Pass::Deferred(Box::new(row), report),
                    None => Pass::Alone(Box::new((ctx, outcome)), report),
                })
            }
            .await;
            traces.push(trace);
            match result {
                Ok(Pass::Deferred(row, report)) => {
                    deferred.push((results.len(), report));
                    rows.push(*row);
                    results.push(None);
                }
                Ok(Pass::Alone(pass, report)) => {
                    let (mut ctx, outcome) = *pass;
                    if let Err(e) = self.before_commit().await {
                        results.push(Some(Err(shared_error(&e))));
                        unsettled = Some(e);
                        break;
                    }
                    results.push(Some(
                        self.bounded(commit(&mut ctx, &outcome))
                            .await
                            .map(|()| report),
                    ));
                    if let Some(Some(trace)) = traces.last_mut() {
                        trace.settled(SystemTime::now());
                    }
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        if !deferred.is_empty() && unsettled.is_none() {
            unsettled = self.before_commit().await.err();
        }
        if let Some(e) = &unsettled {
            for (slot, _) in deferred.drain(..) {
                results[slot] = Some(Err(shared_error(e)));
            }
        }
        if !deferred.is_empty() {
            match self.bounded(commit_many(self.pool, &rows)).await {
                Ok(written) => {
                    for ((slot, report), row) in deferred.into_iter().zip(&rows) {
                        results[slot] = Some(if written.contains(&row.id) {
                            Ok(report)
                        } else {
                            Err(StageError::NotRunning {
                                id: row.id,
                                status: super::commit::LOST_ROW.into(),
                            })
                        });
                    }
                }
                Err(e) => {
                    for (slot, _) in deferred {
                        results[slot] = Some(Err(shared_error(&e)));
                    }
                }
            }
        }
        // Each pass's spans, now that its commit is known: a pass committed alone ends at its
        // own commit, one committed with the batch at the end of its own processing.
        for (trace, result) in traces.into_iter().zip(&results) {
            match (trace, result) {
                (Some(trace), Some(Ok(_))) => trace.emit(&self.telemetry, self.own.program()),
                (Some(trace), Some(Err(e))) => {
                    trace.failed(e).emit(&self.telemetry, self.own.program())
                }
                _ => {}
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every slot answered"))
            .collect()
    }

    /// Reads ids from `input` until EOF, handling each in order and answering each with one
    /// status line on `output`. A bad id or a failed pass answers non-zero and the loop goes
    /// on. Returns how many ids it answered.
    pub async fn run<R, W>(&self, input: R, mut output: W) -> anyhow::Result<u64>
    where
        R: AsyncBufRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut lines = input.lines();
        let mut handled = 0u64;
        let batching = self.own.batches();
        let mut eof = false;
        while !eof {
            let Some(first) = lines.next_line().await? else {
                break;
            };
            let mut round = vec![first];
            if batching {
                // Take what is already waiting, never wait for more (next_line is
                // cancellation safe, and a zero timeout polls it once).
                while round.len() < self.batch_limit {
                    match tokio::time::timeout(Duration::ZERO, lines.next_line()).await {
                        Ok(Ok(Some(line))) => round.push(line),
                        Ok(Ok(None)) => {
                            eof = true;
                            break;
                        }
                        Ok(Err(e)) => return Err(e.into()),
                        Err(_) => break,
                    }
                }
            }
            let round: Vec<String> = round
                .into_iter()
                .map(|l| l.trim().to_owned())
                .filter(|l| !l.is_empty())
                .collect();
            // A round is answered in order; when ROUND_TIME cuts it, the answers so far go out
            // (and are committed) before the rest of its ids run.
            let mut lines_left: &[String] = &round;
            while !lines_left.is_empty() {
                super::watchdog::busy();
                let ids: Vec<i64> = lines_left.iter().filter_map(|l| l.parse().ok()).collect();
                let answers = if batching && ids.len() > 1 {
                    let until = Instant::now() + self.round_time;
                    self.pass_round(&ids, Some(until)).await
                } else {
                    let mut one = Vec::with_capacity(ids.len());
                    for &id in &ids {
                        one.push(self.pass(id).await);
                    }
                    one
                };
                let mut answers = answers.into_iter();
                let mut taken = 0;
                for line in lines_left {
                    let result = match line.parse::<i64>() {
                        Ok(_) => match answers.next() {
                            Some(answer) => answer,
                            // Cut by ROUND_TIME: this id and those after it run next.
                            None => break,
                        },
                        Err(_) => Err(StageError::BadId(line.clone())),
                    };
                    if let Err(e) = &result {
                        tracing::warn!(
                            program = self.own.program(),
                            id = line.as_str(),
                            "message not handled: {e}"
                        );
                    }
                    output.write_all(status_line(&result).as_bytes()).await?;
                    handled += 1;
                    taken += 1;
                }
                output.flush().await?;
                lines_left = &lines_left[taken..];
            }
            super::watchdog::idle();
        }
        Ok(handled)
    }

    /// The context for loaded row `rec`, refusing a row that is not running or whose stage
    /// section runs another program.
    fn context(&self, id: i64, rec: &PgRow, load: Load) -> Result<StageContext<'a>, StageError> {
        let status: String = rec.try_get("status")?;
        if status != "running" {
            return Err(StageError::NotRunning { id, status });
        }
        let row = row_from(rec, load)?;
        let options = match self.options.get(&row.stage.to_ascii_lowercase()) {
            Some(s) => s.clone(),
            // Not readable at start (or added since): say why, as the section is now.
            None => StageOptions::from_config(self.cfg, &row.stage)?,
        };
        if !options.runs(self.own.program()) {
            return Err(StageError::WrongProgram {
                id,
                stage: row.stage,
                configured: options.program,
                program: self.own.program().to_owned(),
            });
        }
        Ok(StageContext {
            pool: self.pool,
            cfg: self.cfg,
            load,
            options,
            stored_stage: row.stage.clone(),
            row,
            changes: Changes::default(),
            carried: Changes::default(),
            mail_log: Vec::new(),
            created: std::cell::Cell::new(false),
            handable: self.handable.clone(),
        })
    }

    /// Runs this worker's stage on `ctx`, then every successor it may fuse; returns the
    /// chain's final transition (its writes folded into `ctx`) and the fused hops.
    async fn chain(
        &self,
        ctx: &mut StageContext<'a>,
        hops: &mut Vec<Hop>,
    ) -> Result<(Outcome, Vec<FusedHop>), StageError> {
        let start = SystemTime::now();
        let first = self.own.process(ctx).await;
        hops.push(Hop {
            stage: ctx.stage().to_owned(),
            start,
            end: SystemTime::now(),
        });
        let mut terminal = first?;
        let mut fused = Vec::new();
        loop {
            let outcome = ctx.apply(terminal);
            let Outcome::Advance { stage } = &outcome else {
                return Ok((outcome, fused));
            };
            if fused.len() >= MAX_FUSED_HOPS {
                return Ok((outcome, fused));
            }
            let Some((next, options)) = self.successor(stage, ctx) else {
                return Ok((outcome, fused));
            };
            ctx.enter(options);
            let started = Instant::now();
            let start = SystemTime::now();
            let processed = next.process(ctx).await;
            hops.push(Hop {
                stage: ctx.stage().to_owned(),
                start,
                end: SystemTime::now(),
            });
            match processed {
                Ok(t) => {
                    fused.push(FusedHop {
                        stage: ctx.stage().to_owned(),
                        ms: started.elapsed().as_secs_f64() * 1000.0,
                    });
                    terminal = t;
                }
                Err(e) => {
                    // Where the unfused pipeline would be: the earlier hops written, the
                    // row at this stage, and this stage's failure reported for it.
                    ctx.changes = Changes::default();
                    self.before_commit().await?;
                    ctx.flush().await?;
                    return Err(e);
                }
            }
        }
    }

    /// The stage `stage` as a fused successor of the pass in `ctx`, when fusion is on, its
    /// program is this one or registered, it needs no more than is loaded and agrees. A
    /// batching worker fuses only stages that batch too: a delivery that waits on the
    /// network runs in its own pool, never holding a round's other answers.
    fn successor(
        &self,
        stage: &str,
        ctx: &StageContext<'_>,
    ) -> Option<(Rc<dyn DynStage>, StageOptions)> {
        if !self.fusion {
            return None;
        }
        let options = self.options.get(&stage.to_ascii_lowercase())?;
        let program = program_name(&options.program);
        // Only what the executable registered is fused (nothing in a per-program build).
        let registration = self.registry.iter().find(|r| r.program == program)?;
        if registration.load > ctx.load {
            return None;
        }
        let next: Rc<dyn DynStage> = if program == self.own.program() {
            self.own.clone()
        } else {
            let mut built = self.fusable.borrow_mut();
            built
                .entry(registration.program)
                .or_insert_with(|| match (registration.build)(self.cfg, &self.scoped) {
                    Ok(stage) => Some(Rc::from(stage)),
                    Err(e) => {
                        tracing::warn!(
                            program = registration.program,
                            "not fused: cannot build the stage here: {e:#}"
                        );
                        None
                    }
                })
                .clone()?
        };
        (next.load() <= ctx.load
            && (next.batches() || !self.own.batches())
            && next.can_fuse(stage, ctx))
        .then(|| (next, options.clone()))
    }
}

/// A pass of a batch: to be committed on its own, or waiting for the batch's UPDATE.
enum Pass<'a> {
    Alone(Box<(StageContext<'a>, Outcome)>, PassReport),
    Deferred(Box<Deferred>, PassReport),
}

fn report(ctx: &StageContext<'_>, outcome: &Outcome, fused: Vec<FusedHop>) -> PassReport {
    let handed = match outcome {
        Outcome::Advance { stage } if ctx.hands_to(stage) => Some(stage.clone()),
        _ => None,
    };
    // Told only to a dispatcher that hands forward: without it the line stays as it was.
    let settled = super::hands_forward()
        && !ctx.created.get()
        && match outcome {
            Outcome::Finish | Outcome::Pause { .. } | Outcome::Fail => true,
            Outcome::Advance { .. } => handed.is_some(),
            Outcome::PauseWith { .. } | Outcome::FinishWith { .. } => false,
        };
    PassReport {
        finished: matches!(outcome, Outcome::Finish | Outcome::FinishWith { .. }),
        fused,
        handed,
        settled,
    }
}

/// When the dispatcher claimed the loaded row: its `updated_at`, which the claim sets.
fn claimed_at(rec: &PgRow) -> Option<DateTime<Utc>> {
    rec.try_get("updated_at").ok()
}

/// One batch-wide failure, told to each of its rows.
fn shared_error(e: &StageError) -> StageError {
    if e.is_temporary() {
        StageError::Temporary(e.to_string())
    } else {
        StageError::Permanent(e.to_string())
    }
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

/// `Worker::new::<S>` then `Worker::run`: the loop of a stage program.
pub async fn run_worker<S, R, W>(
    pool: &PgPool,
    cfg: &Config,
    input: R,
    output: W,
) -> anyhow::Result<u64>
where
    S: Stage,
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    Worker::new::<S>(pool, cfg)?.run(input, output).await
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
    /// `0` when the message was handled (with a JSON report when the pass ended the message
    /// or ran further stages fused into it), `1 {"error": "...", "temporary": true|false}`
    /// when it was not. Logs go to standard error. Exits 0 at end of input.
    ///
    /// With PEPSI_HAND_FORWARD=1 in the environment (set by pepsi-dispatch under its
    /// HAND_FORWARD option) a message advanced to a stage whose section names a PROGRAM is
    /// left running there for the dispatcher to hand on, and the report says so
    /// ("handed", "settled"); without it the message is left pending.
    ///
    /// Every [stage-NAME] section whose PROGRAM is this program is read once, at start; a
    /// bad option stops the worker before it reads an id. With [pepsi] ALLOW_FUSION on (the
    /// default) and the unified `pepsi` executable, a message advanced to a stage of a
    /// program folded into the same executable, needing no more of the row, is handled by
    /// that stage in the same pass and committed once.
    #[command(long_about)]
    Worker,
}

/// A stage program's command line, `PROGRAM worker [-c FILE] [-L LEVEL]`, as `--help` shows
/// it and its manual page documents it. `long_about` is the `--help` text (`-h` shows
/// `about`); empty: `about`.
pub fn command(
    source: &ConfigSource,
    about: &'static str,
    long_about: &'static str,
) -> clap::Command {
    let long_about = if long_about.is_empty() {
        about
    } else {
        long_about
    };
    <StageCli as clap::CommandFactory>::command()
        .name(source.exec)
        .about(about)
        .long_about(long_about)
        .version(env!("CARGO_PKG_VERSION"))
}

/// The whole `main` of a stage program: parses `PROGRAM worker [-c FILE] [-L LEVEL]`, loads
/// the configuration (the file plus the database's global overlay), connects, builds `S`
/// and its sections (a bad one stops here, naming it) and runs the worker loop on
/// stdin/stdout. `long_about` is the `--help` text (`-h` shows `about`); empty: `about`.
pub fn main<S: Stage>(
    source: &ConfigSource,
    about: &'static str,
    long_about: &'static str,
) -> ExitCode {
    // A set-user-id stage (the crypto stages) trusts nothing its caller chose: the
    // environment is emptied first thing, and only the system configuration is read.
    // What the dispatcher passed in the environment is read before it is emptied.
    let inherited = *crate::epoch::inherited();
    super::hands_forward();
    let setuid = pepsi_conf::privilege::scrub_if_setuid();
    // A set-group-id stage (the Maildir delivery, the smarthost relay, .forward) serves its
    // service account only, before it reads any option the caller chose.
    if let Err(e) = pepsi_conf::privilege::refuse_borrowed_group() {
        eprintln!("{}: {e}", source.exec);
        return ExitCode::from(1);
    }
    let matches = command(source, about, long_about).get_matches();
    let cli = match <StageCli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let system = std::path::Path::new(pepsi_conf::config::DEFAULT_CONFIG_PATH);
    if setuid && cli.common.config.as_deref().is_some_and(|c| c != system) {
        eprintln!(
            "{}: -c/--config: started through its set-user-id bit, this program reads {} only",
            source.exec,
            system.display()
        );
        return ExitCode::from(2);
    }
    init_logging(source, &cli.common.log_level);
    super::watchdog::start(source.exec, &inherited);
    // A worker handles one message at a time: one thread is all it needs.
    run_async_current_thread(source, async move {
        let StageCommand::Worker = cli.command;
        let file_cfg = cli.common.load_config()?;
        let db = crate::db::DbOptions::from_config(&file_cfg)?.for_worker();
        // A set-user-id stage (the crypto stages, set-uid pepsi-crypto) connects as the
        // account its bit makes it, whose database role holds what the program needs; the
        // URL names the server, and any user in it is not the one that counts.
        let pool = if setuid {
            // SAFETY: no arguments, cannot fail.
            let euid = unsafe { libc::geteuid() };
            let user = pepsi_conf::privilege::account_name(euid)?
                .ok_or_else(|| anyhow::anyhow!("the effective uid {euid} has no account name"))?;
            db.connect_for_passes_as(&user).await?
        } else {
            db.connect_for_passes().await?
        };
        let rows = crate::overlay::load_all_overrides(&pool).await?;
        let cfg = file_cfg.with_overrides(&rows, &Scope::Global);
        let scoped = ScopedOverrides::new(file_cfg, rows);
        let worker = Worker::with_scopes(
            S::build(&cfg)?,
            &pool,
            &cfg,
            super::fusion::installed(),
            scoped,
        )?;
        let input = tokio::io::BufReader::new(super::stdio::input());
        let handled = worker.run(input, super::stdio::output()).await?;
        tracing::debug!(program = S::PROGRAM, handled, "end of input");
        Ok(ExitCode::SUCCESS)
    })
}
