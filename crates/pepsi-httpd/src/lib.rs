//! pepsi-httpd: the administrative surface of Pepsi over HTTP — a JSON API for the queue
//! (list, show, retry, hold, release, delete, bounce, one by one or in bulk by filter),
//! mailbox accounts, aliases and local domains, every per-address setting, the
//! configuration's overrides (checked by every program's parser, which the binary passes
//! in, before they are stored), the mail log and the audit log, the live
//! pipeline (the stage graph with its queue, throughput, failures and pass times, as JSON
//! and as a page a browser logs in to), a message's journey from its trace (JSON and a
//! page), and `/metrics` in the Prometheus text format.
//!
//! Administrators log in with a name and an Argon2id-hashed password (`admin-add` creates
//! one and prints its generated password once); scripts use API tokens (`token-add`). Only
//! digests of session cookies and token secrets are stored (`store`), sessions are rows, and
//! the credential tables belong to the pepsi-httpd database role alone (pepsi-setup). The
//! process binds its socket and reads its TLS key, then drops privileges before it connects
//! to the database or accepts a connection (`server`).
//!
//! Module map: `options` (the `[pepsi-httpd]` section), `credentials` (secrets, digests,
//! CSRF; pure), `throttle` (login throttling; pure), `store` (SQL of the credential
//! tables), `query` (query strings and filters; pure), `app` (router, authentication,
//! extractors), `api` (handlers), `graph` (the stage graph of a configuration; pure),
//! `pipeline` (the live pipeline document and its throughput; pure), `svg` (the graph's
//! picture; pure), `latency` (the stages' pass times from the telemetry spans),
//! `journey` (a message's trace as a timeline; pure), `pages` (the login and pipeline
//! pages, maud), `journey_page` (the journey page, maud), `metrics`, `error`, `server`.

mod api;
mod app;
mod archive;
pub mod credentials;
mod error;
mod extract;
pub mod graph;
mod journey;
mod journey_page;
pub mod latency;
mod lists;
pub mod metrics;
mod moderate;
pub mod options;
mod pages;
pub mod pipeline;
pub mod query;
mod secretary;
mod secure;
mod server;
mod setup_page;
mod store;
mod svg;
pub mod throttle;
mod tlsrpt;
mod token_page;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::ProgramCheck;
use pepsi_contract::audit::Actor;
use pepsi_contract::stage::edges::StageEdges;

use crate::options::HttpdOptions;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "httpd",
        exec: "pepsi-httpd",
    };
}

const LONG_ABOUT: &str = "\
The administrative HTTP API of Pepsi and its Prometheus metrics.

`pepsi-httpd` (or `pepsi-httpd serve`) listens on [pepsi-httpd] ADDRESS (default
127.0.0.1:8080), over TLS when CERT_FILE and KEY_FILE are set. It binds and reads its key
first, then becomes USER/GROUP, then connects to the database ([database] URL) and serves:
the JSON API under /api/ (docs/api.md, docs/api.openapi.yaml), /metrics, /healthz, and
the live pipeline page /pipeline (the stage graph with each stage's queue, throughput and
failures, updated every few seconds, and the stages' pass times over LATENCY_WINDOW), and
/journey, a message's spans as a timeline by queue row, Message-ID or trace id (a browser
logs in at /login).

Administrators log in with POST /api/login and get a session cookie (a row in
pepsi.admin_session holding only its SHA-256) and a CSRF token every mutating request must
send back in X-CSRF-Token. Scripts send `Authorization: Bearer <token>` instead. Failed logins
are throttled per client address and per name from one client network, at most
LOGIN_CONCURRENCY passwords are checked at once, and one client address holds at most
MAX_CONNECTIONS_PER_CLIENT connections (behind a reverse proxy listed in TRUSTED_PROXIES,
the client is the address it forwards). Every change is recorded in pepsi.event_log
with the administrator as actor.

`admin-add NAME` creates an administrator with a generated password, printed once (or
written to --output). `token-add NAME` creates an API token for administrator NAME, printed
once. Neither secret is stored: only its digest is.

The database role pepsi-httpd connects as needs the grants pepsi-setup gives the httpd role
([pepsi-setup] HTTPD_ROLE, default pepsi-httpd); it alone may read the credential tables.

Exit status: 0 on success (and after SIGTERM/SIGINT), 1 on an error, 2 on a usage error.
See docs/httpd.md for every option.";

