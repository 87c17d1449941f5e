//! The stage contract: how a stage program loads its row, records changes and ends with
//! exactly one terminal outcome, and the worker loop that feeds it ids from stdin.
//!
//! A worker reads workqueue ids from stdin (pipelined by the dispatcher, processed strictly
//! in order) and writes one status line per id to stdout: `0` on success, optionally with a
//! JSON report (`{"finished":true}` when the pass ended the message, `"fused"` listing the
//! stages fused into the pass, `"handed"` naming the stage an advanced row was left running
//! at for the dispatcher to pass on, `"settled":true` when the pass left no pending row
//! anywhere), or `1 {"error": "...", "temporary": bool}` when the message could not be
//! handled (with `"misplaced":true` when the row was not as handed: gone, not running for
//! the worker, or at a stage of another program; the pass wrote nothing). Nothing else may ever be written to stdout; logs go to stderr.
//!
//! A stage is a [`Stage`]: built once at worker start from the configuration, with one typed
//! [`Stage::Section`] per `[stage-<name>]` section that runs it, and a `process` that returns
//! the pass's one [`Terminal`]. Two optimisations sit under the contract (`fusion`, and the
//! batching of `Load::Metadata` stages in `worker`) without changing what a pass means.
//!
//! Only this module and `db` issue queue SQL in `pepsi-contract`. The SQL texts are fixed:
//! the commit UPDATE is assembled from constant fragments for the columns a stage touched.

/// `pepsi.claim_held` for a statement that looks at many rows, the literals naming the row's
/// `claim_epoch`: whether this session's epoch is unfenced is asked once for the statement
/// (an uncorrelated subquery, planned as an InitPlan) rather than once per row looked at
/// (procedures.sql, the two-argument `claim_held`).
macro_rules! claim_held_many {
    ($($col:literal),+) => {
        concat!(
            "pepsi.claim_held(",
            $($col,)+
            ", (SELECT NOT pepsi.epoch_fenced(pepsi.session_epoch())))"
        )
    };
}

mod commit;
mod context;
pub mod edges;
mod fanout;
pub mod fusion;
pub mod scope;
mod stdio;
mod trace;
mod watchdog;
mod worker;

use std::collections::HashMap;
use std::future::Future;

pub use crate::round::RoundMemo;
pub use context::notify_includes;
pub use context::{CloneSpec, StageContext, Terminal};
pub use fanout::{FanGroup, FanRecipients, GroupStatus};
/// Set to `1` by a dispatcher on the workers it starts when it takes advanced rows straight
/// from their status lines (`[pepsi-dispatch] HAND_FORWARD`): an advance then leaves the row
/// `running` at its next stage, already claimed for that stage's pool, and the status line
/// names the stage (`"handed"`). Without it (a worker run by hand, an older dispatcher) an
/// advance leaves the row `pending` for the next claim.
pub const HAND_FORWARD_ENV: &str = "PEPSI_HAND_FORWARD";

/// Whether this worker hands advanced rows forward (read once). Only to stages whose
/// section names a PROGRAM, the stages the dispatcher has a pool for.
pub(crate) fn hands_forward() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(HAND_FORWARD_ENV).is_ok_and(|v| v == "1"))
}

pub use worker::{FusedHop, PassReport, Worker, command, main, run_worker};

use pepsi_conf::config::{Config, ConfigError, StageName};

/// How much of a row a stage loads: fixed per stage, and the cheap envelope, status and
/// state columns are always loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Load {
    /// Envelope and state only (SRS, discard, if, aliases, route).
    Metadata,
    /// Adds the header block (bounce, vacation, block-language).
    Headers,
    /// Adds the body as well (relays, signing, anything that transmits or hashes the message).
    Full,
}

