//! `pepsi-archive`: the operator's tool for the lists' archive (docs/archive.md, "The
//! pepsi-archive tool") — import an mbox (`import`), write one (`export`), purge posts by url
//! id or author (`purge`), rebuild the search text (`reindex`), search and count (`search`,
//! `show`).
//!
//! Input is checked before connecting (list addresses, url ids, months, queries, sizes, and
//! that an import's file opens and reads as an mbox); the list itself is the database's
//! answer. The SQL of the archive is `store`'s; the tool's own (the list, the import's row)
//! is `db`'s. Each change is one transaction per batch with its `archive_event_log` row (the
//! invoking user as actor) and its `pepsi.event_log` row (`pepsi_contract::audit`). Progress
//! and the messages skipped go to stderr, what the command produced to stdout.

mod db;
mod export;
mod import;
mod progress;

use std::io::IsTerminal as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use pepsi_conf::address::Address;
use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_contract::audit::Actor;
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;

use crate::store::Who;
use crate::{export as mbox_export, mbox, query, store, url};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "archive",
        exec: "pepsi-archive",
    };
}

/// The longest message `import` takes unless --max-message-size says otherwise.
const DEFAULT_MAX_MESSAGE: &str = "64M";
/// The most --max-message-size may be: a post is one bytea, held whole while archived.
const MAX_MESSAGE_LIMIT: u64 = 1 << 30;
/// The most url ids one `purge` takes.
const MAX_PURGE_IDS: usize = 10_000;
/// The hits `search` shows unless --limit says otherwise.
const DEFAULT_HITS: i64 = 20;

const LONG_ABOUT: &str = "\
Import, export, search and purge the archive of Pepsi's mailing lists.

The list stage archives every post it accepts for a list whose archive_policy is public or \
private (docs/archive.md); this tool adds what came before (an mbox exported from Mailman or \
public-inbox), writes the archive out as an mbox, deletes posts for good, rebuilds the search \
text and answers what the archive holds.

`import LIST FILE` reads FILE (`-`: stdin) as an mbox, in mboxrd form unless --format mboxo \
(Mailman 2's pipermail archives and older mail readers), and archives each message as the \
list stage would, threaded by References and In-Reply-To. Messages are stored 500 to a \
transaction: an import that stops part way keeps the batches committed, and running it \
again skips every message already archived, since a list's archive holds each Message-ID \
once (they are counted as duplicates). A message longer than --max-message-size (default \
64M, at most 1G) is skipped and counted; so is one that is no message (no header block, or \
a line of it that is no header field), named with its number in the file and its From_ \
line; neither stops the import. Progress goes to stderr (on a terminal as it goes, else \
every 1,000 messages), the summary to stdout. Each import is a pepsi.archive_import row \
(the file, who, when, the counts; its failed column counts the messages too long with those \
that failed), an `import` event and an archive.import audit row. --dry-run does it all and \
rolls each batch back: the counts are what an import would make, nothing is stored. A list \
whose archive_policy is none is refused.

`export LIST` writes the list's posts as an mboxrd file, oldest first, each as it was \
archived, after a From_ line of its author and date; --month YYYY-MM takes one month (UTC), \
--thread URL_ID the thread of one post. --gzip compresses it; -o FILE writes FILE instead of \
stdout and prints a summary.

`purge LIST URL_ID... --yes` deletes those posts of the list for good (their bytes, parts and \
search text; a post others reply to leaves a placeholder of its Message-ID so the thread \
keeps its shape); `purge --address ADDRESS --yes` every post whose author is ADDRESS, in \
every list, and the archive login links issued to it. Without --yes nothing is deleted and \
the refusal says how many posts would be. Each purge writes `purge.message` or \
`purge.address` events (the url id or a count, never the address) and an archive.purge audit \
row.

`reindex [LIST]` rebuilds the search text of every post of LIST (of every list without it) \
from the stored posts, 500 to a transaction, with progress on stderr: after the text \
extraction changed, or to repair. A `reindex` event and an archive.reindex audit row.

`search LIST QUERY` finds posts as the archive's pages do: words, \"a phrase\", -word, a or b, \
from:, subject:, after:YYYY-MM-DD, before:YYYY-MM-DD (docs/archive.md, Search); best first, \
--limit N of them (default 20, at most 200). `show LIST` counts the archive: posts, threads, \
months, bytes, first and last post.

pepsi-archive connects with [database] URL of the configuration as the role named there: the \
pipeline role (pepsi) writes the archive (run it as `sudo -u pepsi pepsi-archive ...` with \
peer authentication).

Exit status: 0 when it was done (a url id not in the archive is reported and is not an \
error), 1 when it could not be (no such list, a list not archived, a database or file \
error), 2 on a usage error or input that is not valid (a malformed list address, url id or \
month, a file that is not an mbox, a query that does not parse, a purge without --yes). See \
docs/archive.md.";

const EXAMPLES: &str = "\
Examples:
  pepsi-archive import team@example.org team.mbox --dry-run
  pepsi-archive import team@example.org team.mbox
  xzcat team.mbox.xz | pepsi-archive import team@example.org - --format mboxo --json
  pepsi-archive show team@example.org
  pepsi-archive search team@example.org 'from:alice budget after:2026-01-01'
  pepsi-archive search team@example.org '\"release notes\" -draft' --limit 5 --json
  pepsi-archive export team@example.org --gzip -o team.mbox.gz
  pepsi-archive export team@example.org --month 2026-03 > march.mbox
  pepsi-archive export team@example.org --thread 1f9d985c0d8d9ef960eded8464879c86
  pepsi-archive purge team@example.org 1f9d985c0d8d9ef960eded8464879c86 --yes
  pepsi-archive purge --address bob@example.net --yes
  pepsi-archive reindex";

/// Import, export, search and purge the mailing lists' archive.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-archive",
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
    /// Archive the messages of an mbox file (a Mailman or public-inbox export) in a list's
    /// archive; messages archived already are counted and skipped.
    Import(ImportArgs),
    /// Write a list's archive (or one month, or one thread) as an mboxrd file, oldest first.
    Export(ExportArgs),
    /// Delete posts for good: LIST URL_ID..., or --address ADDRESS in every list.
    Purge(PurgeArgs),
    /// Rebuild the search text of a list's posts (every list's without LIST).
    Reindex(ReindexArgs),
    /// Search a list's archive (words, "phrases", -word, from:, subject:, after:, before:).
    Search(SearchArgs),
    /// Count a list's archive: posts, threads, months, bytes, first and last post.
    Show(ShowArgs),
}

