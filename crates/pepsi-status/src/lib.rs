//! pepsi-status: one screen of the whole system for an operator — the queue by stage and
//! status with the oldest message, what left the pipeline recently, the recent failures and
//! bounces, and whether the database, the dispatcher, each ingress listener and pepsi-httpd
//! answer — and `log`, the mail log's search.
//!
//! It only reads: the database through `pepsi_admin::status` and `pepsi_contract::mail_log`
//! (this crate issues no SQL of its own), the services through the probes of `probe`. The
//! report's shape is `report`; presentation is `render`.

mod probe;
mod render;
mod report;

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, NaiveDate, Utc};
use clap::{Args, Parser, Subcommand};
use pepsi_admin::status;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::Config;
use pepsi_contract::db::DbOptions;
use pepsi_contract::mail_log::{self, Event, LogRow, Search};
use serde::Serialize;
use sqlx::PgPool;

use crate::probe::{Group, Kind, Service, Target};
use crate::report::Report;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "status",
        exec: "pepsi-status",
    };
}

/// Exit status of a command used wrongly (clap's own errors use the same).
const EXIT_USAGE: u8 = 2;

const LONG_ABOUT: &str = "\
Show the state of a Pepsi installation on one screen.

SERVICES: whether each part answers, every probe bounded by --timeout:
  database      [database] URL accepts a connection and the status reads
  dispatcher    some session of this database holds pepsi-dispatch's advisory lock
                (it holds it for as long as it runs); shown with that session's name,
                `pepsi-dispatch HOST pid PID`
  listener-NAME each [listener-NAME] of pepsi-ingress sends a 220 greeting (then QUIT);
                a ROLE = submissions listener after a TLS handshake (any certificate)
  pepsi-httpd   when the configuration has [pepsi-httpd]: GET /healthz at its ADDRESS
                (HTTPS when CERT_FILE is set, any certificate) answers 200
A wildcard address (0.0.0.0, ::) is probed on the loopback address.

QUEUE: the rows of pepsi.workqueue per stage and status (pending, running, paused, held,
failed, timeout; a held row is a paused one with state.held), and the age of the oldest
message at each stage and overall (since it was received).

LEFT THE PIPELINE: the final outcomes the mail log (pepsi.mail_log) recorded in the last
5 minutes and the last hour — delivered, bounced, expired, dropped — with the rate per
minute over each. The mail log is written in the same commit that decides an outcome, so
these are exact; with [pepsi] MAIL_LOG = no they stay at zero. (pepsi.stage_stats is not
sampled for rates: the dispatcher flushes it every STATS_INTERVAL, 5 s by default; its
cumulative counters are shown as they are.)

RECENT FAILURES: how many rows are failed or timed out, and the --limit most recently
changed with state.dispatch_error (else state.last_error). RECENT BOUNCES: the --limit
newest bounced and expired rows of the mail log with their status and diagnostic.

The database role needs SELECT on pepsi.workqueue, pepsi.stage_stats,
pepsi.dispatch_stats and pepsi.mail_log: the pepsi-httpd role has all of them (the
pipeline role may not read the mail log; the parts it cannot read are named on the screen
instead of shown). See docs/status.md for the JSON document.

Exit status: 0 when every probed service answers, 1 when one does not (it is named on the
screen and in the JSON) or on an error, 2 on a usage error. `log` exits 0 when the search
ran, whether or not anything matched.";

const EXAMPLES: &str = "\
Examples:
  pepsi-status                              the screen
  pepsi-status --json | jq '.services[] | select(.ok | not)'
  pepsi-status --watch 5                    the screen again every 5 seconds
  pepsi-status --skip httpd --timeout 1s    without pepsi-httpd, each probe within 1 s
  pepsi-status log --recipient alice@example.org --since 2h
  pepsi-status log --sender @example.net --event bounced --json
  pepsi-status log --id 4711                everything logged for queue row 4711";

