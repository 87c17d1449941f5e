//! `pepsi-secure-link`: the operator's tool for secure links (docs/secure-link.md, "The
//! operator tool") — list them (`list`), show one with its access log (`show`), revoke,
//! extend and purge them.
//!
//! Input is checked before connecting (link ids, addresses, states, limits, the new expiry),
//! with the words of the admin API (`admin`); the link itself is the database's answer. Each
//! change is one transaction with its `pepsi.event_log` row (`admin`, through
//! `pepsi_contract::audit`). What the command produced goes to stdout, as a table or a
//! summary, or as JSON with `--json`; refusals go to stderr.

use std::process::ExitCode;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_contract::audit::Actor;
use serde::Serialize;
use sqlx::PgPool;

use crate::admin::{self, Detail, Filter, Link, LinkState, Listing};
use crate::store::Error;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "secure-link",
        exec: "pepsi-secure-link",
    };
}

const LONG_ABOUT: &str = "\
List, show, revoke, extend and purge Pepsi's secure links.

A secure link keeps a message for an external recipient sealed in the database and mails the \
recipient a link instead; the recipient proves the address with a one-time code and reads the \
message in pepsi-httpd's portal (docs/secure-link.md). Each link has an id of 22 characters \
(letters, digits, - and _), which names the message and gives nothing of it away; this tool \
takes it and shows it. It cannot read a message: the key's other half travels only in the \
recipient's link.

`list` shows the links, newest first: --sender and --recipient (an address, compared without \
case), --state active, expired, revoked or purged, and at most --limit N of them (default 100, \
at most 10000). A link is purged when its sealed message is gone, revoked when the sender or \
an operator ended it, expired when its time ran out, active otherwise; the state is the most \
final of these.

`show LINK_ID` prints the link and its access log, oldest first: when it was created, each \
code sent and each wrong one, the sessions, each read, revocations, extensions, new links and \
the purge, with the client's address. Never a code, a token or a key.

