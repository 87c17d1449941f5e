//! pepsi-stage-secure-link: for mail leaving to an external recipient, keeps the message
//! sealed (`pepsi_secure_link::store::create`) and sends the recipient a notice with a link
//! to the portal instead, when the authenticated sender asks (a header or a subject tag),
//! when a domain's policy says `always`, and as pepsi-stage-encrypt's fallback (docs/secure-link.md,
//! "The stage").
//!
//! Reads: the envelope, the header block (`Load::Headers`; the body only in a pass that
//! seals, `fetch_body`), `state.secure_link`, `state.origin` (who authenticated), the
//! local domains (`pepsi_contract::local`, the definition the route stage uses) and
//! `pepsi.secure_link_policy` (cached a few seconds per domain). Writes: the header block
//! (the control header removed), `pepsi.secure_link_message` and its access log, and, in
//! the same transaction as the links, a notice per secured recipient at NOTICE_STAGE and
//! one receipt for the sender at RECEIPT_STAGE (`pepsi.workqueue_inject`), taken at most
//! once per queue row (`pepsi.clone_token` `secure-link:<id>`). Terminal helpers: `advance`
//! (the message as it is, for the recipients not secured), `fan_out_keeping_age` (the
//! recipients to secure onto a row of their own at this stage, marked in
//! `state.secure_link`; returned recipients to BOUNCE_STAGE), `reroute` (all returned),
//! `finish` (every recipient secured).
//!
//! The decisions are `plan` (pure, a table); the request in the message is `control`
//! (pure); the mails' texts are `pepsi_secure_link::mail` (pure, shared with the portal).
//! This file gathers the facts and carries the decision out.

pub mod control;
pub mod plan;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use pepsi_conf::address::{Address, address_key};
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::mail_log::Event;
use pepsi_contract::stage::edges::{Declare, NEXT_STAGE};
use pepsi_contract::stage::{FanGroup, FanRecipients};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::{
    Bounce, BounceDetail, BounceKind, Origin, SecureLink, SecureLinkMade, SecureLinkReason,
};
use pepsi_secure_link::policy::{self, Policies, Rule, Scope};
use pepsi_secure_link::{mail, store, url};
use serde_json::{Map, Value, json};

use crate::plan::{Decision, Split};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-secure-link",
        exec: "pepsi-stage-secure-link",
    };
    pub const PROGRAM: &str = "pepsi-stage-secure-link";
}

/// The control header unless `HEADER` says otherwise.
pub const DEFAULT_HEADER: &str = "X-Pepsi-Secure-Link";
/// The subject tag unless `SUBJECT_TAG` says otherwise.
pub const DEFAULT_TAG: &str = "[secure]";
/// A link's lifetime when no policy row gives one, unless `LIFETIME` says otherwise.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);
/// Where receipts enter the graph unless `RECEIPT_STAGE` says otherwise (the portal's
/// replies too): where new mail starts.
pub use pepsi_secure_link::DEFAULT_RECEIPT_STAGE;
/// How long a domain's policy, once read, is used before it is read again.
pub const POLICY_REFRESH: Duration = Duration::from_secs(10);
/// The most domains whose policy is kept; beyond, the cache starts again empty.
const POLICY_CACHE_MAX: usize = 10_000;

/// One `[stage-<name>]` section, read at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `HEADER`: the control header (`yes`, `true`, `1` ask for a link).
    pub header: String,
    /// `SUBJECT_TAG`: the tag in the Subject that asks for a link; empty: none.
    pub tag: String,
    /// `LIFETIME`: a link's lifetime when no policy row gives one.
    pub lifetime: TimeDelta,
    /// `NOTICE_STAGE` (default NEXT_STAGE): where notices start, on the way out.
    pub notice_stage: String,
    /// `RECEIPT_STAGE` (default `init`): where the sender's receipt starts.
    pub receipt_stage: String,
    /// `HOSTNAME` (else `[pepsi] HOSTNAME`): the domain of Message-IDs and MAILER-DAEMON.
    pub hostname: String,
}

