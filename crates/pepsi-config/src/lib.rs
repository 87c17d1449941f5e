//! pepsi-config: the operator's view of the configuration as the programs see it — the
//! files with the database overrides (`pepsi.config_override`) layered on top, every value
//! with the file line or override row it comes from — and the one way to change the
//! overrides: `set` and `unset`, `set` checked first against every program's own parser and
//! the rules of the stage graph (`pepsi_stage_validate::check_override` over the tables the
//! root package passes in), so a stored override never stops a program, never leaves a
//! stage an edge names without its section and never names an option nothing reads.
//! `check` judges the effective configuration the same way (`pepsi_stage_validate::validate`).
//!
//! Writes go through `pepsi_admin::admin` with their `pepsi.event_log` row; the table's
//! trigger announces them on `config_changed` and the running programs re-read. Values from
//! `secrets.d/` are never printed.

mod render;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use pepsi_admin::admin::{self, AdminError};
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::{
    Config, OverrideRow, ProgramCheck, Refusal, Scope, ValueRow, program_check, shown_values,
};
use pepsi_contract::audit::Actor;
use pepsi_contract::overlay::load_overrides;
use pepsi_stage_validate::{Tables, check_override, validate};
use serde::Serialize;
use sqlx::PgPool;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "config",
        exec: "pepsi-config",
    };
}

const EXIT_USAGE: u8 = 2;

const LONG_ABOUT: &str = "\
Show the effective configuration of Pepsi and change its database overrides.

The programs read the configuration file (with its @inline@ includes and secrets.d/
fragments) and then the rows of pepsi.config_override that apply to them: `global` rows,
then those of a recipient domain (`domain:example.org`), then those of an address
(`address:alice@example.org`), each later layer winning (docs/configuration.md).

`show` prints what applies, each value with where it comes from (file:line, or the override
row). With a program name it prints exactly the options that program reads, set or left at
their defaults. `check` runs every program's parser over the effective configuration and
checks the stage graph: every [stage-*] section runs a stage program, every stage a
NEXT_STAGE, BOUNCE_STAGE or branch names has its section, and [stage-init], where new mail
enters, exists. It reports what would stop a program or strand mail (errors) and what looks
wrong but works (warnings: a stage nothing reaches, a section without PROGRAM).

`set` and `unset` change an override. Before anything is stored, every program's parser
runs over the configuration as it would be: a value a program would refuse at start is
refused here with that program's message, and so is a value that leaves the stage graph
with an edge to a stage without its section, and an option no program reads (a typo) unless
--force. [PATHS], [database] and the listener sections, and options that name a program,
file, key or trust anchor, come from the file only. Each change is one transaction
with its pepsi.event_log row (config.set with the previous value, config.unset); the
table's trigger then notifies config_changed: the dispatcher retires its workers so their
replacements read the new value, the ingress applies it to the sessions that start after.

pepsi-config connects with [database] URL of the configuration. Writing overrides needs the
pepsi-config database role (docs/setup.md), the only one that may: with peer
authentication, run `sudo -u pepsi-config pepsi-config set ...`. Reading needs SELECT on
pepsi.config_override (every service role has it).

Values that come from secrets.d/ are shown as (secret), never printed.

Exit status: 0 when done (for `check`: no error, warnings allowed); 1 on an error, when a
change is refused because it would stop a program or break the stage graph, or when `check`
finds an error; 2 on a usage error (a malformed scope, a protected section, an option no
program reads).
See docs/config.md.";

const EXAMPLES: &str = "\
Examples:
  pepsi-config show pepsi-ingress                  every option the ingress reads
  pepsi-config show --section stage-relay          one section, with origins
  pepsi-config show --scope domain:example.org --json
  pepsi-config set stage-relay PARALLELISM 4
  pepsi-config set pepsi-ingress MAX_RECIPIENTS 50
  pepsi-config set stage-relay RETRY_MAX_INTERVAL 2h --scope domain:slow.example
  pepsi-config unset stage-relay PARALLELISM
  pepsi-config overrides                           every stored row
  pepsi-config check                               would anything stop a program?";

