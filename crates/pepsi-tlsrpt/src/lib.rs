//! pepsi-tlsrpt: SMTP TLS reporting (RFC 8460) both ways.
//!
//! - `send`: the daily aggregate report of the TLS results the relay to the internet counted
//!   (`pepsi.tls_report_result`) to every recipient domain whose `_smtp._tls` record names
//!   a report address: by mail (queued as local mail, so it is DKIM-signed and relayed like
//!   any other) or HTTPS POST. `pepsi.tls_report_sent` keeps a report from going twice.
//! - `import`: reports other senders made about our domains, read from mail (a file,
//!   standard input, or the report mailbox's Maildir) and kept in
//!   `pepsi.tls_report_received`.
//! - `show` and `summary`: the reports received, and their failures per sending
//!   organisation and failure type.
//!
//! Modules: `report` (the RFC 8460 JSON, built and parsed, pure), `rua` (the TXT record,
//! pure), `mail` (the report mail both ways, pure), `store` (the tables).

pub mod mail;
pub mod report;
pub mod rua;
pub mod store;

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{NaiveDate, Utc};
use clap::{Args, Parser, Subcommand};
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::Config;
use pepsi_outbound::dns::Dns;
use serde::Serialize;

use crate::report::{Report, Submitter};
use crate::rua::Rua;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "tlsrpt",
        exec: "pepsi-tlsrpt",
    };
    pub const SECTION: &str = "pepsi-tlsrpt";
}

const LONG_ABOUT: &str = "\
SMTP TLS reporting (RFC 8460) for Pepsi, both ways.

pepsi-stage-relay-to-internet counts the TLS result of every session it opens in \
pepsi.tls_report_result: per UTC day, recipient domain, policy (its MTA-STS policy, or none \
found), MX host and result (success, or a failure type of RFC 8460 such as \
starttls-not-supported or certificate-host-mismatch). `send` makes of one day's counts \
(default: yesterday) one aggregate report per recipient domain, and sends it to each \
address the domain's _smtp._tls TXT record names (v=TLSRPTv1; rua=...): a mailto: address \
gets a multipart/report mail with the gzip'ed JSON attached, queued as local mail from \
FROM so the pipeline signs and relays it; an https: address gets it by POST \
(application/tlsrpt+gzip). A domain without such a record gets nothing. What was sent is \
kept in pepsi.tls_report_sent: running `send` again for the same day sends nothing twice. \
Counts older than RETENTION are deleted. Run it once a day (pepsi-tlsrpt.timer).

`import` reads reports other senders made about our domains, mailed to the address our \
own _smtp._tls record names (pepsi-setup dns prints it): from files (mail messages, or \
.json / .json.gz reports), from standard input, or with --maildir from the new/ folder of \
that mailbox's Maildir (imported messages move to cur/, seen). Each report is checked \
against RFC 8460 (required fields, known policy and result types, totals that agree) and \
kept once per organisation and report id in pepsi.tls_report_received. `show` lists the \
reports received; `summary` adds up their sessions per sending organisation, policy domain \
and result, the failures first. Both take --json.

Options of [pepsi-tlsrpt]:
  ORGANIZATION      organization-name of our reports (default [pepsi] HOSTNAME)
  CONTACT           contact-info of our reports (default postmaster@<[pepsi] HOSTNAME>)
  FROM              From: of report mail (default CONTACT)
  DNS_SERVERS       resolvers for _smtp._tls lookups ([pepsi] DNS_SERVERS, else the system's)
  DNS_TIMEOUT       10s ([pepsi] DNS_TIMEOUT)
  HTTPS_TIMEOUT     30s    one POST to an https: report address
  HTTPS_CA_FILE     PEM file of the CAs an https: report address must chain to (default:
                    the web PKI roots)
  ALLOW_INTERNAL_ADDRESSES  no   POST to report hosts on loopback or private addresses
  RETENTION         30d    counts of pepsi.tls_report_result kept

Exit status: 0 when done, 1 when something could not be (a database error, a report that \
could not be sent: the others still go; an unreadable input), 2 on a usage error or a \
report that is not RFC 8460.

See docs/tls-reports.md.";

const EXAMPLES: &str = "\
Examples:
  pepsi-tlsrpt send                          yesterday's reports (from a daily timer)
  pepsi-tlsrpt send --day 2026-12-05 --dry-run
  pepsi-tlsrpt import --maildir /var/mail/tls-reports/Maildir
  pepsi-tlsrpt import report.eml
  pepsi-tlsrpt show
  pepsi-tlsrpt summary --json";

/// SMTP TLS reports (RFC 8460): send ours, import and summarise theirs.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-tlsrpt",
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
    /// Send one day's aggregate reports to the domains that ask for them.
    Send(SendArgs),
    /// Import reports received about our domains.
    Import(ImportArgs),
    /// List the reports received.
    Show(ShowArgs),
    /// Sessions of the reports received per organisation, domain and result.
    Summary(ShowArgs),
}

