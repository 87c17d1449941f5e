//! pepsi-telemetry: the OpenTelemetry receiver of Pepsi. It takes the spans and metric
//! points every Pepsi host's `pepsi-telemetry-client` exports with OTLP over HTTP
//! (protobuf), from clients holding one of its bearer tokens, and keeps them in
//! `pepsi.telemetry_span` and `pepsi.telemetry_metric` (pepsi-0027.sql), which pepsi-httpd
//! reads; it deletes what is older than its RETENTION. docs/telemetry.md describes it.
//!
//! It runs on a host of its own, as the database role `pepsi-telemetry`, which may touch
//! those two tables and nothing else: never the queue, a key or a credential.
//!
//! Module map: `options` (the `[pepsi-telemetry]` section; pure), `tokens` (the bearer
//! tokens, compared in constant time), `trim` (a request's protobuf cut to MAX_ITEMS before
//! it is decoded; pure), `convert` (OTLP messages to rows, within their bounds; pure),
//! `store` (its SQL), `app` (the routes and the checks of each request), `server` (the
//! accept loop: TLS, connection limits, header and idle timeouts).

pub mod app;
pub mod convert;
pub mod options;
pub mod server;
pub mod store;
pub mod tokens;
pub mod trim;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use pepsi_conf::cli::{init_logging, run_async};
use pepsi_conf::config::{CONFIG_ENV, Config, ConfigSource};

use crate::options::{DEFAULT_CONFIG, Options, shown};
use crate::tokens::Tokens;

/// The receiver's name to the configuration and logging machinery.
pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
    project: "pepsi",
    component: "telemetry",
    exec: "pepsi-telemetry",
};

const LONG_ABOUT: &str = "\
The OpenTelemetry receiver of Pepsi: it keeps the spans and metric points the Pepsi hosts
export in PostgreSQL, where pepsi-httpd shows a message's journey and the pipeline's
latencies.

`pepsi-telemetry` (or `pepsi-telemetry serve`) listens on [pepsi-telemetry] LISTEN (default
127.0.0.1:4318) and serves OTLP over HTTP with protobuf bodies:

  POST /v1/traces   an ExportTraceServiceRequest; each span becomes a row of
                    pepsi.telemetry_span (a span already stored is skipped, so a client's
                    retry adds nothing)
  POST /v1/metrics  an ExportMetricsServiceRequest; each point of a sum, gauge or histogram
                    becomes a row of pepsi.telemetry_metric
  GET  /healthz     200 while the database answers, else 503 (asked at most every 2s)