`revoke LINK_ID` ends a link for good (--by NAME is recorded as who did it; default \
\"operator\"). A link revoked or purged already is refused.

`extend LINK_ID --until TIME` or `--days N` moves its expiry: TIME in RFC 3339 \
(2027-01-31T12:00:00Z), N from 1 to 365 days from now, at most 365 days ahead either way. It \
may also bring the expiry closer. A revoked or purged link stays so and is refused.

`purge` deletes the sealed message of every link expired or revoked by now, and prints how \
many (run it daily, e.g. from cron); `purge LINK_ID` purges that one link now, whatever its \
state. The row and its access log stay for the sender; the message is gone for good.

Each change is one transaction with its access-log line (`revoked`, `extended`, `purged`) \
and its pepsi.event_log row (secure_link.revoke, secure_link.extend, secure_link.purge) \
naming the operating-system user who ran the tool.

--json prints what a command shows as JSON instead: `list` {\"links\": [...], \"limit\": N}, \
`show` {\"link\": {...}, \"access\": [...]}, `revoke`, `extend` and `purge LINK_ID` the link \
as it is afterwards, `purge` {\"purged\": N}. A link is {\"link_id\", \"sender\", \"recipient\", \
\"created\", \"expires\", \"generation\", \"state\", \"revoked_by\", \"size\", \
\"last_access\"}, times in RFC 3339.

pepsi-secure-link connects with [database] URL of the configuration as the role named there: \
the pipeline role (pepsi) may revoke, extend and purge (run it as `sudo -u pepsi \
pepsi-secure-link ...` with peer authentication).

Exit status: 0 when it was done; 1 when it was refused (no such link, a link revoked or \
purged already) or failed (the database could not be reached or answered with an error); 2 \
on a usage error or input that is not valid (a malformed link id, address, state, limit or \
time, an expiry not within 365 days). See docs/secure-link.md.";

const EXAMPLES: &str = "\
Examples:
  pepsi-secure-link list
  pepsi-secure-link list --sender ceo@example.org --state active --limit 20
  pepsi-secure-link list --recipient partner@example.net --json
  pepsi-secure-link show 3q2-7wFhQ0yXl9Zb4mTn1A
  pepsi-secure-link revoke 3q2-7wFhQ0yXl9Zb4mTn1A --by 'helpdesk ticket 4711'
  pepsi-secure-link extend 3q2-7wFhQ0yXl9Zb4mTn1A --days 14
  pepsi-secure-link extend 3q2-7wFhQ0yXl9Zb4mTn1A --until 2027-01-31T12:00:00Z
  pepsi-secure-link purge
  pepsi-secure-link purge 3q2-7wFhQ0yXl9Zb4mTn1A --json";

/// List, show, revoke, extend and purge secure links.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-secure-link",
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
    /// List the links, newest first (--sender, --recipient, --state, --limit).
    List(ListArgs),
    /// Show one link and its access log.
    Show(LinkArgs),
    /// Revoke a link for good.
    Revoke(RevokeArgs),
    /// Move a link's expiry (--until TIME or --days N).
    Extend(ExtendArgs),
    /// Purge every expired or revoked link, or one link now.
    Purge(PurgeArgs),
}

#[derive(Debug, Args)]
struct JsonFlag {
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only links from this sender's address
    #[arg(long, value_name = "ADDRESS")]
    sender: Option<String>,
    /// Only links to this recipient's address
    #[arg(long, value_name = "ADDRESS")]
    recipient: Option<String>,
    /// Only links in this state: active, expired, revoked or purged
    #[arg(long, value_name = "STATE")]
    state: Option<String>,
    /// The most links shown, 1 to 10000
    #[arg(long, value_name = "N", default_value_t = admin::DEFAULT_LIMIT, allow_negative_numbers = true)]
    limit: i64,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct LinkArgs {
    /// The link's id (as `list` shows it); it may start with `-`
    #[arg(allow_hyphen_values = true)]
    link_id: String,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct RevokeArgs {
    /// The link's id (as `list` shows it); it may start with `-`
    #[arg(allow_hyphen_values = true)]
    link_id: String,
    /// Who revoked it, as the access log and `show` record it
    #[arg(long, value_name = "NAME", default_value = admin::DEFAULT_REVOKER)]
    by: String,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("expiry").required(true).args(["until", "days"])))]
struct ExtendArgs {
    /// The link's id (as `list` shows it); it may start with `-`
    #[arg(allow_hyphen_values = true)]
    link_id: String,
    /// The new expiry, RFC 3339 (2027-01-31T12:00:00Z)
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// The new expiry in N days from now, 1 to 365
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    days: Option<i64>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct PurgeArgs {
    /// Purge this link now (it may start with `-`); without it, every link expired or
    /// revoked by now
    #[arg(allow_hyphen_values = true)]
    link_id: Option<String>,
    #[command(flatten)]
    out: JsonFlag,
}

/// The command line of `pepsi-secure-link` as clap defines it: its `--help` and its manual
/// page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

type Done = Result<(), Failure>;

/// A command with its input checked.
enum Checked {
    List(Filter),
    Show(String),
    Revoke {
        link_id: String,
        by: String,
    },
    Extend {
        link_id: String,
        until: DateTime<Utc>,
    },
    PurgeOne(String),
    PurgeExpired,
}

/// Runs `pepsi-secure-link` with the process's arguments.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        let json = cli.command.json();
        // Input is checked before connecting: a typing mistake costs no connection.
        let checked = match check(cli.command, Utc::now()) {
            Ok(c) => c,
            Err(e) => return Ok(exit(Err(e))),
        };
        let pool = pepsi_contract::db::connect(&cfg).await?;
        let actor = Actor::local(constants::CONFIG_SOURCE.exec);
        Ok(exit(execute(&pool, &actor, checked, json).await))
    })
}

impl Command {
    fn json(&self) -> bool {
        match self {
            Command::List(a) => a.out.json,
            Command::Show(a) => a.out.json,
            Command::Revoke(a) => a.out.json,
            Command::Extend(a) => a.out.json,
            Command::Purge(a) => a.out.json,
        }
    }
}

fn exit(result: Done) -> ExitCode {
    pepsi_conf::cli::tool_exit(&constants::CONFIG_SOURCE, result)
}

fn link_id(text: &str) -> Result<String, Failure> {
    admin::link_id(text)
        .map(str::to_owned)
        .map_err(Failure::Invalid)
}

