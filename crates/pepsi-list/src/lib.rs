//! pepsi-list: the operator's tool for mailing lists (docs/lists.md) — create, show,
//! configure and delete lists (`pepsi.mailing_list`), manage who is on them
//! (`pepsi.list_member`), import a Mailman 3 members export and export the members as CSV,
//! and forget one person on every list; moderate from the terminal: list the posts a list
//! holds and approve (back to the list stage, approved), reject (a DSN to the sender) or
//! discard them, ban senders (`list_ban`) and keep header filters (`list_header_filter`,
//! `filters`) and the content filter (`list_content_filter`, `content`); run the periodic work (`maintain`: bounce
//! warnings and removals, expiry of requests and held posts).
//!
//! Input is checked before anything is stored, most of it before connecting: list
//! addresses and member addresses (`names`), list options (`options`, the allow-list of
//! `configure`), the members file (`members_csv`). The SQL is `store`'s: each change is one
//! transaction with its `pepsi.list_event_log` rows (the invoking user as actor) and its
//! `pepsi.event_log` row (`pepsi_contract::audit`). Presentation is `render`'s; `--json`
//! prints `store`'s serde types. The stages a decided post goes to are read from the
//! configuration (`moderation`). Only `approve`, `reject` and `maintain` touch the queue
//! (one injected row per post or warning, at most once, and a wake-up of the dispatcher
//! after the commit); other changes take effect for the next post, which the list stage
//! reads. `maintain` keeps its SQL beside its decisions (`maintain`).

// The checks and the SQL are pepsi-httpd's too (its list API and moderation pages), so
// that a change made on the web is the one this tool makes.
pub mod content;
pub mod filters;
mod maintain;
pub mod members_csv;
pub mod mode;
pub mod moderation;
pub mod names;
pub mod options;
mod render;
pub mod store;

use std::io::Read as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::Config;
use pepsi_contract::local::LocalRecipients;
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;

use crate::names::{Action, Role};
use crate::store::Who;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "list",
        exec: "pepsi-list",
    };
}

/// Members stored per statement of an import, and the interval of its progress lines.
const IMPORT_CHUNK: usize = 1000;

const LONG_ABOUT: &str = "\
Create, configure and delete Pepsi's mailing lists, and manage their members.

A list is an address of one of this server's local domains, team@example.org; its command \
addresses are the same name with a suffix: team-join@ (or -subscribe@), team-leave@ (or \
-unsubscribe@), team-request@, team-owner@, team-bounces@ and team-confirm+TOKEN@. So a \
list's name cannot end in one of those suffixes, and neither the list's address nor a \
command address may be a mailbox (pepsi.mailbox_account).

Everyone a list knows is a row of pepsi.list_member with a role: a member receives posts; \
an owner and a moderator run the list; a nonmember row carries a posting rule (--action) \
for one sender who is not subscribed. Members added here are added at once: the \
confirmation by mail that subscribing by mail or on the web asks for is the operator's \
to waive.

`create`, `configure`, `delete`, `add`, `remove`, `import` and `forget` change the list \
tables: each in one transaction that also writes a pepsi.list_event_log row per change \
(list.create, list.configure, list.delete, member.add, member.remove, member.forget; actor: \
the invoking user, the one who ran sudo when it was sudo) and one pepsi.event_log row \
(list.create, list.configure, list.delete, list.add, list.remove, list.import, list.forget). \
`lists`, `show`, `members` and `export` only read. Changes apply to the next post.