/// Show the state of a Pepsi installation on one screen.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-status",
    version,
    about,
    long_about = LONG_ABOUT,
    after_long_help = EXAMPLES
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    #[command(flatten)]
    screen: ScreenArgs,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Args)]
struct ScreenArgs {
    /// Print one JSON document (docs/status.md) instead of the screen
    #[arg(long)]
    json: bool,
    /// How long each probe may take, connecting and answering together; also bounds the
    /// database connection and its reads (90ms, 3s, 1m)
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = parse_timeout)]
    timeout: Duration,
    /// How many failed rows and how many bounces to list (0 to 1000; the totals count all)
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u16).range(0..=1000))]
    limit: u16,
    /// Do not probe SERVICE (dispatcher, ingress or httpd; repeatable): it is neither
    /// shown nor counted for the exit status
    #[arg(long, value_name = "SERVICE", value_enum)]
    skip: Vec<Group>,
    /// Look again every SECONDS until interrupted (Ctrl-C), redrawing the screen on a
    /// terminal; with --json, one compact document per line. The exit status is the last
    /// look's
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u32).range(1..=86400))]
    watch: Option<u32>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Search the mail log (pepsi.mail_log), newest first.
    ///
    /// Every final outcome of a message is one row: delivered (with the mailbox or the next
    /// server's reply), bounced or expired (with the DSN's status and diagnostic), dropped
    /// (with the reason). Filters combine: a row must match all of them. The mail log keeps
    /// no Message-ID header; a message is found by its envelope (--sender, --recipient), its
    /// queue row (--id, the ID pepsi-queue and the screen show) and the time. Columns: AT,
    /// EVENT, ROW (the queue row the outcome was decided on; a bounce is logged on the
    /// notification's row), STAGE, SENDER (<> for the null sender), RECIPIENTS, DETAIL.
    #[command(long_about)]
    Log(LogArgs),
}

#[derive(Debug, Args)]
struct LogArgs {
    /// Only rows whose envelope sender contains TEXT (any letter case)
    #[arg(long, value_name = "TEXT", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    sender: Option<String>,
    /// Only rows with a recipient containing TEXT (any letter case; `@example.org` for a domain)
    #[arg(long, value_name = "TEXT", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    recipient: Option<String>,
    /// Only rows of this queue row (workqueue_id)
    #[arg(long, value_name = "ROW", value_parser = clap::value_parser!(i64).range(1..))]
    id: Option<i64>,
    /// Only this event: delivered, bounced, expired or dropped
    #[arg(long, value_name = "EVENT", value_parser = clap::builder::PossibleValuesParser::new(Event::ALL.map(Event::as_str)))]
    event: Option<String>,
    /// Only rows logged at or after WHEN: a duration ago (30m, 2h, 1d), an RFC 3339 time
    /// (2026-12-01T09:00:00Z) or a date (2026-12-01, midnight UTC)
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    since: Option<DateTime<Utc>>,
    /// Only rows logged before WHEN (the same forms as --since)
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    until: Option<DateTime<Utc>>,
    /// Show at most N rows (1 to 10000)
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10000))]
    limit: u32,
    /// Print one JSON document instead of the table
    #[arg(long)]
    json: bool,
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let d = pepsi_conf::config::parse_duration(text)?;
    if d.is_zero() || d > Duration::from_secs(600) {
        return Err(format!("{text:?}: expected more than 0 and at most 10m"));
    }
    Ok(d)
}

fn parse_when(text: &str) -> Result<DateTime<Utc>, String> {
    when_at(text, Utc::now())
}