#[derive(Debug, Args)]
struct JsonFlag {
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ImportArgs {
    /// The list's address
    list: String,
    /// The mbox file (`-`: stdin)
    file: String,
    /// How `>From ` lines are escaped in it: mboxrd (public-inbox, Mailman 3) or mboxo
    /// (pipermail, older mail readers)
    #[arg(long, value_name = "mboxrd|mboxo", default_value = "mboxrd")]
    format: String,
    /// Skip (and count) messages longer than SIZE: bytes, or with K, M or G
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_MAX_MESSAGE)]
    max_message_size: String,
    /// Read and archive everything, then roll it back: count what an import would do
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct ExportArgs {
    /// The list's address
    list: String,
    /// Only the posts dated in this month (UTC)
    #[arg(long, value_name = "YYYY-MM", conflicts_with = "thread")]
    month: Option<String>,
    /// Only the thread of this post (its url id, as in the archive's links)
    #[arg(long, value_name = "URL_ID")]
    thread: Option<String>,
    /// Compress with gzip
    #[arg(long)]
    gzip: bool,
    /// Write FILE (replaced if it exists) instead of stdout, and print a summary
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<String>,
    /// The summary (with -o) as JSON
    #[arg(long, requires = "output")]
    json: bool,
}

#[derive(Debug, Args)]
struct PurgeArgs {
    /// LIST URL_ID..., or nothing with --address
    #[arg(value_name = "LIST URL_ID")]
    args: Vec<String>,
    /// Purge every post whose author is ADDRESS, in every list
    #[arg(long, value_name = "ADDRESS")]
    address: Option<String>,
    /// Really delete them (required)
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct ReindexArgs {
    /// The list's address (every list without it)
    list: Option<String>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct SearchArgs {
    /// The list's address
    list: String,
    /// What to find (see `pepsi-archive --help`)
    query: String,
    /// The most hits shown, 1 to 200
    #[arg(long, value_name = "N", default_value_t = DEFAULT_HITS, allow_negative_numbers = true)]
    limit: i64,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct ShowArgs {
    /// The list's address
    list: String,
    #[command(flatten)]
    out: JsonFlag,
}

/// The command line of `pepsi-archive` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

type Done = Result<(), Failure>;

/// Who runs the tool: the program and user for the audit row, and the name recorded as the
/// archive's actor (the user who ran sudo when it was sudo, else the user, else the uid).
fn local_who() -> Who {
    let actor = Actor::local(constants::CONFIG_SOURCE.exec);
    let sudo = std::env::var("SUDO_USER").ok().filter(|s| !s.is_empty());
    let name = sudo
        .or_else(|| actor.os_user.clone())
        .or_else(|| actor.os_uid.map(|u| format!("uid {u}")))
        .unwrap_or_else(|| constants::CONFIG_SOURCE.exec.to_owned());
    Who { actor, name }
}

/// Runs `pepsi-archive` with the process's arguments.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        // Input is checked before connecting: a typing mistake costs no connection.
        let checked = match check(cli.command) {
            Ok(c) => c,
            Err(e) => return Ok(exit(Err(e))),
        };
        // One connection, used by each statement in turn: a one-shot command would pay a
        // second connection (and TLS handshake) when a statement follows the release of the
        // last one's.
        let pool = pepsi_contract::db::connect_single(&cfg).await?;
        let who = local_who();
        Ok(exit(execute(&pool, &who, checked).await))
    })
}