impl Load {
    /// The names `[stage-*] LOAD` takes, in order.
    pub const NAMES: [&'static str; 3] = ["metadata", "headers", "full"];

    /// The lower-case name (`metadata`, `headers`, `full`).
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// `[stage-<stage>] LOAD`: what a worker of the section loads at least, so that a fused
    /// chain can go on into successors that need more than the stage itself (the chain
    /// from `init` into the signing stages loads the body once).
    /// It may not be less than `needs`, the stage's own Load; the error names the section.
    pub fn configured(cfg: &Config, stage: &str, needs: Load) -> Result<Option<Load>, ConfigError> {
        cfg.stage_section_named(stage).parse_opt("LOAD", |v| {
            let v = v.trim().to_ascii_lowercase();
            let load = match v.as_str() {
                "metadata" => Load::Metadata,
                "headers" => Load::Headers,
                "full" => Load::Full,
                _ => return Err("metadata, headers or full".to_owned()),
            };
            if load < needs {
                return Err(format!(
                    "at least {}, what the stage's program needs",
                    needs.name()
                ));
            }
            Ok(load)
        })
    }
}

/// A stage program: its name in `[stage-*] PROGRAM`, what it loads, what it builds once at
/// worker start, and what it does with one message.
///
/// `build` and `section` run before the first id is read, so a bad option stops the worker
/// with an error naming it; `process` never parses configuration. `process` returns the
/// pass's outcome, made by one of the context's terminal helpers, so a pass has exactly one.
pub trait Stage: Sized + 'static {
    /// The binary name operators write as `PROGRAM` in a stage section.
    const PROGRAM: &'static str;
    /// The columns this stage needs.
    const LOAD: Load;
    /// Whether a worker running this stage batches: takes the ids already waiting on stdin
    /// (up to QUEUE_LIMIT), loads them with one SELECT and commits their advances, pauses,
    /// fails and finishes with one statement, answering after the whole round. On by default
    /// for body-free stages (§22.5); a stage that loads more opts in when its passes are
    /// short and local (a Maildir delivery, signing, a notice), never when one pass may wait
    /// on the network, since every answer of a round waits for its slowest pass. A batching
    /// worker fuses only successors that batch too.
    const BATCH: bool = matches!(Self::LOAD, Load::Metadata);
    /// What one `[stage-<name>]` section running this program configures, parsed once.
    type Section: 'static;

    /// The program-wide part, built once from the whole configuration (keys, local domains).
    fn build(cfg: &Config) -> anyhow::Result<Self>;

    /// Parses `[stage-<name>]` (`name` as written in the configuration).
    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Self::Section>;

    /// Whether this stage may run fused behind another stage in the same pass (its own
    /// Load permitting). A stage that must run in a pass of its own answers false.
    fn can_fuse(&self, _section: &Self::Section, _ctx: &StageContext<'_>) -> bool {
        true
    }

    /// The stages a section running this program can send a message to, read from the
    /// section's own options into `section` (`edges::Declare`): NEXT_STAGE unless the
    /// program routes by options of its own. BOUNCE_STAGE is every stage's and is not
    /// declared here. pepsi-httpd's pipeline graph is drawn from these (`edges::declared`).
    fn edges(section: &mut edges::Declare<'_>) {
        section.next();
    }

    fn process(
        &self,
        section: &Self::Section,
        ctx: &mut StageContext<'_>,
    ) -> impl Future<Output = Result<Terminal, StageError>>;

    /// Makes durable what the passes since the last call did outside the database (a
    /// Maildir's directory entries, written with their sync left for later). The worker
    /// calls it before every commit, so no pass is committed as done before what it did is
    /// durable; a batch round thus pays for one sync, not one per pass. An error fails
    /// every pass the commit would have recorded, uncommitted, as a crash would.
    fn before_commit(&self) -> impl Future<Output = Result<(), StageError>> {
        async { Ok(()) }
    }
}

/// The dispatcher's MAX_RUNTIME of a stage section that sets none.
pub const DEFAULT_MAX_RUNTIME: std::time::Duration = std::time::Duration::from_secs(300);

/// The MAX_RUNTIME a pass of `stage` runs under, and the stage it belongs to: the
/// dispatcher's limit for the stage's own pool and, since a fused chain runs in the pass of
/// its first stage, for every stage whose NEXT_STAGE chain leads to it; the shortest of
/// them. A stage whose single pass may take long (a delivery attempt) checks its own bound
/// against this at start.
pub fn governing_max_runtime(
    cfg: &Config,
    stage: &str,
) -> Result<(std::time::Duration, String), ConfigError> {
    let runtime = |name: &str| -> Result<std::time::Duration, ConfigError> {
        Ok(cfg
            .stage_section_named(name)
            .duration_opt("MAX_RUNTIME")?
            .unwrap_or(DEFAULT_MAX_RUNTIME))
    };
    let mut best = (runtime(stage)?, stage.to_owned());
    let mut reached = vec![stage.to_ascii_lowercase()];
    let mut i = 0;
    while i < reached.len() {
        let target = reached[i].clone();
        for name in cfg.stage_names() {
            // The default edge every stage declares (`edges::Declare::next`).
            let next = edges::next_stage(&cfg.stage_section(&name))?.unwrap_or_default();
            let lower = name.to_ascii_lowercase();
            if next.eq_ignore_ascii_case(&target) && !reached.contains(&lower) {
                let limit = runtime(&name)?;
                if limit < best.0 {
                    best = (limit, name.to_string());
                }
                reached.push(lower);
            }
        }
        i += 1;
    }
    Ok(best)
}

