//! pepsi-whitelist: a mailbox owner's list of trusted senders (`pepsi.whitelist`, read by
//! `pepsi-stage-check-whitelist`): list it, add and remove entries, and learn entries from
//! the mailbox itself, through `pepsi-helper-mailbox-scan`, run as the owner.
//!
//! Installed setuid `pepsi` (packaging/privileges.txt), so any local user can edit their own
//! list: the bit gives the program the service account's database role by peer
//! authentication, and [`access`] keeps each user to their own mailbox. Started through the
//! bit it trusts nothing of its caller's but the arguments: the environment is emptied, the
//! configuration is the system's (without secrets, which the service account's peer
//! authentication does not need), and the scan runs with the caller's ids alone
//! (`privilege::become_real_ids`), its output parsed as input from that user.

pub mod access;
mod held;

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::Config;
use pepsi_conf::privilege;
use pepsi_contract::audit::{self, Actor};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::whitelist;
use pepsi_helper_mailbox_scan::protocol::{self, Finding};
use pepsi_outbound::maildir::{self, Mailboxes, NoStage};
use serde::Serialize;
use sqlx::PgPool;
use tokio::io::AsyncReadExt as _;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "whitelist",
        exec: "pepsi-whitelist",
    };
    /// The configuration a setuid invocation reads; `-c` and `PEPSI_CONFIG` do not apply.
    pub const SYSTEM_CONFIG: &str = "/etc/pepsi/pepsi.conf";
    /// This program's section.
    pub const SECTION: &str = "pepsi-whitelist";
    /// The scan it runs, by default.
    pub const HELPER: &str = "pepsi-helper-mailbox-scan";
}

const LONG_ABOUT: &str = "\
Show and edit the list of senders a mailbox trusts. Pepsi's whitelist stage \
(pepsi-stage-check-whitelist) looks up the From: address of each arriving message, and its \
domain, in the lists of the message's recipients and records which of them trust it, so \
that trusted mail can skip a language block or a filter's junk verdict (docs/whitelist.md).

An entry is an address (bob@example.org) or a whole domain (@example.org). `add` makes \
entries the owner's own; `remove` deletes them. `learn` reads the mailbox's Maildir, as the \
mailbox's owner, through pepsi-helper-mailbox-scan: the recipients of the messages in its \
sent folders and the authors of the messages flagged replied become entries (origin sent or \
replied) that never replace an owner's. Mail the owner sends through Pepsi after logging in \
teaches the list the same way, as it passes the stage. `list` prints the entries, with their \
origin and when they were added and last confirmed.

Whose list: run by a user, the program works on the mailbox of their account, \
<account>@DOMAIN ([pepsi-whitelist] DOMAIN, by default the first of [pepsi] LOCAL_DOMAINS). \
--mailbox names another address of theirs (the same name in another local domain); an \
account below MIN_UID (1000) has none. Root, or anyone running the program without its \
setuid bit, may name any mailbox.

The installed program is set-user-id pepsi: it connects to the database by peer \
authentication as the service account, and reads only /etc/pepsi/pepsi.conf (no secrets.d \
fragment, no -c, an empty environment). The scan runs with the caller's own ids, so it reads \
exactly what the caller may read, and its output is checked line by line.

Options of [pepsi-whitelist]: DOMAIN; MIN_UID (1000); MAX_ENTRIES (10000, the most entries \
one list may hold: `add` refuses past it, `learn` stops at it); SENT_FOLDERS (the sent \
folders the scan reads, Maildir++ names; default Sent, Sent Messages, Sent Items, \
INBOX.Sent); SCAN_MAX_MESSAGES (20000, newest first); SCAN_TIMEOUT (60s); HELPER \
(pepsi-helper-mailbox-scan, looked for beside this program, then on PATH). Each change is \
recorded in pepsi.event_log (whitelist.add, whitelist.remove, whitelist.learn).