Moderation: `held LIST` shows the posts a list holds for a moderator; `approve LIST ID...` sends each back to the list stage (the stage whose PROGRAM is pepsi-stage-list; --stage NAME when there are several) marked approved, so it goes to the members whatever the posting policy says; `reject LIST ID... [--reason T]` returns each to its sender as a DSN (5.7.1, rejected by the list's moderator) from the list stage's BOUNCE_STAGE; `discard LIST ID...` drops them. Each writes a pepsi.list_moderation_decision row per post (the invoking user as moderator) and post.approve, post.reject or post.discard events. `ban LIST PATTERN` (or `ban --all PATTERN`, every list) refuses a sender's posts: PATTERN is an address, or a POSIX regular expression when it starts with ^ (matched without regard to case, checked by PostgreSQL before it is stored); `unban` lifts it, `bans LIST` lists what applies to the list.

Header filters: `filter LIST HEADER PATTERN ACTION` adds one (after the last, or at --position N); the list stage tries a list's filters in position order on a post's header fields, and the first whose field HEADER has a value matching PATTERN (a POSIX regular expression, matched without regard to case, checked by PostgreSQL before it is stored) decides what becomes of the post: accept, hold, reject, discard or defer. `unfilter LIST POSITION` removes one, `filters LIST` lists them (filter.add and filter.remove events, list.filter and list.unfilter audit rows).

Content filter: `content-filter LIST` shows which parts of a post the members get; with options it changes what they name and keeps the rest. --filter-types and --pass-types take media types (image/png) or top-level types (image), --filter-extensions and --pass-extensions file name extensions, each comma-separated (an empty value empties the list): a part is removed when its type or its file name's extension is filtered, or when a pass list is not empty and does not name it. --collapse-alternatives yes keeps only the first part of a multipart/alternative (the plain text). --empty-action says what becomes of a post left with nothing: hold, reject (the default) or discard. `--clear` removes the filter (content_filter.set and content_filter.clear events, list.content-filter audit rows).

`maintain` is one pass of the periodic work (a systemd timer runs it every few minutes): \
bounce warnings to members whose delivery bounces disabled, every bounce_warning_interval, \
and the member removed after bounce_warnings of them; stale bounce scores set back to 0; \
requests and held posts past their expiry deleted (a held post with an `expire` decision), \
expired member links and old confirmation windows deleted; digests whose digest_period \
has passed sent to the members who take them. Each list is done in one \
transaction under an advisory lock and each warning is queued at most once, so two hosts \
may run it at once and a second run does nothing more.

`configure LIST NAME=VALUE...` changes a list's options (the columns of \
pepsi.mailing_list): `pepsi-list configure --help` lists each with what it takes, its \
default and its meaning. `import LIST FILE` reads a Mailman 3 members export (CSV with a \
header naming an email column and, optionally, a display_name column); `export LIST` \
writes the same format. `set-mode LIST ADDRESS regular|mime|plain` sets how a member \
takes the posts: each as it comes, or collected in a MIME or plain (RFC 1153) digest \
(member.mode event, list.set-mode audit row). `forget ADDRESS --yes` removes a person \
from every list and every list table keyed by the address, on their request.

pepsi-list connects with [database] URL of the configuration as the role named there; it \
needs SELECT, INSERT, UPDATE and DELETE on the list tables (pepsi.mailing_list and \
pepsi.list_*), SELECT on pepsi.mailbox_account and pepsi.settings, and INSERT on \
pepsi.event_log: the pipeline role (pepsi) and the pepsi-httpd role hold them (run it as \
`sudo -u pepsi pepsi-list ...` with peer authentication).

Exit status: 0 when the change was made (or the listing printed; an address that was on \
the list already, or was not, is reported and is not an error), 1 when it could not be (no \
such list, it exists already, a database error), 2 on a usage error or input that is not \
valid (a malformed or non-local address, a command suffix, a mailbox's address, an \
unknown option or a bad value, a members file without an email column). See \
docs/lists.md.";

const EXAMPLES: &str = "\
Examples:
  pepsi-list create team@example.org --display-name 'The team' --owner alice@example.org
  pepsi-list lists
  pepsi-list show team@example.org --json
  pepsi-list configure team@example.org subject_prefix='[team] ' nonmember_action=reject
  pepsi-list configure team@example.org reply_goes_to=explicit reply_to_address=desk@example.org
  pepsi-list add team@example.org bob@example.net carol@example.com
  pepsi-list add team@example.org mod@example.org --role moderator
  pepsi-list add team@example.org spammer@example.net --role nonmember --action discard
  pepsi-list members team@example.org --role member --json
  pepsi-list remove team@example.org bob@example.net
  pepsi-list set-mode team@example.org carol@example.com mime
  pepsi-list import team@example.org members.csv --dry-run
  pepsi-list export team@example.org > members.csv
  pepsi-list forget bob@example.net --yes
  pepsi-list held team@example.org
  pepsi-list approve team@example.org 17 18
  pepsi-list reject team@example.org 19 --reason 'off topic'
  pepsi-list discard team@example.org 20
  pepsi-list ban team@example.org '^.*@spam\\.example$' --reason 'spam run'
  pepsi-list ban --all troll@example.net
  pepsi-list bans team@example.org
  pepsi-list filter team@example.org X-Spam-Flag '^yes' discard
  pepsi-list filter team@example.org Subject 'unsubscribe' hold --position 5
  pepsi-list filters team@example.org
  pepsi-list unfilter team@example.org 5
  pepsi-list content-filter team@example.org --filter-extensions exe,bat,scr --collapse-alternatives yes
  pepsi-list content-filter team@example.org --pass-types text/plain,image --empty-action hold
  pepsi-list content-filter team@example.org --json
  pepsi-list delete team@example.org --yes
  pepsi-list maintain --json";

/// Create, configure and delete mailing lists, and manage their members.
#[derive(Debug, Parser)]
#[command(
    name = "pepsi-list",
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
    /// Create a list at ADDRESS, a local domain's address that is no mailbox.
    Create(CreateArgs),
    /// Every list: address, members, subscription and posting policies.
    Lists(JsonFlag),
    /// One list: every option, its members by role and delivery, pending requests and
    /// held posts.
    Show(ListArg),
    /// Change a list's options: NAME=VALUE... (see --help for every option).
    #[command(after_long_help = options::help())]
    Configure(ConfigureArgs),
    /// Delete a list and everything it holds (members, pending requests, held posts,
    /// digests); its pepsi.list_event_log rows stay, the list named in their detail.
    Delete(DeleteArgs),
    /// A list's members, owners, moderators and nonmember rules.
    Members(MembersArgs),
    /// Add addresses to a list (as members unless --role says otherwise), without a
    /// confirmation by mail.
    Add(AddArgs),
    /// Remove addresses from a list (their rows of --role, members by default).
    Remove(RemoveArgs),
    /// How a member takes the list's posts: regular (each as it comes), or collected in a
    /// digest, mime or plain (RFC 1153). A digest mode needs the list's digests_enabled.
    SetMode(mode::SetModeArgs),
    /// Add the members of a Mailman 3 members export (CSV) to a list, in one transaction.
    ///
    /// The first row names the columns: an email column (email, Email, E-mail, Email
    /// Address or address, any letter case) and, optionally, a display name column
    /// (display_name, Display Name, name, real_name, full_name); other columns are ignored.
    /// A file whose first row is an address and no header is read as address, display
    /// name. Each line is checked on its own: a line that holds no valid address is skipped
    /// and reported with its line number, and an address of an earlier line is counted as
    /// repeated. Members already on the list are left as they are. Progress goes to stderr
    /// every 1,000 rows; the summary to stdout. FILE `-` is stdin.
    #[command(long_about)]
    Import(ImportArgs),
    /// Write a list's rows of --role (members by default) as CSV (email,display_name) to
    /// stdout: what `import` reads.
    Export(ExportArgs),
    /// Remove a person from every list and every list table keyed by the address (their
    /// memberships of every role, pending requests, member links, bounce scores and
    /// reports, confirmation and response counts), and say what was removed.
    Forget(ForgetArgs),
    /// The posts a list holds for a moderator: id, sender, size, when held and when it
    /// expires, why, subject.
    Held(ListArg),
    /// Send held posts back to the list stage, approved: they go to the members whatever
    /// the posting policy says (a post that came round a loop is still dropped).
    Approve(DecideArgs),
    /// Return held posts to their senders: a DSN (5.7.1, rejected by the list's moderator)
    /// from the list stage's BOUNCE_STAGE.
    Reject(RejectArgs),
    /// Drop held posts; nothing goes to the members or the sender.
    Discard(DiscardArgs),
    /// Refuse a sender's posts to a list (or, with --all, to every list): PATTERN is an
    /// address, or a POSIX regular expression (case-insensitive) when it starts with ^.
    Ban(BanArgs),
    /// Lift a ban: LIST PATTERN, or --all PATTERN, as `bans` shows it.
    Unban(UnbanArgs),
    /// The bans that apply to a list (its own and those of every list), or with --all
    /// those of every list.
    Bans(BansArgs),
    /// Add a header filter: posts whose header field HEADER has a value matching PATTERN
    /// (a POSIX regular expression, case-insensitive) get ACTION, when no filter before it
    /// matched.
    Filter(FilterArgs),
    /// Remove the header filter at POSITION (as `filters` shows it).
    Unfilter(UnfilterArgs),
    /// A list's header filters in the order they are tried: position, header, pattern,
    /// action.
    Filters(ListArg),
    /// Show or change which parts of a post the members get: MIME types and file name
    /// extensions removed, HTML alternatives collapsed, and what becomes of a post left
    /// with nothing.
    ContentFilter(ContentFilterArgs),
    /// One pass of the periodic work: bounce warnings and removals, stale bounce scores,
    /// expired requests, held posts, member links and confirmation windows, digests due.
    ///
    /// To each member whose delivery bounces disabled, a warning every
    /// bounce_warning_interval (from the list's -request address, envelope sender its
    /// -bounces address, queued at the list stage's DELIVER_STAGE); after bounce_warnings
    /// warnings and one more interval the member is removed (member.remove, why: bounces).
    /// Scores whose last bounce is older than bounce_info_stale_after go back to 0.
    /// list_pending rows and held posts past expires_at are deleted (a held post with a
    /// list_moderation_decision `expire`), and so are expired member links and confirmation
    /// windows that ended a window ago. Digests whose digest_period has passed since their
    /// first post are sent, each marked sent in the transaction that queues it (at most
    /// once). Each list is one transaction under an advisory lock
    /// (a list another run holds is skipped and reported busy), and each warning is queued
    /// with an at-most-once token: safe from two hosts at once, and a second run does
    /// nothing more.
    #[command(long_about)]
    Maintain(MaintainArgs),
}

#[derive(Debug, Args)]
struct MaintainArgs {
    /// The list stage whose DELIVER_STAGE the warnings start at (required when several
    /// stages run pepsi-stage-list)
    #[arg(long, value_name = "NAME")]
    stage: Option<String>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct DecideArgs {
    /// The list's address
    list: String,
    /// The held posts' ids (`pepsi-list held LIST`)
    #[arg(value_name = "ID", required = true, num_args = 1..)]
    ids: Vec<i64>,
    /// The list stage to send them to (required when several stages run pepsi-stage-list)
    #[arg(long, value_name = "NAME")]
    stage: Option<String>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct RejectArgs {
    /// The list's address
    list: String,
    /// The held posts' ids (`pepsi-list held LIST`)
    #[arg(value_name = "ID", required = true, num_args = 1..)]
    ids: Vec<i64>,
    /// Why, for the sender's DSN (one line)
    #[arg(long, value_name = "TEXT", default_value = "")]
    reason: String,
    /// The list stage whose BOUNCE_STAGE returns them (required when several stages run
    /// pepsi-stage-list)
    #[arg(long, value_name = "NAME")]
    stage: Option<String>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct DiscardArgs {
    /// The list's address
    list: String,
    /// The held posts' ids (`pepsi-list held LIST`)
    #[arg(value_name = "ID", required = true, num_args = 1..)]
    ids: Vec<i64>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct BanArgs {
    /// LIST PATTERN, or PATTERN alone with --all
    #[arg(value_name = "[LIST] PATTERN", required = true, num_args = 1..=2)]
    args: Vec<String>,
    /// Ban from every list
    #[arg(long)]
    all: bool,
    /// Why (one line)
    #[arg(long, value_name = "TEXT", default_value = "")]
    reason: String,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct UnbanArgs {
    /// LIST PATTERN, or PATTERN alone with --all
    #[arg(value_name = "[LIST] PATTERN", required = true, num_args = 1..=2)]
    args: Vec<String>,
    /// The ban of every list
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct BansArgs {
    /// The list's address (without it: --all)
    list: Option<String>,
    /// Only the bans of every list
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct FilterArgs {
    /// The list's address
    list: String,
    /// The header field's name, e.g. Subject or X-Spam-Flag
    header: String,
    /// A POSIX regular expression matched against the field's value, without regard to case
    pattern: String,
    /// What becomes of a post it matches: accept, hold, reject, discard or defer
    action: String,
    /// Put it at position N (1 to 1000000; a taken position is refused) instead of after
    /// the last filter (the last position plus 10)
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    position: Option<i64>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct ContentFilterArgs {
    /// The list's address
    list: String,
    /// Media types removed, comma-separated: image/png, or image for every image/*
    #[arg(long, value_name = "TYPES")]
    filter_types: Option<String>,
    /// When not empty, only these media types are kept (comma-separated, as above)
    #[arg(long, value_name = "TYPES")]
    pass_types: Option<String>,
    /// File name extensions removed, comma-separated: exe,bat,scr
    #[arg(long, value_name = "EXTENSIONS")]
    filter_extensions: Option<String>,
    /// When not empty, only attachments with these extensions are kept (parts without a
    /// file name are judged by their type alone)
    #[arg(long, value_name = "EXTENSIONS")]
    pass_extensions: Option<String>,
    /// yes: a multipart/alternative becomes its first part (the plain text)
    #[arg(long, value_name = "yes|no")]
    collapse_alternatives: Option<String>,
    /// What becomes of a post the filter leaves with nothing: hold, reject or discard
    #[arg(long, value_name = "ACTION")]
    empty_action: Option<String>,
    /// Remove the list's content filter (posts go out whole)
    #[arg(long, conflicts_with_all = ["filter_types", "pass_types", "filter_extensions",
        "pass_extensions", "collapse_alternatives", "empty_action"])]
    clear: bool,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct UnfilterArgs {
    /// The list's address
    list: String,
    /// The filter's position (`pepsi-list filters LIST`)
    #[arg(allow_negative_numbers = true)]
    position: i64,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct JsonFlag {
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ListArg {
    /// The list's address
    list: String,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// The list's address: NAME@DOMAIN of a local domain; NAME of a-z, 0-9, '.', '_', '-'
    address: String,
    /// The list's name as people read it
    #[arg(long, value_name = "TEXT", default_value = "")]
    display_name: String,
    /// What the list is about
    #[arg(long, value_name = "TEXT", default_value = "")]
    description: String,
    /// Put before the subject of posts, e.g. '[team] '
    #[arg(long, value_name = "TEXT", default_value = "")]
    subject_prefix: String,
    /// An owner of the list (repeat for more)
    #[arg(long = "owner", value_name = "ADDRESS")]
    owners: Vec<String>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct ConfigureArgs {
    /// The list's address
    list: String,
    /// Options to set: NAME=VALUE (reply_to_address=none clears the address)
    #[arg(value_name = "NAME=VALUE", required = true, num_args = 1..)]
    assignments: Vec<String>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct DeleteArgs {
    /// The list's address
    list: String,
    /// Really delete it (required)
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct MembersArgs {
    /// The list's address
    list: String,
    /// Only rows of this role (default: every role)
    #[arg(long, value_enum, value_name = "ROLE")]
    role: Option<Role>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct AddArgs {
    /// The list's address
    list: String,
    /// The addresses to add
    #[arg(value_name = "ADDRESS", required = true, num_args = 1..)]
    addresses: Vec<String>,
    /// What they are to the list
    #[arg(long, value_enum, value_name = "ROLE", default_value = "member")]
    role: Role,
    /// Their display name
    #[arg(long, value_name = "TEXT", default_value = "")]
    name: String,
    /// Their own posting rule, instead of the list's member_action or nonmember_action
    #[arg(long, value_enum, value_name = "ACTION")]
    action: Option<Action>,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct RemoveArgs {
    /// The list's address
    list: String,
    /// The addresses to remove
    #[arg(value_name = "ADDRESS", required = true, num_args = 1..)]
    addresses: Vec<String>,
    /// Which of their rows
    #[arg(long, value_enum, value_name = "ROLE", default_value = "member")]
    role: Role,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct ImportArgs {
    /// The list's address
    list: String,
    /// The CSV file (`-`: stdin)
    file: String,
    /// Check the file and count what would be added; store nothing
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    out: JsonFlag,
}

#[derive(Debug, Args)]
struct ExportArgs {
    /// The list's address
    list: String,
    /// Whose rows
    #[arg(long, value_enum, value_name = "ROLE", default_value = "member")]
    role: Role,
}

#[derive(Debug, Args)]
struct ForgetArgs {
    /// The person's address
    address: String,
    /// Really remove it everywhere (required)
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    out: JsonFlag,
}

/// The command line of `pepsi-list` as clap defines it: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

type Done = Result<(), Failure>;

/// Runs `pepsi-list` with the process's arguments.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        // Input is checked before connecting: a typing mistake costs no connection.
        let checked = match check(cli.command, &cfg) {
            Ok(c) => c,
            Err(e) => return Ok(exit(Err(e))),
        };
        let pool = pepsi_contract::db::connect(&cfg).await?;
        let who = Who::local(constants::CONFIG_SOURCE.exec);
        Ok(exit(execute(&pool, &who, &cfg, checked).await))
    })
}

fn exit(result: Done) -> ExitCode {
    pepsi_conf::cli::tool_exit(&constants::CONFIG_SOURCE, result)
}

fn invalid(text: impl Into<String>) -> Failure {
    Failure::Invalid(text.into())
}

fn print_json<T: Serialize>(v: &T) -> Done {
    let text = serde_json::to_string_pretty(v).context("encoding JSON")?;
    println!("{text}");
    Ok(())
}

/// Prints `v` as JSON, or the text `render` makes of it.
fn print<T: Serialize>(json: bool, v: &T, text: impl FnOnce(&T) -> String) -> Done {
    if json {
        return print_json(v);
    }
    print!("{}", text(v));
    Ok(())
}

/// A command with its input checked: addresses in stored form, options parsed, the
/// members file read.
enum Checked {
    Create(store::NewList, bool),
    Lists(bool),
    Show(String, bool),
    Configure(String, Vec<options::Change>, bool),
    Delete(String, bool),
    Members(String, Option<Role>, bool),
    Add(AddArgs, String, Vec<String>),
    Remove(RemoveArgs, String, Vec<String>),
    SetMode(String, String, mode::Mode, bool),
    Import(ImportArgs, String, members_csv::Parsed),
    Export(String, Role),
    Forget(String, bool),
    Held(String, bool),
    Decide(String, Vec<i64>, store::Verdict, bool),
    Ban(Option<String>, moderation::Pattern, String, bool),
    Unban(Option<String>, String, bool),
    Bans(Option<String>, bool),
    Filter(String, filters::NewFilter, bool),
    Unfilter(String, i32, bool),
    Filters(String, bool),
    ContentFilter(String, ContentFilterRun, bool),
    Maintain(maintain::Settings, bool),
}

/// What `content-filter` does.
enum ContentFilterRun {
    Show,
    Set(content::Change),
    Clear,
}

/// The held posts' ids, each once in their order.
fn ids(given: &[i64]) -> Vec<i64> {
    let mut out: Vec<i64> = Vec::new();
    for i in given {
        if !out.contains(i) {
            out.push(*i);
        }
    }
    out
}

/// The list stage a decided post goes to or is returned from.
fn list_stage(cfg: &Config, given: Option<&str>) -> Result<String, Failure> {
    moderation::list_stage(cfg, given).map_err(|e| match e {
        moderation::NoStage::Usage(m) => invalid(m),
        moderation::NoStage::Missing(m) => Failure::Other(anyhow::anyhow!(m)),
    })
}

/// `[LIST] PATTERN` of `ban` and `unban`: the list (None with --all) and the pattern.
fn ban_target(args: &[String], all: bool) -> Result<(Option<String>, &str), Failure> {
    match (args, all) {
        ([pattern], true) => Ok((None, pattern)),
        ([l, pattern], false) => Ok((Some(list(l)?), pattern)),
        ([_], false) => Err(invalid(
            "give the list and the pattern (LIST PATTERN), or --all PATTERN to ban from every              list",
        )),
        _ => Err(invalid(
            "--all takes the pattern alone: it bans from every list, not one",
        )),
    }
}

fn list(text: &str) -> Result<String, Failure> {
    names::named_list(text).map_err(invalid)
}

/// `texts` as stored addresses, each once in their order; the first bad one refuses all.
fn addresses(texts: &[String]) -> Result<Vec<String>, Failure> {
    let mut out: Vec<String> = Vec::new();
    for t in texts {
        let a = names::member_address(t).map_err(invalid)?;
        if !out.contains(&a) {
            out.push(a);
        }
    }
    Ok(out)
}

/// A text option given on the command line, checked as `configure` checks it.
fn text_option(name: &str, value: &str) -> Result<String, Failure> {
    let option = options::find(name).expect("a text option of the table");
    match option.kind.parse(value) {
        Ok(options::Value::Text(t)) => Ok(t),
        Ok(_) => unreachable!("a text option parses to text"),
        Err(expected) => Err(invalid(format!(
            "--{} {value:?} is not valid: {expected}",
            name.replace('_', "-")
        ))),
    }
}

fn check(command: Command, cfg: &Config) -> Result<Checked, Failure> {
    Ok(match command {
        Command::Create(a) => {
            let new = store::NewList {
                address: names::list_address(&a.address).map_err(invalid)?,
                display_name: text_option("display_name", &a.display_name)?,
                description: text_option("description", &a.description)?,
                subject_prefix: text_option("subject_prefix", &a.subject_prefix)?,
                owners: addresses(&a.owners)?,
            };
            Checked::Create(new, a.out.json)
        }
        Command::Lists(a) => Checked::Lists(a.json),
        Command::Show(a) => Checked::Show(list(&a.list)?, a.out.json),
        Command::Configure(a) => Checked::Configure(
            list(&a.list)?,
            options::parse_assignments(&a.assignments).map_err(invalid)?,
            a.out.json,
        ),
        Command::Delete(a) => {
            let l = list(&a.list)?;
            if !a.yes {
                return Err(invalid(format!(
                    "not deleted: deleting {l} removes its members, pending requests and held \
                     posts for good; confirm with --yes"
                )));
            }
            Checked::Delete(l, a.out.json)
        }
        Command::Members(a) => Checked::Members(list(&a.list)?, a.role, a.out.json),
        Command::Add(a) => {
            let l = list(&a.list)?;
            let addrs = addresses(&a.addresses)?;
            if a.name.chars().count() > members_csv::MAX_NAME_CHARS
                || a.name.chars().any(char::is_control)
            {
                return Err(invalid(format!(
                    "--name {:?} is not valid: text of at most {} characters, on one line",
                    a.name,
                    members_csv::MAX_NAME_CHARS
                )));
            }
            Checked::Add(a, l, addrs)
        }
        Command::Remove(a) => {
            let l = list(&a.list)?;
            let addrs = addresses(&a.addresses)?;
            Checked::Remove(a, l, addrs)
        }
        Command::Import(a) => {
            let l = list(&a.list)?;
            let parsed = read_members(&a.file)?;
            Checked::Import(a, l, parsed)
        }
        Command::SetMode(a) => Checked::SetMode(
            list(&a.list)?,
            names::member_address(&a.address).map_err(invalid)?,
            a.mode,
            a.json,
        ),
        Command::Export(a) => Checked::Export(list(&a.list)?, a.role),
        Command::Forget(a) => {
            let address = names::member_address(&a.address).map_err(invalid)?;
            if !a.yes {
                return Err(invalid(format!(
                    "not forgotten: this removes {address} from every list for good; confirm \
                     with --yes"
                )));
            }
            Checked::Forget(address, a.out.json)
        }
        Command::Held(a) => Checked::Held(list(&a.list)?, a.out.json),
        Command::Approve(a) => {
            let l = list(&a.list)?;
            let stage = list_stage(cfg, a.stage.as_deref())?;
            Checked::Decide(
                l,
                ids(&a.ids),
                store::Verdict::Approve { stage },
                a.out.json,
            )
        }
        Command::Reject(a) => {
            let l = list(&a.list)?;
            let reason = moderation::reason(&a.reason).map_err(invalid)?;
            let stage = list_stage(cfg, a.stage.as_deref())?;
            let bounce_stage = moderation::bounce_stage(cfg, &stage)
                .map_err(|e| Failure::Other(anyhow::anyhow!(e)))?;
            Checked::Decide(
                l,
                ids(&a.ids),
                store::Verdict::Reject {
                    stage,
                    bounce_stage,
                    reason,
                },
                a.out.json,
            )
        }
        Command::Discard(a) => Checked::Decide(
            list(&a.list)?,
            ids(&a.ids),
            store::Verdict::Discard,
            a.out.json,
        ),
        Command::Ban(a) => {
            let (l, pattern) = ban_target(&a.args, a.all)?;
            let pattern = moderation::pattern(pattern).map_err(invalid)?;
            let reason = moderation::reason(&a.reason).map_err(invalid)?;
            Checked::Ban(l, pattern, reason, a.out.json)
        }
        Command::Unban(a) => {
            let (l, pattern) = ban_target(&a.args, a.all)?;
            let pattern = moderation::pattern(pattern).map_err(invalid)?;
            Checked::Unban(l, pattern.as_str().to_owned(), a.out.json)
        }
        Command::Filter(a) => {
            let l = list(&a.list)?;
            let new = filters::NewFilter {
                header: filters::header(&a.header).map_err(invalid)?,
                pattern: filters::pattern(&a.pattern).map_err(invalid)?,
                action: filters::action(&a.action).map_err(invalid)?,
                position: a
                    .position
                    .map(filters::position)
                    .transpose()
                    .map_err(invalid)?,
            };
            Checked::Filter(l, new, a.out.json)
        }
        Command::Unfilter(a) => Checked::Unfilter(
            list(&a.list)?,
            filters::position(a.position).map_err(invalid)?,
            a.out.json,
        ),
        Command::Filters(a) => Checked::Filters(list(&a.list)?, a.out.json),
        Command::ContentFilter(a) => {
            let l = list(&a.list)?;
            let change = content::Change {
                filter_types: a
                    .filter_types
                    .map(|t| content::types("--filter-types", &t))
                    .transpose()
                    .map_err(invalid)?,
                pass_types: a
                    .pass_types
                    .map(|t| content::types("--pass-types", &t))
                    .transpose()
                    .map_err(invalid)?,
                filter_extensions: a
                    .filter_extensions
                    .map(|t| content::extensions("--filter-extensions", &t))
                    .transpose()
                    .map_err(invalid)?,
                pass_extensions: a
                    .pass_extensions
                    .map(|t| content::extensions("--pass-extensions", &t))
                    .transpose()
                    .map_err(invalid)?,
                collapse_alternatives: a
                    .collapse_alternatives
                    .map(|t| content::yes_no("--collapse-alternatives", &t))
                    .transpose()
                    .map_err(invalid)?,
                empty_action: a
                    .empty_action
                    .map(|t| content::empty_action(&t))
                    .transpose()
                    .map_err(invalid)?,
            };
            let run = if a.clear {
                ContentFilterRun::Clear
            } else if change.is_empty() {
                ContentFilterRun::Show
            } else {
                ContentFilterRun::Set(change)
            };
            Checked::ContentFilter(l, run, a.out.json)
        }
        Command::Maintain(a) => {
            // No list stage: the rest of the work is still done; warnings wait for one.
            let stage = match moderation::list_stage(cfg, a.stage.as_deref()) {
                Ok(s) => Some(s),
                Err(moderation::NoStage::Missing(_)) => None,
                Err(moderation::NoStage::Usage(m)) => return Err(invalid(m)),
            };
            let settings =
                maintain::Settings::from_config(cfg, stage.as_deref()).map_err(Failure::Other)?;
            Checked::Maintain(settings, a.out.json)
        }
        Command::Bans(a) => match (a.list, a.all) {
            (Some(l), false) => Checked::Bans(Some(list(&l)?), a.out.json),
            (None, true) => Checked::Bans(None, a.out.json),
            _ => {
                return Err(invalid(
                    "give the list (bans LIST), or --all for the bans of every list",
                ));
            }
        },
    })
}

/// Reads and checks the members file `file` (`-`: stdin); a file without an email column
/// is input that is not valid.
fn read_members(file: &str) -> Result<members_csv::Parsed, Failure> {
    let mut bytes = Vec::new();
    if file == "-" {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("reading stdin")?;
    } else {
        bytes = std::fs::read(file).with_context(|| format!("reading {file}"))?;
    }
    members_csv::read(bytes.as_slice()).map_err(|e| invalid(format!("{file}: {e}")))
}

async fn execute(pool: &PgPool, who: &Who, cfg: &Config, checked: Checked) -> Done {
    match checked {
        Checked::Create(new, json) => {
            let local =
                LocalRecipients::from_config(cfg).context("reading [pepsi] LOCAL_DOMAINS")?;
            let list_id = store::create(pool, who, &local, &new).await?;
            print(
                json,
                &json!({"list": new.address, "list_id": list_id, "owners": new.owners}),
                |_| render::created(&new.address, &new.owners),
            )
        }
        Checked::Lists(json) => {
            let rows = store::lists(pool).await?;
            print(json, &json!({ "lists": rows }), |_| render::lists(&rows))
        }
        Checked::Show(l, json) => {
            let shown = store::show(pool, &l).await?;
            print(json, &shown, render::shown)
        }
        Checked::Configure(l, changes, json) => {
            let changed = store::configure(pool, who, &l, changes).await?;
            print(json, &json!({"list": l, "changed": changed}), |_| {
                render::configured(&l, &changed)
            })
        }
        Checked::Delete(l, json) => {
            let roles = store::delete(pool, who, &l).await?;
            print(json, &json!({"list": l, "deleted": roles}), |_| {
                render::deleted(&l, &roles)
            })
        }
        Checked::Members(l, role, json) => {
            let rows = store::members(pool, &l, role).await?;
            print(json, &json!({"list": l, "members": rows}), |_| {
                render::members(&l, &rows)
            })
        }
        Checked::Add(a, l, addrs) => {
            let done = store::add(pool, who, &l, &addrs, a.role, &a.name, a.action).await?;
            print(a.out.json, &done, render::added)
        }
        Checked::Remove(a, l, addrs) => {
            let done = store::remove(pool, who, &l, &addrs, a.role).await?;
            print(a.out.json, &done, render::removed)
        }
        Checked::SetMode(l, address, m, json) => {
            let done = mode::set(pool, who, &l, &address, m).await?;
            print(json, &done, mode::render)
        }
        Checked::Import(a, l, parsed) => import(pool, who, a, &l, parsed).await,
        Checked::Export(l, role) => {
            let rows = store::export(pool, &l, role).await?;
            members_csv::write(std::io::stdout().lock(), &rows).context("writing the CSV")?;
            Ok(())
        }
        Checked::Forget(address, json) => {
            let done = store::forget(pool, who, &address).await?;
            print(json, &done, render::forgotten)
        }
        Checked::Held(l, json) => {
            let rows = store::held(pool, &l).await?;
            print(json, &json!({"list": l, "held": rows}), |_| {
                render::held(&l, &rows)
            })
        }
        Checked::Decide(l, ids, verdict, json) => {
            let done = store::decide(pool, who, &l, &ids, &verdict).await?;
            print(json, &done, render::decided)
        }
        Checked::Ban(l, pattern, reason, json) => {
            if let moderation::Pattern::Regex(p) = &pattern {
                store::check_regex(pool, p).await?;
            }
            let done = store::ban(pool, who, l.as_deref(), pattern.as_str(), &reason).await?;
            print(json, &done, |b| render::ban_changed(b, true))
        }
        Checked::Unban(l, pattern, json) => {
            let done = store::unban(pool, who, l.as_deref(), &pattern).await?;
            print(json, &done, |b| render::ban_changed(b, false))
        }
        Checked::Filter(l, new, json) => {
            let done = filters::add(pool, who, &l, &new).await?;
            print(json, &done, filters::render_added)
        }
        Checked::Unfilter(l, position, json) => {
            let done = filters::remove(pool, who, &l, position).await?;
            print(json, &done, filters::render_removed)
        }
        Checked::Filters(l, json) => {
            let rows = filters::list(pool, &l).await?;
            print(json, &json!({"list": l, "filters": rows}), |_| {
                filters::render_list(&l, &rows)
            })
        }
        Checked::ContentFilter(l, run, json) => {
            let done = match run {
                ContentFilterRun::Show => content::show(pool, &l).await?,
                ContentFilterRun::Set(change) => content::set(pool, who, &l, &change).await?,
                ContentFilterRun::Clear => content::clear(pool, who, &l).await?,
            };
            print(json, &done, content::render)
        }
        Checked::Maintain(settings, json) => {
            let done = maintain::run(pool, who, &settings).await?;
            print(json, &done, maintain::render)
        }
        Checked::Bans(l, json) => {
            let rows = store::bans(pool, l.as_deref()).await?;
            print(json, &json!({"list": l, "bans": rows}), |_| {
                render::bans(&rows)
            })
        }
    }
}

async fn import(
    pool: &PgPool,
    who: &Who,
    a: ImportArgs,
    list: &str,
    parsed: members_csv::Parsed,
) -> Done {
    let total = parsed.entries.len();
    let mut run = store::Import::begin(pool, list, &a.file).await?;
    let mut added = 0usize;
    let mut done = 0usize;
    for chunk in parsed.entries.chunks(IMPORT_CHUNK) {
        added += run.chunk(who, chunk).await?;
        done += chunk.len();
        if chunk.len() == IMPORT_CHUNK {
            eprintln!(
                "{list}: {done} of {total} addresses done ({added} added, {} already members)",
                done - added
            );
        }
    }
    let report = render::Imported {
        list: list.to_owned(),
        file: a.file.clone(),
        dry_run: a.dry_run,
        rows: parsed.rows,
        added: added as u64,
        already_members: (total - added) as u64,
        duplicates: parsed.duplicates,
        invalid: parsed.invalid,
    };
    let summary = json!({
        "file": report.file,
        "rows": report.rows,
        "added": report.added,
        "already_members": report.already_members,
        "duplicates": report.duplicates.len(),
        "invalid_lines": report.invalid.iter().map(|i| i.line).collect::<Vec<_>>(),
    });
    run.finish(who, summary, added, a.dry_run).await?;
    print(a.out.json, &report, render::imported)
}