An export must carry `Authorization: Bearer <token>` with a token of TOKEN_FILE (else 401)
and `Content-Type: application/x-protobuf` (else 415); gzip bodies are taken. The answer is
the protobuf Export*ServiceResponse; spans and points that cannot be stored (a malformed
id, no time, an exponential histogram or summary, a column value too long, those beyond
MAX_ITEMS) are counted in its partial_success. Attributes beyond MAX_ATTRIBUTES are left
out and counted in otel.dropped_attributes_count; strings are cut at 4 KiB, lists at 128
entries and 4 levels. Other statuses: 400 a body that is not the message, 408 a body slower than
REQUEST_TIMEOUT, 413 a body larger than MAX_BODY, 503 the database did not take it (retry).
Error bodies are JSON, {\"error\": \"...\"}. All rows of one request are stored in one
transaction.

Every RETENTION_SWEEP, the spans that ended and the points taken more than RETENTION ago
(default 7d) are deleted, RETENTION_BATCH rows at a time.

The configuration is /etc/pepsi-telemetry/pepsi-telemetry.conf unless -c or PEPSI_CONFIG
names another: LISTEN, TLS_CERT and TLS_KEY (TLS; required beyond loopback, and what
production must use), TOKEN_FILE (one token a line, at least 16 characters, # comments;
required), DATABASE_URL (else [database] URL), DATABASE_MAX_CONNECTIONS, RETENTION,
RETENTION_SWEEP, RETENTION_BATCH, MAX_BODY (4 MiB), MAX_ITEMS (10000), MAX_ATTRIBUTES
(128), MAX_CONNECTIONS (256), MAX_CONNECTIONS_PER_ADDRESS (32), HEADER_TIMEOUT (10s),
IDLE_TIMEOUT (30s), REQUEST_TIMEOUT (30s), INSECURE_PLAINTEXT, ALLOW_ROOT. `check` reads all of it, the
token file and the certificate, and connects to the database, without serving.

It connects as the database role pepsi-setup creates for it ([pepsi-setup] TELEMETRY_ROLE,
default pepsi-telemetry), which may read, add and delete the two telemetry tables and read
pepsi.schema_patch, nothing else. It will not run as root unless ALLOW_ROOT = yes.

Exit status: 0 on success (and after SIGTERM/SIGINT), 1 on an error (a configuration,
token file, certificate or database it cannot use, named on stderr), 2 on a usage error.
See docs/telemetry.md.";

/// The OpenTelemetry (OTLP/HTTP) receiver of Pepsi.
#[derive(Debug, Parser)]
#[command(name = "pepsi-telemetry", version, about, long_about = LONG_ABOUT)]
struct Cli {
    /// Configuration file (default: $PEPSI_CONFIG, else /etc/pepsi-telemetry/pepsi-telemetry.conf)
    #[arg(short = 'c', long = "config", value_name = "FILE", global = true)]
    config: Option<PathBuf>,

    /// Log level or tracing filter for messages on stderr (error, warn, info, debug, trace)
    #[arg(
        short = 'L',
        long = "log-level",
        value_name = "LEVEL",
        default_value = "info",
        global = true
    )]
    log_level: String,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Receive exports and sweep old rows (the default when no command is given).
    Serve,
    /// Check the configuration, the token file, the certificate and the database, and say
    /// what the receiver would do; serve nothing.
    ///
    /// Prints one line per part checked. Exit status 0 when everything can be used, 1 with
    /// the first problem on stderr otherwise. With --offline the database is not connected to.
    #[command(long_about)]
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// Do not connect to the database
    #[arg(long)]
    offline: bool,
}

/// The command line of `pepsi-telemetry` as clap defines it: its `--help` and its manual
/// page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-telemetry` binary.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&CONFIG_SOURCE, &cli.log_level);
    run_async(&CONFIG_SOURCE, async move {
        let cfg = load_config(cli.config.as_deref())?;
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => serve(&cfg).await,
            Command::Check(a) => check(&cfg, a).await,
        }
    })
}

/// `-c`, else `PEPSI_CONFIG`, else [`DEFAULT_CONFIG`].
fn load_config(explicit: Option<&std::path::Path>) -> anyhow::Result<Config> {
    if explicit.is_some() || std::env::var_os(CONFIG_ENV).is_some_and(|v| !v.is_empty()) {
        return Ok(Config::load_default(explicit)?);
    }
    let path = std::path::Path::new(DEFAULT_CONFIG);
    if !path.exists() {
        anyhow::bail!(
            "no configuration at {DEFAULT_CONFIG} (the default location; use -c/--config or PEPSI_CONFIG to choose another)"
        );
    }
    Ok(Config::load(path)?)
}

/// Refuses to go on as root without ALLOW_ROOT: the receiver faces the network.
fn refuse_root(options: &Options) -> anyhow::Result<()> {
    // SAFETY: a plain getter.
    if unsafe { libc::geteuid() } == 0 && !options.allow_root {
        anyhow::bail!(
            "pepsi-telemetry will not serve as root: run it as its own account (the package's unit runs it as pepsi-telemetry), or set [pepsi-telemetry] ALLOW_ROOT = yes on a development machine"
        );
    }
    Ok(())
}