The confirm-to-send secretary (pepsi-stage-secretary, docs/secretary.md) holds mail from \
senders a mailbox does not trust until they confirm. `held` lists that mail (--all: decided \
messages too), `held release ID...` delivers messages (without adding their senders) and \
`held discard ID...` drops them; `payments` lists the postage auto-pay paid or refused for the \
mailbox. `held digest`, for root or an operator (a daily timer), mails each owner whose mailbox \
holds mail that no digest listed yet a list of it, with a link to their page in pepsi-httpd \
(when [pepsi] SECRETARY_URL is set), as often as the setting's digest_days allow.

Exit status: 0 when done, 1 when it could not be (a database error, an entry to remove that \
is not there, a full list, a failed scan), 2 on a usage error or input that is not valid \
(a malformed entry, a mailbox that is not the caller's).";

const EXAMPLES: &str = "\
Examples:
  pepsi-whitelist list
  pepsi-whitelist add bob@example.org @example.net
  pepsi-whitelist remove @example.net
  pepsi-whitelist learn --dry-run                    what the scan would teach, changing nothing
  pepsi-whitelist learn
  pepsi-whitelist held                               the mail the secretary holds
  pepsi-whitelist held release 17 18
  pepsi-whitelist payments                           postage auto-pay paid
  pepsi-whitelist held digest                        (root, from a timer) mail owners their digest
  pepsi-whitelist --mailbox alice@example.test list --json     (root, or an operator)";

/// A mailbox owner's trusted senders: list, add, remove, learn.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-whitelist",
    version,
    about,
    long_about = LONG_ABOUT,
    after_long_help = EXAMPLES
)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,

    /// The mailbox whose list to use (default: your account's, <account>@DOMAIN)
    #[arg(short = 'm', long, value_name = "ADDRESS", global = true)]
    mailbox: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The entries of the list.
    List(ListArgs),
    /// Add entries as the owner's own (a learnt entry becomes the owner's).
    Add(SendersArg),
    /// Remove entries.
    Remove(SendersArg),
    /// Learn entries from the mailbox's sent folders and replied messages.
    Learn(LearnArgs),
    /// Mail the secretary holds for the mailbox: list (the default), release, discard;
    /// and the owners' digest.
    Held(held::HeldArgs),
    /// Postage auto-pay paid or refused for the mailbox's mail.
    Payments(ListArgs),
}

