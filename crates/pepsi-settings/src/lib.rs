//! pepsi-settings: the operator's tool for what `pepsi.settings` and the mailbox tables
//! hold — mailbox accounts (create, delete, enable, disable, set a password, hashed here),
//! aliases and catch-alls, local domains, and any other setting a Pepsi program reads.
//!
//! Every change goes through `pepsi_admin::admin`, which validates the input where it
//! enters and writes the change and its `pepsi.event_log` row in one transaction, exactly
//! as pepsi-httpd's API does; this crate issues no SQL of its own. Presentation is in
//! `render`. A password is read from a terminal without echo, from stdin or from a file,
//! and never appears in an argument, a log line or the audit log.

mod password;
mod render;

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use pepsi_admin::admin::{self, AdminError, KNOWN_SETTINGS};
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_contract::audit::Actor;
use pepsi_contract::local::{LOCAL_DOMAIN_SETTING, LocalRecipients};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;

use crate::password::PasswordSource;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "settings",
        exec: "pepsi-settings",
    };
}

/// Exit status of a command used wrongly or given input that is not valid.
const EXIT_USAGE: u8 = 2;
/// The most rows a listing shows unless told otherwise.
const DEFAULT_LIMIT: i64 = 1000;

const LONG_ABOUT: &str = "\
Manage mailbox accounts and the per-address settings layer (pepsi.settings) of Pepsi.

`account` creates, lists, enables, disables and deletes mailboxes (pepsi.mailbox_account)
and sets their passwords (pepsi.mailbox_password, Argon2id, hashed by this tool: the
password never reaches the database, an argument or a log). `alias` sets where an address's
mail goes instead; an alias for @domain is the domain's catch-all. `domain` adds and removes
local domains beside those of [pepsi] LOCAL_DOMAINS. `set`, `unset`, `list` and `show` reach
every setting a Pepsi program reads (`names` lists them with the shape of their rows);
values are validated before they are stored, so a row the software cannot read is never
written.

Every change is one transaction together with its pepsi.event_log row (actions
account.create, account.delete, account.enable, account.disable, account.password,
settings.set, settings.delete), recording the database role, this program and the
operating-system user. Changes take effect for the next message: the stages and the ingress
read the settings layer per message.

pepsi-settings connects with [database] URL of the configuration as the role named there.
Settings rows need INSERT, UPDATE and DELETE on pepsi.settings; accounts and passwords also
need them on pepsi.mailbox_account and pepsi.mailbox_password, which only the pepsi-httpd
role holds among the service roles (docs/setup.md): run the account commands as that role
(with peer authentication: `sudo -u pepsi-httpd pepsi-settings account add ...`) or as a
database superuser.

Passwords: from the terminal (asked twice, not echoed) when stdin is one; otherwise give
--password-stdin (the first line of stdin) or --password-file FILE (its first line). A
password is 1 to 1024 bytes without NUL, CR or LF.

Exit status: 0 when the change was made (or the listing printed), 1 when it could not be
(no such mailbox, it exists already, a database error), 2 on a usage error or input that is
not valid (a malformed address, an unknown setting, a bad value). See docs/settings.md.";

const EXAMPLES: &str = "\
Examples:
  pepsi-settings account add alice@example.org              asks for the password
  echo \"$PW\" | pepsi-settings account add bob@example.org --password-stdin
  pepsi-settings account password alice@example.org --password-file /root/pw
  pepsi-settings account disable alice@example.org
  pepsi-settings account list --search example.org --json
  pepsi-settings alias set postmaster@example.org alice@example.org bob@example.org
  pepsi-settings alias set @example.org alice@example.org     catch-all of the domain
  pepsi-settings domain add example.net
  pepsi-settings set alice@example.org send_as @example.net
  pepsi-settings show alice@example.org                       what applies to an address
  pepsi-settings unset alice@example.org send_as";