async fn serve(cfg: &Config) -> anyhow::Result<ExitCode> {
    let options = Options::from_config(cfg)?;
    refuse_root(&options)?;
    let tokens = Tokens::load(&options.token_file)?;
    let listening = server::Listening::open(&options)?;
    let pool = store::connect(&options.database, options.database_max_connections).await?;
    tracing::info!(
        tokens = tokens.len(),
        database = %options.database.describe(),
        retention = %shown(options.retention),
        "serving OTLP/HTTP on {}/v1/traces and /v1/metrics",
        listening.url()?
    );
    let sweeper = tokio::spawn(sweep_forever(pool.clone(), options.clone()));
    let app = Arc::new(app::App::new(pool, tokens, &options));
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping");
    };
    let served = listening.serve(app::router(app), &options, stop).await;
    sweeper.abort();
    served?;
    Ok(ExitCode::SUCCESS)
}

/// The time before which rows are past `retention` at `now`; None when that is no time
/// chrono holds (a RETENTION beyond [`options::MAX_RETENTION`], which `Options` refuses).
fn cutoff(
    now: chrono::DateTime<chrono::Utc>,
    retention: std::time::Duration,
) -> Option<chrono::DateTime<chrono::Utc>> {
    now.checked_sub_signed(chrono::Duration::from_std(retention).ok()?)
}

/// Deletes what is past RETENTION now and every RETENTION_SWEEP after; a failed sweep is
/// logged and tried again at the next.
async fn sweep_forever(pool: sqlx::PgPool, options: Options) {
    let mut tick = tokio::time::interval(options.retention_sweep);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(cutoff) = cutoff(chrono::Utc::now(), options.retention) else {
            tracing::error!(
                "RETENTION {} reaches before any time that can be stored: nothing is deleted",
                shown(options.retention)
            );
            continue;
        };
        match store::sweep(&pool, cutoff, options.retention_batch).await {
            Ok(s) if s.spans + s.points > 0 => tracing::info!(
                spans = s.spans,
                points = s.points,
                "deleted what ended before {cutoff} (RETENTION {})",
                shown(options.retention)
            ),
            Ok(_) => tracing::debug!("retention sweep: nothing before {cutoff}"),
            Err(e) => tracing::warn!(
                "retention sweep failed (tried again in {:?}): {e}",
                options.retention_sweep
            ),
        }
    }
}

async fn check(cfg: &Config, args: CheckArgs) -> anyhow::Result<ExitCode> {
    let options = Options::from_config(cfg)?;
    println!("configuration: {}", cfg.file().display());
    let tokens = Tokens::load(&options.token_file)?;
    println!(
        "tokens: {} accepted ({})",
        tokens.len(),
        options.token_file.display()
    );
    match &options.tls {
        Some((cert, key)) => {
            pepsi_smtp::server_tls::server_config(cert, key)
                .context("[pepsi-telemetry] TLS_CERT / TLS_KEY")?;
            println!(
                "listen: https://{} (certificate {}, key {})",
                options.listen,
                cert.display(),
                key.display()
            );
        }
        None => println!("listen: http://{} (no TLS)", options.listen),
    }
    println!(
        "retention: {}, swept every {}, {} rows at a time",
        shown(options.retention),
        shown(options.retention_sweep),
        options.retention_batch
    );
    println!(
        "limits: {} spans or points a request, {} attributes an item, {} connections ({} from one address), header {}, idle {}",
        options.max_items,
        options.max_attributes,
        options.max_connections,
        options.max_connections_per_address,
        shown(options.header_timeout),
        shown(options.idle_timeout)
    );
    if args.offline {
        println!(
            "database: {} (not checked: --offline)",
            options.database.describe()
        );
    } else {
        let pool = store::connect(&options.database, 1).await?;
        pool.close().await;
        println!(
            "database: {} answers, with {}",
            options.database.describe(),
            store::PATCH
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn the_cutoff_is_checked_arithmetic() {
        let now = chrono::Utc::now();
        assert_eq!(
            super::cutoff(now, Duration::from_secs(86_400)),
            Some(now - chrono::Duration::days(1))
        );
        assert!(super::cutoff(now, crate::options::MAX_RETENTION).is_some());
        // Beyond what chrono holds: no cutoff, and no panic that would end the sweeps.
        assert_eq!(super::cutoff(now, Duration::MAX), None);
        assert_eq!(
            super::cutoff(now, Duration::from_secs(400_000 * 365 * 86_400)),
            None
        );
    }
}