#[derive(Debug, Args)]
struct ListArgs {
    /// One JSON document instead of the table
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct SendersArg {
    /// bob@example.org, or @example.org for the whole domain
    #[arg(required = true, value_name = "SENDER")]
    senders: Vec<String>,
}

#[derive(Debug, Args)]
struct LearnArgs {
    /// The Maildir to read (default: the mailbox's, by the Maildir delivery stage's
    /// MAILDIR_ROOT and MAILDIR)
    #[arg(long, value_name = "DIR")]
    maildir: Option<PathBuf>,
    /// The Maildir delivery stage whose MAILDIR_ROOT and MAILDIR apply (default: the only
    /// stage running pepsi-stage-relay-to-maildir)
    #[arg(long, value_name = "NAME")]
    stage: Option<String>,
    /// Print what would be learnt and change nothing
    #[arg(long)]
    dry_run: bool,
}

/// The command line of `pepsi-whitelist` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// `[pepsi-whitelist]`, read once at start.
#[derive(Debug, Clone)]
struct Options {
    rules: access::Rules,
    max_entries: i64,
    sent_folders: Vec<String>,
    scan_max_messages: u32,
    scan_timeout: Duration,
    helper: PathBuf,
}

impl Options {
    fn from_config(cfg: &Config) -> anyhow::Result<Options> {
        let s = cfg.section(constants::SECTION);
        let local = LocalRecipients::from_config(cfg)?;
        let first_local = cfg
            .section("pepsi")
            .list_opt("LOCAL_DOMAINS")?
            .and_then(|l| l.into_iter().next());
        let domain = s
            .string_opt("DOMAIN")?
            .filter(|d| !d.trim().is_empty())
            .or(first_local)
            .map(|d| d.trim().trim_end_matches('.').to_lowercase());
        let positive = |name: &str, default: u64| -> anyhow::Result<u64> {
            match s.number_opt(name)? {
                Some(0) => anyhow::bail!("[{}] {name} must be above 0", constants::SECTION),
                Some(n) => Ok(n),
                None => Ok(default),
            }
        };
        Ok(Options {
            rules: access::Rules {
                domain,
                min_uid: s.number_opt("MIN_UID")?.unwrap_or(1000),
                local,
            },
            max_entries: positive("MAX_ENTRIES", 10_000)?.min(i64::MAX as u64) as i64,
            sent_folders: s.list_opt("SENT_FOLDERS")?.unwrap_or_default(),
            scan_max_messages: positive("SCAN_MAX_MESSAGES", 20_000)?.min(u32::MAX as u64) as u32,
            scan_timeout: s
                .duration_opt("SCAN_TIMEOUT")?
                .unwrap_or(Duration::from_secs(60))
                .max(Duration::from_secs(1)),
            helper: pepsi_conf::cli::locate_program(
                &s.string_opt("HELPER")?
                    .filter(|h| !h.trim().is_empty())
                    .unwrap_or_else(|| constants::HELPER.to_owned()),
            ),
        })
    }
}

type Done = Result<(), Failure>;

/// What one run is: whose list, for whom, with what rules.
struct Run {
    pool: PgPool,
    mailbox: String,
    actor: Actor,
    options: Options,
    cfg: Config,
}

/// Runs `pepsi-whitelist` with the process's arguments.
pub fn run() -> ExitCode {
    // Nothing from the caller's environment may reach logging or the configuration.
    let setuid = privilege::scrub_if_setuid();
    if setuid {
        // The database client reads $HOME/.pgpass, and without HOME the home directory of
        // the *real* user: a file the caller could point anywhere, read as pepsi. HOME names
        // a directory that does not exist (only root could make it).
        // SAFETY: one thread yet, and nothing has read the environment.
        unsafe { std::env::set_var("HOME", "/nonexistent") };
    }
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    if setuid && cli.common.config.is_some() {
        return exit(Err(Failure::Invalid(format!(
            "-c/--config: started through its setuid bit, this program reads {} only",
            constants::SYSTEM_CONFIG
        ))));
    }
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = if setuid {
            Config::load_without_secrets(std::path::Path::new(constants::SYSTEM_CONFIG))?
        } else {
            cli.common.load_config()?
        };
        let options = Options::from_config(&cfg)?;
        let real = privilege::RealIds::current();
        let caller = access::Caller {
            uid: real.uid,
            account: privilege::account_name(real.uid)?,
            operator: !setuid || real.uid == 0,
        };
        // Whose list, and every entry named, are checked before connecting.
        // The digest is every owner's: an operator names no mailbox for it.
        let all_owners = caller.operator
            && cli.mailbox.is_none()
            && matches!(&cli.command, Command::Held(a) if a.is_digest());
        let mailbox = match access::mailbox(&caller, cli.mailbox.as_deref(), &options.rules) {
            Ok(m) => m,
            Err(_) if all_owners => String::new(),
            Err(e) => return Ok(exit(Err(Failure::Invalid(e)))),
        };
        let senders = match &cli.command {
            Command::Add(a) | Command::Remove(a) => match entries(&a.senders) {
                Ok(s) => s,
                Err(e) => return Ok(exit(Err(e))),
            },
            _ => Vec::new(),
        };
        let db = pepsi_contract::db::DbOptions::from_config(&cfg)?;
        let pool = if setuid {
            // Peer authentication knows the bit's account, not the caller's.
            let me = privilege::account_name(privilege::current().uid)?
                .context("the effective uid has no account name")?;
            db.connect_for_caller(&me).await?
        } else {
            db.connect().await?
        };
        let run = Run {
            pool,
            mailbox,
            actor: Actor {
                program: constants::CONFIG_SOURCE.exec.to_owned(),
                principal: None,
                os_user: caller.account.clone(),
                os_uid: Some(caller.uid),
            },
            options,
            cfg,
        };
        let result = match cli.command {
            Command::List(a) => list(&run, a.json).await,
            Command::Add(_) => add(&run, &senders).await,
            Command::Remove(_) => remove(&run, &senders).await,
            Command::Learn(a) => learn(&run, a).await,
            Command::Held(a) => held::held(&run, a, caller.operator).await,
            Command::Payments(a) => held::payments(&run, a.json).await,
        };
        Ok(exit(result))
    })
}