/// A delivery stage's `ATTEMPT_TIMEOUT` against the MAX_RUNTIME its passes run under
/// (`governing_max_runtime`): an attempt must end at least 10 s before, with room for the
/// commit, or the dispatcher would kill a worker waiting on a slow peer and the message
/// would end as `timeout`. The error names both options.
pub fn check_attempt_timeout(
    cfg: &Config,
    stage: &str,
    attempt: std::time::Duration,
) -> Result<(), String> {
    let (limit, of) = governing_max_runtime(cfg, stage).map_err(|e| e.to_string())?;
    if attempt.is_zero() {
        return Err(format!(
            "[stage-{stage}] ATTEMPT_TIMEOUT must be longer than 0"
        ));
    }
    if attempt + std::time::Duration::from_secs(10) > limit {
        return Err(format!(
            "[stage-{stage}] ATTEMPT_TIMEOUT = {}s does not end 10s before MAX_RUNTIME = {}s \
             of [stage-{of}], under which its passes run: the dispatcher would kill a worker \
             waiting on a slow peer and the message would end as `timeout`; lower \
             ATTEMPT_TIMEOUT or raise [stage-{of}] MAX_RUNTIME",
            attempt.as_secs(),
            limit.as_secs()
        ));
    }
    Ok(())
}

/// `ATTEMPT_TIMEOUT` of a delivery stage when unset: a minute under the dispatcher's default
/// MAX_RUNTIME.
pub const DEFAULT_ATTEMPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(240);

/// Parses every `[stage-*]` section whose PROGRAM is `S::PROGRAM` for `stage`, keyed by
/// lower-case stage name: what a worker does at start (the error names the section).
pub fn sections<S: Stage>(stage: &S, cfg: &Config) -> anyhow::Result<HashMap<String, S::Section>> {
    use anyhow::Context as _;
    let mut sections = HashMap::new();
    for name in StageOptions::stages_of(cfg, S::PROGRAM) {
        let section = stage
            .section(cfg, &name)
            .with_context(|| format!("[stage-{name}]"))?;
        sections.insert(name.to_ascii_lowercase(), section);
    }
    Ok(sections)
}

/// What a worker of `S` parses at start, without a database: its stage sections' common
/// settings, `build` and every section naming `S::PROGRAM` (nothing when none does).
/// pepsi-config runs it over a candidate configuration (`config::check_override`).
pub fn check_config<S: Stage>(cfg: &Config) -> anyhow::Result<()> {
    let names = StageOptions::stages_of(cfg, S::PROGRAM);
    if names.is_empty() {
        return Ok(());
    }
    for name in &names {
        StageOptions::from_config(cfg, name)?;
        // What the worker reads of the section itself (the batch's bounds).
        let section = cfg.stage_section_named(name);
        section.number_opt::<usize>("QUEUE_LIMIT")?;
        section.duration_opt("ROUND_TIME")?;
        Load::configured(cfg, name, S::LOAD)?;
    }
    let stage = S::build(cfg)?;
    sections(&stage, cfg)?;
    Ok(())
}

/// A stage section's settings, resolved for the message's current stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageOptions {
    /// The stage name (the section is `[stage-<name>]`), as asked for: the section matched
    /// it in any letter case.
    pub name: StageName,
    pub program: String,
    pub next_stage: Option<String>,
    pub bounce_stage: Option<String>,
    pub originate_success_dsn: bool,
    /// `MAIL_LOG` of the section, else of `[pepsi]` (default on): final outcomes decided at
    /// this stage are written to `pepsi.mail_log` with the pass's commit.
    pub mail_log: bool,
}

impl StageOptions {
    /// Reads `[stage-<name>]`; the section must exist and name a PROGRAM.
    pub fn from_config(cfg: &Config, name: &str) -> Result<Self, StageError> {
        let Some(stage) = cfg.stage(name) else {
            return Err(StageError::NoSection {
                stage: name.to_owned(),
            });
        };
        let section = cfg.stage_section(&stage);
        // Read before the section's own value, so a bad [pepsi] value stops every stage.
        let global = cfg
            .section("pepsi")
            .bool_opt("ORIGINATE_SUCCESS_DSN")?
            .unwrap_or(false);
        Ok(Self {
            name: stage,
            program: section.string("PROGRAM")?,
            // The same readers the stage graph uses (pepsi-httpd, the MAX_RUNTIME walk).
            next_stage: edges::next_stage(&section)?,
            bounce_stage: edges::bounce_stage(&section)?,
            originate_success_dsn: section.bool_opt("ORIGINATE_SUCCESS_DSN")?.unwrap_or(global),
            mail_log: section.or_global().bool_opt("MAIL_LOG")?.unwrap_or(true),
        })
    }

