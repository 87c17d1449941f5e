//! pepsi-stage-list: mail to mailing lists (docs/lists.md). A message's recipients that are
//! addresses of an existing list (`pepsi_contract::list`) are handled here; the others go on
//! to NEXT_STAGE on a row of their own.
//!
//! Reads: the envelope and the header block (`Load::Headers`), the body of a post it
//! accepts or holds (`fetch_body`, at most the list's `max_message_size` plus the room of a
//! too-large post's hold), `pepsi.mailing_list`, `list_member`, `list_member_preference`,
//! `list_ban`, `list_header_filter` and `list_content_filter`. Writes: `pepsi.list_post`
//! (one row per accepted post and queue row, which keeps a re-run pass from fanning out
//! twice), the fan-out rows (`pepsi.list_fanout`: one
//! row per member at DELIVER_STAGE with the member's VERP envelope sender, all sharing one
//! body), `list_held_message`, `list_bounce_event`, `list_bounce_score`, a member's
//! `delivery_status` (bounces, complaints), `list_event_log`, and the archive's tables
//! (`pepsi_archive::store::archive_post`) for each accepted post of a list whose
//! `archive_policy` is not `none`.
//!
//! What each list address does:
//! - a post: the posting policy (`plan`) accepts it (the list copy of `post` to every
//!   enabled member), holds it for a moderator, rejects it (a DSN to the sender, 5.7.1),
//!   discards it, or defers it (tried again later, 4.7.1);
//! - `-owner`: the message as it is to every owner, with the list's `-bounces` address as
//!   envelope sender;
//! - `-bounces` and VERP addresses: the report read (`bounces`: RFC 3464 DSNs, RFC 5965
//!   complaints) and recorded in `list_bounce_event` for the member the VERP address names
//!   (else the members the report names); hard and soft bounces scored in
//!   `list_bounce_score`, delivery disabled at the list's threshold; a complaint disables
//!   delivery as the member's wish;
//! - `-join`, `-leave`, `-request`, `-confirm+…`: subscribing and leaving by mail, each
//!   confirmed by the address it concerns (`commands`).
//!
//! The list recipients end like a delivery's (`delivery::conclude_here`): accepted, held,
//! discarded and recorded ones as delivered (the mail log says which), refused ones bounced,
//! deferred ones retried under the section's retry options.

use std::cell::RefCell;
use std::process::ExitCode;

use content::{ContentFilter, EmptyAction, Filtered};
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::list::{Command, ListAddress};
use pepsi_contract::list_directory::ListDirectory;
use pepsi_contract::round::RoundMemo;
use pepsi_contract::stage::edges::Declare;
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_outbound::delivery::{self, Delivery, Failure, RcptResult, RetryPolicy};
use sqlx::Row as _;

pub mod bounces;
pub mod commands;
pub mod content;
pub mod dmarc;
pub mod plan;
pub mod post;

use plan::{Action, Decision, Facts};
use post::ListFacts;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-list",
        exec: "pepsi-stage-list",
    };
    pub const PROGRAM: &str = "pepsi-stage-list";
}

/// Where the members' copies start unless `DELIVER_STAGE` says otherwise: routed like any
/// mail, so a member may be a local mailbox, an alias or a remote address.
pub const DEFAULT_DELIVER_STAGE: &str = "aliases";

/// The most of a bounce report read beyond the list's `max_message_size` (a report may
/// return the whole post).
pub const MAX_REPORT_READ: u64 = 256 * 1024;

/// One `[stage-<name>]` section, read at start.
#[derive(Debug, Clone)]
pub struct Options {
    /// `DELIVER_STAGE`: where the members' and owners' copies start.
    pub deliver_stage: String,
    /// The retry options (`RETRY_*`, `MAX_LIFETIME`) of deferred posts.
    pub policy: RetryPolicy,
    /// `HOSTNAME` (else `[pepsi] HOSTNAME`, else the system's): the domain of the
    /// Message-IDs of the list's own messages (confirmations, help).
    pub hostname: String,
    /// `[pepsi] LIST_WEB_URL`: the public base of the list pages (`https://host`, no
    /// trailing slash), for one-click unsubscribe links; `None`: the copies carry none.
    pub web_url: Option<String>,
    /// `DNS_SERVERS` (else `[pepsi]`, else the system's): where From domains' DMARC
    /// policies are asked.
    pub dns_servers: Vec<std::net::SocketAddr>,
    /// `DNS_TIMEOUT` (else `[pepsi]`, 5s): per query and server.
    pub dns_timeout: std::time::Duration,
    /// `DMARC_TIMEOUT` (10s, 1s to 60s): the most one post's DMARC lookup may take; past
    /// it the domain counts as `p=reject`.
    pub dmarc_timeout: std::time::Duration,
    /// `DMARC_CACHE` (4h, 1h to 1d): how long a looked-up policy is kept.
    pub dmarc_cache: std::time::Duration,
    /// The resolver, made on first use.
    pub dns: DnsCell,
    /// `REFUSAL_NOTICES` (3, 0 to 100): the most refusals (DSNs) one envelope sender is
    /// sent per list and day; past it a refused post is dropped without one, so a flood of
    /// forged senders gets no flood of bounces (`list_autoresponse`, kind `reject_notice`).
    pub refusal_notices: u32,
    /// `CONFIRMATIONS_PER_CLIENT` (`list`): the most confirmations one SMTP client may
    /// cause by mail per list in each `confirm_window`, counted with the web's per-client
    /// count (`commands`).
    pub confirm_limit_per_client: ClientLimit,
    /// `PATTERN_TIMEOUT` (2s, 1s to 30s): the most PostgreSQL may spend matching a post's
    /// sender and header fields against the list's ban and header filter patterns; past
    /// it the post is held for a moderator (`pattern_check`).
    pub pattern_timeout: std::time::Duration,
}

/// The default of `REFUSAL_NOTICES`.
pub const DEFAULT_REFUSAL_NOTICES: u32 = 3;

/// The most `CONFIRMATIONS_PER_CLIENT` may be, as the lists' `confirm_limit_per_client`.
pub const MAX_CONFIRMATIONS_PER_CLIENT: u32 = 100_000;

/// `CONFIRMATIONS_PER_CLIENT`: how many confirmations requested by mail one client may
/// cause per list and `confirm_window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientLimit {
    /// `list` (the default): the list's `confirm_limit_per_client`, as on the web.
    List,
    /// `0`: no limit per client by mail (every request comes through one relay, say).
    Off,
    /// `1` to [`MAX_CONFIRMATIONS_PER_CLIENT`]: this many, whatever the list says.
    At(u32),
}

impl ClientLimit {
    /// The option's value: `list`, `0`, or 1 to [`MAX_CONFIRMATIONS_PER_CLIENT`].
    pub fn parse(text: &str) -> Result<ClientLimit, String> {
        let v = text.trim();
        if v.eq_ignore_ascii_case("list") {
            return Ok(ClientLimit::List);
        }
        match v.parse::<u32>() {
            Ok(0) => Ok(ClientLimit::Off),
            Ok(n) if n <= MAX_CONFIRMATIONS_PER_CLIENT => Ok(ClientLimit::At(n)),
            _ => Err(format!(
                "expected list (the list's confirm_limit_per_client), 0 (no limit) or 1 to \
                 {MAX_CONFIRMATIONS_PER_CLIENT}"
            )),
        }
    }
}