impl Options {
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Options> {
        let s = cfg.stage_section_named(stage);
        let set = |option: &str| -> anyhow::Result<Option<String>> {
            Ok(s.string_opt(option)?
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty()))
        };
        let header = set("HEADER")?.unwrap_or_else(|| DEFAULT_HEADER.to_owned());
        if !header.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
            anyhow::bail!(
                "[stage-{stage}] HEADER = {header}: a header field name (printable ASCII, no colon)"
            );
        }
        // SUBJECT_TAG may be set empty on purpose: no tag.
        let tag = match s.string_opt("SUBJECT_TAG")? {
            Some(v) => v.trim().to_owned(),
            None => DEFAULT_TAG.to_owned(),
        };
        let lifetime = s.duration_opt("LIFETIME")?.unwrap_or(DEFAULT_LIFETIME);
        let lifetime = TimeDelta::from_std(lifetime)
            .ok()
            .filter(|l| *l > TimeDelta::zero() && *l <= store::MAX_LIFETIME)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "[stage-{stage}] LIFETIME = {}s: between 1s and {} days",
                    lifetime.as_secs(),
                    store::MAX_LIFETIME.num_days()
                )
            })?;
        let exists = |option: &str, target: &str| -> anyhow::Result<()> {
            if cfg.stage(target).is_none() {
                anyhow::bail!(
                    "{}: [stage-{stage}] {option} = {target}: there is no [stage-{target}]",
                    cfg.file().display()
                );
            }
            Ok(())
        };
        let notice_stage = match set("NOTICE_STAGE")? {
            Some(t) => t,
            None => set(NEXT_STAGE)?.ok_or_else(|| {
                anyhow::anyhow!(
                    "[stage-{stage}] needs NOTICE_STAGE or NEXT_STAGE: where notices go out"
                )
            })?,
        };
        exists("NOTICE_STAGE", &notice_stage)?;
        let receipt_stage =
            set("RECEIPT_STAGE")?.unwrap_or_else(|| DEFAULT_RECEIPT_STAGE.to_owned());
        exists("RECEIPT_STAGE", &receipt_stage)?;
        Ok(Options {
            header,
            tag,
            lifetime,
            notice_stage,
            receipt_stage,
            hostname: cfg.name_option(&s, "HOSTNAME")?,
        })
    }
}

/// Each domain's policy row as last read (None: no row), and when.
type PolicyCache = HashMap<(Scope, String), (Instant, Option<Rule>)>;

/// The program: the portal's base, the local domains, the policies read so far.
pub struct SecureLinkStage {
    base: String,
    local: LocalRecipients,
    policies: RefCell<PolicyCache>,
}

impl SecureLinkStage {
    /// The policy rows of these domains, from the cache where fresh, else in one query.
    async fn policies(
        &self,
        pool: &sqlx::PgPool,
        recipient_domains: &[String],
        sender_domain: Option<&str>,
    ) -> Result<Policies, StageError> {
        let now = Instant::now();
        let wanted: Vec<(Scope, String)> = recipient_domains
            .iter()
            .map(|d| (Scope::RecipientDomain, d.clone()))
            .chain(sender_domain.map(|d| (Scope::SenderDomain, d.to_owned())))
            .collect();
        let stale: Vec<&(Scope, String)> = {
            let cache = self.policies.borrow();
            wanted
                .iter()
                .filter(|k| {
                    cache
                        .get(*k)
                        .is_none_or(|(at, _)| now.duration_since(*at) >= POLICY_REFRESH)
                })
                .collect()
        };
        if !stale.is_empty() {
            let of = |scope| -> Vec<String> {
                stale
                    .iter()
                    .filter(|(s, _)| *s == scope)
                    .map(|(_, d)| d.clone())
                    .collect()
            };
            let rows =
                policy::fetch(pool, &of(Scope::RecipientDomain), &of(Scope::SenderDomain)).await?;
            let mut cache = self.policies.borrow_mut();
            if cache.len() + stale.len() > POLICY_CACHE_MAX {
                cache.clear();
            }
            for key in stale {
                let rule = rows
                    .iter()
                    .find(|(s, d, _)| (s, d) == (&key.0, &key.1))
                    .map(|(_, _, r)| *r);
                cache.insert(key.clone(), (now, rule));
            }
        }
        let cache = self.policies.borrow();
        let mut out = Policies::default();
        for key in &wanted {
            if let Some((_, Some(rule))) = cache.get(key) {
                out.insert(key.0, key.1.clone(), *rule);
            }
        }
        Ok(out)
    }
}

