//! The stage contract: how a stage program loads its row, records changes and ends with
//! exactly one terminal helper, and the worker loop that feeds it ids from stdin.
//!
//! A worker reads workqueue ids from stdin (pipelined by the dispatcher, processed strictly
//! in order) and writes one status line per id to stdout: `0` on success (`0
//! {"finished":true}` when the pass ended the message), or `1 {"error": "...", "temporary":
//! bool}` when the message could not be handled and the row was left as it was. Nothing else may ever be written to stdout; logs go to stderr.
//!
//! Only this module and `db` issue queue SQL in `pepsi-common`. The SQL texts are fixed:
//! the commit UPDATE is assembled from constant fragments for the columns a stage touched.

mod commit;
mod context;
mod fanout;
mod worker;

use std::future::Future;

pub(crate) use context::notify_includes;
pub use context::{CloneSpec, StageContext};
pub use fanout::{FanGroup, FanRecipients, GroupStatus};
pub use worker::{
    PassReport, main, main_with, main_with_long_about, main_with_long_about_built, prepare_on,
    run_pass, run_worker,
};

use crate::config::{Config, ConfigError};

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

/// A stage program: its name in `[stage-*] PROGRAM`, what it loads, and what it does with one
/// message. `process` must call exactly one terminal helper of the context.
pub trait Stage {
    /// The binary name operators write as `PROGRAM` in a stage section.
    const PROGRAM: &'static str;
    /// The columns this stage needs.
    const LOAD: Load;

    fn process(&self, ctx: &mut StageContext<'_>) -> impl Future<Output = Result<(), StageError>>;
}

/// A stage section's settings, resolved for the message's current stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageSettings {
    /// The stage name (the section is `[stage-<name>]`).
    pub name: String,
    pub program: String,
    pub next_stage: Option<String>,
    pub bounce_stage: Option<String>,
    pub originate_success_dsn: bool,
}

impl StageSettings {
    /// Reads `[stage-<name>]`; the section must exist and name a PROGRAM.
    pub fn from_config(cfg: &Config, name: &str) -> Result<Self, StageError> {
        let section_name = format!("stage-{name}");
        if !cfg.has_section(&section_name) {
            return Err(StageError::NoSection {
                stage: name.to_owned(),
            });
        }
        let section = cfg.section(&section_name);
        let global = cfg
            .section("pepsi")
            .bool_opt("ORIGINATE_SUCCESS_DSN")?
            .unwrap_or(false);
        Ok(Self {
            name: name.to_owned(),
            program: section.string("PROGRAM")?,
            next_stage: section.string_opt("NEXT_STAGE")?.filter(|s| !s.is_empty()),
            bounce_stage: section
                .string_opt("BOUNCE_STAGE")?
                .filter(|s| !s.is_empty()),
            originate_success_dsn: section.bool_opt("ORIGINATE_SUCCESS_DSN")?.unwrap_or(global),
        })
    }

    /// The names of the stages (`[stage-<name>]` sections, name as written) whose PROGRAM
    /// is `program`: what a stage built at start compiles its per-stage settings for.
    pub fn stages_of(cfg: &Config, program: &str) -> Vec<String> {
        cfg.sections()
            .filter_map(|s| {
                s.get(..6)
                    .filter(|p| p.eq_ignore_ascii_case("stage-"))
                    .map(|_| s[6..].to_owned())
            })
            .filter(|name| {
                cfg.section(&format!("stage-{name}"))
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

fn runs_program(configured: &str, program: &str) -> bool {
    let configured = configured.split_whitespace().next().unwrap_or("");
    std::path::Path::new(configured)
        .file_name()
        .is_some_and(|name| name == program)
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
    #[error("the stage ended without calling a terminal helper")]
    NoTerminal,
    #[error("a terminal helper was already called ({0})")]
    SecondTerminal(&'static str),
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
}

/// What a stage program compiled at start for the stage section `stage` (the map is keyed
/// by lower-case stage name): a condition, a route table. A stage added to the configuration
/// after the worker started is an error for an operator, not a reason to guess.
pub fn built_for<'m, T>(
    stages: &'m std::collections::HashMap<String, T>,
    stage: &str,
) -> Result<&'m T, StageError> {
    stages.get(&stage.to_ascii_lowercase()).ok_or_else(|| {
        StageError::Permanent(format!(
            "stage {stage:?} was not configured when this worker started"
        ))
    })
}