/// WHEN relative to `now`: a duration ago, an RFC 3339 time, or a date at midnight UTC.
fn when_at(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    let t = text.trim();
    if let Ok(at) = DateTime::parse_from_rfc3339(t) {
        return Ok(at.to_utc());
    }
    if let Ok(day) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        return Ok(day.and_hms_opt(0, 0, 0).expect("midnight").and_utc());
    }
    if let Ok(ago) = pepsi_conf::config::parse_duration(t)
        && let Ok(ago) = chrono::Duration::from_std(ago)
        && let Some(at) = now.checked_sub_signed(ago)
    {
        return Ok(at);
    }
    Err(format!(
        "{text:?} is neither a duration ago (30m, 2h, 1d), an RFC 3339 time \
         (2026-12-01T09:00:00Z) nor a date (2026-12-01)"
    ))
}

/// The command line; the screen's options given together with `log` are a usage error
/// (clap's own conflict rule would refuse the global `-c` and `-L` as well).
fn parse() -> Cli {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if cli.command.is_some() {
        for id in ["json", "timeout", "limit", "skip", "watch"] {
            if matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
                Cli::command()
                    .error(
                        clap::error::ErrorKind::ArgumentConflict,
                        format!(
                            "--{id} belongs to the screen, not to log; log's own options follow it (pepsi-status log --json)"
                        ),
                    )
                    .exit();
            }
        }
    }
    cli
}

/// The command line of `pepsi-status` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point of the `pepsi-status` binary.
pub fn run() -> ExitCode {
    let cli = parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        match cli.command {
            Some(Command::Log(a)) => log(&cfg, a).await,
            None => screen(&cfg, cli.screen).await,
        }
    })
}

async fn screen(cfg: &Config, a: ScreenArgs) -> anyhow::Result<ExitCode> {
    let targets = probe::targets(cfg, &a.skip)?;
    let mut db = DbOptions::from_config(cfg)?;
    db.connect_timeout = a.timeout;
    db.max_connections = 2;
    let mut pool = None;
    let terminal = std::io::stdout().is_terminal();
    loop {
        let report = look(&db, &mut pool, &targets, &a).await;
        let mut out = std::io::stdout().lock();
        if a.json && a.watch.is_some() {
            writeln!(out, "{}", serde_json::to_string(&report)?)?;
        } else if a.json {
            writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
        } else {
            if a.watch.is_some() && terminal {
                // Home and clear: the next look replaces this one.
                write!(out, "\x1b[H\x1b[2J")?;
            }
            write!(out, "{}", render::screen(&report))?;
            if let Some(every) = a.watch {
                writeln!(out, "\n(every {every}s; Ctrl-C ends)")?;
            }
        }
        out.flush()?;
        drop(out);
        let code = if report.ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
        let Some(every) = a.watch else {
            return Ok(code);
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(u64::from(every))) => {}
            _ = tokio::signal::ctrl_c() => return Ok(code),
        }
    }
}

/// What the database said in one look.
struct Reads {
    role: String,
    database: String,
    holder: Option<status::LockHolder>,
    counts: Vec<status::QueueCount>,
    oldest: Vec<status::Oldest>,
    counters: report::Counters,
    failures: Vec<status::Failure>,
    /// The mail log's parts, or why they could not be read.
    log: Result<LogReads, sqlx::Error>,
}

/// What the mail log said: the recent outcomes, the newest bounced and expired rows.
struct LogReads {
    recent: Vec<status::RecentOutcome>,
    bounced: Vec<LogRow>,
    expired: Vec<LogRow>,
}

async fn read(pool: &PgPool, limit: i64) -> Result<Reads, sqlx::Error> {
    let (role, database) = status::session(pool).await?;
    let holder = status::dispatcher(pool).await?;
    let counts = status::queue_counts(pool).await?;
    let oldest = status::oldest(pool).await?;
    let counters = report::Counters {
        dispatch: status::dispatch_counters(pool).await?,
        stages: status::stage_counters(pool).await?,
    };
    let failures = status::failures(pool, limit).await?;
    let log = async {
        let recent = status::recent_outcomes(pool).await?;
        let search = |event| Search {
            event: Some(event),
            ..Search::default()
        };
        let bounced = mail_log::search(pool, &search(Event::Bounced), limit).await?;
        let expired = mail_log::search(pool, &search(Event::Expired), limit).await?;
        Ok::<_, sqlx::Error>(LogReads {
            recent,
            bounced,
            expired,
        })
    }
    .await;
    Ok(Reads {
        role,
        database,
        holder,
        counts,
        oldest,
        counters,
        failures,
        log,
    })
}

