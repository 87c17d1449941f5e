//! pepsi-quota: the operator's tool for mailbox quotas — the limits of `pepsi.quota_limit`
//! (per mailbox and per domain), the usage `pepsi.quota_usage` records, and a recount of a
//! Maildir from disk.
//!
//! Limits and usage go through `pepsi_contract::quota` (each change with its `pepsi.event_log`
//! row). A recount runs the Maildir writer the delivery stage runs (`[stage-<name>] HELPER`,
//! found the same way) with a `usage … rebuild yes` request, so the count is made as the
//! mailbox's owner and rewrites the Maildir++ `maildirsize` an IMAP server reads; the tool is
//! set-group-id `pepsi-maildir` for that reason alone (spec 22.2), like the stage.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use pepsi_conf::address;
use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::Config;
use pepsi_contract::audit::Actor;
use pepsi_contract::quota::{self, Limits, Recorded, Scope, Usage};
use pepsi_helper_maildir_writer::client::CoProcess;
use pepsi_helper_maildir_writer::protocol::{Reply, UsageRequest};
use pepsi_outbound::maildir::{self, Mailboxes, NoStage};
use serde::Serialize;
use sqlx::PgPool;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "quota",
        exec: "pepsi-quota",
    };
}

const LONG_ABOUT: &str = "\
Show and set the quotas of Pepsi's Maildir mailboxes, and count a mailbox again from disk.

A quota limits what a mailbox holds in bytes, in messages, or both. `set alice@example.org` \
gives one mailbox its own limits; `set @example.org` limits what all the mailboxes of the \
domain hold together. A mailbox without limits of its own has those of the Maildir delivery \
stage (QUOTA, QUOTA_MESSAGES of its [stage-<name>]). Limits are stored in pepsi.quota_limit, \
each change with a pepsi.event_log row (quota.set, quota.unset), and apply to the next \
delivery (the stage rereads them within its QUOTA_LOOKUP_TTL).

The delivery keeps each limited Maildir's Maildir++ maildirsize file, which Dovecot's maildir \
quota reads too, and records the usage it finds in pepsi.quota_usage; the ingress refuses RCPT \
to a mailbox (or domain) that is full by that record with 452 4.2.2. A message that does not \
fit is deferred (4.2.2) for QUOTA_GRACE, then returned to its sender (5.2.2). docs/quota.md \
has the whole picture.

`show` prints the limits and the recorded usage: of the scopes named, or of every scope with \
limits and every mailbox with a record. `recalc` counts the Maildirs of the addresses named \
(or, with --all, of every mailbox with limits or a record) from disk, through the Maildir \
writer as their owners, rewrites their maildirsize and records the result: after mail was \
removed outside an IMAP server, or to check a record. It prints one line per mailbox.

pepsi-quota connects with [database] URL of the configuration as the role named there, \
which needs the pepsi-config role's rights on the quota tables (docs/setup.md). `recalc` \
starts the writer, which only root and group pepsi-maildir may run: this program is \
installed set-group-id pepsi-maildir, executable by root and that group.

Exit status: 0 when the change was made (or the listing printed), 1 when it could not be \
(a database error, a mailbox the writer could not count), 2 on a usage error or input that \
is not valid (a malformed address or size).";

const EXAMPLES: &str = "\
Examples:
  pepsi-quota set alice@example.org --storage 2G --messages 50000
  pepsi-quota set @example.org --storage 100G          all of the domain's mailboxes together
  pepsi-quota set alice@example.org --messages none     keep the storage limit, drop the count
  pepsi-quota show alice@example.org
  pepsi-quota show --json
  pepsi-quota recalc alice@example.org
  pepsi-quota recalc --all
  pepsi-quota unset alice@example.org                   back to the stage's QUOTA";

/// Show and set mailbox quotas, and count Maildirs again.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-quota",
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
    /// The limits and recorded usage of the scopes named (all of them when none is).
    Show(ShowArgs),
    /// Set the limits of a mailbox or (@domain) a domain.
    Set(SetArgs),
    /// Remove a scope's limits (a mailbox falls back to the stage's QUOTA).
    Unset(ScopeArg),
    /// Count mailboxes again from disk and record the result.
    Recalc(RecalcArgs),
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// alice@example.org or @example.org
    scopes: Vec<String>,
    /// One JSON document instead of the table
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct SetArgs {
    /// alice@example.org, or @example.org for the whole domain
    scope: String,
    /// Bytes: 500M, 2G, 1073741824, or `none`
    #[arg(long, value_name = "SIZE")]
    storage: Option<String>,
    /// Messages: a whole number, or `none`
    #[arg(long, value_name = "N")]
    messages: Option<String>,
}