fn check(command: Command, now: DateTime<Utc>) -> Result<Checked, Failure> {
    Ok(match command {
        Command::List(a) => Checked::List(Filter {
            sender: a
                .sender
                .map(|s| admin::filter_address("--sender", &s))
                .transpose()
                .map_err(Failure::Invalid)?,
            recipient: a
                .recipient
                .map(|s| admin::filter_address("--recipient", &s))
                .transpose()
                .map_err(Failure::Invalid)?,
            state: a
                .state
                .map(|s| LinkState::parse("--state", &s))
                .transpose()
                .map_err(Failure::Invalid)?,
            limit: admin::limit("--limit", a.limit).map_err(Failure::Invalid)?,
        }),
        Command::Show(a) => Checked::Show(link_id(&a.link_id)?),
        Command::Revoke(a) => {
            let by = a.by.trim();
            if by.is_empty() || by.len() > 320 || by.chars().any(char::is_control) {
                return Err(Failure::Invalid(format!(
                    "--by {:?} is not a name: 1 to 320 bytes, no control characters",
                    a.by
                )));
            }
            Checked::Revoke {
                link_id: link_id(&a.link_id)?,
                by: by.to_owned(),
            }
        }
        Command::Extend(a) => Checked::Extend {
            link_id: link_id(&a.link_id)?,
            until: admin::until(a.until.as_deref(), a.days, now)
                // The API's words, with the tool's option names.
                .map_err(|e| Failure::Invalid(format!("--{e}")))?,
        },
        Command::Purge(a) => match a.link_id {
            Some(id) => Checked::PurgeOne(link_id(&id)?),
            None => Checked::PurgeExpired,
        },
    })
}

/// `e` as the tool reports it: a refusal explained (exit status 1), a value out of bounds
/// as input that is not valid (2), anything else as a failure (1).
async fn failed(pool: &PgPool, link_id: &str, e: Error) -> Failure {
    match e {
        Error::Refused(r) => Failure::Other(anyhow::anyhow!(admin::why(pool, link_id, r).await)),
        Error::Invalid(m) => Failure::Invalid(m),
        other => Failure::Other(anyhow::Error::new(other).context(format!("link {link_id}"))),
    }
}

async fn execute(pool: &PgPool, actor: &Actor, checked: Checked, json: bool) -> Done {
    match checked {
        Checked::List(filter) => {
            let links = admin::list(pool, &filter)
                .await
                .context("listing the links")?;
            let listing = Listing {
                links,
                limit: filter.limit,
            };
            print(json, &listing, || table(&listing))
        }
        Checked::Show(id) => match admin::detail(pool, &id).await {
            Ok(d) => print(json, &d, || show(&d)),
            Err(e) => Err(failed(pool, &id, e).await),
        },
        Checked::Revoke { link_id, by } => {
            let mut tx = pool.begin().await.context("starting a transaction")?;
            if let Err(e) = admin::revoke(&mut tx, actor, &link_id, &by).await {
                drop(tx);
                return Err(failed(pool, &link_id, e).await);
            }
            tx.commit().await.context("committing the revocation")?;
            changed(pool, &link_id, json, |l| {
                format!("revoked link {} (by {by})\n", l.link_id)
            })
            .await
        }
        Checked::Extend { link_id, until } => {
            let mut tx = pool.begin().await.context("starting a transaction")?;
            if let Err(e) = admin::extend(&mut tx, actor, &link_id, until).await {
                drop(tx);
                return Err(failed(pool, &link_id, e).await);
            }
            tx.commit().await.context("committing the extension")?;
            changed(pool, &link_id, json, |l| {
                format!(
                    "link {} now expires {} ({})\n",
                    l.link_id,
                    time(l.expires),
                    l.state.as_str()
                )
            })
            .await
        }
        Checked::PurgeOne(link_id) => {
            let mut tx = pool.begin().await.context("starting a transaction")?;
            if let Err(e) = admin::purge_one(&mut tx, actor, &link_id).await {
                drop(tx);
                return Err(failed(pool, &link_id, e).await);
            }
            tx.commit().await.context("committing the purge")?;
            changed(pool, &link_id, json, |l| {
                format!(
                    "purged link {}: its message ({}) is deleted; the row and its access log \
                     stay\n",
                    l.link_id,
                    bytes(l.size)
                )
            })
            .await
        }
        Checked::PurgeExpired => {
            let mut tx = pool.begin().await.context("starting a transaction")?;
            let purged = admin::purge_expired(&mut tx, actor)
                .await
                .context("purging the expired and revoked links")?;
            tx.commit().await.context("committing the purge")?;
            print(json, &purged, || {
                format!(
                    "purged {} expired or revoked {}\n",
                    purged.purged,
                    if purged.purged == 1 { "link" } else { "links" }
                )
            })
        }
    }
}