/// The administrative HTTP API and metrics of Pepsi.
#[derive(Debug, Parser)]
#[command(name = "pepsi-httpd", version, about, long_about = LONG_ABOUT)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the API and /metrics (the default when no command is given).
    Serve,
    /// Create an administrator with a generated password, shown once.
    ///
    /// The password (24 letters and digits) is printed on standard output, or written to
    /// --output (created with mode 0600, never overwritten). Only its Argon2id hash is
    /// stored. With --if-none, nothing is created when an administrator exists already
    /// (exit 0): how a first start provisions its administrator.
    #[command(long_about)]
    AdminAdd(AdminAddArgs),
    /// Create an API token for an administrator, shown once.
    ///
    /// The token, `pepsi_<id>_<secret>`, is printed on standard output; only the SHA-256
    /// of its secret half is stored. Send it as `Authorization: Bearer <token>`.
    #[command(long_about)]
    TokenAdd(TokenAddArgs),
    /// List the API tokens: id, administrator, label, created, expires, last used (never a
    /// secret: none is stored).
    TokenList(TokenListArgs),
    /// Revoke an API token: it is refused from the next request on (`token.revoke` in the
    /// event log). ID is the 16 hex digits after `pepsi_`, or the whole token.
    TokenRevoke(TokenRevokeArgs),
}

#[derive(Debug, clap::Args)]
struct TokenListArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct TokenRevokeArgs {
    /// The token's id (or the token)
    id: String,
}

#[derive(Debug, clap::Args)]
struct AdminAddArgs {
    /// The administrator's login: lower-case letters, digits, '.', '_', '-' (at most 64)
    name: String,
    /// Write "name password" to this file (mode 0600) instead of standard output
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Do nothing when any administrator exists already
    #[arg(long)]
    if_none: bool,
}

#[derive(Debug, clap::Args)]
struct TokenAddArgs {
    /// The administrator the token acts as
    admin: String,
    /// What the token is for (at most 200 characters)
    #[arg(long, value_name = "TEXT", default_value = "")]
    label: String,
    /// The token stops working this long from now (30d, 12h); default: never
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    expires_in: Option<std::time::Duration>,
}

fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    pepsi_conf::config::parse_duration(text)
}

/// The command line of `pepsi-httpd` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-httpd` binary; `checks` is every program's configuration
/// parser (`pepsi::checks::CONFIG_CHECKS`), which the configuration API runs over an
/// override before storing it; `stage_edges` every stage program's declaration of its edges
/// (`pepsi::programs::STAGE_EDGES`), which the pipeline graph is drawn from.
pub fn run(checks: &'static [ProgramCheck], stage_edges: &'static [StageEdges]) -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => serve(cfg, checks, stage_edges).await,
            Command::AdminAdd(a) => admin_add(&cfg, a).await,
            Command::TokenAdd(a) => token_add(&cfg, a).await,
            Command::TokenList(a) => token_list(&cfg, a).await,
            Command::TokenRevoke(a) => token_revoke(&cfg, a).await,
        }
    })
}

/// The actor of the command-line subcommands: the local user running them.
fn local_actor() -> Actor {
    Actor::local(constants::CONFIG_SOURCE.exec)
}

async fn admin_add(cfg: &pepsi_conf::config::Config, a: AdminAddArgs) -> anyhow::Result<ExitCode> {
    if !credentials::valid_admin_name(&a.name) {
        eprintln!(
            "pepsi-httpd: administrator name {:?} must be 1 to 64 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit",
            a.name
        );
        return Ok(ExitCode::from(2));
    }
    let pool = pepsi_contract::db::connect(cfg).await?;
    if a.if_none && store::admin_count(&pool).await? > 0 {
        println!("an administrator exists already; nothing created");
        return Ok(ExitCode::SUCCESS);
    }
    // The file first: a password that cannot be written must not be created.
    let mut file = match &a.output {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode_0600()
                .open(path)
                .with_context(|| format!("cannot create {} (it must not exist)", path.display()))?,
        ),
        None => None,
    };
    let password = credentials::new_password();
    let hash = pepsi_admin::password::hash_password(password.as_bytes())
        .map_err(|e| anyhow::anyhow!("cannot hash the password: {e}"))?;
    let created = store::create_admin(&pool, &local_actor(), &a.name, &hash).await;
    if let Err(e) = created {
        if let Some(path) = &a.output {
            let _ = std::fs::remove_file(path);
        }
        if let store::StoreError::Exists(m) = &e {
            eprintln!("pepsi-httpd: {m}");
            return Ok(ExitCode::from(1));
        }
        return Err(e.into());
    }
    match (&mut file, &a.output) {
        (Some(f), Some(path)) => {
            writeln!(f, "{} {password}", a.name)?;
            println!(
                "administrator {} created; the password is in {}",
                a.name,
                path.display()
            );
        }
        _ => println!(
            "administrator {} created; password (shown once): {password}",
            a.name
        ),
    }
    Ok(ExitCode::SUCCESS)
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
}

async fn token_add(cfg: &pepsi_conf::config::Config, a: TokenAddArgs) -> anyhow::Result<ExitCode> {
    if a.label.chars().count() > 200 || a.label.chars().any(char::is_control) {
        eprintln!("pepsi-httpd: --label: at most 200 characters, no control characters");
        return Ok(ExitCode::from(2));
    }
    let pool = pepsi_contract::db::connect(cfg).await?;
    let (id, secret, text) = credentials::new_token();
    let expires = a.expires_in.map(|d| {
        chrono::Utc::now() + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
    });
    match store::create_token(
        &pool,
        &local_actor(),
        &id,
        &credentials::digest(&secret),
        &a.admin,
        &a.label,
        expires,
    )
    .await
    {
        Ok(()) => {}
        Err(store::StoreError::NotFound(m)) => {
            eprintln!("pepsi-httpd: {m}");
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e.into()),
    }
    println!("{text}");
    Ok(ExitCode::SUCCESS)
}