    /// Every stage section that names a PROGRAM, keyed by lower-case stage name. A section
    /// that cannot be read is left out here (its own program's worker reports it at start).
    pub fn all(cfg: &Config) -> HashMap<String, StageOptions> {
        cfg.stage_names()
            .filter_map(|name| {
                let settings = Self::from_config(cfg, &name).ok()?;
                Some((name.to_ascii_lowercase(), settings))
            })
            .collect()
    }

    /// The names of the stages (`[stage-<name>]` sections, name as written) whose PROGRAM
    /// is `program`: what a stage built at start compiles its per-stage settings for.
    pub fn stages_of(cfg: &Config, program: &str) -> Vec<StageName> {
        cfg.stage_names()
            .filter(|name| {
                cfg.stage_section(name)
                    .string_opt("PROGRAM")
                    .ok()
                    .flatten()
                    .is_some_and(|p| runs_program(&p, program))
            })
            .collect()
    }

    /// True when the section's PROGRAM (a name or a path) is `program`.
    pub fn runs(&self, program: &str) -> bool {
        runs_program(&self.program, program)
    }
}

/// The program name of a PROGRAM option (a name or a path, possibly followed by words).
pub fn program_name(configured: &str) -> &str {
    let configured = configured.split_whitespace().next().unwrap_or("");
    std::path::Path::new(configured)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
}

fn runs_program(configured: &str, program: &str) -> bool {
    program_name(configured) == program
}

/// Why a stage could not handle a message. `is_temporary` tells a failure worth retrying
/// from one that is not.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("workqueue id {0:?} is not a number")]
    BadId(String),
    #[error("workqueue row {0} does not exist")]
    NoSuchRow(i64),
    #[error("workqueue row {id} is {status}, not running")]
    NotRunning { id: i64, status: String },
    #[error("stage {stage:?} has no [stage-{stage}] section in the configuration")]
    NoSection { stage: String },
    #[error(
        "workqueue row {id} is at stage {stage:?} whose PROGRAM is {configured:?}, not {program}"
    )]
    WrongProgram {
        id: i64,
        stage: String,
        configured: String,
        program: String,
    },
    #[error("the stage read its {wanted} but declared Load::{declared:?}")]
    UnderDeclared {
        wanted: &'static str,
        declared: Load,
    },
    #[error("{helper} cannot follow a content change ({changed}): it would be lost")]
    ContentWouldBeLost {
        helper: &'static str,
        changed: String,
    },
    #[error("stage {0:?} was not configured when this worker started")]
    NotBuilt(String),
    #[error("stage {0:?} has no NEXT_STAGE to advance to")]
    NoNextStage(String),
    #[error("stage {0:?} has no BOUNCE_STAGE")]
    NoBounceStage(String),
    #[error("recipient index {index} out of range: the message has {count} recipients")]
    BadRecipientIndex { index: usize, count: usize },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("temporary failure: {0}")]
    Temporary(String),
    #[error("{0}")]
    Permanent(String),
}

impl StageError {
    /// True when trying again later may succeed.
    pub fn is_temporary(&self) -> bool {
        match self {
            StageError::Temporary(_) => true,
            StageError::Database(e) => {
                !matches!(e, sqlx::Error::Database(db) if db.code().as_deref().is_some_and(|c| c.starts_with("22") || c.starts_with("23")))
            }
            _ => false,
        }
    }

    /// True when the row was not as the worker was handed it: gone, not running for this
    /// worker's dispatcher epoch (when it loaded, or when its commit found no row to
    /// change), or at a stage whose PROGRAM is another. The pass wrote nothing of its own:
    /// what the database holds stands (an asynchronous commit PostgreSQL lost in a crash,
    /// a claim taken back), and the dispatcher returns the row rather than fail it.
    pub fn is_misplaced(&self) -> bool {
        matches!(
            self,
            StageError::NoSuchRow(_)
                | StageError::NotRunning { .. }
                | StageError::WrongProgram { .. }
        )
    }
}