fn is_permission_denied(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("42501"))
}

/// One look: the probes run while the database is read.
async fn look(
    db: &DbOptions,
    pool: &mut Option<PgPool>,
    targets: &[Target],
    a: &ScreenArgs,
) -> Report {
    let generated_at = Utc::now();
    let probes: Vec<_> = targets
        .iter()
        .cloned()
        .map(|t| {
            let limit = a.timeout;
            let name = t.name.clone();
            (
                name,
                t.kind,
                tokio::spawn(async move { probe::probe(&t, limit).await }),
            )
        })
        .collect();
    let started = Instant::now();
    let limit = i64::from(a.limit);
    let mut database = Service::new("database", Kind::Database, false, "");
    let mut reads = None;
    if pool.is_none() {
        match tokio::time::timeout(a.timeout, db.connect()).await {
            Ok(Ok(p)) => *pool = Some(p),
            Ok(Err(e)) => database.detail = format!("{e:#}"),
            Err(_) => {
                database.detail = format!(
                    "cannot connect to the database: no connection within {}",
                    probe::secs(a.timeout)
                )
            }
        }
    }
    if let Some(p) = pool.as_ref() {
        match tokio::time::timeout(a.timeout, read(p, limit)).await {
            Ok(Ok(r)) => {
                database.ok = true;
                database.detail = format!("connected as {} to {}", r.role, r.database);
                reads = Some(r);
            }
            Ok(Err(e)) if is_permission_denied(&e) => {
                database.detail = format!(
                    "connected, but {e}: the role in [database] URL may not read what pepsi-status shows (the pepsi-httpd role may; docs/status.md)"
                );
            }
            Ok(Err(e)) => database.detail = format!("connected, but reading failed: {e}"),
            Err(_) => {
                database.detail = format!(
                    "connected, but the reads took longer than {}",
                    probe::secs(a.timeout)
                )
            }
        }
        if reads.is_none() {
            // Connect afresh next time (the server may have restarted).
            *pool = None;
        }
    }
    database.elapsed_ms = Some(started.elapsed().as_millis() as u64);

    let mut services = vec![database];
    if !a.skip.contains(&Group::Dispatcher) {
        let mut s = Service::new("dispatcher", Kind::Dispatcher, false, "");
        match &reads {
            None => s.detail = "unknown: the database did not answer".into(),
            Some(r) => match &r.holder {
                None => {
                    s.detail = "nobody holds the dispatcher's lock in this database: pepsi-dispatch is not running".into()
                }
                Some(h) => {
                    s.ok = true;
                    let since = h
                        .since
                        .map(|t| format!(", since {}", render::when(t)))
                        .unwrap_or_default();
                    let name = if h.application_name.is_empty() {
                        "an unnamed session".to_owned()
                    } else {
                        h.application_name.clone()
                    };
                    s.detail = format!("{name} (server backend {}{since})", h.backend_pid);
                    s.holder = Some(h.clone());
                }
            },
        }
        services.push(s);
    }
    for (name, kind, p) in probes {
        match p.await {
            Ok(s) => services.push(s),
            Err(e) => services.push(Service::new(
                &name,
                kind,
                false,
                format!("the probe failed: {e}"),
            )),
        }
    }
    let ok = services.iter().all(|s| s.ok);
    let mut report = Report {
        generated_at,
        ok,
        services,
        queue: None,
        rates: None,
        counters: None,
        failures: None,
        bounces: None,
        notes: Vec::new(),
    };
    if let Some(r) = reads {
        report.queue = Some(report::queue(&r.counts, &r.oldest));
        let total = r
            .counts
            .iter()
            .filter(|c| c.status == "failed" || c.status == "timeout")
            .map(|c| c.rows)
            .sum();
        report.failures = Some(report::Failures {
            total,
            rows: r.failures,
        });
        report.counters = Some(r.counters);
        match r.log {
            Ok(LogReads {
                recent,
                bounced,
                expired,
            }) => {
                report.rates = Some(report::rates(&recent));
                report.bounces = Some(report::bounces(bounced, expired, usize::from(a.limit)));
            }
            Err(e) => report.notes.push(if is_permission_denied(&e) {
                format!(
                    "the mail log is not shown: role {} may not read pepsi.mail_log (the pepsi-httpd role may)",
                    r.role
                )
            } else {
                format!("the mail log is not shown: {e}")
            }),
        }
    }
    report
}