/// Manage mailbox accounts and per-address settings.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-settings",
    version,
    about,
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
    /// Mailbox accounts: list, add, password, enable, disable, delete.
    #[command(subcommand)]
    Account(AccountCommand),
    /// Aliases and catch-alls: list, set, delete.
    #[command(subcommand)]
    Alias(AliasCommand),
    /// Local domains kept in the settings layer: list, add, delete.
    #[command(subcommand)]
    Domain(DomainCommand),
    /// Store a setting: KEY (an address, or @domain) NAME VALUE...
    ///
    /// The value is checked against what the setting takes (see `names`): `yes` for a
    /// flag, one or more addresses (separated by spaces or commas) for a list. An existing
    /// row is replaced; the audit log keeps its previous value.
    #[command(long_about)]
    Set(SetArgs),
    /// Delete a setting: KEY NAME.
    Unset(UnsetArgs),
    /// List the stored rows of every setting, or of the names given.
    List(ListArgs),
    /// Show what applies to one address: its mailbox and every known setting, with the row
    /// it comes from (the address's own, else its domain's).
    Show(ShowArgs),
    /// The settings Pepsi reads: name, key, value, who reads it.
    Names(JsonFlag),
}

#[derive(Debug, Subcommand)]
enum AccountCommand {
    /// List mailboxes in address order.
    List(AccountListArgs),
    /// Create a mailbox, with a password unless --no-password.
    Add(AccountAddArgs),
    /// Set or replace a mailbox's password.
    Password(AccountPasswordArgs),
    /// Let a disabled mailbox receive mail and log in again.
    Enable(AddressArg),
    /// Keep a mailbox from receiving mail and logging in, keeping its account.
    Disable(AddressArg),
    /// Delete a mailbox and its password (its Maildir on disk is left alone).
    Delete(DeleteArgs),
}

#[derive(Debug, Subcommand)]
enum AliasCommand {
    /// List aliases and catch-alls.
    List(LimitArgs),
    /// Make ADDRESS (or @domain, the catch-all) an alias of TARGET...
    Set(AliasSetArgs),
    /// Delete the alias of ADDRESS (or the catch-all of @domain).
    Delete(AddressArg),
}

#[derive(Debug, Subcommand)]
enum DomainCommand {
    /// List local domains: those of the configuration file and those of the settings layer.
    List(JsonFlag),
    /// Make DOMAIN local.
    Add(DomainArg),
    /// Make DOMAIN no longer local (only one added here; the file's are the file's).
    Delete(DomainArg),
}

#[derive(Debug, Args)]
struct JsonFlag {
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct LimitArgs {
    /// Show at most N rows
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIMIT,
          value_parser = clap::value_parser!(i64).range(1..=100_000))]
    limit: i64,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct AccountListArgs {
    /// Only addresses containing TEXT (any letter case)
    #[arg(long, value_name = "TEXT")]
    search: Option<String>,
    #[command(flatten)]
    limit: LimitArgs,
}

#[derive(Debug, Args)]
struct PasswordArgs {
    /// Read the password from the first line of stdin
    #[arg(long, conflicts_with = "password_file")]
    password_stdin: bool,
    /// Read the password from the first line of FILE
    #[arg(long, value_name = "FILE")]
    password_file: Option<std::path::PathBuf>,
}

impl PasswordArgs {
    fn source(&self) -> PasswordSource {
        if self.password_stdin {
            PasswordSource::Stdin
        } else if let Some(f) = &self.password_file {
            PasswordSource::File(f.clone())
        } else {
            PasswordSource::Terminal
        }
    }
}

#[derive(Debug, Args)]
struct AccountAddArgs {
    /// The mailbox's address
    address: String,
    #[command(flatten)]
    password: PasswordArgs,
    /// Create the account without a password (it receives mail but cannot log in)
    #[arg(long, conflicts_with_all = ["password_stdin", "password_file"])]
    no_password: bool,
    /// Create it disabled
    #[arg(long)]
    disabled: bool,
}

#[derive(Debug, Args)]
struct AccountPasswordArgs {
    /// The mailbox's address
    address: String,
    #[command(flatten)]
    password: PasswordArgs,
}

#[derive(Debug, Args)]
struct AddressArg {
    /// The address (for aliases also @domain)
    address: String,
}