/// Prints the link as a change left it.
async fn changed(
    pool: &PgPool,
    link_id: &str,
    json: bool,
    text: impl FnOnce(&Link) -> String,
) -> Done {
    let link = admin::get(pool, link_id)
        .await
        .with_context(|| format!("reading link {link_id} back"))?;
    print(json, &link, || text(&link))
}

/// Prints `v` as JSON, or `text`.
fn print<T: Serialize>(json: bool, v: &T, text: impl FnOnce() -> String) -> Done {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(v).context("encoding JSON")?
        );
    } else {
        print!("{}", text());
    }
    Ok(())
}

fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M").to_string()
}

/// A size for people: bytes up to 10 KiB, then KiB or MiB.
fn bytes(n: i64) -> String {
    const K: i64 = 1024;
    if n < 10 * K {
        format!("{n} B")
    } else if n < 10 * K * K {
        format!("{} KiB", n / K)
    } else {
        format!("{} MiB", n / (K * K))
    }
}

/// The listing as a table, one link a line, and a line saying when it was cut.
fn table(listing: &Listing) -> String {
    if listing.links.is_empty() {
        return "no links\n".to_owned();
    }
    let width = |f: &dyn Fn(&Link) -> usize, title: &str| {
        listing
            .links
            .iter()
            .map(f)
            .max()
            .unwrap_or(0)
            .max(title.len())
    };
    let ws = width(&|l| l.sender.chars().count(), "SENDER");
    let wr = width(&|l| l.recipient.chars().count(), "RECIPIENT");
    let mut out = format!(
        "{:<22}  {:<7}  {:<16}  {:<16}  {:<ws$}  {:<wr$}  {:>8}  LAST ACCESS\n",
        "LINK", "STATE", "CREATED", "EXPIRES", "SENDER", "RECIPIENT", "SIZE"
    );
    for l in &listing.links {
        out.push_str(&format!(
            "{:<22}  {:<7}  {:<16}  {:<16}  {:<ws$}  {:<wr$}  {:>8}  {}\n",
            l.link_id,
            l.state.as_str(),
            time(l.created),
            time(l.expires),
            l.sender,
            l.recipient,
            bytes(l.size),
            l.last_access.map_or_else(|| "-".to_owned(), time),
        ));
    }
    let n = listing.links.len() as i64;
    if n == listing.limit {
        out.push_str(&format!(
            "(the newest {n}; --limit N shows more, up to {})\n",
            admin::MAX_LIMIT
        ));
    }
    out
}

/// One link and its access log.
fn show(d: &Detail) -> String {
    let l = &d.link;
    let mut out = format!(
        "link        {}\nstate       {}\nsender      {}\nrecipient   {}\ncreated     {}\n\
         expires     {}\ngeneration  {}\nsize        {}\n",
        l.link_id,
        l.state.as_str(),
        l.sender,
        l.recipient,
        time(l.created),
        time(l.expires),
        l.generation,
        bytes(l.size),
    );
    if let Some(by) = &l.revoked_by {
        out.push_str(&format!("revoked by  {by}\n"));
    }
    out.push_str("\naccess log:\n");
    for a in &d.access {
        out.push_str(&format!(
            "  {}  {:<14}  {:<20}  {}\n",
            a.at.format("%Y-%m-%d %H:%M:%S"),
            a.event,
            a.client_key.as_deref().unwrap_or("-"),
            a.detail.as_deref().unwrap_or(""),
        ));
    }
    out
}
