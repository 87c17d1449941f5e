//! The errors of the configuration layer, worded for the operator who has to fix the file.
//!
//! Every message names where the problem is (file and line, or the database override that
//! supplied the value), what was found and what was expected. A value that came from a
//! `secrets.d/` fragment is never printed.

use std::path::PathBuf;

use super::Origin;

/// Why the configuration could not be loaded or a value could not be read.
///
/// Messages are lowercase, carry no trailing period and are complete on their own: the
/// underlying I/O or database error is part of the message rather than a separate source,
/// so `{:#}` printing does not repeat it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file or directory could not be read.
    #[error("{path}: {error}", path = .path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    /// The main configuration file does not exist; `chosen` says how its path was picked.
    #[error("configuration file {path} does not exist ({chosen})", path = .path.display())]
    NotFound { path: PathBuf, chosen: &'static str },

    /// A line is neither a section header, an assignment, a comment nor a directive.
    #[error("{path}:{line}: cannot parse {text:?}: {reason}", path = .path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        text: String,
        reason: String,
    },

    /// A file named by `@inline@` could not be read.
    #[error("{path}:{line}: cannot read included file {target}: {error}", path = .path.display(), target = .target.display())]
    Include {
        path: PathBuf,
        line: usize,
        target: PathBuf,
        error: std::io::Error,
    },

    /// An `@inline@` chain leads back to a file that is still being read.
    #[error("{path}:{line}: @inline@ {target} would include itself ({chain})", path = .path.display(), target = .target.display())]
    IncludeCycle {
        path: PathBuf,
        line: usize,
        target: PathBuf,
        chain: String,
    },

    /// The path after `@inline@` could not be expanded.
    #[error("{path}:{line}: @inline@ {target}: {problem}", path = .path.display())]
    IncludeExpansion {
        path: PathBuf,
        line: usize,
        target: String,
        problem: Box<ExpandProblem>,
    },

    /// A secrets fragment that any local user could read; refused rather than trusted.
    #[error(
        "{path}: secrets fragment is readable by every user (mode {mode:04o}); run `chmod o-r {path}` and restart",
        path = .path.display()
    )]
    WorldReadable { path: PathBuf, mode: u32 },

    /// A required option is absent from every file and override.
    #[error("{file}: [{section}] {option} is required but missing", file = .file.display())]
    Missing {
        file: PathBuf,
        section: String,
        option: String,
    },

    /// A value is present but is not of the expected kind.
    #[error("{at} = {shown}: expected {expected}", shown = show_value(.raw, .value, *.secret))]
    Invalid {
        at: Box<ValueAt>,
        /// The value as written.
        raw: String,
        /// The value after `$VAR` expansion, which is what failed to parse.
        value: String,
        /// True when the value came from a `secrets.d/` fragment and must not be shown.
        secret: bool,
        expected: String,
    },

    /// A `$VAR` reference in a value could not be expanded.
    #[error("{at}: {problem}")]
    Expansion {
        at: Box<ValueAt>,
        problem: ExpandProblem,
    },

    /// The database overlay could not be read.
    #[error("cannot load configuration overrides from the database: {0}")]
    Database(Box<dyn std::error::Error + Send + Sync>),
}

/// The option a value belongs to and where that value was set, shown as
/// `<file>:<line>: [<section>] <OPTION>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: [{section}] {option}")]
pub struct ValueAt {
    pub origin: Origin,
    /// The section name as written in the file.
    pub section: String,
    /// The option name as written where the value was set.
    pub option: String,
}

impl ConfigError {
    /// True when trying again later may succeed without anyone editing a file: only a
    /// database failure qualifies, every other error needs the operator.
    pub fn is_temporary(&self) -> bool {
        matches!(self, ConfigError::Database(_))
    }
}

impl ConfigError {
    /// The overlay's rows could not be read; `error` is the database's.
    pub fn database(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        ConfigError::Database(Box::new(error))
    }
}

/// What went wrong while expanding `$VAR`, `${VAR}` or `${VAR:-default}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpandProblem {
    /// Neither `[PATHS]` nor the environment defines the variable, and no default was given.
    #[error("variable {variable} is not set in {searched} and has no default{via}",
        via = .via.as_deref().map(|v| format!(" (reached through {v})")).unwrap_or_default())]
    Unset {
        variable: String,
        /// Where the variable was looked for, e.g. "[PATHS] or the environment".
        searched: &'static str,
        /// The `[PATHS]` entry whose value held the reference, when it was not the option itself.
        via: Option<String>,
    },

    /// `[PATHS]` entries refer to each other in a circle.
    #[error("expansion loops through [PATHS]: {chain}")]
    Loop { chain: String },

    /// The chain of `[PATHS]` references is longer than any sane configuration needs.
    #[error("expansion of {variable} nests deeper than {limit} levels")]
    TooDeep { variable: String, limit: usize },

    /// The text around a `$` cannot be read as a reference.
    #[error("{reason} in {text:?}")]
    Malformed { text: String, reason: &'static str },
}

fn show_value(raw: &str, value: &str, secret: bool) -> String {
    if secret {
        "(value from a secrets fragment, not shown)".to_owned()
    } else if raw == value {
        format!("{value:?}")
    } else {
        format!("{raw:?} (expanded to {value:?})")
    }
}