#[derive(Debug, Parser)]
#[command(
    name = "pepsi-config",
    version,
    about = "Show the effective Pepsi configuration and change its database overrides",
    long_about = LONG_ABOUT,
    after_long_help = EXAMPLES
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the effective configuration, each value with where it comes from.
    ///
    /// Without arguments: every section and option set in the files or the overrides.
    /// With PROGRAM names (pepsi-ingress, pepsi-stage-route, ...): exactly the options each
    /// reads, those left unset marked `(default)`.
    #[command(long_about)]
    Show(ShowArgs),
    /// Store an override, after checking it against every program's parser.
    Set(SetArgs),
    /// Delete an override.
    Unset(UnsetArgs),
    /// List the stored override rows.
    Overrides(OverridesArgs),
    /// Run every program's parser over the effective configuration and check the stage graph.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
struct ScopeArg {
    /// global, domain:DOMAIN or address:ADDRESS
    #[arg(long, value_name = "SCOPE", default_value = "global")]
    scope: String,
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// Programs whose options to show
    programs: Vec<String>,
    /// Only these sections (repeatable)
    #[arg(long = "section", value_name = "SECTION")]
    sections: Vec<String>,
    #[command(flatten)]
    scope: ScopeArg,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct SetArgs {
    /// The section, as in the file (stage-relay, pepsi-ingress, pepsi)
    section: String,
    /// The option (any letter case; stored upper-case)
    option: String,
    /// The value, read exactly like a value in the file (may start with `-`)
    #[arg(allow_hyphen_values = true)]
    value: String,
    #[command(flatten)]
    scope: ScopeArg,
    /// Store an option no program reads at start (one read only later, per message)
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct UnsetArgs {
    section: String,
    option: String,
    #[command(flatten)]
    scope: ScopeArg,
}

#[derive(Debug, Args)]
struct OverridesArgs {
    /// Only this scope (default: every row)
    #[arg(long, value_name = "SCOPE")]
    scope: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct CheckArgs {
    #[command(flatten)]
    scope: ScopeArg,
    #[arg(long)]
    json: bool,
}

/// The command line of `pepsi-config` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Runs `pepsi-config` with the process's arguments, judging configurations by `tables`
/// (the root package's `pepsi::programs::VALIDATION`).
pub fn run(tables: &'static Tables) -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let file = cli.common.load_config()?;
        let pool = pepsi_contract::db::connect(&file).await?;
        let tool = Tool {
            file,
            pool,
            tables,
            actor: Actor::local(constants::CONFIG_SOURCE.exec),
        };
        let result = match cli.command {
            Command::Show(a) => tool.show(a).await,
            Command::Set(a) => tool.set(a).await,
            Command::Unset(a) => tool.unset(a).await,
            Command::Overrides(a) => tool.overrides(a).await,
            Command::Check(a) => tool.check(a).await,
        };
        Ok(match result {
            Ok(code) => code,
            Err(failure) => {
                eprintln!("{}: {}", constants::CONFIG_SOURCE.exec, failure.text);
                ExitCode::from(failure.code)
            }
        })
    })
}

/// A refusal or error, with the exit status it ends in.
struct Failure {
    code: u8,
    text: String,
}

impl Failure {
    fn usage(text: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_USAGE,
            text: text.into(),
        }
    }
}

impl From<AdminError> for Failure {
    fn from(e: AdminError) -> Self {
        let code = if matches!(e, AdminError::Invalid(_)) {
            EXIT_USAGE
        } else {
            1
        };
        Failure {
            code,
            text: e.to_string(),
        }
    }
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        AdminError::Database(e).into()
    }
}

impl From<pepsi_conf::config::ConfigError> for Failure {
    fn from(e: pepsi_conf::config::ConfigError) -> Self {
        Failure {
            code: 1,
            text: e.to_string(),
        }
    }
}

impl From<Refusal> for Failure {
    fn from(e: Refusal) -> Self {
        let code = match e {
            Refusal::Breaks(_) => 1,
            Refusal::FileOnly(_) | Refusal::Unread(_) | Refusal::Unscoped(_) => EXIT_USAGE,
        };
        Failure {
            code,
            text: e.to_string(),
        }
    }
}

type Done = Result<ExitCode, Failure>;

/// `global`, `domain:DOMAIN` or `address:ADDRESS`, normalized (`admin::override_scope`).
fn parse_scope(text: &str) -> Result<Scope, Failure> {
    Ok(admin::override_scope(text)?)
}

fn print_json<T: Serialize>(v: &T) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(v).map_err(|e| Failure {
        code: 1,
        text: format!("encoding JSON: {e}"),
    })?;
    println!("{text}");
    Ok(())
}