#[derive(Debug, Args)]
struct SendArgs {
    /// The UTC day to report, YYYY-MM-DD (default: yesterday)
    #[arg(long, value_name = "DAY")]
    day: Option<NaiveDate>,
    /// Say what would be sent, and send nothing
    #[arg(long)]
    dry_run: bool,
    /// Print what was sent as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ImportArgs {
    /// Mail messages or .json / .json.gz reports; - or none: standard input
    files: Vec<PathBuf>,
    /// Import the messages in DIR/new of a Maildir, moving each to DIR/cur
    #[arg(long, value_name = "DIR", conflicts_with = "files")]
    maildir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// Only reports whose range ended within this many days
    #[arg(long, value_name = "DAYS", default_value_t = 30)]
    days: u32,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

/// The command line of `pepsi-tlsrpt`: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// `[pepsi-tlsrpt]`, read once at start.
#[derive(Debug, Clone)]
struct Options {
    submitter: Submitter,
    from: String,
    dns_servers: Vec<std::net::SocketAddr>,
    dns_timeout: Duration,
    https_timeout: Duration,
    https_ca_file: Option<PathBuf>,
    allow_internal: bool,
    retention: Duration,
}

impl Options {
    fn from_config(cfg: &Config) -> anyhow::Result<Options> {
        let s = cfg.section(constants::SECTION);
        let hostname = cfg.name_option(&s, "HOSTNAME")?;
        let contact = s
            .string_opt("CONTACT")?
            .filter(|c| !c.trim().is_empty())
            .unwrap_or_else(|| format!("postmaster@{hostname}"));
        let layered = s.or_global();
        Ok(Options {
            submitter: Submitter {
                organization: s
                    .string_opt("ORGANIZATION")?
                    .filter(|o| !o.trim().is_empty())
                    .unwrap_or_else(|| hostname.clone()),
                contact: contact.clone(),
                hostname,
            },
            from: s
                .string_opt("FROM")?
                .filter(|f| !f.trim().is_empty())
                .unwrap_or(contact),
            dns_servers: pepsi_outbound::dns::servers_opt(layered.section_for("DNS_SERVERS"))?
                .unwrap_or_default(),
            dns_timeout: layered
                .duration_opt("DNS_TIMEOUT")?
                .filter(|d| !d.is_zero())
                .unwrap_or(Duration::from_secs(10)),
            https_timeout: s
                .duration_opt("HTTPS_TIMEOUT")?
                .filter(|d| !d.is_zero())
                .unwrap_or(Duration::from_secs(30)),
            https_ca_file: s.path_opt("HTTPS_CA_FILE")?,
            allow_internal: s.bool_opt("ALLOW_INTERNAL_ADDRESSES")?.unwrap_or(false),
            retention: s
                .duration_opt("RETENTION")?
                .filter(|d| !d.is_zero())
                .unwrap_or(Duration::from_secs(30 * 86_400)),
        })
    }
}

/// Entry point of the `pepsi-tlsrpt` binary.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        let options = Options::from_config(&cfg)?;
        let pool = pepsi_contract::db::DbOptions::from_config(&cfg)?
            .connect()
            .await?;
        match cli.command {
            Command::Send(args) => send(&pool, &options, args).await,
            Command::Import(args) => import(&pool, args).await,
            Command::Show(args) => show(&pool, args).await,
            Command::Summary(args) => summary(&pool, args).await,
        }
    })
}

/// One report that went (or would go) to one address.
#[derive(Debug, Serialize)]
struct Sent {
    domain: String,
    rua: String,
    report_id: String,
    /// `sent`, `already sent`, `would send`, or why it failed.
    outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_id: Option<i64>,
}