fn exit(result: Done) -> ExitCode {
    pepsi_conf::cli::tool_exit(&constants::CONFIG_SOURCE, result)
}

/// The entries named, checked and in stored form, each once.
fn entries(texts: &[String]) -> Result<Vec<String>, Failure> {
    let mut out: Vec<String> = Vec::new();
    for t in texts {
        let e = whitelist::entry(t).map_err(Failure::Invalid)?;
        if !out.contains(&e) {
            out.push(e);
        }
    }
    Ok(out)
}

/// One entry as `list` shows it.
#[derive(Debug, Serialize)]
struct Entry {
    sender: String,
    origin: String,
    added_at: chrono::DateTime<chrono::Utc>,
    seen_at: chrono::DateTime<chrono::Utc>,
}

#[derive(Debug, Serialize)]
struct Listing<'a> {
    mailbox: &'a str,
    entries: &'a [Entry],
}

async fn list(run: &Run, json: bool) -> Done {
    type Row = (
        String,
        String,
        chrono::DateTime<chrono::Utc>,
        chrono::DateTime<chrono::Utc>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT sender, origin, added_at, seen_at FROM pepsi.whitelist \
         WHERE mailbox = $1 ORDER BY sender",
    )
    .bind(&run.mailbox)
    .fetch_all(&run.pool)
    .await?;
    let rows: Vec<Entry> = rows
        .into_iter()
        .map(|(sender, origin, added_at, seen_at)| Entry {
            sender,
            origin,
            added_at,
            seen_at,
        })
        .collect();
    if json {
        let doc = Listing {
            mailbox: &run.mailbox,
            entries: &rows,
        };
        println!("{}", serde_json::to_string_pretty(&doc).context("JSON")?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("{}: no entries", run.mailbox);
        return Ok(());
    }
    let width = rows
        .iter()
        .map(|r| r.sender.len())
        .max()
        .unwrap_or(0)
        .max(6);
    println!("{}: {} entries", run.mailbox, rows.len());
    println!(
        "{:width$}  {:7}  {:16}  LAST SEEN",
        "SENDER", "ORIGIN", "ADDED"
    );
    for r in &rows {
        println!(
            "{:width$}  {:7}  {:16}  {}",
            r.sender,
            r.origin,
            r.added_at.format("%Y-%m-%d %H:%M"),
            r.seen_at.format("%Y-%m-%d %H:%M")
        );
    }
    Ok(())
}

/// How many entries the list holds, and those of `senders` it does not hold yet. The
/// transaction first takes the mailbox's advisory lock, so two runs of the tool on one list
/// count one after the other (the stage's learning does not take it, and is bounded per
/// message instead).
async fn after_adding(
    tx: &mut sqlx::PgConnection,
    mailbox: &str,
    senders: &[String],
) -> Result<(i64, Vec<String>), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('pepsi.whitelist ' || $1))")
        .bind(mailbox)
        .execute(&mut *tx)
        .await?;
    let held: Vec<String> =
        sqlx::query_scalar("SELECT sender FROM pepsi.whitelist WHERE mailbox = $1")
            .bind(mailbox)
            .fetch_all(&mut *tx)
            .await?;
    let new: Vec<String> = senders
        .iter()
        .filter(|s| !held.contains(s))
        .cloned()
        .collect();
    Ok((held.len() as i64, new))
}

