//! pepsi-setup: creates, upgrades and verifies the Pepsi database.
//!
//! `pepsi-setup db` applies the numbered patches in `db/` that the database lacks, re-applies
//! `db/procedures.sql`, creates the PostgreSQL roles and brings their privileges to exactly
//! the matrix in `schema::privilege_matrix`, then verifies that matrix against the live
//! server. A second run changes nothing.

pub mod schema;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pepsi_common::cli::{CommonArgs, init_logging, run_async};
pub mod constants {
    use pepsi_common::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "setup",
        exec: "pepsi-setup",
    };
}

/// Provision and upgrade a Pepsi installation.
#[derive(Debug, Parser)]
#[command(name = "pepsi-setup", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or upgrade the database, its procedures, roles and grants, then verify them.
    ///
    /// Creates the database named in the URL when it does not exist, applies every numbered
    /// patch not yet recorded in pepsi.schema_patch (each in the same transaction as its
    /// record), re-applies procedures.sql, creates the roles (pipeline, ingress, config) and
    /// grants each exactly its privileges, and checks them against the live server. Running
    /// it again changes nothing. Exit status 0 when the database is current and verified,
    /// 1 on any error, 2 when --check finds work to do.
    #[command(long_about)]
    Db(DbArgs),
}

#[derive(Debug, clap::Args)]
struct DbArgs {
    /// PostgreSQL URL; overrides [database] URL of the configuration file
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,

    /// Only report what would change and verify the grants; change nothing
    #[arg(long)]
    check: bool,

    /// Print the report as JSON
    #[arg(long)]
    json: bool,
}

/// Entry point of the `pepsi-setup` binary.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        match cli.command {
            Command::Db(args) => db_command(&cli.common, args).await,
        }
    })
}

async fn db_command(common: &CommonArgs, args: DbArgs) -> anyhow::Result<ExitCode> {
    let (url, roles) = match &args.database_url {
        Some(url) => {
            let roles = match common.config.is_some() {
                true => schema::Roles::from_config(&common.load_config()?)?,
                false => schema::Roles::default(),
            };
            (url.clone(), roles)
        }
        None => {
            let cfg = common.load_config()?;
            (
                cfg.section("database").string("URL")?,
                schema::Roles::from_config(&cfg)?,
            )
        }
    };
    let report = if args.check {
        schema::check(&url, &roles).await?
    } else {
        schema::setup_url(&url, &roles).await?
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.render());
    }
    Ok(if args.check && !report.is_current() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