async fn send(pool: &sqlx::PgPool, o: &Options, args: SendArgs) -> anyhow::Result<ExitCode> {
    let day = args
        .day
        .unwrap_or_else(|| Utc::now().date_naive() - chrono::Days::new(1));
    let dns = Dns::new(&o.dns_servers, o.dns_timeout)?;
    let http = https_client(o)?;
    let domains = store::domains_of(pool, day).await?;
    if !args.json {
        eprintln!("{day}: TLS results for {} domain(s)", domains.len());
    }
    let mut sent = Vec::new();
    let mut failed = false;
    for domain in &domains {
        let ruas = match dns.txt(&format!("_smtp._tls.{domain}")).await {
            Ok(answers) => match rua::select(&answers) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    tracing::info!(domain, "TLS-RPT record ignored: {e}");
                    continue;
                }
            },
            Err(e) => {
                failed = true;
                sent.push(Sent {
                    domain: domain.clone(),
                    rua: String::new(),
                    report_id: String::new(),
                    outcome: format!("the _smtp._tls lookup failed: {e}"),
                    queue_id: None,
                });
                continue;
            }
        };
        let rows = store::results(pool, day, domain).await?;
        let report = report::build(&o.submitter, domain, day, &rows);
        report::validate(&report).map_err(|e| anyhow::anyhow!("report for {domain}: {e}"))?;
        for r in ruas {
            let uri = r.as_uri();
            let mut entry = Sent {
                domain: domain.clone(),
                rua: uri.clone(),
                report_id: report.report_id.clone(),
                outcome: String::new(),
                queue_id: None,
            };
            if store::was_sent(pool, day, domain, &uri).await? {
                entry.outcome = "already sent".into();
            } else if args.dry_run {
                entry.outcome = "would send".into();
            } else {
                match deliver(pool, o, &http, &report, domain, &r).await {
                    Ok(queue_id) => {
                        store::mark_sent(pool, day, domain, &uri, &report.report_id, queue_id)
                            .await?;
                        entry.outcome = "sent".into();
                        entry.queue_id = queue_id;
                    }
                    Err(e) => {
                        failed = true;
                        entry.outcome = format!("not sent: {e:#}");
                    }
                }
            }
            if !args.json {
                eprintln!("{domain} → {uri}: {}", entry.outcome);
            }
            sent.push(entry);
        }
    }
    if !args.dry_run {
        if sent.iter().any(|s| s.queue_id.is_some()) {
            pepsi_contract::db::wake_dispatcher(pool, None).await?;
        }
        let gone = store::forget_results(pool, o.retention).await?;
        if gone > 0 {
            tracing::info!(rows = gone, "old TLS results deleted");
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&sent)?);
    } else if sent.is_empty() {
        println!("{day}: no domain asks for TLS reports");
    } else {
        let n = sent.iter().filter(|s| s.outcome == "sent").count();
        println!(
            "{day}: {n} report(s) sent, {} address(es) in all",
            sent.len()
        );
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn https_client(o: &Options) -> anyhow::Result<reqwest::Client> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let dns = std::sync::Arc::new(Dns::new(&o.dns_servers, o.dns_timeout)?);
    let mut b = reqwest::Client::builder()
        .timeout(o.https_timeout)
        .connect_timeout(o.https_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .https_only(true)
        .dns_resolver(std::sync::Arc::new(pepsi_outbound::dns::HttpResolver {
            dns,
            allowed: if o.allow_internal {
                |_| true
            } else {
                pepsi_outbound::dns::is_public
            },
            option: "ALLOW_INTERNAL_ADDRESSES",
        }))
        .user_agent(concat!("pepsi-tlsrpt/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = &o.https_ca_file {
        let pem = std::fs::read(path)
            .with_context(|| format!("[pepsi-tlsrpt] HTTPS_CA_FILE {}", path.display()))?;
        b = b.tls_built_in_root_certs(false);
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("[pepsi-tlsrpt] HTTPS_CA_FILE {}", path.display()))?
        {
            b = b.add_root_certificate(cert);
        }
    }
    b.build().context("cannot set up the HTTPS client")
}

/// Sends `report` to one address: queued as mail (the queue row's id), or POSTed.
async fn deliver(
    pool: &sqlx::PgPool,
    o: &Options,
    http: &reqwest::Client,
    report: &Report,
    domain: &str,
    rua: &Rua,
) -> anyhow::Result<Option<i64>> {
    match rua {
        Rua::Mailto(to) => {
            let now = Utc::now();
            let message_id = format!("{}.tlsrpt@{}", now.timestamp_micros(), o.submitter.hostname);
            let raw = mail::compose(
                report,
                domain,
                &mail::Envelope {
                    from: &o.from,
                    to,
                    message_id: &message_id,
                    now,
                },
            );
            Ok(Some(store::queue(pool, &o.from, to, &raw).await?))
        }
        Rua::Https(url) => {
            let response = http
                .post(url)
                .header(reqwest::header::CONTENT_TYPE, "application/tlsrpt+gzip")
                .body(report::gzip(report))
                .send()
                .await
                .with_context(|| format!("POST {url}"))?;
            if !response.status().is_success() {
                anyhow::bail!("POST {url} answered {}", response.status());
            }
            Ok(None)
        }
    }
}

async fn import(pool: &sqlx::PgPool, args: ImportArgs) -> anyhow::Result<ExitCode> {
    let mut inputs: Vec<(String, Vec<u8>, Option<PathBuf>)> = Vec::new();
    let read = |path: &Path| -> anyhow::Result<Vec<u8>> {
        let len = std::fs::metadata(path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .len();
        if len > mail::MAX_MAIL_BYTES as u64 {
            anyhow::bail!(
                "{} is {len} bytes, more than the {} read",
                path.display(),
                mail::MAX_MAIL_BYTES
            );
        }
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
    };
    if let Some(dir) = &args.maildir {
        let new = dir.join("new");
        let mut names: Vec<PathBuf> = std::fs::read_dir(&new)
            .with_context(|| format!("cannot read the Maildir folder {}", new.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        names.sort();
        for p in names {
            inputs.push((p.display().to_string(), read(&p)?, Some(p)));
        }
    } else if args.files.is_empty() || args.files.iter().any(|f| f.as_os_str() == "-") {
        let mut buf = Vec::new();
        std::io::stdin()
            .take(mail::MAX_MAIL_BYTES as u64 + 1)
            .read_to_end(&mut buf)
            .context("cannot read standard input")?;
        inputs.push(("standard input".into(), buf, None));
    } else {
        for p in &args.files {
            inputs.push((p.display().to_string(), read(p)?, None));
        }
    }
    let (mut added, mut known, mut bad) = (0, 0, 0);
    for (source, bytes, maildir_file) in inputs {
        let parsed = if bytes.starts_with(b"{") || bytes.starts_with(&[0x1f, 0x8b]) {
            report::parse(&bytes)
        } else {
            mail::extract(&bytes)
        };
        match parsed {
            Ok(r) => {
                if store::receive(pool, &r, &source).await? {
                    added += 1;
                    eprintln!(
                        "{source}: report {} from {}",
                        r.report_id, r.organization_name
                    );
                } else {
                    known += 1;
                    eprintln!(
                        "{source}: report {} from {} was imported before",
                        r.report_id, r.organization_name
                    );
                }
            }
            Err(e) => {
                bad += 1;
                eprintln!("{source}: not imported: {e}");
            }
        }
        if let Some(file) = maildir_file {
            seen(&file)?;
        }
    }
    println!("{added} report(s) imported, {known} already known, {bad} refused");
    Ok(if bad > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// Moves a Maildir message from new/ to cur/ with the Seen flag.
fn seen(file: &Path) -> anyhow::Result<()> {
    let name = file.file_name().context("a Maildir file has a name")?;
    let cur = file
        .parent()
        .and_then(Path::parent)
        .context("a Maildir file is in new/")?
        .join("cur")
        .join(format!("{}:2,S", name.to_string_lossy()));
    std::fs::rename(file, &cur)
        .with_context(|| format!("cannot move {} to {}", file.display(), cur.display()))
}

async fn show(pool: &sqlx::PgPool, args: ShowArgs) -> anyhow::Result<ExitCode> {
    let reports = store::received(pool, args.days).await?;
    if args.json {
        let list: Vec<_> = reports
            .iter()
            .map(|(r, source)| serde_json::json!({"report": r, "source": source}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(ExitCode::SUCCESS);
    }
    if reports.is_empty() {
        println!("no report received in the last {} days", args.days);
    }
    for (r, _) in &reports {
        let (ok, failed) = r.policies.iter().fold((0u64, 0u64), |(a, b), p| {
            (
                a + p.summary.total_successful_session_count,
                b + p.summary.total_failure_session_count,
            )
        });
        let domains: Vec<&str> = r
            .policies
            .iter()
            .map(|p| p.policy.policy_domain.as_str())
            .collect();
        println!(
            "{}  {}  {}  {}  sessions: {ok} ok, {failed} failed",
            r.date_range.start_datetime.format("%Y-%m-%d"),
            r.organization_name,
            domains.join(","),
            r.report_id
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Sessions per (organisation, policy domain, result), added up over reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    pub organization: String,
    pub domain: String,
    /// `success` or an RFC 8460 result type.
    pub result: String,
    pub sessions: u64,
}

/// The summary of `reports`: failures first (most sessions first), then successes.
pub fn summarize(reports: &[Report]) -> Vec<Line> {
    let mut sums: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    for r in reports {
        for p in &r.policies {
            let key = |result: &str| {
                (
                    r.organization_name.clone(),
                    p.policy.policy_domain.clone(),
                    result.to_owned(),
                )
            };
            *sums.entry(key("success")).or_default() += p.summary.total_successful_session_count;
            for d in &p.failure_details {
                *sums.entry(key(&d.result_type)).or_default() += d.failed_session_count;
            }
        }
    }
    let mut lines: Vec<Line> = sums
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|((organization, domain, result), sessions)| Line {
            organization,
            domain,
            result,
            sessions,
        })
        .collect();
    lines.sort_by(|a, b| {
        (a.result == "success")
            .cmp(&(b.result == "success"))
            .then(b.sessions.cmp(&a.sessions))
            .then(a.organization.cmp(&b.organization))
    });
    lines
}

async fn summary(pool: &sqlx::PgPool, args: ShowArgs) -> anyhow::Result<ExitCode> {
    let reports: Vec<Report> = store::received(pool, args.days)
        .await?
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    let lines = summarize(&reports);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&lines)?);
    } else if lines.is_empty() {
        println!("no report received in the last {} days", args.days);
    } else {
        println!(
            "{:<30} {:<30} {:<28} {:>9}",
            "ORGANIZATION", "DOMAIN", "RESULT", "SESSIONS"
        );
        for l in &lines {
            println!(
                "{:<30} {:<30} {:<28} {:>9}",
                l.organization, l.domain, l.result, l.sessions
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Counted, build};

    #[test]
    fn the_summary_puts_failures_first() {
        let s = |org: &str| Submitter {
            organization: org.into(),
            contact: "c@x".into(),
            hostname: "x".into(),
        };
        let day = NaiveDate::from_ymd_opt(2026, 12, 5).unwrap();
        let row = |result: &str, n| Counted {
            policy_type: "sts".into(),
            policy_string: vec![],
            mx_host: "mx.ours.test".into(),
            receiving_ip: String::new(),
            result_type: result.into(),
            sessions: n,
            detail: String::new(),
        };
        let reports = [
            build(
                &s("Big Mail"),
                "ours.test",
                day,
                &[row("success", 90), row("certificate-expired", 4)],
            ),
            build(
                &s("Small Mail"),
                "ours.test",
                day,
                &[row("success", 5), row("starttls-not-supported", 7)],
            ),
            build(
                &s("Big Mail"),
                "ours.test",
                day.succ_opt().unwrap(),
                &[row("success", 10)],
            ),
        ];
        let got: Vec<(String, String, u64)> = summarize(&reports)
            .into_iter()
            .map(|l| (l.organization, l.result, l.sessions))
            .collect();
        assert_eq!(
            got,
            [
                ("Small Mail", "starttls-not-supported", 7),
                ("Big Mail", "certificate-expired", 4),
                ("Big Mail", "success", 100),
                ("Small Mail", "success", 5),
            ]
            .map(|(o, r, n)| (o.to_owned(), r.to_owned(), n))
        );
    }
}