async fn add(run: &Run, senders: &[String]) -> Done {
    let mut tx = run.pool.begin().await?;
    let (held, new) = after_adding(&mut tx, &run.mailbox, senders).await?;
    let total = held + new.len() as i64;
    if !new.is_empty() && total > run.options.max_entries {
        return Err(Failure::Other(anyhow::anyhow!(
            "{}: the list would hold {total} entries, more than [{}] MAX_ENTRIES {}; remove some first",
            run.mailbox,
            constants::SECTION,
            run.options.max_entries
        )));
    }
    sqlx::query(
        "INSERT INTO pepsi.whitelist (mailbox, sender, origin) \
         SELECT $1, s, 'owner' FROM unnest($2::text[]) AS s \
         ON CONFLICT (mailbox, sender) DO UPDATE SET origin = 'owner', seen_at = now()",
    )
    .bind(&run.mailbox)
    .bind(senders)
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        &run.actor,
        "whitelist.add",
        None,
        serde_json::json!({ "mailbox": run.mailbox, "senders": senders }),
    )
    .await?;
    tx.commit().await?;
    for s in senders {
        let how = if new.contains(s) {
            "added"
        } else {
            "kept, now the owner's"
        };
        println!("{}: {s} {how}", run.mailbox);
    }
    Ok(())
}

async fn remove(run: &Run, senders: &[String]) -> Done {
    let mut tx = run.pool.begin().await?;
    let removed: Vec<String> = sqlx::query_scalar(
        "DELETE FROM pepsi.whitelist WHERE mailbox = $1 AND sender = ANY($2) RETURNING sender",
    )
    .bind(&run.mailbox)
    .bind(senders)
    .fetch_all(&mut *tx)
    .await?;
    if !removed.is_empty() {
        audit::record(
            &mut tx,
            &run.actor,
            "whitelist.remove",
            None,
            serde_json::json!({ "mailbox": run.mailbox, "senders": removed }),
        )
        .await?;
    }
    tx.commit().await?;
    let mut missing = Vec::new();
    for s in senders {
        if removed.contains(s) {
            println!("{}: {s} removed", run.mailbox);
        } else {
            missing.push(s.as_str());
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Failure::Other(anyhow::anyhow!(
            "{}: not on the list: {}",
            run.mailbox,
            missing.join(", ")
        )))
    }
}