#[derive(Debug, Args)]
struct DeleteArgs {
    /// The mailbox's address
    address: String,
    /// Do not ask for confirmation (required when stdin is not a terminal)
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, Args)]
struct AliasSetArgs {
    /// The alias: an address, or @domain for the domain's catch-all
    address: String,
    /// Where its mail goes: one or more addresses
    #[arg(required = true, num_args = 1..)]
    targets: Vec<String>,
}

#[derive(Debug, Args)]
struct DomainArg {
    /// The domain
    domain: String,
}

#[derive(Debug, Args)]
struct SetArgs {
    /// An address, or @domain for every address of the domain
    key: String,
    /// The setting's name (see `names`)
    name: String,
    /// The value: `yes` for a flag, addresses for a list
    #[arg(required = true, num_args = 1..)]
    value: Vec<String>,
}

#[derive(Debug, Args)]
struct UnsetArgs {
    /// An address, or @domain
    key: String,
    /// The setting's name
    name: String,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only these settings (default: every known one)
    #[arg(long = "name", value_name = "NAME")]
    names: Vec<String>,
    #[command(flatten)]
    limit: LimitArgs,
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// The address (or @domain)
    address: String,
    #[command(flatten)]
    out: JsonFlag,
}

/// The command line of `pepsi-settings` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Runs `pepsi-settings` with the process's arguments.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        if let Command::Names(a) = &cli.command {
            return Ok(exit(names(a)));
        }
        // A password is read before connecting, so a typing mistake costs no connection
        // and a database that is down does not swallow what was typed unasked.
        let source = match &cli.command {
            Command::Account(AccountCommand::Add(a)) if !a.no_password => Some(a.password.source()),
            Command::Account(AccountCommand::Password(a)) => Some(a.password.source()),
            _ => None,
        };
        let password = match source.as_ref().map(password::read).transpose() {
            Ok(p) => p,
            Err(e) => return Ok(exit(Err(e))),
        };
        let pool = pepsi_contract::db::connect(&cfg).await?;
        let actor = Actor::local(constants::CONFIG_SOURCE.exec);
        let result = match cli.command {
            Command::Account(c) => account(&pool, &actor, c, password).await,
            Command::Alias(c) => alias(&pool, &actor, c).await,
            Command::Domain(c) => domain(&pool, &actor, &cfg, c).await,
            Command::Set(a) => set(&pool, &actor, a).await,
            Command::Unset(a) => unset(&pool, &actor, a).await,
            Command::List(a) => list(&pool, a).await,
            Command::Show(a) => show(&pool, a).await,
            Command::Names(_) => unreachable!("`names` is answered before connecting"),
        };
        Ok(exit(result))
    })
}

/// The exit status of a command's result, its refusal printed: 2 for input that is not
/// valid, 1 for anything else.
fn exit(result: Done) -> ExitCode {
    let (code, text) = match result {
        Ok(()) => return ExitCode::SUCCESS,
        Err(Failure::Admin(e @ AdminError::Invalid(_))) => (EXIT_USAGE, e.to_string()),
        Err(Failure::Admin(e)) => (1, e.to_string()),
        Err(Failure::Other(e)) => (1, format!("{e:#}")),
    };
    eprintln!("{}: {text}", constants::CONFIG_SOURCE.exec);
    ExitCode::from(code)
}

/// Why a command failed: a refusal of `admin` (its kind decides the exit status), or
/// anything else (status 1).
pub(crate) enum Failure {
    Admin(AdminError),
    Other(anyhow::Error),
}

impl From<AdminError> for Failure {
    fn from(e: AdminError) -> Self {
        Failure::Admin(e)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Other(e)
    }
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        Failure::Admin(AdminError::Database(e))
    }
}

pub(crate) type Done = Result<(), Failure>;

fn say(text: &str) {
    println!("{text}");
}

fn print_json<T: Serialize>(v: &T) -> Done {
    let text = serde_json::to_string_pretty(v).context("encoding JSON")?;
    println!("{text}");
    Ok(())
}