/// Whether the message came from an authenticated sender: SMTP AUTH (the row's
/// `auth_user`, or `state.origin.auth_user`), or a local user through pepsi-sendmail
/// (`state.origin.local`, which only `pepsi.sendmail_submit` writes).
fn authenticated(ctx: &StageContext<'_>, origin: Option<&Origin>) -> bool {
    ctx.auth_user().is_some_and(|u| !u.is_empty())
        || origin.is_some_and(|o| {
            o.auth_user.as_deref().is_some_and(|u| !u.is_empty()) || o.local.is_some()
        })
}

/// The domain of an address, normalized; None for the null sender or text that is not an
/// address.
fn domain_of(address: &str) -> Option<String> {
    Address::parse(address).ok().map(|a| a.domain().to_owned())
}

impl Stage for SecureLinkStage {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Headers;
    // Local work (a lookup; for a secured message, sealing and queueing in one
    // transaction): its passes batch.
    const BATCH: bool = true;
    type Section = Options;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        let value = cfg.section("pepsi").string_opt("SECURE_LINK_URL")?;
        let base = url::portal_base(value.as_deref())
            .map_err(|e| anyhow::anyhow!("{}: {e}", cfg.file().display()))?
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: [pepsi] SECURE_LINK_URL is not set: the secure-link stage mails links \
                     to the portal at that https:// base (as https://mail.example.org)",
                    cfg.file().display()
                )
            })?;
        Ok(SecureLinkStage {
            base,
            local: LocalRecipients::from_config(cfg)?,
            policies: RefCell::new(HashMap::new()),
        })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    /// NEXT_STAGE for the message itself, NOTICE_STAGE (default NEXT_STAGE) where notices
    /// go out and RECEIPT_STAGE (default `init`) where receipts start.
    fn edges(d: &mut Declare<'_>) {
        d.next();
        match d.option("NOTICE_STAGE") {
            Some(t) => d.branch("NOTICE_STAGE", t, "notice"),
            None if d.option(NEXT_STAGE).is_some() => {}
            None => d.problem("needs NOTICE_STAGE or NEXT_STAGE"),
        }
        let receipt = d
            .option("RECEIPT_STAGE")
            .unwrap_or_else(|| DEFAULT_RECEIPT_STAGE.to_owned());
        d.branch("RECEIPT_STAGE", receipt, "receipt");
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let mark = SecureLink::from_state(ctx.state())?.unwrap_or_default();
        if mark.made.is_some() {
            // A notice or receipt of ours: on its way, never secured again.
            return ctx.advance();
        }
        let id = ctx.id();
        let headers = ctx.headers()?.to_vec();
        let request = control::read(&headers, &options.header, &options.tag);
        let origin = Origin::from_state(ctx.state())?;
        let sender = ctx.mail_from().to_owned();
        let sender_domain = domain_of(&sender);
        let rcpts = ctx.rcpt_to().to_vec();
        let domains: Vec<Option<String>> = rcpts.iter().map(|r| domain_of(r)).collect();
        let mut distinct: Vec<String> = Vec::new();
        for d in domains.iter().flatten() {
            if !distinct.contains(d) {
                distinct.push(d.clone());
            }
        }
        let local = self
            .local
            .local_domains_among(ctx.pool(), &distinct)
            .await?;
        let external: Vec<bool> = domains
            .iter()
            .map(|d| d.as_ref().is_some_and(|d| !local.contains(d)))
            .collect();
        let external_domains: Vec<String> = distinct
            .iter()
            .filter(|d| !local.contains(*d))
            .cloned()
            .collect();
        let policies = if external_domains.is_empty() {
            Policies::default()
        } else {
            self.policies(ctx.pool(), &external_domains, sender_domain.as_deref())
                .await?
        };
        let resolved: Vec<Option<policy::Resolved>> = domains
            .iter()
            .map(|d| policies.resolve(d.as_deref(), sender_domain.as_deref()))
            .collect();
        let facts: Vec<plan::Recipient> = external
            .iter()
            .zip(&resolved)
            .map(|(external, r)| plan::Recipient {
                external: *external,
                policy: r.map(|r| r.rule.mode),
            })
            .collect();
        let mut message = plan::Message {
            made: false,
            reason: mark.reason,
            asked: request.asked(),
            authenticated: authenticated(ctx, origin.as_ref()),
            null_sender: sender.is_empty(),
            too_large: false,
        };
        let mut decisions = plan::decide(&message, &facts);
        let mut split = Split::of(&decisions);
        if split.pass.is_empty() && !split.secure.is_empty() {
            // This row is the one sealed: its body, unless it is too large to keep.
            let room = store::MAX_MESSAGE.saturating_sub(headers.len() + 2) as u64;
            if ctx.fetch_body(room).await?.is_none() {
                message.too_large = true;
                decisions = plan::decide(&message, &facts);
                split = Split::of(&decisions);
            }
        }
        for (i, d) in decisions.iter().enumerate() {
            match d {
                Decision::Pass(plan::Pass::Never) => tracing::info!(id, rcpt = %rcpts[i],
                    "secure link asked for, but the domain's policy says never: delivered as it is"),
                Decision::Pass(plan::Pass::Unauthenticated) => tracing::info!(id, rcpt = %rcpts[i],
                    "secure link asked for by an unauthenticated sender: not honoured"),
                Decision::Pass(plan::Pass::NullSender) => tracing::info!(id, rcpt = %rcpts[i],
                    "secure link due, but the sender is null: delivered as it is"),
                Decision::Return(why) => {
                    tracing::info!(id, rcpt = %rcpts[i], status = why.status(),
                    "no secure link possible: returned to the sender")
                }
                _ => {}
            }
        }
        if split.secure.is_empty() && split.returned.is_empty() {
            return pass(options, ctx, &headers, request.header);
        }

        let name = ctx.options().name.to_string();
        let mut groups = Vec::new();
        let bounce = if split.returned.is_empty() {
            None
        } else {
            let stage = ctx
                .options()
                .bounce_stage
                .clone()
                .ok_or_else(|| StageError::NoBounceStage(name.clone()))?;
            Some((stage, bounce_state(&name, &rcpts, &split.returned)))
        };
        let keep_secure = split.pass.is_empty();
        let keep = if keep_secure {
            &split.secure
        } else {
            &split.pass
        };
        if keep.is_empty() {
            // Every recipient returned.
            let (stage, state) = bounce.expect("returned recipients");
            return ctx.reroute(&stage, state);
        }
        if let Some((stage, state)) = bounce {
            let returned = split.returned.iter().map(|(i, _)| *i).collect();
            groups.push(FanGroup {
                state,
                ..FanGroup::new(FanRecipients::Indices(returned), stage)
            });
        }
        if !keep_secure && !split.secure.is_empty() {
            // Sealed in a pass of their own, on a row that says why: the recipients that
            // go on take this row as it is.
            let reason = split.reason(&decisions).unwrap_or(SecureLinkReason::Policy);
            let mut state = Map::new();
            SecureLink::to_secure(reason).insert_into(&mut state);
            groups.push(FanGroup {
                state,
                ..FanGroup::new(FanRecipients::Indices(split.secure.clone()), name.clone())
            });
            tracing::info!(id, rcpt = ?split.secure.iter().map(|i| &rcpts[*i]).collect::<Vec<_>>(),
                reason = reason.as_str(), "recipients split off to be reached by secure link");
        }
        if !groups.is_empty() {
            ctx.fan_out_keeping_age(keep, &groups).await?;
        }
        if !keep_secure {
            return pass(options, ctx, &headers, request.header);
        }
        // The row now holds exactly the recipients to secure.
        let lifetimes: Vec<TimeDelta> = split
            .secure
            .iter()
            .map(|i| resolved[*i].map_or(options.lifetime, |r| r.rule.lifetime))
            .collect();
        let reasons: Vec<SecureLinkReason> = split
            .secure
            .iter()
            .map(|i| match decisions[*i] {
                Decision::Secure(r) => r,
                _ => unreachable!("a secured recipient"),
            })
            .collect();
        self.seal(options, ctx, &headers, &lifetimes, &reasons)
            .await
    }
}