fn exit(result: Done) -> ExitCode {
    pepsi_conf::cli::tool_exit(&constants::CONFIG_SOURCE, result)
}

fn invalid(text: impl Into<String>) -> Failure {
    Failure::Invalid(text.into())
}

fn other(text: impl Into<String>) -> Failure {
    Failure::Other(anyhow::anyhow!(text.into()))
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

/// A command with its input checked.
enum Checked {
    Import(import::Import),
    Export(export::Export),
    PurgeIds {
        list: String,
        url_ids: Vec<String>,
        yes: bool,
        json: bool,
    },
    PurgeAddress {
        address: String,
        yes: bool,
        json: bool,
    },
    Reindex(Option<String>, bool),
    Search {
        list: String,
        query: String,
        limit: i64,
        json: bool,
    },
    Show(String, bool),
}

/// The list a command names, in the form it is stored in (`pepsi.mailing_list.address`).
fn list(text: &str) -> Result<String, Failure> {
    Address::parse(text)
        .map(|a| a.key())
        .map_err(|e| invalid(format!("list {e}")))
}

fn url_id(text: &str) -> Result<String, Failure> {
    let t = text.trim();
    if url::is_url_id(t) {
        Ok(t.to_owned())
    } else {
        Err(invalid(format!(
            "{text:?} is not a url id: expected the 32 lower-case hex digits of a post's link \
             (`pepsi-archive search` shows them)"
        )))
    }
}

/// `YYYY-MM` as the first day of that month.
fn month(text: &str) -> Result<chrono::NaiveDate, Failure> {
    mbox_export::month(text).ok_or_else(|| {
        invalid(format!(
            "--month {text:?} is not a month: expected YYYY-MM, e.g. 2026-03"
        ))
    })
}

fn check(command: Command) -> Result<Checked, Failure> {
    Ok(match command {
        Command::Import(a) => {
            let l = list(&a.list)?;
            let format = mbox::Format::parse(&a.format).ok_or_else(|| {
                invalid(format!(
                    "--format {:?} is not an mbox format: expected mboxrd or mboxo",
                    a.format
                ))
            })?;
            let max = pepsi_conf::config::parse_size(&a.max_message_size)
                .ok()
                .filter(|n| (1..=MAX_MESSAGE_LIMIT).contains(n))
                .ok_or_else(|| {
                    invalid(format!(
                        "--max-message-size {:?} is not valid: a size from 1 to 1G, in bytes \
                         or with K, M or G",
                        a.max_message_size
                    ))
                })?;
            Checked::Import(import::Import::open(
                l, &a.file, format, max, a.dry_run, a.out.json,
            )?)
        }
        Command::Export(a) => {
            let scope = match (&a.month, &a.thread) {
                (Some(m), _) => export::Wanted::Month(month(m)?),
                (None, Some(t)) => export::Wanted::Thread(url_id(t)?),
                (None, None) => export::Wanted::All,
            };
            if a.output.is_none() && a.gzip && std::io::stdout().is_terminal() {
                return Err(invalid(
                    "not writing gzip data to a terminal: give -o FILE or redirect stdout",
                ));
            }
            Checked::Export(export::Export {
                list: list(&a.list)?,
                wanted: scope,
                gzip: a.gzip,
                output: a.output,
                json: a.json,
            })
        }
        Command::Purge(a) => match (a.address, a.args.as_slice()) {
            (Some(address), []) => Checked::PurgeAddress {
                address: store::author_address(&address)
                    .map_err(|e| invalid(format!("--address {e}")))?,
                yes: a.yes,
                json: a.out.json,
            },
            (None, [l, ids @ ..]) if !ids.is_empty() => {
                if ids.len() > MAX_PURGE_IDS {
                    return Err(invalid(format!(
                        "{} url ids: at most {MAX_PURGE_IDS} at once",
                        ids.len()
                    )));
                }
                let mut url_ids: Vec<String> = Vec::new();
                for t in ids {
                    let u = url_id(t)?;
                    if !url_ids.contains(&u) {
                        url_ids.push(u);
                    }
                }
                Checked::PurgeIds {
                    list: list(l)?,
                    url_ids,
                    yes: a.yes,
                    json: a.out.json,
                }
            }
            (Some(_), _) => {
                return Err(invalid(
                    "--address purges in every list: give it alone, without LIST or url ids",
                ));
            }
            (None, _) => {
                return Err(invalid(
                    "give the list and the url ids of the posts (purge LIST URL_ID...), or \
                     --address ADDRESS",
                ));
            }
        },
        Command::Reindex(a) => {
            Checked::Reindex(a.list.as_deref().map(list).transpose()?, a.out.json)
        }
        Command::Search(a) => {
            let l = list(&a.list)?;
            query::parse(&a.query).map_err(|e| invalid(format!("query {:?}: {e}", a.query)))?;
            if !(1..=store::MAX_HITS).contains(&a.limit) {
                return Err(invalid(format!(
                    "--limit {} is not valid: 1 to {}",
                    a.limit,
                    store::MAX_HITS
                )));
            }
            Checked::Search {
                list: l,
                query: a.query,
                limit: a.limit,
                json: a.out.json,
            }
        }
        Command::Show(a) => Checked::Show(list(&a.list)?, a.out.json),
    })
}

async fn execute(pool: &PgPool, who: &Who, checked: Checked) -> Done {
    match checked {
        Checked::Import(i) => import::run(pool, who, i).await,
        Checked::Export(e) => export::run(pool, e).await,
        Checked::PurgeIds {
            list,
            url_ids,
            yes,
            json,
        } => purge_ids(pool, who, &list, &url_ids, yes, json).await,
        Checked::PurgeAddress { address, yes, json } => {
            purge_address(pool, who, &address, yes, json).await
        }
        Checked::Reindex(list, json) => reindex(pool, who, list.as_deref(), json).await,
        Checked::Search {
            list,
            query,
            limit,
            json,
        } => search(pool, &list, &query, limit, json).await,
        Checked::Show(list, json) => show(pool, &list, json).await,
    }
}

fn plural(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

async fn purge_ids(
    pool: &PgPool,
    who: &Who,
    list: &str,
    url_ids: &[String],
    yes: bool,
    json: bool,
) -> Done {
    let found = db::list(pool, list).await?;
    let existing = store::existing(pool, found.list_id, url_ids).await?;
    if !yes {
        return Err(invalid(format!(
            "not purged: {} of the {} named {} in the archive of {list} and would be deleted \
             for good; confirm with --yes",
            existing.len(),
            plural(url_ids.len() as u64, "post", "posts"),
            if existing.len() == 1 { "is" } else { "are" },
        )));
    }
    let mut tx = pool.begin().await?;
    let done = store::purge_posts(&mut tx, who, found.list_id, list, url_ids).await?;
    tx.commit().await?;
    print(json, &done, || {
        let mut out = format!(
            "purged {} from the archive of {list}\n",
            plural(done.purged.len() as u64, "post", "posts")
        );
        for m in &done.not_in_archive {
            out.push_str(&format!("not in the archive: {m}\n"));
        }
        out
    })
}

async fn purge_address(pool: &PgPool, who: &Who, address: &str, yes: bool, json: bool) -> Done {
    if !yes {
        let counts = store::count_by_address(pool, address).await?;
        let names = db::list_names(pool, &counts.iter().map(|c| c.0).collect::<Vec<_>>()).await?;
        let per_list: Vec<(String, i64)> = counts
            .iter()
            .map(|(id, n)| (names.get(id).cloned().unwrap_or_default(), *n))
            .collect();
        let total: i64 = per_list.iter().map(|p| p.1).sum();
        return Err(invalid(format!(
            "not purged: {} by {address} in {}{} and its archive login links would be deleted \
             for good; confirm with --yes",
            plural(total as u64, "post", "posts"),
            plural(per_list.len() as u64, "list", "lists"),
            listed(per_list.iter().map(|(l, n)| (l.as_str(), *n as u64))),
        )));
    }
    let mut tx = pool.begin().await?;
    let done = store::purge_author(&mut tx, who, address, None).await?;
    tx.commit().await?;
    print(json, &done, || {
        format!(
            "purged {} by {address}{}\n",
            plural(done.purged, "post", "posts"),
            listed(done.lists.iter().map(|(l, n)| (l.as_str(), *n)))
        )
    })
}

/// ` (list: n, ...)` of posts per list, or nothing for none.
fn listed<'a>(per_list: impl Iterator<Item = (&'a str, u64)>) -> String {
    let parts: Vec<String> = per_list.map(|(l, n)| format!("{l}: {n}")).collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// Posts reindexed per transaction.
const REINDEX_BATCH: i64 = 500;

async fn reindex(pool: &PgPool, who: &Who, list: Option<&str>, json: bool) -> Done {
    let list_id = match list {
        Some(l) => Some(db::list(pool, l).await?.list_id),
        None => None,
    };
    let total = db::post_count(pool, list_id).await?;
    let what = list.unwrap_or("every list");
    let mut progress = progress::Progress::new(what, "posts reindexed", None);
    let (mut done, mut after) = (0u64, 0i64);
    loop {
        let mut tx = pool.begin().await?;
        let (n, last) = store::reindex(&mut tx, list_id, after, REINDEX_BATCH).await?;
        if n == 0 {
            store::log(
                &mut tx,
                list_id,
                &who.name,
                "reindex",
                json!({"posts": done}),
            )
            .await?;
            who.audit(
                &mut tx,
                "archive.reindex",
                json!({"list": list, "posts": done}),
            )
            .await?;
            tx.commit().await?;
            break;
        }
        tx.commit().await?;
        done += n;
        after = last;
        progress.update(done, None, Some(total));
    }
    progress.finish();
    store::analyze(pool).await?;
    print(json, &json!({"list": list, "reindexed": done}), || {
        format!("reindexed {} of {what}\n", plural(done, "post", "posts"))
    })
}

async fn search(pool: &PgPool, list: &str, q: &str, limit: i64, json: bool) -> Done {
    let found = db::list(pool, list).await?;
    let hits = match store::search(pool, found.list_id, q, limit, true).await {
        Ok(h) => h,
        Err(store::Error::Query(e)) => return Err(invalid(format!("query {q:?}: {e}"))),
        Err(e) => return Err(e.into()),
    };
    print(
        json,
        &json!({"list": list, "query": q, "hits": hits}),
        || {
            if hits.is_empty() {
                return format!("no post of {list} matches {q:?}\n");
            }
            let mut out = format!(
                "{} of {list} matching {q:?}, best first:\n",
                plural(hits.len() as u64, "post", "posts")
            );
            for h in &hits {
                let from = if h.from_name.is_empty() {
                    h.from_address.clone()
                } else {
                    format!("{} <{}>", h.from_name, h.from_address)
                };
                out.push_str(&format!(
                    "{}  {}  {}\n    {}\n",
                    h.date.format("%Y-%m-%d %H:%M"),
                    h.url_id,
                    from,
                    h.subject
                ));
            }
            out
        },
    )
}

async fn show(pool: &PgPool, list: &str, json: bool) -> Done {
    let found = db::list(pool, list).await?;
    let s = store::summary(pool, found.list_id).await?;
    print(
        json,
        &json!({
            "list": list,
            "archive_policy": found.archive_policy,
            "posts": s.posts,
            "threads": s.threads,
            "months": s.months,
            "bytes": s.bytes,
            "first_post": s.first_post,
            "last_post": s.last_post,
        }),
        || {
            let day = |d: Option<chrono::DateTime<chrono::Utc>>| {
                d.map_or_else(
                    || "-".to_owned(),
                    |d| d.format("%Y-%m-%d %H:%M UTC").to_string(),
                )
            };
            format!(
                "archive of {list} (archive_policy {})\n  posts       {}\n  threads     {}\n  \
                 months      {}\n  bytes       {}\n  first post  {}\n  last post   {}\n",
                found.archive_policy,
                s.posts,
                s.threads,
                s.months,
                s.bytes,
                day(s.first_post),
                day(s.last_post)
            )
        },
    )
}
