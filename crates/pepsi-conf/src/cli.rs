//! The command-line convention every Pepsi program shares: `-c/--config`, `-L/--log-level`,
//! `-h`, `-V`, logs on stderr, and one error printed with its causes on failure.
//!
//! Never write to stdout here: a stage worker's stdout belongs to the status protocol.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{Config, ConfigSource};

/// A program's command line as clap defines it: what each crate's `command()` returns for
/// its manual page (`pepsi::manual`), so a crate need not depend on clap itself.
pub use clap::Command;

/// Options every program accepts; flatten into the program's clap parser.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// Configuration file (default: $PEPSI_CONFIG, else /etc/pepsi/pepsi.conf)
    #[arg(short = 'c', long = "config", value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,

    /// Log level or tracing filter for messages on stderr (error, warn, info, debug, trace)
    #[arg(
        short = 'L',
        long = "log-level",
        value_name = "LEVEL",
        default_value = "info",
        global = true
    )]
    pub log_level: String,
}

impl CommonArgs {
    /// Loads the configuration the options name.
    pub fn load_config(&self) -> anyhow::Result<Config> {
        Ok(Config::load_default(self.config.as_deref())?)
    }
}

/// Sends `tracing` output to stderr at the given level; `RUST_LOG` wins when set.
pub fn init_logging(source: &ConfigSource, level: &str) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .or_else(|| tracing_subscriber::EnvFilter::try_new(level).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
    tracing::debug!(program = source.exec, "logging initialised");
}

/// Runs an async program body on a fresh multi-threaded runtime and turns its result into
/// an exit code: 0 on success, 1 with `<program>: <error: causes>` on stderr otherwise.
pub fn run_async<F>(source: &ConfigSource, body: F) -> ExitCode
where
    F: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    run_on(source, tokio::runtime::Builder::new_multi_thread(), body)
}

/// `run_async` on a single-threaded runtime: for a program that does one thing at a time
/// (a stage worker), where a thread pool would only add wake-ups between threads.
pub fn run_async_current_thread<F>(source: &ConfigSource, body: F) -> ExitCode
where
    F: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    run_on(source, tokio::runtime::Builder::new_current_thread(), body)
}

fn run_on<F>(source: &ConfigSource, mut builder: tokio::runtime::Builder, body: F) -> ExitCode
where
    F: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{}: cannot start the async runtime: {e}", source.exec);
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(body) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}: {e:#}", source.exec);
            ExitCode::from(1)
        }
    }
}

/// A helper program as configured (`HELPER`): a path is used as is; a bare name is looked for
/// next to this program's own executable (an installed system's directory of programs),
/// then on PATH.
pub fn locate_program(configured: &str) -> std::path::PathBuf {
    if configured.contains('/') {
        return std::path::PathBuf::from(configured);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(configured)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| std::path::PathBuf::from(configured))
}

/// Exit status of an operator tool used wrongly or given input that is not valid.
pub const EXIT_USAGE: u8 = 2;

/// Why an operator tool's command failed: input that is not valid (exit status 2, the
/// message naming what was wrong) or anything else (status 1).
#[derive(Debug)]
pub enum ToolFailure {
    Invalid(String),
    Other(anyhow::Error),
}

/// Any error a tool meets below its own checks (the database's, a file's, anyhow's) is
/// `Other`: exit status 1 with its text. A typed error that means bad input must be turned
/// into `Invalid` by the tool before `?` (this conversion takes it as `Other`); and since
/// it takes every `Into<anyhow::Error>`, `ToolFailure` itself cannot be a `std::error::Error`.
impl<E: Into<anyhow::Error>> From<E> for ToolFailure {
    fn from(e: E) -> Self {
        ToolFailure::Other(e.into())
    }
}

/// The exit status of a tool command's result, its failure printed as `<program>: <text>`.
pub fn tool_exit(source: &ConfigSource, result: Result<(), ToolFailure>) -> ExitCode {
    let (code, text) = match result {
        Ok(()) => return ExitCode::SUCCESS,
        Err(ToolFailure::Invalid(e)) => (EXIT_USAGE, e),
        Err(ToolFailure::Other(e)) => (1, format!("{e:#}")),
    };
    eprintln!("{}: {text}", source.exec);
    ExitCode::from(code)
}