async fn account(
    pool: &PgPool,
    actor: &Actor,
    c: AccountCommand,
    password: Option<String>,
) -> Done {
    match c {
        AccountCommand::List(a) => {
            let rows = admin::list_accounts(pool, a.search.as_deref(), a.limit.limit).await?;
            if a.limit.out.json {
                return print_json(&json!({"accounts": rows, "limit": a.limit.limit}));
            }
            print!("{}", render::accounts(&rows));
            if rows.len() as i64 == a.limit.limit {
                eprintln!("(at most {} shown: --limit shows more)", a.limit.limit);
            }
            Ok(())
        }
        AccountCommand::Add(a) => {
            let address = admin::address(&a.address, "address")?;
            let hash = password.map(|p| password::hash(&p)).transpose()?;
            admin::create_account(pool, actor, &address, hash.as_deref(), !a.disabled).await?;
            let how = match (&hash, a.disabled) {
                (Some(_), false) => "with a password",
                (None, false) => "without a password (it cannot log in)",
                (Some(_), true) => "with a password, disabled",
                (None, true) => "without a password, disabled",
            };
            say(&format!("created mailbox {address} {how}"));
            Ok(())
        }
        AccountCommand::Password(a) => {
            let address = admin::address(&a.address, "address")?;
            let p = password.context("no password was read")?;
            let hash = password::hash(&p)?;
            admin::set_account_password(pool, actor, &address, &hash).await?;
            say(&format!("password of {address} set"));
            Ok(())
        }
        AccountCommand::Enable(a) => enable(pool, actor, &a.address, true).await,
        AccountCommand::Disable(a) => enable(pool, actor, &a.address, false).await,
        AccountCommand::Delete(a) => {
            let address = admin::address(&a.address, "address")?;
            if !a.yes && !confirm(&format!("delete mailbox {address} and its password?"))? {
                return Err(AdminError::Invalid(
                    "not deleted: confirm with --yes (stdin is not a terminal, or the answer was no)"
                        .into(),
                )
                .into());
            }
            admin::delete_account(pool, actor, &address).await?;
            say(&format!("deleted mailbox {address}"));
            Ok(())
        }
    }
}

async fn enable(pool: &PgPool, actor: &Actor, text: &str, on: bool) -> Done {
    let address = admin::address(text, "address")?;
    let changed = admin::set_account_enabled(pool, actor, &address, on).await?;
    let state = if on { "enabled" } else { "disabled" };
    if changed {
        say(&format!("mailbox {address} {state}"));
    } else {
        say(&format!(
            "mailbox {address} was {state} already: nothing changed"
        ));
    }
    Ok(())
}

/// Asks `question` on the terminal; false when stdin is not one.
fn confirm(question: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes" | "YES"))
}

async fn alias(pool: &PgPool, actor: &Actor, c: AliasCommand) -> Done {
    match c {
        AliasCommand::List(a) => {
            let rows = admin::list_settings(pool, &["alias", "catchall"], a.limit).await?;
            let aliases: Vec<render::Alias> = rows.iter().map(render::Alias::from_row).collect();
            if a.out.json {
                return print_json(&json!({"aliases": aliases, "limit": a.limit}));
            }
            print!("{}", render::aliases(&aliases));
            Ok(())
        }
        AliasCommand::Set(a) => {
            let name = if a.address.trim().starts_with('@') {
                "catchall"
            } else {
                "alias"
            };
            store(pool, actor, &a.address, name, &a.targets).await
        }
        AliasCommand::Delete(a) => {
            let name = if a.address.trim().starts_with('@') {
                "catchall"
            } else {
                "alias"
            };
            remove(pool, actor, &a.address, name).await
        }
    }
}

/// Validates and stores one setting, saying what it did.
async fn store(pool: &PgPool, actor: &Actor, key: &str, name: &str, words: &[String]) -> Done {
    let known = admin::known_setting(name)?;
    let key = admin::setting_key(known, key)?;
    let value = admin::setting_value(known, words)?;
    let created = admin::put_setting(pool, actor, &key, name, &value).await?;
    let verb = if created { "set" } else { "replaced" };
    say(&format!(
        "{verb} {name} of {key}: {}",
        render::value(&value)
    ));
    Ok(())
}