#[derive(Debug, Args)]
struct ScopeArg {
    /// alice@example.org or @example.org
    scope: String,
}

#[derive(Debug, Args)]
struct RecalcArgs {
    /// The mailboxes to count
    addresses: Vec<String>,
    /// Every mailbox with limits of its own or a recorded usage
    #[arg(long, conflicts_with = "addresses")]
    all: bool,
    /// The Maildir delivery stage whose MAILDIR_ROOT, MAILDIR and HELPER apply (default:
    /// the only stage running pepsi-stage-relay-to-maildir)
    #[arg(long, value_name = "NAME")]
    stage: Option<String>,
}

/// The command line of `pepsi-quota` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

type Done = Result<(), Failure>;

/// Runs `pepsi-quota` with the process's arguments.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        // Input is checked before connecting: a typing mistake costs no connection.
        let checked = match &cli.command {
            Command::Set(a) => set_args(a).map(Some),
            _ => Ok(None),
        };
        let limits = match checked {
            Ok(l) => l,
            Err(e) => return Ok(exit(Err(e))),
        };
        let pool = pepsi_contract::db::connect(&cfg).await?;
        let actor = Actor::local(constants::CONFIG_SOURCE.exec);
        let result = match cli.command {
            Command::Show(a) => show(&pool, a).await,
            Command::Set(a) => {
                let (scope, limits) = limits.expect("checked above");
                set(&pool, &actor, &a, &scope, limits).await
            }
            Command::Unset(a) => unset(&pool, &actor, &a.scope).await,
            Command::Recalc(a) => recalc(&pool, &cfg, a).await,
        };
        Ok(exit(result))
    })
}

fn exit(result: Done) -> ExitCode {
    pepsi_conf::cli::tool_exit(&constants::CONFIG_SOURCE, result)
}

fn scope(text: &str) -> Result<Scope, Failure> {
    quota::parse_scope(text).map_err(Failure::Invalid)
}

/// One limit as given: a number (a size for storage), `none` for no limit; absent keeps the
/// stored value (`None` here).
fn limit_arg(
    text: Option<&str>,
    what: &str,
    parse: fn(&str) -> Result<u64, String>,
) -> Result<Option<Option<u64>>, Failure> {
    let Some(text) = text else {
        return Ok(None);
    };
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(Some(None));
    }
    match parse(text) {
        Ok(0) => Err(Failure::Invalid(format!(
            "--{what} 0: a limit must be above 0 (`none` for no limit)"
        ))),
        Ok(n) => Ok(Some(Some(n))),
        Err(e) => Err(Failure::Invalid(format!("--{what} {text:?}: {e}"))),
    }
}

type SetPlan = (Scope, (Option<Option<u64>>, Option<Option<u64>>));

fn set_args(a: &SetArgs) -> Result<SetPlan, Failure> {
    let scope = scope(&a.scope)?;
    if a.storage.is_none() && a.messages.is_none() {
        return Err(Failure::Invalid(
            "give --storage, --messages or both".into(),
        ));
    }
    let storage = limit_arg(
        a.storage.as_deref(),
        "storage",
        pepsi_conf::config::parse_size,
    )?;
    let messages = limit_arg(a.messages.as_deref(), "messages", |t| {
        t.trim()
            .parse::<u64>()
            .map_err(|_| "not a whole number of messages".to_owned())
    })?;
    Ok((scope, (storage, messages)))
}

async fn set(
    pool: &PgPool,
    actor: &Actor,
    a: &SetArgs,
    scope: &Scope,
    (storage, messages): (Option<Option<u64>>, Option<Option<u64>>),
) -> Done {
    let stored = quota::all_limits(pool)
        .await?
        .into_iter()
        .find(|(k, _)| *k == scope.key())
        .map(|(_, l)| l)
        .unwrap_or_default();
    let limits = Limits {
        bytes: storage.unwrap_or(stored.bytes),
        messages: messages.unwrap_or(stored.messages),
    };
    if !limits.any() {
        return Err(Failure::Invalid(format!(
            "{}: that leaves no limit at all; use `pepsi-quota unset {}` to remove its limits",
            a.scope, a.scope
        )));
    }
    quota::set_limit(pool, actor, scope, limits).await?;
    println!("{scope}: {}", describe(limits));
    Ok(())
}

async fn unset(pool: &PgPool, actor: &Actor, text: &str) -> Done {
    let scope = scope(text)?;
    if quota::unset_limit(pool, actor, &scope).await? {
        println!("{scope}: limits removed");
        Ok(())
    } else {
        Err(Failure::Other(anyhow::anyhow!(
            "{scope} has no limits of its own"
        )))
    }
}