/// What a scan found: each entry with the origin it is learnt with, and the counts of its
/// `done` line.
#[derive(Debug, Default, PartialEq, Eq)]
struct Scanned {
    entries: Vec<(String, &'static str)>,
    messages: u64,
    skipped: u64,
}

/// Parses a scan's whole output (the helper's lines are the caller's input: each is checked,
/// and output without its `done` line is a failed scan). An address `is_self` says is the
/// mailbox's own is never learnt; one found both ways is learnt as `replied`.
fn parse_scan(output: &[u8], is_self: &dyn Fn(&str) -> bool) -> Result<Scanned, String> {
    let text = std::str::from_utf8(output).map_err(|_| "output that is not UTF-8".to_owned())?;
    let mut scanned = Scanned::default();
    let mut done = false;
    for (n, line) in text.lines().enumerate() {
        if done {
            return Err(format!("line {}: output after the done line", n + 1));
        }
        let (address, origin) =
            match Finding::parse(line).map_err(|e| format!("line {}: {e}", n + 1))? {
                Finding::Sent(a) => (a, "sent"),
                Finding::Replied(a) => (a, "replied"),
                Finding::Done { messages, skipped } => {
                    scanned.messages = messages;
                    scanned.skipped = skipped;
                    done = true;
                    continue;
                }
            };
        if is_self(&address) {
            continue;
        }
        match scanned.entries.iter_mut().find(|(a, _)| *a == address) {
            Some(found) if origin == "replied" => found.1 = origin,
            Some(_) => {}
            None => scanned.entries.push((address, origin)),
        }
    }
    if !done {
        return Err("the scan ended without its done line".into());
    }
    Ok(scanned)
}

/// The Maildir `learn` reads.
fn maildir_of(run: &Run, a: &LearnArgs) -> Result<PathBuf, Failure> {
    if let Some(dir) = &a.maildir {
        return Ok(dir.clone());
    }
    let stage = maildir::delivery_stage(&run.cfg, a.stage.as_deref()).map_err(|e| match e {
        NoStage::Unknown(t) | NoStage::Several(t) => Failure::Invalid(t),
        NoStage::None(t) => Failure::Other(anyhow::anyhow!("{t}; name the Maildir with --maildir")),
    })?;
    let s = Mailboxes::of_stage(&run.cfg, &stage).with_context(|| format!("[stage-{stage}]"))?;
    s.template
        .mailbox(&s.root, &run.mailbox, &s.delimiters)
        .map_err(|f| Failure::Other(anyhow::anyhow!("{}", f.diagnostic)))
}

/// Runs the scan on `maildir` with the caller's own ids and returns its output, bounded in
/// size and time.
async fn scan(run: &Run, maildir: &std::path::Path) -> Result<Vec<u8>, Failure> {
    let s = &run.options;
    let mut cmd = tokio::process::Command::new(&s.helper);
    cmd.arg("--max-messages")
        .arg(s.scan_max_messages.to_string())
        .arg("--max-findings")
        .arg(s.max_entries.min(u32::MAX as i64).to_string());
    for f in &s.sent_folders {
        cmd.arg("--sent-folder").arg(f);
    }
    cmd.arg("--")
        .arg(maildir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .env_clear()
        .kill_on_drop(true);
    // A user's scan runs as that user. Root's runs as the Maildir's owner, so that links
    // the owner planted lead nowhere the owner could not read.
    let owner = if privilege::RealIds::current().uid == 0 {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(maildir)
            .map_err(|e| anyhow::anyhow!("the Maildir {}: {e}", maildir.display()))?;
        Some((meta.uid(), meta.gid()))
    } else {
        None
    };
    // SAFETY: both make three system calls at most and allocate nothing.
    unsafe {
        match owner {
            Some((uid, gid)) => cmd.pre_exec(move || privilege::become_ids(uid, gid)),
            None => cmd.pre_exec(privilege::become_real_ids),
        };
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", s.helper.display()))?;
    let mut stdout = child.stdout.take().expect("piped above");
    // Each finding is one line of at most MAX_LINE bytes, plus the done line.
    let limit = (s.max_entries as u64 + 2) * (protocol::MAX_LINE as u64 + 1);
    let work = async {
        let mut out = Vec::new();
        (&mut stdout).take(limit + 1).read_to_end(&mut out).await?;
        if out.len() as u64 > limit {
            // It would block on a full pipe: stop it now.
            child.kill().await?;
        }
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((out, status))
    };
    let (out, status) = match tokio::time::timeout(s.scan_timeout, work).await {
        Ok(r) => r.map_err(|e| anyhow::anyhow!("the scan of {}: {e}", maildir.display()))?,
        Err(_) => {
            return Err(Failure::Other(anyhow::anyhow!(
                "the scan of {} took longer than [{}] SCAN_TIMEOUT ({:?}); it was stopped",
                maildir.display(),
                constants::SECTION,
                s.scan_timeout
            )));
        }
    };
    if out.len() as u64 > limit {
        return Err(Failure::Other(anyhow::anyhow!(
            "the scan of {} printed more than its limit of {limit} bytes",
            maildir.display()
        )));
    }
    if !status.success() {
        return Err(Failure::Other(anyhow::anyhow!(
            "the scan of {} failed ({status})",
            maildir.display()
        )));
    }
    Ok(out)
}

async fn learn(run: &Run, a: LearnArgs) -> Done {
    let maildir = maildir_of(run, &a)?;
    let output = scan(run, &maildir).await?;
    let local = &run.options.rules.local;
    let found = parse_scan(&output, &|a| local.mailbox_key(a) == run.mailbox)
        .map_err(|e| anyhow::anyhow!("the scan of {}: {e}", maildir.display()))?;
    let summary = format!(
        "({} messages read in {}, {} not read)",
        found.messages,
        maildir.display(),
        found.skipped
    );
    if a.dry_run {
        for (address, origin) in &found.entries {
            println!("{address} {origin}");
        }
        println!(
            "{}: {} addresses would be learnt or confirmed {summary}; nothing changed",
            run.mailbox,
            found.entries.len()
        );
        return Ok(());
    }
    let senders: Vec<String> = found.entries.iter().map(|(s, _)| s.clone()).collect();
    let mut tx = run.pool.begin().await?;
    let (held, new) = after_adding(&mut tx, &run.mailbox, &senders).await?;
    let room = (run.options.max_entries - held).max(0) as usize;
    let dropped = new.len().saturating_sub(room);
    // Entries held already are confirmed; new ones are added while the list has room.
    let take: Vec<(String, &str)> = found
        .entries
        .iter()
        .filter(|(s, _)| !new.contains(s) || new.iter().take(room).any(|n| n == s))
        .cloned()
        .collect();
    let (addresses, origins): (Vec<String>, Vec<&str>) = take.into_iter().unzip();
    sqlx::query(
        "INSERT INTO pepsi.whitelist (mailbox, sender, origin) \
         SELECT $1, s, o FROM unnest($2::text[], $3::text[]) AS t(s, o) \
         ON CONFLICT (mailbox, sender) DO UPDATE SET seen_at = now()",
    )
    .bind(&run.mailbox)
    .bind(&addresses)
    .bind(&origins)
    .execute(&mut *tx)
    .await?;
    let added = new.len() - dropped;
    let confirmed = addresses.len() - added;
    audit::record(
        &mut tx,
        &run.actor,
        "whitelist.learn",
        None,
        serde_json::json!({
            "mailbox": run.mailbox, "added": added, "confirmed": confirmed,
            "dropped": dropped, "messages": found.messages, "skipped": found.skipped,
        }),
    )
    .await?;
    tx.commit().await?;
    println!(
        "{}: {added} learnt, {confirmed} confirmed {summary}",
        run.mailbox
    );
    if dropped > 0 {
        eprintln!(
            "{}: not learnt, the list being full ([{}] MAX_ENTRIES {}): {dropped}",
            constants::CONFIG_SOURCE.exec,
            constants::SECTION,
            run.options.max_entries
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_output_table() {
        let me = |a: &str| a.starts_with("alice");
        let ok = parse_scan(
            b"sent bob@example.org\nreplied carol@example.net\nsent alice+x@example.test\n\
              replied bob@example.org\nsent dave@example.com\ndone 7 1\n",
            &me,
        )
        .unwrap();
        assert_eq!(
            ok,
            Scanned {
                entries: vec![
                    ("bob@example.org".into(), "replied"),
                    ("carol@example.net".into(), "replied"),
                    ("dave@example.com".into(), "sent"),
                ],
                messages: 7,
                skipped: 1,
            }
        );
        for (output, why) in [
            (&b"sent bob@example.org\n"[..], "without its done line"),
            (b"done 1 0\nsent bob@example.org\n", "after the done line"),
            (
                b"sent Bob@example.org\ndone 1 0\n",
                "line 1: not an address",
            ),
            (b"owner bob@example.org\ndone 1 0\n", "unknown line"),
            (b"sent \xff@example.org\ndone 1 0\n", "not UTF-8"),
        ] {
            let e = parse_scan(output, &me).unwrap_err();
            assert!(e.contains(why), "{output:?}: {e}");
        }
    }

    #[test]
    fn entries_are_checked_and_kept_once() {
        let got = entries(&[
            "Bob@Example.org".into(),
            "@x.test".into(),
            "bob@example.org".into(),
        ])
        .unwrap();
        assert_eq!(got, vec!["bob@example.org", "@x.test"]);
        assert!(
            matches!(entries(&["bob".into()]), Err(Failure::Invalid(e)) if e.contains("not an address"))
        );
    }
}