async fn remove(pool: &PgPool, actor: &Actor, key: &str, name: &str) -> Done {
    let known = admin::known_setting(name)?;
    let key = admin::setting_key(known, key)?;
    admin::delete_setting(pool, actor, &key, name).await?;
    say(&format!("deleted {name} of {key}"));
    Ok(())
}

async fn domain(
    pool: &PgPool,
    actor: &Actor,
    cfg: &pepsi_conf::config::Config,
    c: DomainCommand,
) -> Done {
    let configured = LocalRecipients::from_config(cfg).context("reading [pepsi] LOCAL_DOMAINS")?;
    match c {
        DomainCommand::List(a) => {
            let mut domains: Vec<render::Domain> = configured
                .configured_domains()
                .map(|d| render::Domain {
                    domain: d.to_owned(),
                    source: "config",
                    updated_at: None,
                })
                .collect();
            for r in admin::list_settings(pool, &[LOCAL_DOMAIN_SETTING], 100_000).await? {
                if r.value == json!(true)
                    && let Some(d) = r.address.strip_prefix('@')
                    && !configured.is_configured_local(d)
                {
                    domains.push(render::Domain {
                        domain: d.to_owned(),
                        source: "settings",
                        updated_at: Some(r.updated_at),
                    });
                }
            }
            if a.json {
                return print_json(&json!({ "domains": domains }));
            }
            print!("{}", render::domains(&domains));
            Ok(())
        }
        DomainCommand::Add(a) => {
            let d = admin::domain(&a.domain, "domain")?;
            if configured.is_configured_local(&d) {
                say(&format!(
                    "{d} is local already ([pepsi] LOCAL_DOMAINS of the configuration file): nothing changed"
                ));
                return Ok(());
            }
            store(
                pool,
                actor,
                &format!("@{d}"),
                LOCAL_DOMAIN_SETTING,
                &["yes".into()],
            )
            .await
        }
        DomainCommand::Delete(a) => {
            let d = admin::domain(&a.domain, "domain")?;
            if configured.is_configured_local(&d) {
                return Err(AdminError::Invalid(format!(
                    "{d} is listed in [pepsi] LOCAL_DOMAINS of the configuration file: remove it there"
                ))
                .into());
            }
            remove(pool, actor, &format!("@{d}"), LOCAL_DOMAIN_SETTING).await
        }
    }
}

async fn set(pool: &PgPool, actor: &Actor, a: SetArgs) -> Done {
    store(pool, actor, &a.key, &a.name, &a.value).await
}

async fn unset(pool: &PgPool, actor: &Actor, a: UnsetArgs) -> Done {
    remove(pool, actor, &a.key, &a.name).await
}

async fn list(pool: &PgPool, a: ListArgs) -> Done {
    let names: Vec<&str> = if a.names.is_empty() {
        KNOWN_SETTINGS.iter().map(|k| k.name).collect()
    } else {
        let mut v = Vec::new();
        for n in &a.names {
            v.push(admin::known_setting(n)?.name);
        }
        v
    };
    let rows = admin::list_settings(pool, &names, a.limit.limit).await?;
    if a.limit.out.json {
        return print_json(&json!({"settings": rows, "limit": a.limit.limit}));
    }
    print!("{}", render::settings(&rows));
    if rows.len() as i64 == a.limit.limit {
        eprintln!("(at most {} shown: --limit shows more)", a.limit.limit);
    }
    Ok(())
}

async fn show(pool: &PgPool, a: ShowArgs) -> Done {
    // The lookup is pepsi_admin::admin's, shared with pepsi-httpd's GET /api/settings/{address}.
    let shown = admin::applied_settings(pool, &a.address).await?;
    if a.out.json {
        return print_json(&shown);
    }
    print!(
        "{}",
        render::shown(&shown.address, shown.account.as_ref(), &shown.settings)
    );
    Ok(())
}

fn names(a: &JsonFlag) -> Done {
    if a.json {
        return print_json(&json!({ "settings": KNOWN_SETTINGS }));
    }
    print!("{}", render::names());
    Ok(())
}