/// `2.0 GiB, 50000 messages`, `no limit`.
fn describe(l: Limits) -> String {
    let mut parts = Vec::new();
    if let Some(b) = l.bytes {
        parts.push(format!("{} ({b} bytes)", human(b)));
    }
    if let Some(m) = l.messages {
        parts.push(format!("{m} messages"));
    }
    if parts.is_empty() {
        "no limit".into()
    } else {
        parts.join(", ")
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// One scope as `show` reports it.
#[derive(Debug, Serialize)]
struct ScopeReport {
    scope: String,
    /// Its own limits row.
    limits: Option<Limits>,
    /// A mailbox's domain's limits row.
    #[serde(skip_serializing_if = "Option::is_none")]
    domain_limits: Option<Limits>,
    /// A mailbox's recorded usage.
    #[serde(skip_serializing_if = "Option::is_none")]
    recorded: Option<Recorded>,
    /// A domain's mailboxes together, by their records.
    #[serde(skip_serializing_if = "Option::is_none")]
    domain_usage: Option<Usage>,
}

async fn show(pool: &PgPool, a: ShowArgs) -> Done {
    let scopes = a
        .scopes
        .iter()
        .map(|s| scope(s))
        .collect::<Result<Vec<_>, _>>()?;
    let limits = quota::all_limits(pool).await?;
    let records = quota::all_recorded(pool).await?;
    let limits_of = |key: &str| limits.iter().find(|(k, _)| k == key).map(|(_, l)| *l);
    let mut keys: Vec<Scope> = scopes;
    if keys.is_empty() {
        let mut all: Vec<String> = limits.iter().map(|(k, _)| k.clone()).collect();
        all.extend(records.iter().map(|(m, _)| m.clone()));
        all.sort();
        all.dedup();
        keys = all
            .iter()
            .filter_map(|k| quota::parse_scope(k).ok())
            .collect();
    }
    let mut reports = Vec::new();
    for key in keys {
        let report = match &key {
            Scope::Mailbox(m) => ScopeReport {
                scope: key.key(),
                limits: limits_of(m),
                domain_limits: limits_of(&format!(
                    "@{}",
                    address::domain_part(m).unwrap_or_default()
                )),
                recorded: records.iter().find(|(k, _)| k == m).map(|(_, r)| r.clone()),
                domain_usage: None,
            },
            Scope::Domain(d) => ScopeReport {
                scope: key.key(),
                limits: limits_of(&key.key()),
                domain_limits: None,
                recorded: None,
                domain_usage: Some(quota::domain_usage(pool, d).await?),
            },
        };
        reports.push(report);
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).context("encoding the report")?
        );
        return Ok(());
    }
    if reports.is_empty() {
        println!("no quota set and no usage recorded");
    }
    for r in &reports {
        println!("{}", r.scope);
        match r.limits {
            Some(l) => println!("  limits:         {}", describe(l)),
            None if r.scope.starts_with('@') => println!("  limits:         none"),
            None => println!("  limits:         the delivery stage's QUOTA / QUOTA_MESSAGES"),
        }
        if let Some(l) = r.domain_limits {
            println!("  domain limits:  {}", describe(l));
        }
        match (&r.recorded, r.domain_usage) {
            (Some(rec), _) => println!(
                "  used:           {} in {} messages (measured {}, under {})",
                human(rec.usage.bytes),
                rec.usage.messages,
                rec.measured_at.format("%Y-%m-%d %H:%M:%S UTC"),
                describe(rec.limits)
            ),
            (None, Some(u)) => println!(
                "  used:           {} in {} messages (its mailboxes' records together)",
                human(u.bytes),
                u.messages
            ),
            (None, None) => println!("  used:           not recorded yet"),
        }
    }
    Ok(())
}

/// The delivery stage whose settings say where mailboxes are.
fn delivery_stage(cfg: &Config, asked: Option<&str>) -> Result<String, Failure> {
    maildir::delivery_stage(cfg, asked).map_err(|e| match e {
        NoStage::Unknown(t) | NoStage::Several(t) => Failure::Invalid(t),
        NoStage::None(t) => Failure::Other(anyhow::anyhow!(t)),
    })
}