/// The message goes on to its recipients as it is, without the control header.
fn pass(
    options: &Options,
    ctx: &mut StageContext<'_>,
    headers: &[u8],
    has_header: bool,
) -> Result<Terminal, StageError> {
    if has_header {
        ctx.set_headers(control::without_header(headers, &options.header));
    }
    ctx.advance()
}

/// The bounce of the recipients no link can be made for.
fn bounce_state(
    stage: &str,
    rcpts: &[String],
    returned: &[(usize, plan::Return)],
) -> Map<String, Value> {
    let detail = |why: plan::Return, address: &str| {
        let diagnostic = match why {
            plan::Return::NoKey => format!(
                "encryption is required, no key for {address} was found, and the secure-link \
                 policy allows no link instead"
            ),
            plan::Return::TooLarge => format!(
                "the message for {address} is larger than a secure link may keep ({} bytes)",
                store::MAX_MESSAGE
            ),
        };
        BounceDetail {
            diagnostic: Some(diagnostic),
            enhanced_status: Some(why.status().to_owned()),
            ..BounceDetail::default()
        }
    };
    let (first, why) = returned[0];
    let mut bounce = Bounce::new(BounceKind::Permanent)
        .stage(stage)
        .with_detail(detail(why, &rcpts[first]));
    bounce.recipients = returned
        .iter()
        .map(|(i, why)| (rcpts[*i].clone(), detail(*why, &rcpts[*i])))
        .collect();
    let mut state = Map::new();
    bounce.insert_into(&mut state);
    state
}

