//! pepsi-helper-token-refresh: keeps the OAuth 2.0 access tokens of the smarthost stage
//! fresh. For each `[token-<name>]` section ([`account`]) it asks the account's token
//! endpoint for a new access token with the account's refresh token (the refresh grant of
//! RFC 6749 §6, [`grant`]) once the current one expires within `REFRESH_BEFORE`, and writes
//! it to `TOKEN_FILE` ([`token_file`], the one definition of the file both it and
//! `pepsi-stage-relay-to-smarthost` use), replaced whole ([`store`]).
//!
//! Run by `pepsi-token-refresh.timer` as its own account, `pepsi-token`, which alone reads
//! the refresh tokens (mode 0600) and writes the access tokens (mode 0640, group
//! `pepsi-token`, which the smarthost stage is set-group-id to). It opens no database and
//! execs nothing; it never writes a token or a secret to its output or its logs.

pub mod account;
pub mod grant;
pub mod refresh;
pub mod store;
pub mod token_file;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use pepsi_conf::cli::{CommonArgs, init_logging};
use pepsi_conf::config::Config;

use crate::account::Account;
use crate::refresh::Outcome;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "helper-token-refresh",
        exec: "pepsi-helper-token-refresh",
    };
}

const LONG_ABOUT: &str = "\
Keeps the OAuth 2.0 access tokens that pepsi-stage-relay-to-smarthost logs in to its smarthost \
with (SMTP AUTH OAUTHBEARER or XOAUTH2, AUTH_TOKEN_FILE of its section) fresh: for each \
[token-<name>] section of the configuration, once the access token in TOKEN_FILE expires \
within REFRESH_BEFORE (or is missing, or unreadable), it asks the account's token endpoint for \
a new one with the refresh token in REFRESH_TOKEN_FILE (the refresh grant of RFC 6749 section \
6: a POST of grant_type=refresh_token, refresh_token, scope and the client's id and secret) and \
writes it to TOKEN_FILE. The provider's consent flow, done once by the operator outside Pepsi, \
gives the first refresh token; when the provider sends a new refresh token with an answer (it \
rotates them), the new one replaces the old in REFRESH_TOKEN_FILE before the access token is \
written.

Both files are replaced whole (a temporary file beside them, synced and renamed), so the stage \
reads the old token or the new one, never a part. TOKEN_FILE gets mode 0640 and \
REFRESH_TOKEN_FILE mode 0600, each with the group of its directory: in an installed system \
both are in /var/lib/pepsi/tokens (owner pepsi-token, group pepsi-token, mode 0750), which \
this program's account, pepsi-token, alone writes, and which the smarthost stage reads \
through its set-group-id bit (group pepsi-token). TOKEN_FILE holds one JSON object, \
{\"access_token\": \"...\", \"expires_at\": \"2026-12-10T14:03:27Z\"} (RFC 3339, UTC): the \
moment the token was asked for plus the expires_in the server answered (3600 seconds when it \
gave none). Two runs at once take turns per account (a lock on the refresh token's \
directory), so a refresh token is never spent twice.

pepsi-token-refresh.timer runs `pepsi-helper-token-refresh once` every two minutes, so \
REFRESH_BEFORE (default 10m) gives each token several tries before it expires. A refusal \
(RFC 6749 section 5.2, e.g. invalid_grant for a refresh token that was revoked or expired) \
is printed with the account, the endpoint and the server's error and error_description; \
only a new consent, written to REFRESH_TOKEN_FILE, ends it. Until then the smarthost stage \
defers its mail (4.7.0, its last_error naming the token file) and bounces none.