/// The DMARC lookups' resolver (`pepsi_outbound::dns`), made when a post first needs it and
/// then shared by the section's passes; `None` inside when it could not be made (no
/// `/etc/resolv.conf` and no `DNS_SERVERS`: every lookup then counts as failed).
#[derive(Clone, Default)]
pub struct DnsCell(std::sync::Arc<std::sync::OnceLock<Option<pepsi_outbound::dns::Dns>>>);

impl std::fmt::Debug for DnsCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DnsCell")
    }
}

impl DnsCell {
    fn get(
        &self,
        servers: &[std::net::SocketAddr],
        timeout: std::time::Duration,
    ) -> Option<&pepsi_outbound::dns::Dns> {
        self.0
            .get_or_init(|| match pepsi_outbound::dns::Dns::new(servers, timeout) {
                Ok(dns) => Some(dns),
                Err(e) => {
                    tracing::error!("DMARC lookups: {e:#}");
                    None
                }
            })
            .as_ref()
    }
}

/// `[pepsi] LIST_WEB_URL`: empty or unset is none; otherwise an `https://` URL of a host
/// (and port, and path) without a trailing slash, query, fragment, white space, braces or
/// quotes, because it is written into header fields and footers.
pub fn web_url_value(text: &str) -> Result<Option<String>, String> {
    let v = text.trim();
    if v.is_empty() {
        return Ok(None);
    }
    let expected = "an https:// URL without a trailing slash, such as https://lists.example.org";
    let Some(rest) = v.strip_prefix("https://") else {
        return Err(expected.into());
    };
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty()
        || v.ends_with('/')
        || v.chars().any(|c| {
            c.is_whitespace()
                || c.is_control()
                || !c.is_ascii()
                || matches!(c, '?' | '#' | '"' | '<' | '>' | '{' | '}' | '\\' | ',')
        })
    {
        return Err(expected.into());
    }
    Ok(Some(v.to_owned()))
}

impl Options {
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Options> {
        let s = cfg.stage_section_named(stage);
        let deliver_stage = s
            .string_opt("DELIVER_STAGE")?
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| DEFAULT_DELIVER_STAGE.to_owned());
        if cfg.stage(&deliver_stage).is_none() {
            anyhow::bail!(
                "{}: [stage-{stage}] DELIVER_STAGE = {deliver_stage}: there is no [stage-{deliver_stage}]",
                cfg.file().display()
            );
        }
        let layered = s.or_global();
        let within =
            |opt: &str, default: u64, min: u64, max: u64| -> anyhow::Result<std::time::Duration> {
                let v = s
                    .duration_opt(opt)?
                    .unwrap_or(std::time::Duration::from_secs(default));
                if v.as_secs() < min || v.as_secs() > max {
                    anyhow::bail!(
                        "{}: [stage-{stage}] {opt} = {}: expected {} to {}",
                        cfg.file().display(),
                        options_duration(v.as_secs()),
                        options_duration(min),
                        options_duration(max)
                    );
                }
                Ok(v)
            };
        Ok(Options {
            deliver_stage,
            policy: RetryPolicy::from_config(cfg, stage)?,
            hostname: cfg.name_option(&s, "HOSTNAME")?,
            web_url: cfg
                .section("pepsi")
                .parse_opt("LIST_WEB_URL", web_url_value)?
                .flatten(),
            dns_servers: pepsi_outbound::dns::servers_opt(layered.section_for("DNS_SERVERS"))?
                .unwrap_or_default(),
            dns_timeout: layered
                .duration_opt("DNS_TIMEOUT")?
                .filter(|v| !v.is_zero())
                .unwrap_or(std::time::Duration::from_secs(5)),
            dmarc_timeout: within("DMARC_TIMEOUT", 10, 1, 60)?,
            dmarc_cache: within("DMARC_CACHE", 4 * 3600, 3600, 86_400)?,
            dns: DnsCell::default(),
            refusal_notices: match s.number_opt::<u32>("REFUSAL_NOTICES")? {
                None => DEFAULT_REFUSAL_NOTICES,
                Some(n) if n <= 100 => n,
                Some(n) => anyhow::bail!(
                    "{}: [stage-{stage}] REFUSAL_NOTICES = {n}: expected 0 to 100",
                    cfg.file().display()
                ),
            },
            confirm_limit_per_client: s
                .parse_opt("CONFIRMATIONS_PER_CLIENT", ClientLimit::parse)?
                .unwrap_or(ClientLimit::List),
            pattern_timeout: within("PATTERN_TIMEOUT", 2, 1, 30)?,
        })
    }
}

/// `3600` as `1h`, for the messages of `Options`.
fn options_duration(secs: u64) -> String {
    match secs {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// A list as the stage reads it.
#[derive(Debug, Clone)]
struct List {
    id: i64,
    address: String,
    display_name: String,
    subject_prefix: String,
    reply_goes_to: String,
    reply_to_address: Option<String>,
    member_action: Action,
    nonmember_action: Action,
    emergency: bool,
    max_message_size: u64,
    /// `munge_from`, `wrap` or `none` (`dmarc`).
    dmarc_mitigation: String,
    /// `personalize = individual`: a footer of each member's own.
    personalize: bool,
    /// `archive_policy` is not `none`: accepted posts are archived (`pepsi_archive`).
    archive: bool,
    /// `digests_enabled` and an enabled member takes digests: accepted posts are also
    /// collected into the list's digest (`pepsi_list_digest`).
    digesting: bool,
    /// The list's content filter (`list_content_filter`), when it has one that can change
    /// a post.
    content_filter: Option<ContentFilter>,
}

impl Options {
    /// Where the lists' digests start, and what names their Message-IDs and members' links.
    fn digest_route(&self) -> pepsi_list_digest::Route<'_> {
        pepsi_list_digest::Route {
            deliver_stage: &self.deliver_stage,
            hostname: &self.hostname,
            web_url: self.web_url.as_deref(),
        }
    }
}

impl List {
    fn facts(&self) -> ListFacts<'_> {
        ListFacts {
            address: &self.address,
            display_name: &self.display_name,
            subject_prefix: &self.subject_prefix,
            reply_goes_to: &self.reply_goes_to,
            reply_to_address: self.reply_to_address.as_deref(),
        }
    }
}

const LISTS: &str = "SELECT list_id, address, display_name, subject_prefix, reply_goes_to, \
    reply_to_address, member_action, nonmember_action, emergency, max_message_size, \
    dmarc_mitigation, personalize, archive_policy <> 'none' AS archive, \
    (digests_enabled AND EXISTS (SELECT 1 FROM pepsi.list_member_preference p \
       JOIN pepsi.list_member m USING (member_id) \
       WHERE p.delivery_mode <> 'regular' AND m.list_id = l.list_id \
         AND m.role = 'member' AND m.delivery_status = 'enabled')) AS digesting, \
    cf.list_id IS NOT NULL AS has_content_filter, cf.filter_types, cf.pass_types, \
    cf.filter_extensions, cf.pass_extensions, cf.collapse_alternatives, cf.empty_action \
    FROM pepsi.mailing_list l LEFT JOIN pepsi.list_content_filter cf USING (list_id) \
    WHERE address = ANY($1)";

/// Per candidate list address, the list when it exists, as the round learnt it.
type Round = RoundMemo<String, Option<List>>;