async fn token_list(
    cfg: &pepsi_conf::config::Config,
    a: TokenListArgs,
) -> anyhow::Result<ExitCode> {
    let pool = pepsi_contract::db::connect(cfg).await?;
    let tokens = store::list_tokens(&pool).await?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "tokens": tokens }))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if tokens.is_empty() {
        println!("no API tokens");
        return Ok(ExitCode::SUCCESS);
    }
    let when = |t: Option<chrono::DateTime<chrono::Utc>>, none: &str| {
        t.map_or_else(|| none.to_owned(), pepsi_admin::queue::json::ts)
    };
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .map(|t| {
            vec![
                t.token_id.clone(),
                t.admin.clone(),
                pepsi_conf::text::clip(&t.label, 40),
                pepsi_admin::queue::json::ts(t.created_at),
                when(t.expires_at, "never"),
                when(t.last_used_at, "never"),
            ]
        })
        .collect();
    print!(
        "{}",
        pepsi_conf::text::table(
            &["ID", "ADMIN", "LABEL", "CREATED", "EXPIRES", "LAST USED"],
            &[false; 6],
            &rows
        )
    );
    Ok(ExitCode::SUCCESS)
}

async fn token_revoke(
    cfg: &pepsi_conf::config::Config,
    a: TokenRevokeArgs,
) -> anyhow::Result<ExitCode> {
    // The whole token names its id too; its secret is never sent anywhere.
    let id = credentials::parse_token(a.id.trim())
        .map(|(id, _)| id.to_owned())
        .unwrap_or_else(|| a.id.trim().to_owned());
    if id.len() != 16 || !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        eprintln!(
            "pepsi-httpd: {:?} is not a token id (16 hex digits, as token-list shows)",
            a.id
        );
        return Ok(ExitCode::from(2));
    }
    let pool = pepsi_contract::db::connect(cfg).await?;
    match store::revoke_token(&pool, &local_actor(), &id).await {
        Ok(()) => {
            println!("API token {id} revoked");
            Ok(ExitCode::SUCCESS)
        }
        Err(store::StoreError::NotFound(m)) => {
            eprintln!("pepsi-httpd: {m}");
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e.into()),
    }
}

/// The pool of `CONFIG_DATABASE_URL`, connected on first use: pepsi-httpd serves while the
/// pepsi-config role cannot connect, and only an override write finds out. A URL that names
/// no host is pinned to `[database] SOCKET_DIR`, as every program's `[database] URL` is.
fn config_pool(
    httpd: &HttpdOptions,
    socket_dir: &std::path::Path,
) -> anyhow::Result<Option<sqlx::PgPool>> {
    let Some(url) = &httpd.config_database_url else {
        return Ok(None);
    };
    let options = pepsi_contract::db::pinned_options(&url.0, socket_dir)
        .context("[pepsi-httpd] CONFIG_DATABASE_URL is not a PostgreSQL URL")?;
    Ok(Some(
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect_lazy_with(options.application_name("pepsi-httpd")),
    ))
}

async fn serve(
    cfg: pepsi_conf::config::Config,
    checks: &'static [ProgramCheck],
    stage_edges: &'static [StageEdges],
) -> anyhow::Result<ExitCode> {
    let options = HttpdOptions::from_config(&cfg)?;
    lists::check(&cfg)?;
    let bound = server::bind(&options)?;
    server::drop_privileges(&options)?;
    let pool = pepsi_contract::db::connect(&cfg).await?;
    let config_pool = config_pool(&options, &pepsi_contract::db::socket_dir(&cfg)?)?;
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let local = bound.listener.local_addr()?;
    tracing::info!("serving {scheme}://{local}/");
    let state = extract::AppState {
        pool: pool.clone(),
        cfg: Arc::new(cfg),
        throttle: Arc::new(Mutex::new(extract::Throttles::new(&options))),
        login_slots: Arc::new(tokio::sync::Semaphore::new(options.login_concurrency)),
        metrics_cache: Arc::default(),
        options: Arc::new(options.clone()),
        samples: Arc::default(),
        latency: Arc::default(),
        checks,
        stage_edges,
        config_pool,
    };
    // Sessions past their limits are never honoured; this only keeps the table small.
    let purge_pool = pool.clone();
    let (idle, max_age) = (options.session_idle, options.session_max_age);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(60));
        loop {
            tick.tick().await;
            if let Err(e) = store::purge_sessions(&purge_pool, idle, max_age).await {
                tracing::warn!("cannot delete expired sessions: {e}");
            }
        }
    });
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping");
    };
    server::serve(bound, app::router(state), &options, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