fn store_error(e: store::Error) -> StageError {
    match e {
        store::Error::Db(db) => StageError::Database(db),
        e if e.is_temporary() => StageError::Temporary(e.to_string()),
        e => StageError::Permanent(format!("cannot keep the message behind a link: {e}")),
    }
}

fn write_error(e: std::io::Error) -> StageError {
    StageError::Temporary(format!("writing a message: {e}"))
}

/// Takes the at-most-once `token` in `tx`: false when it was taken before.
async fn once(tx: &mut sqlx::PgConnection, token: &str) -> Result<bool, StageError> {
    let taken: Option<i32> = sqlx::query_scalar(
        "INSERT INTO pepsi.clone_token (token) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1",
    )
    .bind(token)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(taken.is_some())
}

/// Queues `raw` for `to` at `stage`, in `tx`, at most once per `token`.
async fn inject(
    tx: &mut sqlx::PgConnection,
    stage: &str,
    mail_from: &str,
    to: &str,
    raw: &[u8],
    made: SecureLinkMade,
    token: &str,
) -> Result<(), StageError> {
    let (headers, body) = pepsi_contract::message::split(raw);
    let mut state = Map::new();
    SecureLink::made(made).insert_into(&mut state);
    sqlx::query("SELECT pepsi.workqueue_inject($1, $2, $3, $4, $5, $6, $7)")
        .bind(stage)
        .bind(mail_from)
        .bind(vec![to.to_owned()])
        .bind(headers)
        .bind(body)
        .bind(Value::Object(state))
        .bind(token)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

impl SecureLinkStage {
    /// Seals the message once per recipient of this row, queues each recipient's notice
    /// and the sender's receipt, all in one transaction taken at most once per row, and
    /// ends the row.
    async fn seal(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
        headers: &[u8],
        lifetimes: &[TimeDelta],
        reasons: &[SecureLinkReason],
    ) -> Result<Terminal, StageError> {
        let id = ctx.id();
        let sender = ctx.mail_from().to_owned();
        let rcpts = ctx.rcpt_to().to_vec();
        let sealed = pepsi_contract::message::join(
            &control::sealed(headers, &options.header, &options.tag),
            ctx.body()?,
        );
        let author = mail::Author::of(headers, &sender);
        let first = |name: &str| {
            pepsi_contract::message::field_values(headers, name)
                .into_iter()
                .next()
        };
        let (original_id, original_date) = (first("Message-ID"), first("Date"));
        let mut tx = ctx.pool().begin().await?;
        if !once(&mut tx, &format!("secure-link:{id}")).await? {
            tx.rollback().await?;
            tracing::info!(id, "secured before (a pass run again): the row ends");
            let entries = rcpts
                .iter()
                .map(|r| {
                    ctx.log_entry(
                        Event::Delivered,
                        vec![r.clone()],
                        json!({"secure_link": null, "detail": "secured before"}),
                    )
                })
                .collect::<Vec<_>>();
            return Ok(ctx.finish()?.log(entries));
        }
        let now = Utc::now();
        let mut secured: Vec<mail::Secured> = Vec::new();
        let mut entries = Vec::new();
        let mut seen = HashSet::new();
        for (n, rcpt) in rcpts.iter().enumerate() {
            if !seen.insert(address_key(rcpt)) {
                continue;
            }
            let created = store::create(&mut tx, &sender, rcpt, &sealed, lifetimes[n])
                .await
                .map_err(store_error)?;
            let link = url::link_url(
                &self.base,
                &created.link_id,
                created.generation,
                &created.link_half,
            );
            let message_id = format!(
                "{}.{id}.{n}.secure-link@{}",
                now.timestamp_micros(),
                options.hostname
            );
            let notice = mail::notice(&mail::Notice {
                author: &author,
                recipient: rcpt,
                link: &link,
                expires: created.expires,
                now,
                message_id: &message_id,
            })
            .map_err(write_error)?;
            inject(
                &mut tx,
                &options.notice_stage,
                &sender,
                rcpt,
                &notice,
                SecureLinkMade::Notice,
                &format!("secure-link-notice:{id}:{}", address_key(rcpt)),
            )
            .await?;
            tracing::info!(id, rcpt, link_id = %created.link_id, reason = reasons[n].as_str(),
                expires = %created.expires, "message kept behind a secure link; notice queued");
            entries.push(ctx.log_entry(
                Event::Delivered,
                vec![rcpt.clone()],
                json!({"secure_link": created.link_id, "reason": reasons[n].as_str()}),
            ));
            secured.push(mail::Secured {
                recipient: rcpt.clone(),
                manage: url::manage_url(&self.base, &created.link_id, &created.manage_token.0),
                expires: created.expires,
            });
        }
        let receipt = mail::receipt(&mail::Receipt {
            hostname: &options.hostname,
            sender: &sender,
            original_id: original_id.as_deref(),
            original_date: original_date.as_deref(),
            secured: &secured,
            now,
            message_id: &format!(
                "{}.{id}.secure-link-receipt@{}",
                now.timestamp_micros(),
                options.hostname
            ),
        })
        .map_err(write_error)?;
        inject(
            &mut tx,
            &options.receipt_stage,
            "",
            &sender,
            &receipt,
            SecureLinkMade::Receipt,
            &format!("secure-link-receipt:{id}"),
        )
        .await?;
        tx.commit().await?;
        ctx.note_rows_created();
        Ok(ctx.finish()?.log(entries))
    }
}

const ABOUT: &str = "\
Pepsi stage that keeps mail for external recipients behind a secure link

For each recipient outside our domains (the local domains the route stage uses) the stage \
keeps the message sealed in the database (pepsi.secure_link_message) and sends the recipient \
a notice with a link to the portal at [pepsi] SECURE_LINK_URL instead, where a one-time code \
mailed to the address opens it. It does so when the sender asks, by the control header \
(HEADER: yes, true or 1) or the subject tag (SUBJECT_TAG, anywhere in the Subject, any \
case), honoured only from an authenticated sender (SMTP AUTH or pepsi-sendmail); when \
pepsi.secure_link_policy says `always` for the recipient's domain or the sender's domain; \
and for the recipients pepsi-stage-encrypt sends here (its SECURE_LINK_STAGE) because \
encryption is required and no key was found, when the policy says `fallback` or `always` \
(otherwise they are returned with 5.7.5). A `never` policy wins over the sender's wish; a \
recipient-domain row over a sender-domain row. The header is removed from every copy; the \
tag is cut from the Subject of the sealed copy. The notice (From the message's From, \
Subject \"Secure message from <sender>\", never the original subject or body) goes out at \
NOTICE_STAGE; the sender gets one receipt with a manage link per recipient (access log, \
revoke, resend) at RECEIPT_STAGE. Links, notices and the receipt are made in one \
transaction, at most once per queue row. The other recipients get the message as it is at \
NEXT_STAGE.

Options of [stage-<name>]:
  HEADER         X-Pepsi-Secure-Link   the control header
  SUBJECT_TAG    [secure]      the subject tag (empty: none)
  LIFETIME       30d           a link's lifetime when no policy row gives one (at most 365d)
  NOTICE_STAGE   NEXT_STAGE    where notices start (the way out: dkim, relay)
  RECEIPT_STAGE  init          where the sender's receipt starts (where new mail enters)
  HOSTNAME       the domain of Message-IDs and of MAILER-DAEMON (default [pepsi] HOSTNAME)
  NEXT_STAGE     the message itself, for the recipients not secured
  BOUNCE_STAGE   recipients returned (encrypt fallback without a link, a message too large)

[pepsi] SECURE_LINK_URL (the portal's https:// base) is required: the stage does not start \
without it. See docs/secure-link.md.";

/// The command line of `pepsi-stage-secure-link`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-secure-link` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<SecureLinkStage>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_str_named(text, "s.conf").unwrap()
    }

    const BASE: &str = "[pepsi]\nHOSTNAME = mx.example.test\nSECURE_LINK_URL = https://mail.example.test\n\
                        [stage-init]\nPROGRAM = x\n[stage-out]\nPROGRAM = x\n";

    #[test]
    fn options_as_a_table() {
        let o = Options::from_config(&cfg(&format!("{BASE}[stage-sl]\nNEXT_STAGE = out\n")), "sl")
            .unwrap();
        assert_eq!(
            o,
            Options {
                header: DEFAULT_HEADER.into(),
                tag: DEFAULT_TAG.into(),
                lifetime: TimeDelta::days(30),
                notice_stage: "out".into(),
                receipt_stage: "init".into(),
                hostname: "mx.example.test".into(),
            }
        );
        let o = Options::from_config(
            &cfg(&format!(
                "{BASE}[stage-sl]\nNEXT_STAGE = out\nNOTICE_STAGE = init\nRECEIPT_STAGE = out\n\
                 HEADER = X-Seal\nSUBJECT_TAG =\nLIFETIME = 7d\n"
            )),
            "sl",
        )
        .unwrap();
        assert_eq!(
            (
                o.header.as_str(),
                o.tag.as_str(),
                o.lifetime,
                o.notice_stage.as_str(),
                o.receipt_stage.as_str()
            ),
            ("X-Seal", "", TimeDelta::days(7), "init", "out")
        );
        let bad: &[(&str, &str)] = &[
            ("", "needs NOTICE_STAGE or NEXT_STAGE"),
            (
                "NEXT_STAGE = nowhere\n",
                "NOTICE_STAGE = nowhere: there is no [stage-nowhere]",
            ),
            (
                "NEXT_STAGE = out\nRECEIPT_STAGE = gone\n",
                "RECEIPT_STAGE = gone",
            ),
            ("NEXT_STAGE = out\nLIFETIME = 400d\n", "LIFETIME"),
            ("NEXT_STAGE = out\nHEADER = X: y\n", "HEADER = X: y"),
        ];
        for (options, want) in bad {
            let e = Options::from_config(&cfg(&format!("{BASE}[stage-sl]\n{options}")), "sl")
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{options:?}: {e}");
        }
    }

    #[test]
    fn the_stage_needs_the_portals_url() {
        for (pepsi, want) in [
            ("", "[pepsi] SECURE_LINK_URL is not set"),
            (
                "SECURE_LINK_URL = http://mail.example.test\n",
                "SECURE_LINK_URL = http://mail.example.test",
            ),
            (
                "SECURE_LINK_URL = https://mail.example.test/\n",
                "SECURE_LINK_URL",
            ),
        ] {
            let e = match SecureLinkStage::build(&cfg(&format!("[pepsi]\n{pepsi}"))) {
                Ok(_) => panic!("built without a valid SECURE_LINK_URL: {pepsi:?}"),
                Err(e) => e.to_string(),
            };
            assert!(e.contains(want) && e.contains("s.conf"), "{pepsi:?}: {e}");
        }
        let built = SecureLinkStage::build(&cfg(BASE)).unwrap();
        assert_eq!(built.base, "https://mail.example.test");
    }
}