/// The lists among the readings of `rcpt_to`, and per recipient its reading (if any). The
/// round's answers are asked first: only candidates it does not know cost a query, so a
/// round of mail to the same mailboxes asks once.
async fn resolve(
    round: &RefCell<Round>,
    directory: &ListDirectory,
    ctx: &StageContext<'_>,
    rcpt_to: &[String],
) -> Result<(Vec<List>, Vec<Option<ListAddress>>), StageError> {
    let candidates: Vec<Vec<ListAddress>> =
        rcpt_to.iter().map(|r| ListAddress::candidates(r)).collect();
    // Every list's address, when the directory can vouch for it: a candidate that is none
    // is answered without a query, so mail to mailboxes costs nothing here.
    let known = if candidates.iter().all(Vec::is_empty) {
        None
    } else {
        directory.addresses(ctx.pool()).await?
    };
    let missing: Vec<String> = {
        let mut round = round.borrow_mut();
        round.expire();
        let mut missing: Vec<String> = Vec::new();
        for c in candidates.iter().flatten() {
            if round.knows(c.list.as_str()) || missing.contains(&c.list) {
                continue;
            }
            if known.as_ref().is_some_and(|k| !k.contains(&c.list)) {
                round.insert(c.list.clone(), None);
                continue;
            }
            missing.push(c.list.clone());
        }
        missing
    };
    if !missing.is_empty() {
        let rows = sqlx::query(LISTS)
            .bind(&missing)
            .fetch_all(ctx.pool())
            .await?;
        let mut found = Vec::with_capacity(rows.len());
        for row in rows {
            let action = |col: &str| -> Result<Action, StageError> {
                let word: String = row.try_get(col)?;
                Action::parse(&word)
                    .ok_or_else(|| StageError::Invalid(format!("mailing_list.{col} = {word:?}")))
            };
            found.push(List {
                id: row.try_get("list_id")?,
                address: row.try_get("address")?,
                display_name: row.try_get("display_name")?,
                subject_prefix: row.try_get("subject_prefix")?,
                reply_goes_to: row.try_get("reply_goes_to")?,
                reply_to_address: row.try_get("reply_to_address")?,
                member_action: action("member_action")?,
                nonmember_action: action("nonmember_action")?,
                emergency: row.try_get("emergency")?,
                max_message_size: row.try_get::<i64, _>("max_message_size")?.max(0) as u64,
                dmarc_mitigation: row.try_get("dmarc_mitigation")?,
                personalize: row.try_get::<String, _>("personalize")? == "individual",
                archive: row.try_get("archive")?,
                digesting: row.try_get("digesting")?,
                content_filter: content_filter(&row)?,
            });
        }
        let mut round = round.borrow_mut();
        for name in missing {
            let list = found.iter().find(|l| l.address == name).cloned();
            round.insert(name, list);
        }
    }
    let mut round = round.borrow_mut();
    let mut lists: Vec<List> = Vec::new();
    let mut readings = Vec::with_capacity(candidates.len());
    for cs in candidates {
        let reading = cs
            .into_iter()
            .find(|c| matches!(round.get(c.list.as_str()), Some(Some(_))));
        if let Some(r) = &reading
            && !lists.iter().any(|l| l.address == r.list)
            && let Some(Some(list)) = round.get(r.list.as_str())
        {
            lists.push(list.clone());
        }
        readings.push(reading);
    }
    Ok((lists, readings))
}

/// The ban, then the list's header filters, each under `timeout`: whether `sender` is
/// banned, and the first filter (by position) whose field has a value its pattern matches,
/// with its description. Patterns are POSIX regular expressions run by PostgreSQL, and some
/// (back-references) take time steeply growing with a value's length: a check cut off by
/// the timeout holds the post for a moderator, naming why, rather than tying up a database
/// backend or failing the pass again and again. The ban is asked apart, so header fields
/// made to be slow cannot hide a ban: a banned sender is refused whatever the filters do.
async fn pattern_check(
    pool: &sqlx::PgPool,
    timeout: std::time::Duration,
    list_id: i64,
    sender: &str,
    names: &[String],
    values: &[String],
) -> Result<(bool, Option<(Action, String)>), StageError> {
    let cut_off = |what: &str| {
        let why = format!(
            "matching the list's {what} took longer than {} (PATTERN_TIMEOUT)",
            options_duration(timeout.as_secs())
        );
        tracing::warn!(list_id, %sender, "{why}");
        (Action::Hold, why)
    };
    let timed_out =
        |e: &sqlx::Error| e.as_database_error().and_then(|d| d.code()).as_deref() == Some("57014");
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT set_config('statement_timeout', $1, true)")
        .bind(format!("{}ms", timeout.as_millis()))
        .execute(&mut *tx)
        .await?;
    let banned =
        sqlx::query_scalar::<_, bool>(concat!("SELECT ", pepsi_contract::list_banned_sql!()))
            .bind(list_id)
            .bind(sender)
            .fetch_one(&mut *tx)
            .await;
    let banned = match banned {
        Ok(b) => b,
        Err(e) if timed_out(&e) => return Ok((false, Some(cut_off("ban patterns")))),
        Err(e) => return Err(e.into()),
    };
    if banned {
        tx.commit().await?;
        return Ok((true, None));
    }
    let row = sqlx::query(
        "SELECT f.action, f.position, f.header FROM pepsi.list_header_filter f \
         WHERE f.list_id = $1 AND EXISTS \
           (SELECT 1 FROM unnest($2::text[], $3::text[]) AS h(name, value) \
            WHERE lower(h.name) = lower(f.header) AND h.value ~* f.pattern) \
         ORDER BY f.position LIMIT 1",
    )
    .bind(list_id)
    .bind(names)
    .bind(values)
    .fetch_optional(&mut *tx)
    .await;
    let row = match row {
        Ok(row) => row,
        Err(e) if timed_out(&e) => return Ok((false, Some(cut_off("header filter patterns")))),
        Err(e) => return Err(e.into()),
    };
    tx.commit().await?;
    let filter = match row {
        None => None,
        Some(row) => {
            let word: String = row.try_get("action")?;
            let action = Action::parse(&word).ok_or_else(|| {
                StageError::Invalid(format!("list_header_filter.action = {word:?}"))
            })?;
            let position: i32 = row.try_get("position")?;
            let header: String = row.try_get("header")?;
            Some((action, format!("header filter {position} ({header})")))
        }
    };
    Ok((false, filter))
}

/// The content filter of a `LISTS` row: `None` without one, or with one that changes nothing.
fn content_filter(row: &sqlx::postgres::PgRow) -> Result<Option<ContentFilter>, StageError> {
    if !row.try_get::<bool, _>("has_content_filter")? {
        return Ok(None);
    }
    let word: String = row.try_get("empty_action")?;
    let empty_action = EmptyAction::parse(&word).ok_or_else(|| {
        StageError::Invalid(format!("list_content_filter.empty_action = {word:?}"))
    })?;
    let filter = ContentFilter {
        filter_types: row.try_get("filter_types")?,
        pass_types: row.try_get("pass_types")?,
        filter_extensions: row.try_get("filter_extensions")?,
        pass_extensions: row.try_get("pass_extensions")?,
        collapse_alternatives: row.try_get("collapse_alternatives")?,
        empty_action,
    };
    Ok(filter.is_active().then_some(filter))
}