async fn recalc(pool: &PgPool, cfg: &Config, a: RecalcArgs) -> Done {
    let stage = delivery_stage(cfg, a.stage.as_deref())?;
    let s = Mailboxes::of_stage(cfg, &stage).with_context(|| format!("[stage-{stage}]"))?;
    let local = pepsi_contract::local::LocalRecipients::from_config(cfg)
        .with_context(|| format!("[stage-{stage}]"))?;
    let mailboxes: Vec<String> = if a.all {
        let mut all: Vec<String> = quota::all_limits(pool)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| !k.starts_with('@'))
            .collect();
        all.extend(quota::all_recorded(pool).await?.into_iter().map(|(m, _)| m));
        all.sort();
        all.dedup();
        all
    } else if a.addresses.is_empty() {
        return Err(Failure::Invalid(
            "name the mailboxes to count, or give --all".into(),
        ));
    } else {
        let mut named = Vec::new();
        for address in &a.addresses {
            match scope(address)? {
                Scope::Mailbox(m) => named.push(local.mailbox_key(&m)),
                Scope::Domain(_) => {
                    return Err(Failure::Invalid(format!(
                        "{address}: recalc counts mailboxes; name their addresses (or --all)"
                    )));
                }
            }
        }
        named
    };
    let mut writer = CoProcess::start(s.writer.clone()).map_err(|e| anyhow::anyhow!(e))?;
    let limits = quota::all_limits(pool).await?;
    let (mut counted, mut failed) = (0usize, 0usize);
    for mailbox in &mailboxes {
        // The limits the delivery applies (pepsi_contract::quota): the mailbox's own, else the
        // stage's, else its domain's.
        let find = |key: &str| limits.iter().find(|(k, _)| k == key).map(|(_, l)| *l);
        let domain = find(&format!(
            "@{}",
            address::domain_part(mailbox).unwrap_or_default()
        ))
        .unwrap_or_default();
        let effective = find(mailbox)
            .unwrap_or(Limits {
                bytes: s.quota,
                messages: s.quota_messages,
            })
            .or(domain);
        let path = match s.template.mailbox(&s.root, mailbox, &s.delimiters) {
            Ok(p) => p,
            Err(f) => {
                eprintln!("{mailbox}: {}", f.diagnostic);
                failed += 1;
                continue;
            }
        };
        let req = UsageRequest {
            mailbox: path.clone(),
            limits: effective,
            rebuild: true,
        };
        let timeout = s.writer_timeout.max(Duration::from_secs(1));
        match writer.usage(&req, timeout).await {
            Ok(Reply::Usage(usage)) => {
                quota::record(pool, mailbox, usage, effective).await?;
                counted += 1;
                println!(
                    "{mailbox}: {} in {} messages ({})",
                    human(usage.bytes),
                    usage.messages,
                    path.display()
                );
            }
            Ok(other) => {
                failed += 1;
                eprintln!("{mailbox}: {}", other.to_line().trim_end());
            }
            Err(e) => {
                writer.kill().await;
                return Err(Failure::Other(anyhow::anyhow!(
                    "the maildir writer {} failed at {mailbox}: {e}",
                    s.writer.program.display()
                )));
            }
        }
    }
    if mailboxes.len() > 1 || failed > 0 {
        println!("{counted} of {} mailboxes counted", mailboxes.len());
    }
    if failed > 0 {
        return Err(Failure::Other(anyhow::anyhow!(
            "{failed} mailboxes could not be counted"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_arguments_are_checked_before_anything_is_stored() {
        let args = |scope: &str, storage: Option<&str>, messages: Option<&str>| SetArgs {
            scope: scope.into(),
            storage: storage.map(Into::into),
            messages: messages.map(Into::into),
        };
        let ok = set_args(&args("Alice@Example.org", Some("2G"), Some("none"))).unwrap();
        assert_eq!(ok.0, Scope::Mailbox("alice@example.org".into()));
        assert_eq!(ok.1, (Some(Some(2 << 30)), Some(None)));
        let ok = set_args(&args("@example.org", None, Some("10"))).unwrap();
        assert_eq!(ok.1, (None, Some(Some(10))));
        for (a, want) in [
            (
                args("alice@example.org", None, None),
                "give --storage, --messages or both",
            ),
            (args("alice", Some("1G"), None), "is neither an address"),
            (
                args("alice@example.org", Some("lots"), None),
                "--storage \"lots\"",
            ),
            (
                args("alice@example.org", Some("0"), None),
                "must be above 0",
            ),
            (
                args("alice@example.org", None, Some("1.5")),
                "not a whole number",
            ),
        ] {
            match set_args(&a) {
                Err(Failure::Invalid(e)) => assert!(e.contains(want), "{a:?}: {e}"),
                _ => panic!("{a:?} accepted"),
            }
        }
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(3 << 20), "3.0 MiB");
        assert_eq!(
            describe(Limits {
                bytes: Some(1024),
                messages: Some(5)
            }),
            "1.0 KiB (1024 bytes), 5 messages"
        );
    }
}