struct Tool {
    file: Config,
    pool: PgPool,
    tables: &'static Tables,
    actor: Actor,
}

impl Tool {
    /// The configuration as a program working for `scope` sees it.
    async fn effective(&self, scope: &Scope) -> Result<Config, Failure> {
        let rows = load_overrides(&self.pool, scope).await?;
        Ok(self.file.with_overrides(&rows, scope))
    }

    fn program(&self, name: &str) -> Result<&'static ProgramCheck, Failure> {
        program_check(self.tables.checks, name).map_err(Failure::usage)
    }

    async fn show(&self, a: ShowArgs) -> Done {
        let scope = parse_scope(&a.scope.scope)?;
        let cfg = self.effective(&scope).await?;
        let programs = a
            .programs
            .iter()
            .map(|name| self.program(name))
            .collect::<Result<Vec<_>, _>>()?;
        let shown = shown_values(&cfg, &programs, &a.sections);
        for (program, error) in &shown.problems {
            eprintln!("{program}: {error}");
        }
        let rows = shown.values;
        if a.json {
            print_json(&render::Shown {
                scope: scope.to_db_string(),
                values: rows,
            })?;
        } else {
            print!("{}", render::values(&rows));
        }
        Ok(ExitCode::SUCCESS)
    }

    async fn set(&self, a: SetArgs) -> Done {
        let scope = parse_scope(&a.scope.scope)?;
        let (section, option) = admin::override_names(&a.section, &a.option)?;
        admin::override_value(&a.value)?;
        let base = self.effective(&scope).await?;
        let row = OverrideRow {
            scope: scope.to_db_string(),
            section: section.clone(),
            option: option.clone(),
            value: a.value.clone(),
        };
        check_override(&base, &row, &scope, self.tables, a.force)?;
        let previous = admin::put_override(
            &self.pool,
            &self.actor,
            &row.scope,
            &section,
            &option,
            &a.value,
        )
        .await?;
        let was = match previous {
            Some(p) => format!(" (was {p:?})"),
            None => String::new(),
        };
        println!(
            "set [{section}] {option} = {:?} for {}{was}",
            a.value, row.scope
        );
        Ok(ExitCode::SUCCESS)
    }

    async fn unset(&self, a: UnsetArgs) -> Done {
        let scope = parse_scope(&a.scope.scope)?;
        let (section, option) = admin::override_names(&a.section, &a.option)?;
        let previous = admin::delete_override(
            &self.pool,
            &self.actor,
            &scope.to_db_string(),
            &section,
            &option,
        )
        .await?;
        let now = self.effective(&scope).await?;
        let falls_back = match ValueRow::of(&now, &section, &option) {
            ValueRow {
                origin: Some(origin),
                ..
            } => format!("now from {origin}"),
            _ => "now the program's default".into(),
        };
        println!(
            "unset [{section}] {option} for {} (was {previous:?}; {falls_back})",
            scope.to_db_string()
        );
        Ok(ExitCode::SUCCESS)
    }

    async fn overrides(&self, a: OverridesArgs) -> Done {
        let scope = a.scope.as_deref().map(parse_scope).transpose()?;
        let key = scope.as_ref().map(Scope::to_db_string);
        let rows = admin::list_overrides(&self.pool, key.as_deref()).await?;
        if a.json {
            print_json(&serde_json::json!({ "overrides": rows }))?;
        } else {
            print!("{}", render::overrides(&rows));
        }
        Ok(ExitCode::SUCCESS)
    }

    async fn check(&self, a: CheckArgs) -> Done {
        let scope = parse_scope(&a.scope.scope)?;
        let cfg = self.effective(&scope).await?;
        let report = validate(&cfg, self.tables);
        if a.json {
            print_json(&serde_json::json!({
                "scope": scope.to_db_string(),
                "problems": report.errors().map(render::Problem::of).collect::<Vec<_>>(),
                "warnings": report.warnings().map(render::Warning::of).collect::<Vec<_>>(),
            }))?;
        } else {
            // Warnings first: the last line of a failed check is an error (pepsi-setup apply
            // quotes it).
            for p in report.warnings() {
                println!("warning: {p}");
            }
            for p in report.errors() {
                println!("error: {p}");
            }
            if report.is_ok() {
                println!(
                    "every program's configuration reads without error and the stage graph \
                     is whole ({}, scope {})",
                    report.summary(),
                    scope.to_db_string()
                );
            }
        }
        Ok(if report.is_ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    }
}