/// The list stage: which lists exist (the directory), and the round's answers about them.
#[derive(Default)]
pub struct ListStage {
    round: RefCell<Round>,
    /// Which lists exist, kept for the life of the worker.
    directory: ListDirectory,
}

impl Stage for ListStage {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Headers;
    // Local work (lookups, a fan-out statement): its passes batch, so a batching chain from
    // route fuses it rather than handing every local message to a pool of its own.
    const BATCH: bool = true;
    type Section = Options;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self::default())
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    /// NEXT_STAGE for the other recipients, DELIVER_STAGE (default `aliases`) where the
    /// members' copies start.
    fn edges(d: &mut Declare<'_>) {
        d.next();
        let deliver = d
            .option("DELIVER_STAGE")
            .unwrap_or_else(|| DEFAULT_DELIVER_STAGE.to_owned());
        d.branch("DELIVER_STAGE", deliver, "list");
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let (lists, readings) = resolve(&self.round, &self.directory, ctx, ctx.rcpt_to()).await?;
        if readings.iter().all(Option::is_none) {
            return ctx.advance();
        }
        let others: Vec<usize> = (0..readings.len())
            .filter(|&i| readings[i].is_none())
            .collect();
        let mut readings = readings;
        if !others.is_empty() {
            let next = ctx
                .options()
                .next_stage
                .clone()
                .ok_or_else(|| StageError::NoNextStage(ctx.options().name.to_string()))?;
            ctx.split_off_recipients(&others, &next).await?;
            readings.retain(Option::is_some);
        }
        let mut results = Vec::with_capacity(readings.len());
        for reading in readings.into_iter().flatten() {
            let list = lists
                .iter()
                .find(|l| l.address == reading.list)
                .expect("a reading is of a list found");
            let result = match &reading.command {
                Command::Post => self.post(options, ctx, list).await?,
                Command::Owner => self.to_owners(options, ctx, list).await?,
                Command::Bounces(member) => self.bounce(ctx, list, member.as_deref()).await?,
                Command::Join => commands::join(options, ctx, list).await?,
                Command::Leave => commands::leave(options, ctx, list).await?,
                Command::Request => commands::request_message(options, ctx, list).await?,
                Command::Confirm(token) => commands::confirm(options, ctx, list, token).await?,
            };
            results.push(result);
        }
        delivery::conclude_here(ctx, &options.policy, &results)
    }

    /// The round's answers are forgotten: the next round reads the lists afresh.
    async fn before_commit(&self) -> Result<(), StageError> {
        self.round.borrow_mut().clear();
        Ok(())
    }
}