/// The `log --json` document.
#[derive(Debug, Serialize)]
struct LogDocument {
    rows: Vec<LogRow>,
    limit: u32,
    /// True when more rows matched than are shown.
    truncated: bool,
}

async fn log(cfg: &Config, a: LogArgs) -> anyhow::Result<ExitCode> {
    if let (Some(since), Some(until)) = (a.since, a.until)
        && since >= until
    {
        eprintln!(
            "pepsi-status: --since ({}) must be before --until ({})",
            render::when(since),
            render::when(until)
        );
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let search = Search {
        sender: a.sender,
        recipient: a.recipient,
        event: a.event.as_deref().and_then(Event::parse),
        workqueue_id: a.id,
        since: a.since,
        until: a.until,
    };
    let pool = pepsi_contract::db::connect(cfg).await?;
    let limit = usize::try_from(a.limit).unwrap_or(usize::MAX);
    let mut rows = mail_log::search(&pool, &search, i64::from(a.limit) + 1)
        .await
        .map_err(|e| {
            let denied = is_permission_denied(&e);
            let err = anyhow::Error::new(e);
            if denied {
                err.context("the role in [database] URL may not read pepsi.mail_log (the pepsi-httpd role may; docs/status.md)")
            } else {
                err
            }
        })
        .context("cannot search the mail log")?;
    let truncated = rows.len() > limit;
    rows.truncate(limit);
    let mut out = std::io::stdout().lock();
    if a.json {
        let doc = LogDocument {
            rows,
            limit: a.limit,
            truncated,
        };
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else if rows.is_empty() {
        writeln!(out, "no mail log rows match")?;
    } else {
        write!(out, "{}", render::log_table(&rows))?;
        if truncated {
            writeln!(
                out,
                "(the newest {} shown; more match: narrow the search or raise --limit)",
                rows.len()
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    #[test]
    fn when_takes_a_duration_a_time_or_a_date() {
        let now = DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z")
            .unwrap()
            .to_utc();
        for (text, want) in [
            ("2h", "2026-12-01T10:00:00+00:00"),
            ("90", "2026-12-01T11:58:30+00:00"),
            ("1d", "2026-11-30T12:00:00+00:00"),
            ("2026-11-02T09:30:00Z", "2026-11-02T09:30:00+00:00"),
            ("2026-11-02T09:30:00+02:00", "2026-11-02T07:30:00+00:00"),
            ("2026-11-02", "2026-11-02T00:00:00+00:00"),
        ] {
            assert_eq!(when_at(text, now).unwrap().to_rfc3339(), want, "{text}");
        }
        for bad in ["yesterday", "", "2026-13-01", "-2h"] {
            let e = when_at(bad, now).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn timeouts_are_bounded() {
        assert_eq!(parse_timeout("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("1h").unwrap_err().contains("\"1h\""));
        assert!(parse_timeout("soon").is_err());
    }
}