Options of [token-<name>] (one section per account; <name> is what messages call it):
  TOKEN_ENDPOINT      the provider's token endpoint, https:// only (required):
                      Microsoft 365's or Google's (docs/relay-smarthost.md)
  CLIENT_ID           the client id the provider registered (required)
  CLIENT_SECRET       its secret, if it has one; keep it in a secrets fragment
                      (secrets.d/*.conf, mode 0640, group pepsi)
  CLIENT_AUTH         body   body: client_id and client_secret in the form (Microsoft,
                      Google); basic: HTTP Basic authentication (RFC 6749 section 2.3.1)
  SCOPE               the scope asked for, e.g. https://outlook.office.com/SMTP.Send
                      offline_access (default: none sent, the grant's own)
  REFRESH_TOKEN_FILE  the refresh token, one line (required)
  TOKEN_FILE          where the access token is written (required); the smarthost stage's
                      AUTH_TOKEN_FILE
  REFRESH_BEFORE      10m    refresh a token that expires within this (1s to 24h)
  TIMEOUT             30s    one request, connection and answer (1s to 5m); an answer is
                      read up to 64 KiB
  TLS_CA_FILE         PEM file of the CAs the endpoint's certificate must chain to (default:
                      the web PKI's roots)

The configuration is read from the file alone, never from the database's overrides: the \
endpoint is where the refresh token and the client's secret are sent.

Exit status: 0 when every account's token is fresh or was refreshed (also with no \
[token-<name>] section at all); 1 when one or more failed (each named on standard error, the \
others still tried) or the configuration is wrong; 2 for an account name that has no \
section. `status` exits 1 when an account's token is expired or missing (the smarthost stage \
would defer its mail), else 0.";

const EXAMPLES: &str = "\
Examples:
  pepsi-helper-token-refresh once                 refresh every token that is due
  pepsi-helper-token-refresh once --force m365    refresh m365's token now
  pepsi-helper-token-refresh status               each token file and when it expires
  pepsi-helper-token-refresh status --json

See docs/relay-smarthost.md, \"Providers that require OAuth 2.0\".";

/// Keeps the smarthost's OAuth 2.0 access tokens fresh from their refresh tokens.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-helper-token-refresh",
    version,
    about = "Pepsi's OAuth 2.0 token refresher: keeps the smarthost's access tokens fresh from their refresh tokens",
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
    /// Refresh each account's access token that is due, then exit (what the timer runs).
    Once(OnceArgs),
    /// Each account's token file and when its token expires.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
struct OnceArgs {
    /// The accounts (the <name> of [token-<name>]); default: every one
    accounts: Vec<String>,
    /// Refresh even a token that is not due yet
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct StatusArgs {
    /// The accounts (the <name> of [token-<name>]); default: every one
    accounts: Vec<String>,
    /// One JSON document instead of the table
    #[arg(long)]
    json: bool,
}

/// The command line of `pepsi-helper-token-refresh` as clap defines it: its `--help` and
/// its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// The accounts of `cfg` that `names` asks for (every one when empty); an unknown name is
/// a usage error naming it and the accounts there are.
fn select(cfg: &Config, names: &[String]) -> anyhow::Result<Result<Vec<Account>, String>> {
    let all = account::accounts(cfg)?;
    if names.is_empty() {
        return Ok(Ok(all));
    }
    let mut chosen = Vec::new();
    for name in names {
        match all.iter().find(|a| a.name.eq_ignore_ascii_case(name)) {
            Some(a) => chosen.push(a.clone()),
            None => {
                let known: Vec<&str> = all.iter().map(|a| a.name.as_str()).collect();
                return Ok(Err(format!(
                    "no section [{}{name}] in {} (accounts: {})",
                    account::SECTION_PREFIX,
                    cfg.file().display(),
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                )));
            }
        }
    }
    Ok(Ok(chosen))
}

fn usage(text: &str) -> ExitCode {
    eprintln!("{}: {text}", constants::CONFIG_SOURCE.exec);
    ExitCode::from(pepsi_conf::cli::EXIT_USAGE)
}

async fn once(cfg: &Config, args: OnceArgs) -> anyhow::Result<ExitCode> {
    let accounts = match select(cfg, &args.accounts)? {
        Ok(a) => a,
        Err(e) => return Ok(usage(&e)),
    };
    if accounts.is_empty() {
        tracing::debug!("no [token-<name>] section: nothing to refresh");
    }
    let mut failed = 0;
    for account in &accounts {
        match refresh::refresh_account(account, args.force).await {
            Ok(Outcome::Fresh { .. }) => {}
            Ok(Outcome::Refreshed {
                expires_at,
                why,
                rotated,
            }) => {
                println!(
                    "{}: refreshed ({why}); the new access token in {} expires at {expires_at}{}",
                    account.name,
                    account.token_file.display(),
                    if rotated {
                        format!(
                            "; the provider rotated the refresh token, stored in {}",
                            account.refresh_token_file.display()
                        )
                    } else {
                        String::new()
                    }
                );
            }
            Err(e) => {
                failed += 1;
                eprintln!("{}: {e}", constants::CONFIG_SOURCE.exec);
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// One account's line of `status`.
#[derive(Debug, serde::Serialize)]
struct State {
    account: String,
    token_file: String,
    /// `fresh`, `due` (within REFRESH_BEFORE), `expired` or `missing`.
    state: &'static str,
    expires_at: Option<String>,
    error: Option<String>,
}

fn state_of(account: &Account, now: chrono::DateTime<chrono::Utc>) -> State {
    let read = token_file::read_any(&account.token_file);
    let (state, expires_at, error) = match &read {
        Err(e) => ("missing", None, Some(e.to_string())),
        Ok(t) if t.is_expired(now) => ("expired", Some(t.expires()), None),
        Ok(t) => {
            let current = Ok(t.clone());
            let due = refresh::why_refresh(&current, now, account.refresh_before, false);
            (
                if due.is_some() { "due" } else { "fresh" },
                Some(t.expires()),
                None,
            )
        }
    };
    State {
        account: account.name.clone(),
        token_file: account.token_file.display().to_string(),
        state,
        expires_at,
        error,
    }
}

fn status(cfg: &Config, args: StatusArgs) -> anyhow::Result<ExitCode> {
    let accounts = match select(cfg, &args.accounts)? {
        Ok(a) => a,
        Err(e) => return Ok(usage(&e)),
    };
    let now = chrono::Utc::now();
    let states: Vec<State> = accounts.iter().map(|a| state_of(a, now)).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&states)?);
    } else if states.is_empty() {
        println!(
            "no [token-<name>] section in {}: no token to keep fresh",
            cfg.file().display()
        );
    } else {
        let width = states
            .iter()
            .map(|s| s.account.len())
            .max()
            .unwrap_or(0)
            .max(7);
        println!(
            "{:width$}  {:8} {:21} TOKEN FILE",
            "ACCOUNT", "STATE", "EXPIRES"
        );
        for s in &states {
            println!(
                "{:width$}  {:8} {:21} {}",
                s.account,
                s.state,
                s.expires_at.as_deref().unwrap_or("-"),
                s.token_file
            );
            if let Some(e) = &s.error {
                println!("{:width$}  {e}", "");
            }
        }
    }
    // A token the stage cannot use is worth a non-zero status to whoever monitors this.
    let unusable = states
        .iter()
        .any(|s| s.state == "missing" || s.state == "expired");
    Ok(if unusable {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Entry point of the `pepsi-helper-token-refresh` binary.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    pepsi_conf::cli::run_async_current_thread(&constants::CONFIG_SOURCE, async move {
        // The file alone: the helper opens no database, so no override reaches it.
        let cfg = cli.common.load_config()?;
        match cli.command {
            Command::Once(args) => once(&cfg, args).await,
            Command::Status(args) => status(&cfg, args),
        }
    })
}