impl ListStage {
    /// A post: the policy's decision, carried out.
    async fn post(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
        list: &List,
    ) -> Result<RcptResult, StageError> {
        let headers = ctx.headers()?.to_vec();
        let sender = sender_of(ctx)?.unwrap_or_default();
        // A moderator's approval for this list (`pepsi-list approve`): only pepsi-list writes
        // the key, on the row it injects with the held post.
        let approval = pepsi_contract::state::ListApproval::from_state(ctx.state())?
            .filter(|a| a.approves(list.id));
        let pool = ctx.pool();
        let rule = sqlx::query(
            "SELECT role, moderation_action FROM pepsi.list_member \
             WHERE list_id = $1 AND address = $2 AND role IN ('member', 'nonmember')",
        )
        .bind(list.id)
        .bind(&sender)
        .fetch_all(pool)
        .await?;
        let is_member = rule
            .iter()
            .any(|r| r.try_get::<String, _>("role").is_ok_and(|v| v == "member"));
        let own_action = rule
            .iter()
            .filter_map(|r| {
                r.try_get::<Option<String>, _>("moderation_action")
                    .ok()
                    .flatten()
            })
            .find_map(|w| Action::parse(&w));
        // The ban and the list's header filters, in one query: the first filter (by
        // position) whose field has a value its pattern matches decides.
        let (names, values) = header_pairs(&headers);
        let (banned, filter) = pattern_check(
            pool,
            options.pattern_timeout,
            list.id,
            &sender,
            &names,
            &values,
        )
        .await?;
        let facts = list.facts();
        // The body is fetched for a post that is accepted or held; its size decides too.
        let Some(body) = ctx
            .fetch_body(list.max_message_size.saturating_mul(4))
            .await?
        else {
            return Ok(RcptResult::Permanent(Failure::new(
                format!(
                    "the post is more than four times the list's limit of {} bytes",
                    list.max_message_size
                ),
                "5.3.4",
            )));
        };
        let body = body.to_vec();
        let mut decision = plan::decide(&Facts {
            sender: &sender,
            is_member,
            own_action,
            banned,
            filter,
            own_list_id: post::carries_list_id(&headers, &facts.list_id())
                || post::carries_loop(&headers, list.address.as_str()),
            approved: approval.is_some(),
            emergency: list.emergency,
            size: (headers.len() + 2 + body.len()) as u64,
            max_message_size: list.max_message_size,
            member_action: list.member_action,
            nonmember_action: list.nonmember_action,
        });
        // What the members get of an accepted post: the list's content filter decides.
        let mut filtered = None;
        if decision == Decision::Accept
            && let Some(cf) = &list.content_filter
        {
            match content::filter(cf, &headers, &body) {
                Filtered::Unchanged => {}
                Filtered::Changed {
                    headers,
                    body,
                    removed,
                } => {
                    tracing::info!(id = ctx.id(), list = %list.address, ?removed, "list content filtered");
                    filtered = Some((headers, body));
                }
                Filtered::Empty { removed } => {
                    decision = plan::when_empty(cf.empty_action, approval.is_some(), &removed);
                }
            }
        }
        let id = ctx.id();
        let approved_by = approval.as_ref().map(|a| a.moderator.as_str());
        let held_id = approval.as_ref().map(|a| a.held_id);
        tracing::info!(id, list = %list.address, %sender, ?decision, approved_by, held_id, "list post");
        Ok(match decision {
            Decision::Accept => {
                let ask = dmarc::Asker {
                    dns: if list.dmarc_mitigation == "none" {
                        None
                    } else {
                        options.dns.get(&options.dns_servers, options.dns_timeout)
                    },
                    timeout: options.dmarc_timeout,
                    cache_for: options.dmarc_cache,
                };
                let (sent_headers, sent_body) = match &filtered {
                    Some((h, b)) => (h.as_slice(), b.as_slice()),
                    None => (headers.as_slice(), body.as_slice()),
                };
                let (post_headers, post_body, _) = dmarc::mitigate(
                    pool,
                    &ask,
                    &list.dmarc_mitigation,
                    sent_headers,
                    sent_body,
                    &facts,
                )
                .await;
                let web_url = options.web_url.as_deref();
                let copy_headers = post::shared_headers(&post_headers, &facts);
                let (copy_body, footer) = post::body_and_footer(
                    &copy_headers,
                    &post_body,
                    &facts,
                    list.personalize,
                    web_url,
                );
                let member_fields =
                    pepsi_list_digest::message::unsubscribe_fields(facts.address, web_url);
                let subject = pepsi_contract::message::field_values(&headers, "Subject")
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                let message_id = pepsi_contract::message::field_values(&headers, "Message-ID")
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                let mut tx = pool.begin().await?;
                let post_id: Option<i64> = sqlx::query_scalar(
                    "INSERT INTO pepsi.list_post \
                     (list_id, message_id, sender, subject, workqueue_id, size) \
                     VALUES ($1, $2, $3, $4, $5, $6) \
                     ON CONFLICT (list_id, workqueue_id) DO NOTHING RETURNING post_id",
                )
                .bind(list.id)
                .bind(&message_id)
                .bind(&sender)
                .bind(&subject)
                .bind(id)
                .bind((headers.len() + 2 + body.len()) as i64)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(post_id) = post_id else {
                    // A pass run again after its fan-out committed: the members have it.
                    tx.rollback().await?;
                    return Ok(delivered("accepted by the list (sent before)"));
                };
                let skip: Vec<String> = sqlx::query_scalar(
                    "SELECT m.address FROM pepsi.list_member m \
                     JOIN pepsi.list_member_preference p USING (member_id) \
                     WHERE m.list_id = $1 AND m.role = 'member' AND m.address = $2 \
                       AND NOT p.receive_own_postings",
                )
                .bind(list.id)
                .bind(&sender)
                .fetch_all(&mut *tx)
                .await?;
                if list.digesting {
                    // Before reading who takes regular copies: a member's change of mode
                    // then falls wholly before or after this post
                    // (`pepsi_list_digest::store::switch`).
                    pepsi_list_digest::store::lock_open(&mut tx, list.id).await?;
                }
                // One row per regular member, each with its own unsubscribe fields (and
                // footer, for a personal one); the digests take the others' share.
                let n: i32 = sqlx::query_scalar(
                    "SELECT pepsi.list_fanout($1, 'member', $2, $3, $4, '', true, $5, \
                     '{}', NULL, 'regular', $6, $7)",
                )
                .bind(list.id)
                .bind(&options.deliver_stage)
                .bind(&copy_headers)
                .bind(&copy_body)
                .bind(&skip)
                .bind(&member_fields)
                .bind(&footer)
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query("UPDATE pepsi.list_post SET recipients = $2 WHERE post_id = $1")
                    .bind(post_id)
                    .bind(n)
                    .execute(&mut *tx)
                    .await?;
                if list.digesting {
                    let digest = pepsi_list_digest::Post {
                        headers: &copy_headers,
                        body: &copy_body,
                    };
                    let route = options.digest_route();
                    let sent = pepsi_list_digest::store::collect(
                        &mut tx, &route, list.id, &sender, &subject, digest,
                    )
                    .await?;
                    if let Some(s) = sent {
                        tracing::info!(id, list = %list.address, digest = ?s, "list digest sent");
                    }
                }
                // The post as it came, after the content filter and before the list's
                // changes (DMARC mitigation, List-* fields, footer): in the same
                // transaction as its list_post row, so a pass run again archives nothing.
                if list.archive {
                    let archived = pepsi_archive::store::archive_post(
                        &mut tx,
                        list.id,
                        sent_headers,
                        sent_body,
                        chrono::Utc::now(),
                    )
                    .await
                    .map_err(archive_error)?;
                    tracing::info!(id, list = %list.address, url_id = archived.as_ref().map(|a| a.url_id.as_str()), "list post archived");
                }
                tx.commit().await?;
                ctx.note_rows_created();
                tracing::info!(id, list = %list.address, post_id, members = n, "list post sent");
                delivered(&format!("accepted by the list for {n} members"))
            }
            Decision::Hold(reason) => {
                let subject = pepsi_contract::message::field_values(&headers, "Subject")
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                let message_id = pepsi_contract::message::field_values(&headers, "Message-ID")
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                // Held once per queue row (an at-most-once token): a pass run again finds
                // its own hold.
                sqlx::query(
                    "WITH once AS (INSERT INTO pepsi.clone_token (token) VALUES ($9) \
                                   ON CONFLICT DO NOTHING RETURNING 1) \
                     INSERT INTO pepsi.list_held_message \
                     (list_id, sender, mail_from, subject, message_id, reason, headers, body, expires_at) \
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, now() + held_lifetime \
                     FROM pepsi.mailing_list l WHERE l.list_id = $1 AND EXISTS (SELECT 1 FROM once)",
                )
                .bind(list.id)
                .bind(&sender)
                .bind(ctx.mail_from())
                .bind(&subject)
                .bind(&message_id)
                .bind(&reason)
                .bind(&headers)
                .bind(&body)
                .bind(format!("list-hold:{id}:{}", list.id))
                .execute(pool)
                .await?;
                delivered(&format!("held for the list's moderators: {reason}"))
            }
            Decision::Reject(reason) => {
                if refusal_notice(options, ctx, list).await? {
                    RcptResult::Permanent(Failure::new(
                        format!("{} refused the post: {reason}", list.address),
                        "5.7.1",
                    ))
                } else {
                    tracing::info!(id, list = %list.address, mail_from = ctx.mail_from(), "refused without a notice: the day's notices to this sender are spent");
                    delivered(&format!(
                        "refused by the list ({reason}); no notice: the sender had {} today",
                        options.refusal_notices
                    ))
                }
            }
            Decision::Discard(reason) => delivered(&format!("discarded by the list: {reason}")),
            Decision::Defer(reason) => RcptResult::Transient(Failure::new(
                format!("{} deferred the post: {reason}", list.address),
                "4.7.1",
            )),
        })
    }

    /// Mail to `-owner`: as it is, to every owner.
    async fn to_owners(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
        list: &List,
    ) -> Result<RcptResult, StageError> {
        let owner = list.facts().command_address("-owner");
        if post::carries_loop(ctx.headers()?, &owner) {
            return Ok(delivered(
                "owner mail that came back to the list (a loop): dropped",
            ));
        }
        let mut headers = ctx.headers()?.to_vec();
        post::mark_loop(&mut headers, &owner);
        let Some(body) = ctx
            .fetch_body(list.max_message_size.saturating_mul(4))
            .await?
        else {
            return Ok(RcptResult::Permanent(Failure::new(
                "the message is too large for the list's owners",
                "5.3.4",
            )));
        };
        let body = body.to_vec();
        let bounces = list.facts().command_address("-bounces");
        let n: i32 = sqlx::query_scalar(
            "SELECT pepsi.list_fanout($1, 'owner', $2, $3, $4, $5, false, '{}', '{}', $6)",
        )
        .bind(list.id)
        .bind(&options.deliver_stage)
        .bind(&headers)
        .bind(&body)
        .bind(&bounces)
        .bind(format!("list-owner:{}:{}", ctx.id(), list.id))
        .fetch_one(ctx.pool())
        .await?;
        if n < 0 {
            return Ok(delivered("sent to the list's owners (before)"));
        }
        if n == 0 {
            return Ok(RcptResult::Permanent(Failure::new(
                format!("{} has no owner to read this", list.address),
                "5.1.1",
            )));
        }
        ctx.note_rows_created();
        Ok(delivered(&format!("sent to the list's {n} owners")))
    }

    /// A bounce or a complaint (docs/lists.md, "Bounces"): the report read
    /// (`bounces::read`) and, for the member the VERP address names (else each member of
    /// the list the report names), a `list_bounce_event` row; a hard or soft bounce counted
    /// in `list_bounce_score` (`bounces::count`), delivery disabled at the threshold
    /// (`by_bounces`, `member.disable`); a complaint disables delivery as the member's own
    /// wish (`by_user`, `member.disable`). One transaction, at most once per queue row.
    async fn bounce(
        &self,
        ctx: &mut StageContext<'_>,
        list: &List,
        member: Option<&str>,
    ) -> Result<RcptResult, StageError> {
        // A report may return the whole post: room for the list's largest one.
        let limit = MAX_REPORT_READ.saturating_add(list.max_message_size);
        let Some(body) = ctx.fetch_body(limit).await? else {
            tracing::warn!(id = ctx.id(), list = %list.address, limit, "bounce report too large");
            return Ok(delivered(&format!(
                "a bounce report larger than {limit} bytes: dropped"
            )));
        };
        let body = body.to_vec();
        let raw = pepsi_contract::message::join(ctx.headers()?, &body);
        let report = bounces::read(&raw);
        if report.findings.is_empty() {
            return Ok(delivered(
                "a bounce without a failure status or a complaint: dropped",
            ));
        }
        let mut tx = ctx.pool().begin().await?;
        let targets: Vec<(String, bounces::Finding)> = match member {
            Some(m) => report
                .about(m)
                .map(|f| vec![(m.to_owned(), f.clone())])
                .unwrap_or_default(),
            None => {
                let named = report.named();
                let addresses: Vec<String> = named.iter().map(|(a, _)| (*a).to_owned()).collect();
                let members: Vec<String> = sqlx::query_scalar(
                    "SELECT address FROM pepsi.list_member \
                     WHERE list_id = $1 AND role = 'member' AND address = ANY($2)",
                )
                .bind(list.id)
                .bind(&addresses)
                .fetch_all(&mut *tx)
                .await?;
                named
                    .into_iter()
                    .filter(|(a, _)| members.iter().any(|m| m == a))
                    .map(|(a, f)| (a.to_owned(), f.clone()))
                    .collect()
            }
        };
        if targets.is_empty() {
            tx.rollback().await?;
            return Ok(delivered(
                "a bounce to the list's -bounces address naming no member: dropped",
            ));
        }
        // Once per queue row: a pass run again counts no bounce twice.
        let first: Option<i32> = sqlx::query_scalar(
            "INSERT INTO pepsi.clone_token (token) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1",
        )
        .bind(format!("list-bounce:{}:{}", ctx.id(), list.id))
        .fetch_optional(&mut *tx)
        .await?;
        if first.is_none() {
            tx.rollback().await?;
            return Ok(delivered("the bounce was recorded before"));
        }
        let (threshold, stale_after_secs): (f64, f64) = sqlx::query_as(
            "SELECT bounce_score_threshold::float8, \
                    extract(epoch FROM bounce_info_stale_after)::float8 \
               FROM pepsi.mailing_list WHERE list_id = $1",
        )
        .bind(list.id)
        .fetch_one(&mut *tx)
        .await?;
        let rules = bounces::Rules {
            threshold,
            stale_after_secs,
        };
        let mut said: Vec<String> = Vec::with_capacity(targets.len());
        for (address, finding) in &targets {
            said.push(record_bounce(&mut tx, list, address, finding, &report, rules).await?);
        }
        tx.commit().await?;
        let said = said.join("; ");
        tracing::info!(id = ctx.id(), list = %list.address, %said, "list bounce");
        Ok(delivered(&said))
    }
}

/// A failure of the archive as the stage's: the database's as itself (temporary).
fn archive_error(e: pepsi_archive::store::Error) -> StageError {
    match e {
        pepsi_archive::store::Error::Database(e) => e.into(),
        other => StageError::Invalid(format!("archive: {other}")),
    }
}

/// One finding of a report about `address`, stored in `tx`: its event, the score, and a
/// member's delivery disabled when the score reaches the threshold or the finding is a
/// complaint. Says what it did.
async fn record_bounce(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    list: &List,
    address: &str,
    finding: &bounces::Finding,
    report: &bounces::Report,
    rules: bounces::Rules,
) -> Result<String, StageError> {
    let kind = finding.kind.as_str();
    sqlx::query(
        "INSERT INTO pepsi.list_bounce_event \
         (list_id, address, kind, status, diagnostic, report_message_id, processed_at) \
         VALUES ($1, $2, $3, $4, $5, $6, now())",
    )
    .bind(list.id)
    .bind(address)
    .bind(kind)
    .bind(&finding.status)
    .bind(&finding.diagnostic)
    .bind(&report.message_id)
    .execute(&mut **tx)
    .await?;
    // The member's row locked: `pepsi-list maintain` and a concurrent bounce wait for it.
    let status: Option<String> = sqlx::query_scalar(
        "SELECT delivery_status FROM pepsi.list_member \
         WHERE list_id = $1 AND address = $2 AND role = 'member' FOR UPDATE",
    )
    .bind(list.id)
    .bind(address)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(status) = status else {
        return Ok(format!("{kind} bounce of {address} (no member) recorded"));
    };
    match finding.kind {
        bounces::Kind::Policy => Ok(format!(
            "policy refusal ({}) of {address} recorded, not counted",
            finding.status
        )),
        bounces::Kind::Complaint => {
            let detail = serde_json::json!({
                "list": list.address,
                "why": "complaint",
                "report": finding.diagnostic,
                "report_message_id": report.message_id,
            });
            if disable_member(tx, list, address, "by_user", detail).await? {
                Ok(format!("complaint of {address}: delivery disabled"))
            } else {
                Ok(format!(
                    "complaint of {address} recorded (delivery was {status})"
                ))
            }
        }
        bounces::Kind::Hard | bounces::Kind::Soft => {
            sqlx::query(
                "INSERT INTO pepsi.list_bounce_score (list_id, address) VALUES ($1, $2) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(list.id)
            .bind(address)
            .execute(&mut **tx)
            .await?;
            let (score, days): (f64, Option<i64>) = sqlx::query_as(
                "SELECT score::float8, (current_date - last_bounce_on)::int8 \
                   FROM pepsi.list_bounce_score WHERE list_id = $1 AND address = $2 FOR UPDATE",
            )
            .bind(list.id)
            .bind(address)
            .fetch_one(&mut **tx)
            .await?;
            let step = bounces::count(
                bounces::Score {
                    score,
                    days_since_last: days,
                },
                finding.kind,
                rules,
            );
            if !step.counted {
                return Ok(format!(
                    "{kind} bounce of {address} recorded, counted today already (score {score:.2})"
                ));
            }
            sqlx::query(
                "UPDATE pepsi.list_bounce_score SET score = $3::numeric(8,2), \
                        last_bounce_on = current_date WHERE list_id = $1 AND address = $2",
            )
            .bind(list.id)
            .bind(address)
            .bind(step.score)
            .execute(&mut **tx)
            .await?;
            if step.reached && status == "enabled" {
                let detail = serde_json::json!({
                    "list": list.address,
                    "why": "bounces",
                    "score": step.score,
                    "threshold": rules.threshold,
                    "status": finding.status,
                    "report_message_id": report.message_id,
                });
                if disable_member(tx, list, address, "by_bounces", detail).await? {
                    sqlx::query(
                        "UPDATE pepsi.list_bounce_score SET disabled_at = now(), \
                                warnings_sent = 0, last_warning_at = NULL \
                          WHERE list_id = $1 AND address = $2",
                    )
                    .bind(list.id)
                    .bind(address)
                    .execute(&mut **tx)
                    .await?;
                    return Ok(format!(
                        "{kind} bounce of {address}: score {:.2} reached {:.2}, delivery disabled",
                        step.score, rules.threshold
                    ));
                }
            }
            Ok(format!(
                "{kind} bounce of {address} recorded (score {:.2} of {:.2})",
                step.score, rules.threshold
            ))
        }
    }
}

/// Turns off delivery to the member `address` of `list` in `tx` (`to`: `by_bounces` or
/// `by_user`) unless it is off for that reason or by a moderator already, with a
/// `member.disable` event holding `detail`. Whether it changed.
async fn disable_member(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    list: &List,
    address: &str,
    to: &str,
    detail: serde_json::Value,
) -> Result<bool, StageError> {
    let changed: Option<i64> = sqlx::query_scalar(
        "UPDATE pepsi.list_member SET delivery_status = $3, updated_at = now() \
         WHERE list_id = $1 AND address = $2 AND role = 'member' \
           AND delivery_status IN ('enabled', 'by_bounces') AND delivery_status <> $3 \
         RETURNING member_id",
    )
    .bind(list.id)
    .bind(address)
    .bind(to)
    .fetch_optional(&mut **tx)
    .await?;
    if changed.is_none() {
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         VALUES ($1, $2, 'member.disable', $3, $4)",
    )
    .bind(list.id)
    .bind(address)
    .bind(detail)
    .bind(constants::PROGRAM)
    .execute(&mut **tx)
    .await?;
    Ok(true)
}

/// The most header fields, and characters of each value, the header filters are tried on.
pub const FILTER_FIELDS: usize = 200;
pub const FILTER_VALUE_CHARS: usize = 2000;

/// The header block's fields as (name, unfolded value) columns for the filter query: at most
/// [`FILTER_FIELDS`] fields, each value cut at [`FILTER_VALUE_CHARS`] characters, so the
/// regular expressions have bounded input.
fn header_pairs(headers: &[u8]) -> (Vec<String>, Vec<String>) {
    let mut names = Vec::new();
    let mut values = Vec::new();
    for field in pepsi_contract::message::fields(headers).take(FILTER_FIELDS) {
        let Some(name) = pepsi_contract::message::field_name(field) else {
            continue;
        };
        let colon = field.iter().position(|&b| b == b':').unwrap_or(field.len());
        let value: Vec<u8> = field[(colon + 1).min(field.len())..]
            .iter()
            .copied()
            .filter(|&b| b != b'\r' && b != b'\n')
            .collect();
        names.push(String::from_utf8_lossy(name).into_owned());
        values.push(
            String::from_utf8_lossy(&value)
                .trim()
                .chars()
                .take(FILTER_VALUE_CHARS)
                .collect(),
        );
    }
    (names, values)
}

/// Whether a refusal of this message may be told to its envelope sender (a DSN): at most
/// `REFUSAL_NOTICES` per sender, list and day, counted in `list_autoresponse` once per
/// queue row (a pass run again counts nothing twice). A null sender gets no DSN anyway.
pub(crate) async fn refusal_notice(
    options: &Options,
    ctx: &StageContext<'_>,
    list: &List,
) -> Result<bool, StageError> {
    let Some(sender) = pepsi_conf::address::Address::parse(ctx.mail_from())
        .ok()
        .map(|a| a.key())
    else {
        return Ok(true);
    };
    let count: i32 = sqlx::query_scalar(
        "WITH once AS (INSERT INTO pepsi.clone_token (token) VALUES ($3) \
                       ON CONFLICT DO NOTHING RETURNING 1), \
              up AS (INSERT INTO pepsi.list_autoresponse (list_id, address, kind, count) \
                     SELECT $1, $2, 'reject_notice', 1 WHERE EXISTS (SELECT 1 FROM once) \
                     ON CONFLICT (list_id, address, kind, day) \
                     DO UPDATE SET count = pepsi.list_autoresponse.count + 1 \
                     RETURNING count) \
         SELECT COALESCE((SELECT count FROM up), \
                         (SELECT count FROM pepsi.list_autoresponse WHERE list_id = $1 \
                          AND address = $2 AND kind = 'reject_notice' AND day = current_date), 0)",
    )
    .bind(list.id)
    .bind(&sender)
    .bind(format!("list-refusal:{}:{}", ctx.id(), list.id))
    .fetch_one(ctx.pool())
    .await?;
    Ok(count <= options.refusal_notices as i32)
}

/// Who a message to a list is from: its From address, else its envelope sender, in the form
/// addresses are stored (`Address::key`). `None` when that is no address (a null sender, a
/// From without one).
pub(crate) fn sender_of(ctx: &StageContext<'_>) -> Result<Option<String>, StageError> {
    let from = pepsi_contract::message::from_addresses(ctx.headers()?)
        .into_iter()
        .next()
        .unwrap_or_else(|| ctx.mail_from().to_owned());
    Ok(pepsi_conf::address::Address::parse(&from)
        .ok()
        .map(|a| a.key()))
}

fn delivered(what: &str) -> RcptResult {
    RcptResult::Delivered(Delivery {
        reply: Some(what.to_owned()),
        ..Delivery::UNKNOWN
    })
}

const ABOUT: &str = "\
Pepsi stage for mailing lists: posts, owner mail and bounces of the lists in pepsi.mailing_list

Recipients that are addresses of an existing list (see docs/lists.md) are handled here; the \
message's other recipients go on to NEXT_STAGE on a row of their own. A post to a list is \
decided by the list's posting policy: a loop (the post already carries the list's List-Id) is \
discarded; a banned sender is refused; a sender's own rule (pepsi-list add --action) wins; \
under emergency moderation or above max_message_size the post is held; otherwise members \
get member_action and everyone else nonmember_action. An accepted post goes to every enabled \
member who takes posts one by one (digest members do not) as the list copy (List-* fields of \
RFC 2369 and 2919, Precedence: list, the subject prefix, Reply-To as the list says, the \
footer after plain text), one queue row per member at DELIVER_STAGE with the member's VERP \
envelope sender (list+bounces-local=domain@), all sharing one body (one each when the \
list's personalize is individual: the footer names the member and their unsubscribe link). \
Each member's row has its own List-Unsubscribe: with [pepsi] LIST_WEB_URL, the member's \
one-click link LIST_WEB_URL/lists/unsubscribe/TOKEN and List-Unsubscribe-Post (RFC 8058) \
besides the list-leave address; without it, the address alone. When the From domain \
publishes DMARC p=reject or p=quarantine (_dmarc TXT of the domain, else of its parents; \
cached in pepsi.list_dmarc_policy; a failed or late lookup counts as p=reject) the list's \
dmarc_mitigation rewrites the From to \"Author via List\" <list> with the author in Reply-To \
(or Cc when replies go to the list), or wraps the post as a message/rfc822 attachment. A held post is kept in pepsi.list_held_message; a refused one is bounced \
(5.7.1); a deferred one is retried. Mail to list-owner goes to the owners; bounces to \
list-bounces and VERP addresses (RFC 3464 reports, RFC 5965 complaints) are recorded per \
member and scored (hard 1, soft 0.5 a day, policy refusals 5.7.x not counted); at the list's \
bounce_score_threshold the member's delivery is disabled, and a complaint disables it too. \
Mail to list-join and list-leave (or join and leave commands to list-request) asks the \
address for a confirmation (double opt-in, at most confirm_limit_per_address per \
confirm_window, and per SMTP client); its reply to list-confirm+TOKEN carries the request out.

Options of [stage-<name>]:
  DELIVER_STAGE  aliases  where the members' and owners' copies start
  REFUSAL_NOTICES  3  the most refusals (DSNs) one envelope sender gets per list and day;
                 past it a refused post is dropped without one (forged senders)
  CONFIRMATIONS_PER_CLIENT  list  the most confirmations one SMTP client may cause by mail
                 per list and confirm_window: list (the list's confirm_limit_per_client),
                 0 (none) or 1 to 100000; past it a request is dropped
  HOSTNAME       the domain of the list's own Message-IDs (default [pepsi] HOSTNAME)
  DMARC_TIMEOUT  10s  the most one post's DMARC lookup may take (1s to 1m)
  PATTERN_TIMEOUT  2s  the most matching a post against the list's ban and header filter
                 patterns may take (1s to 30s); past it the post is held for a moderator
  DMARC_CACHE    4h   how long a From domain's DMARC policy is kept (1h to 1d)
  DNS_SERVERS, DNS_TIMEOUT  the resolvers of the DMARC lookups ([pepsi]'s; default
                 /etc/resolv.conf, 5s)
  RETRY_INITIAL, RETRY_FACTOR, RETRY_MAX_INTERVAL, DELAY_WARNING, MAX_LIFETIME
                 the retries of deferred posts, as for the delivery stages
  NEXT_STAGE, BOUNCE_STAGE  as for every stage
Of [pepsi]:
  LIST_WEB_URL   https://host of the list pages, for one-click unsubscribe links (optional)";

/// The command line of `pepsi-stage-list`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-list` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<ListStage>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_web_url_and_dmarc_options_table() {
        let ok: &[(&str, Option<&str>)] = &[
            ("", None),
            ("  ", None),
            (
                "https://lists.example.org",
                Some("https://lists.example.org"),
            ),
            (
                " https://example.org:8443/pepsi ",
                Some("https://example.org:8443/pepsi"),
            ),
        ];
        for (text, want) in ok {
            assert_eq!(web_url_value(text), Ok(want.map(str::to_owned)), "{text:?}");
        }
        for bad in [
            "http://lists.example.org",
            "https://lists.example.org/",
            "https://",
            "https:///x",
            "https://lists.example.org/?a=b",
            "https://lists.example.org/{token}",
            "https://exa mple.org",
            "lists.example.org",
        ] {
            assert!(web_url_value(bad).is_err(), "{bad:?}");
        }
        let cfg = |t: &str| Config::from_str_named(t, "l.conf").unwrap();
        let base = "[stage-aliases]\nPROGRAM = x\n[stage-lists]\n";
        let o = Options::from_config(&cfg(base), "lists").unwrap();
        assert_eq!(o.web_url, None);
        assert_eq!(o.dmarc_timeout, std::time::Duration::from_secs(10));
        assert_eq!(o.dmarc_cache, std::time::Duration::from_secs(4 * 3600));
        let o = Options::from_config(
            &cfg(&format!(
                "[pepsi]\nLIST_WEB_URL = https://lists.example.org\nDNS_SERVERS = 127.0.0.1:5353\n\
                 {base}DMARC_TIMEOUT = 3s\nDMARC_CACHE = 1d\n"
            )),
            "lists",
        )
        .unwrap();
        assert_eq!(o.web_url.as_deref(), Some("https://lists.example.org"));
        assert_eq!(o.dns_servers, vec!["127.0.0.1:5353".parse().unwrap()]);
        assert_eq!(o.dmarc_timeout, std::time::Duration::from_secs(3));
        for (conf, names) in [
            (
                "[pepsi]\nLIST_WEB_URL = http://x.example\n",
                &["l.conf", "LIST_WEB_URL", "https://"][..],
            ),
            (
                "[pepsi]\nLIST_WEB_URL = https://x.example/\n",
                &["l.conf", "LIST_WEB_URL"][..],
            ),
            ("", &["l.conf", "DMARC_TIMEOUT", "1s to 1m"][..]),
            ("", &["l.conf", "DMARC_CACHE", "1h to 1d"][..]),
        ] {
            let extra = match names[1] {
                "DMARC_TIMEOUT" => "DMARC_TIMEOUT = 2m\n",
                "DMARC_CACHE" => "DMARC_CACHE = 10m\n",
                _ => "",
            };
            let e = Options::from_config(&cfg(&format!("{conf}{base}{extra}")), "lists")
                .unwrap_err()
                .to_string();
            for n in names {
                assert!(e.contains(n), "{n:?} in {e}");
            }
        }
    }

    #[test]
    fn options_table() {
        let cfg = |t: &str| Config::from_str_named(t, "l.conf").unwrap();
        let o = Options::from_config(
            &cfg("[stage-aliases]\nPROGRAM = x\n[stage-lists]\n"),
            "lists",
        )
        .unwrap();
        assert_eq!(o.deliver_stage, "aliases");
        let o = Options::from_config(
            &cfg("[stage-route]\nPROGRAM = x\n[stage-lists]\nDELIVER_STAGE = \" route \"\nRETRY_INITIAL = 1m\n"),
            "lists",
        )
        .unwrap();
        assert_eq!(o.deliver_stage, "route");
        assert_eq!(o.policy.initial, std::time::Duration::from_secs(60));
        let e = Options::from_config(&cfg("[stage-lists]\nDELIVER_STAGE = nowhere\n"), "lists")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("l.conf") && e.contains("DELIVER_STAGE = nowhere"),
            "{e}"
        );
    }

    #[test]
    fn confirm_limit_per_client_table() {
        let cfg = |t: &str| Config::from_str_named(t, "l.conf").unwrap();
        let limit = |line: &str| {
            Options::from_config(
                &cfg(&format!(
                    "[stage-aliases]\nPROGRAM = x\n[stage-lists]\n{line}\n"
                )),
                "lists",
            )
            .map(|o| o.confirm_limit_per_client)
            .map_err(|e| format!("{e:#}"))
        };
        let ok: &[(&str, ClientLimit)] = &[
            ("", ClientLimit::List),
            ("CONFIRMATIONS_PER_CLIENT = list", ClientLimit::List),
            ("CONFIRMATIONS_PER_CLIENT = List", ClientLimit::List),
            ("CONFIRMATIONS_PER_CLIENT = 0", ClientLimit::Off),
            ("CONFIRMATIONS_PER_CLIENT = 1", ClientLimit::At(1)),
            ("CONFIRMATIONS_PER_CLIENT = 250", ClientLimit::At(250)),
            (
                "CONFIRMATIONS_PER_CLIENT = 100000",
                ClientLimit::At(100_000),
            ),
        ];
        for (line, want) in ok {
            assert_eq!(limit(line), Ok(*want), "{line:?}");
        }
        for bad in ["100001", "-1", "lots", "10 per hour"] {
            let e = limit(&format!("CONFIRMATIONS_PER_CLIENT = {bad}")).unwrap_err();
            for n in ["l.conf", "CONFIRMATIONS_PER_CLIENT", bad, "1 to 100000"] {
                assert!(e.contains(n), "{n:?} in {e}");
            }
        }
    }
}
