//! pepsi-stage-relay-to-maildir: local delivery. Keeps the recipients of a local domain,
//! sends the others on, and stores one copy per local recipient in its Maildir through the
//! `pepsi-helper-maildir-writer` co-process.
//!
//! Reads: envelope, `state.dsn`, `state.attempts`/`delay_sent`, headers and body
//! (`Load::Full`). Writes: through `pepsi_outbound::delivery` only (`attempts`, `last_error`,
//! `delay_sent`, the `bounce` of clones). Terminal helpers: `advance_to` (every recipient
//! non-local), otherwise `delivery::conclude` (finish, finish_with clones, pause_with, or
//! advance_or_finish); `split_off_recipients` first when the recipients are mixed.
//!
//! The stage never touches a mailbox itself: the helper owns every filesystem write, so the
//! stage can run unprivileged (setgid to the group allowed to run the helper).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use pepsi_conf::address;
use pepsi_conf::config::{Config, ConfigError, StageName};
use pepsi_contract::quota::{self, Limits};
use pepsi_contract::stage::edges::Declare;
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_helper_maildir_writer::protocol::{DeliveryKey, DirSync, Reply, Request};
use pepsi_outbound::delivery::{self, Delivery, Failure, RcptResult, RetryPolicy};

use pepsi_helper_maildir_writer::client::CoProcess;
use pepsi_outbound::maildir::{Mailboxes, Template, WriterArgs};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-relay-to-maildir",
        exec: "pepsi-stage-relay-to-maildir",
    };
    pub const PROGRAM: &str = pepsi_outbound::maildir::DELIVERY_PROGRAM;
}

/// A stage section's options, read once per stage name and validated together.
#[derive(Debug, Clone)]
pub struct Options {
    pub root: PathBuf,
    pub template: Template,
    pub delimiters: String,
    /// Local domains (configured, or marked in the settings layer).
    pub local: pepsi_contract::local::LocalRecipients,
    pub nonlocal_stage: Option<String>,
    /// The limits of a mailbox without a `pepsi.quota_limit` row of its own.
    pub quota: Option<u64>,
    pub quota_messages: Option<u64>,
    /// How a full mailbox is answered.
    pub over_quota: OverQuota,
    /// How long a mailbox's and its domain's limit rows are reused (0: read every time).
    pub quota_lookup_ttl: Duration,
    pub helper: WriterArgs,
    pub helper_timeout: Duration,
    pub retry: RetryPolicy,
}

impl Options {
    /// Reads `[stage-<stage>]`, with `[pepsi] LOCAL_DOMAINS`/`RECIPIENT_DELIMITER` and
    /// `[PATHS] MAIL_ROOT` as fallbacks.
    pub fn from_config(cfg: &Config, stage: &str) -> Result<Options, ConfigError> {
        let s = cfg.stage_section_named(stage);
        let m = Mailboxes::from_section(cfg, &s)?;
        Ok(Options {
            local: pepsi_contract::local::LocalRecipients::from_config(cfg)?,
            nonlocal_stage: s.string_opt("NONLOCAL_STAGE")?.filter(|v| !v.is_empty()),
            over_quota: OverQuota {
                temporary: s.bool_opt("QUOTA_FULL_TEMPORARY")?.unwrap_or(false),
                grace: s
                    .duration_opt("QUOTA_GRACE")?
                    .unwrap_or(Duration::from_secs(24 * 3600)),
            },
            quota_lookup_ttl: s
                .duration_opt("QUOTA_LOOKUP_TTL")?
                .unwrap_or(Duration::from_secs(10)),
            retry: RetryPolicy::from_config(cfg, stage)?,
            root: m.root,
            template: m.template,
            delimiters: m.delimiters,
            quota: m.quota,
            quota_messages: m.quota_messages,
            helper: m.writer,
            helper_timeout: m.writer_timeout,
        })
    }
}

/// What a full mailbox (over its quota, its domain's, or the filesystem's) means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverQuota {
    /// `QUOTA_FULL_TEMPORARY`: always 4.2.2, retried until MAX_LIFETIME.
    pub temporary: bool,
    /// `QUOTA_GRACE`: 4.2.2 while the message is younger than this, then 5.2.2.
    pub grace: Duration,
}

impl OverQuota {
    /// The status for a message received `age` ago: deferred (4.2.2) within the grace
    /// period, bounced (5.2.2) after it.
    pub fn status(&self, age: Duration) -> &'static str {
        if self.temporary || age < self.grace {
            "4.2.2"
        } else {
            "5.2.2"
        }
    }
}

/// What a helper reply means for a recipient of a message received `age` ago.
pub fn result_of(reply: Reply, over_quota: &OverQuota, age: Duration) -> RcptResult {
    let failure = |text: String, status: &str| {
        let mut f = Failure::new(text, status);
        f.phase = Some("delivery".into());
        f
    };
    let full = |text: String| match over_quota.status(age) {
        "5.2.2" => RcptResult::Permanent(failure(text, "5.2.2")),
        status => RcptResult::Transient(failure(text, status)),
    };
    match reply {
        Reply::Ok(_) | Reply::Stored { .. } => RcptResult::Delivered(Delivery::default()),
        Reply::Full { text, .. } => full(text),
        Reply::Perm { status, text } if status == "5.2.2" => full(text),
        Reply::Perm { status, text } => RcptResult::Permanent(failure(text, &status)),
        Reply::Temp { status, text } => RcptResult::Transient(failure(text, &status)),
        Reply::Usage(_) => RcptResult::Transient(failure(
            "the maildir writer answered a delivery with a usage".into(),
            "4.3.0",
        )),
    }
}

/// The stage: the helper co-process shared by its passes, and the quota limits read.
#[derive(Default)]
pub struct RelayToMaildir {
    helper: tokio::sync::Mutex<Helper>,
    /// Mailbox key → (its own limits, its domain's), when read.
    limits: std::sync::Mutex<std::collections::HashMap<String, (CachedLimits, std::time::Instant)>>,
}

type CachedLimits = (Option<Limits>, Option<Limits>);

/// Most mailboxes whose limits a worker remembers.
const LIMITS_REMEMBERED: usize = 10_000;

/// The running helper, and what was lost with one that stopped.
#[derive(Default)]
struct Helper {
    process: Option<CoProcess>,
    /// The timeout of the last delivery's section, for the sync that follows it.
    timeout: Duration,
    /// A helper stopped before it synced the directories of deliveries it had answered:
    /// those copies may not survive a crash, so the commit that would record them fails.
    unsynced_lost: Option<String>,
}

impl Helper {
    /// Stops the helper, remembering whether it held unsynced deliveries.
    async fn stop(&mut self, why: &str) {
        if let Some(h) = self.process.take() {
            if h.unsynced && self.unsynced_lost.is_none() {
                self.unsynced_lost = Some(format!(
                    "maildir writer {} stopped ({why}) before syncing the Maildirs it wrote; \
                     those deliveries are tried again",
                    h.args.program.display()
                ));
            }
            h.kill().await;
        }
    }
}

impl RelayToMaildir {
    /// A mailbox's own and its domain's limit rows, reused for `QUOTA_LOOKUP_TTL`.
    async fn limits_of(
        &self,
        s: &Options,
        pool: &sqlx::PgPool,
        mailbox: &str,
    ) -> Result<CachedLimits, StageError> {
        let now = std::time::Instant::now();
        if let Ok(cache) = self.limits.lock()
            && let Some((limits, at)) = cache.get(mailbox)
            && now.duration_since(*at) < s.quota_lookup_ttl
        {
            return Ok(*limits);
        }
        let limits = quota::limits_of(pool, mailbox).await?;
        if !s.quota_lookup_ttl.is_zero()
            && let Ok(mut cache) = self.limits.lock()
        {
            if cache.len() >= LIMITS_REMEMBERED {
                cache.retain(|_, (_, at)| now.duration_since(*at) < s.quota_lookup_ttl);
                if cache.len() >= LIMITS_REMEMBERED {
                    cache.clear();
                }
            }
            cache.insert(mailbox.to_owned(), (limits, now));
        }
        Ok(limits)
    }

    /// Delivers one copy through the helper, starting it when none runs (or when it runs
    /// with other arguments); a helper that fails is stopped and the recipient waits. The
    /// copy's directory entry is synced by `before_commit`.
    async fn deliver(
        &self,
        s: &Options,
        req: &Request,
        age: Duration,
    ) -> (RcptResult, Option<Reply>) {
        let mut helper = self.helper.lock().await;
        if helper.process.as_ref().is_some_and(|h| h.args != s.helper) {
            helper.stop("its arguments changed").await;
        }
        helper.timeout = s.helper_timeout;
        let slot = &mut helper.process;
        if slot.is_none() {
            match CoProcess::start(s.helper.clone()) {
                Ok(h) => *slot = Some(h),
                Err(e) => {
                    tracing::error!("maildir writer: {e}");
                    let reply = Reply::temp("4.3.0", format!("maildir writer: {e}"));
                    return (result_of(reply, &s.over_quota, age), None);
                }
            }
        }
        let h = slot.as_mut().expect("started above");
        match h.deliver(req, s.helper_timeout).await {
            Ok(reply) => (result_of(reply.clone(), &s.over_quota, age), Some(reply)),
            Err(e) => {
                let program = h.args.program.display().to_string();
                helper.stop(&e).await;
                tracing::error!("maildir writer {program} failed: {e}; it will be restarted");
                let reply = Reply::temp("4.3.0", format!("maildir writer {program} failed: {e}"));
                (result_of(reply, &s.over_quota, age), None)
            }
        }
    }
}

impl Stage for RelayToMaildir {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Full;
    // A pass is a local file write through the helper, milliseconds: a worker batches the
    // ids waiting for it (one SELECT, one commit for the round, docs/perf.md).
    const BATCH: bool = true;
    type Section = Options;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self::default())
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Ok(Options::from_config(cfg, name)?)
    }

    /// NEXT_STAGE, and NONLOCAL_STAGE for the recipients with no local mailbox.
    fn edges(d: &mut Declare<'_>) {
        d.next();
        if let Some(t) = d.option("NONLOCAL_STAGE") {
            d.branch("NONLOCAL_STAGE", t, "non-local");
        }
    }

    /// Syncs the Maildir directories the round's deliveries renamed into (once each).
    async fn before_commit(&self) -> Result<(), StageError> {
        let mut helper = self.helper.lock().await;
        if let Some(why) = helper.unsynced_lost.take() {
            return Err(StageError::Temporary(why));
        }
        let timeout = helper.timeout;
        let Some(h) = helper.process.as_mut().filter(|h| h.unsynced) else {
            return Ok(());
        };
        let program = h.args.program.display().to_string();
        let failed = match h.sync(timeout).await {
            Ok(Reply::Ok(_)) => return Ok(()),
            Ok(reply) => reply.to_line().trim_end().to_owned(),
            Err(e) => e,
        };
        helper.stop(&failed).await;
        helper.unsynced_lost = None;
        tracing::error!("maildir writer {program} could not sync: {failed}");
        Err(StageError::Temporary(format!(
            "maildir writer {program} could not sync the Maildirs written: {failed}"
        )))
    }

    async fn process(
        &self,
        s: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let local = s.local.recipients_local(ctx.pool(), ctx.rcpt_to()).await?;
        let nonlocal: Vec<usize> = local
            .iter()
            .enumerate()
            .filter(|(_, is_local)| !**is_local)
            .map(|(i, _)| i)
            .collect();
        let onward = s
            .nonlocal_stage
            .clone()
            .or_else(|| ctx.options().next_stage.clone());
        let mut stranded = Vec::new();
        if !nonlocal.is_empty() {
            match onward {
                Some(target) if nonlocal.len() == ctx.rcpt_to().len() => {
                    tracing::debug!(id = ctx.id(), target, "no local recipient");
                    return ctx.advance_to(&target);
                }
                Some(target) => {
                    let sibling = ctx.split_off_recipients(&nonlocal, &target).await?;
                    tracing::info!(
                        id = ctx.id(),
                        sibling,
                        target,
                        "non-local recipients sent on"
                    );
                }
                // Nowhere to send them: they wait (and expire) rather than vanish.
                None => stranded = nonlocal,
            }
        }
        let message = ctx.raw_message()?;
        let rcpt = ctx.rcpt_to().to_vec();
        let age = (chrono::Utc::now() - ctx.received_at())
            .to_std()
            .unwrap_or_default();
        let mut results = Vec::with_capacity(rcpt.len());
        for (i, r) in rcpt.iter().enumerate() {
            if stranded.contains(&i) {
                let mut f = Failure::new(
                    format!(
                        "{r} is not in a local domain and stage {} has no NONLOCAL_STAGE or NEXT_STAGE",
                        ctx.options().name
                    ),
                    "4.3.5",
                );
                f.phase = Some("delivery".into());
                results.push(RcptResult::Transient(f));
                continue;
            }
            let mailbox = match s.template.mailbox(&s.root, r, &s.delimiters) {
                Ok(m) => m,
                Err(f) => {
                    results.push(RcptResult::Permanent(*f));
                    continue;
                }
            };
            let key = s.local.mailbox_key(r);
            let (own, domain) = self.limits_of(s, ctx.pool(), &key).await?;
            // A mailbox is limited by its own row, else the stage's QUOTA, else (it can hold
            // no more than its domain) the domain's limits, so that the writer keeps its
            // count for the domain's total too.
            let limits = own
                .unwrap_or(Limits {
                    bytes: s.quota,
                    messages: s.quota_messages,
                })
                .or(domain.unwrap_or_default());
            let size = (message.len() + Request::prepended_len(ctx.mail_from(), r)) as u64;
            if let Some(domain_limits) = domain.filter(Limits::any) {
                let domain_name = address::domain_part(&key).unwrap_or_default();
                let used = quota::domain_usage(ctx.pool(), domain_name).await?;
                if !domain_limits.fits(used, size) {
                    let text = format!(
                        "domain {} full: its mailboxes hold {} bytes in {} messages, {size} more \
                         for this message; the domain's quota is {}",
                        domain_name,
                        used.bytes,
                        used.messages,
                        pepsi_helper_maildir_writer::quota::definition(domain_limits)
                    );
                    tracing::info!(id = ctx.id(), rcpt = %r, "not delivered: {text}");
                    results.push(result_of(
                        Reply::Full { usage: used, text },
                        &s.over_quota,
                        age,
                    ));
                    continue;
                }
            }
            let req = Request {
                mailbox,
                return_path: ctx.mail_from().to_owned(),
                delivered_to: r.clone(),
                // The copy's name comes from the row, its incarnation and the recipient: a
                // pass redone after a crash finds the copy it stored instead of a second one.
                key: Some(DeliveryKey {
                    row: ctx.id(),
                    incarnation: ctx.received_at().timestamp_micros(),
                }),
                quota: limits.bytes,
                quota_messages: limits.messages,
                // Synced once for the round, before the worker commits (`before_commit`).
                dir_sync: DirSync::Later,
                message: message.clone(),
            };
            let (mut result, reply) = self.deliver(s, &req, age).await;
            if let Some(Reply::Stored { usage, .. } | Reply::Full { usage, .. }) = reply {
                // What the domain limit and the ingress read; a failure only leaves the
                // recorded usage behind the Maildir's own until the next delivery.
                if let Err(e) = quota::record(ctx.pool(), &key, usage, limits).await {
                    tracing::warn!(rcpt = %r, "cannot record the mailbox's usage: {e}");
                }
            }
            if let RcptResult::Delivered(d) = &mut result {
                d.mailbox = Some(req.mailbox.display().to_string());
            }
            match &result {
                RcptResult::Delivered(_) => {
                    tracing::info!(id = ctx.id(), rcpt = %r, mailbox = %req.mailbox.display(), "delivered")
                }
                RcptResult::Permanent(f) | RcptResult::Transient(f) => {
                    tracing::info!(id = ctx.id(), rcpt = %r, "not delivered: {}", f.summary())
                }
            }
            results.push(result);
        }
        delivery::conclude(ctx, &s.retry, &results)
    }
}

const ABOUT: &str = "Pepsi stage that delivers local recipients into their Maildirs";

/// The command line of `pepsi-stage-relay-to-maildir`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-relay-to-maildir` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<RelayToMaildir>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_become_results() {
        let usage = pepsi_contract::quota::Usage {
            bytes: 10,
            messages: 1,
        };
        let bounce = OverQuota {
            temporary: false,
            grace: Duration::ZERO,
        };
        let grace = OverQuota {
            temporary: false,
            grace: Duration::from_secs(3600),
        };
        let wait = OverQuota {
            temporary: true,
            grace: Duration::ZERO,
        };
        let young = Duration::from_secs(60);
        let old = Duration::from_secs(7200);
        let full = || Reply::Full {
            usage,
            text: "mailbox full".into(),
        };
        let cases: Vec<(Reply, OverQuota, Duration, &str, Option<&str>)> = vec![
            (Reply::Ok("n".into()), bounce, young, "delivered", None),
            (
                Reply::Stored {
                    name: "n".into(),
                    usage,
                },
                bounce,
                young,
                "delivered",
                None,
            ),
            (
                Reply::perm("5.1.1", "no such mailbox"),
                bounce,
                young,
                "permanent",
                Some("5.1.1"),
            ),
            (
                Reply::perm("5.2.2", "mailbox full"),
                bounce,
                young,
                "permanent",
                Some("5.2.2"),
            ),
            (full(), bounce, young, "permanent", Some("5.2.2")),
            // Within the grace period a full mailbox defers; past it, it bounces.
            (full(), grace, young, "transient", Some("4.2.2")),
            (full(), grace, old, "permanent", Some("5.2.2")),
            (
                Reply::perm("5.2.2", "filesystem quota"),
                grace,
                young,
                "transient",
                Some("4.2.2"),
            ),
            (full(), wait, old, "transient", Some("4.2.2")),
            (
                Reply::perm("5.1.1", "no such mailbox"),
                wait,
                young,
                "permanent",
                Some("5.1.1"),
            ),
            (
                Reply::temp("4.3.0", "rename failed"),
                bounce,
                young,
                "transient",
                Some("4.3.0"),
            ),
        ];
        for (reply, policy, age, kind, status) in cases {
            let label = format!("{reply:?} {policy:?} {age:?}");
            let (got_kind, f) = match result_of(reply, &policy, age) {
                RcptResult::Delivered(_) => ("delivered", None),
                RcptResult::Permanent(f) => ("permanent", Some(f)),
                RcptResult::Transient(f) => ("transient", Some(f)),
            };
            assert_eq!(got_kind, kind, "{label}");
            assert_eq!(
                f.as_ref().and_then(|f| f.enhanced_status.as_deref()),
                status,
                "{label}"
            );
        }
    }

    #[test]
    fn settings_defaults_and_fallbacks() {
        let cfg = Config::from_str_named(
            "[PATHS]\nMAIL_ROOT = /srv/mail\n[pepsi]\nLOCAL_DOMAINS = a.test, b.test\n\
             [stage-local]\nPROGRAM = pepsi-stage-relay-to-maildir\nQUOTA = 10M\n\
             [stage-other]\nPROGRAM = pepsi-stage-relay-to-maildir\nMAILDIR_ROOT = /home\n\
             MAILDIR = %u/.maildir\nRECIPIENT_DELIMITER = -+\nHELPER = /opt/w\nNONLOCAL_STAGE = out\n",
            "t.conf",
        )
        .unwrap();
        let s = Options::from_config(&cfg, "local").unwrap();
        assert_eq!(s.root, PathBuf::from("/srv/mail"));
        assert_eq!(s.quota, Some(10 << 20));
        assert_eq!(s.delimiters, "+");
        assert_eq!(
            s.local.configured_domains().collect::<Vec<_>>(),
            vec!["a.test", "b.test"]
        );
        assert!(!s.over_quota.temporary && !s.helper.create);
        assert_eq!(s.over_quota.grace, Duration::from_secs(24 * 3600));
        assert_eq!(
            (s.quota_messages, s.quota_lookup_ttl),
            (None, Duration::from_secs(10))
        );
        let o = Options::from_config(&cfg, "other").unwrap();
        assert_eq!(
            o.template
                .mailbox(&o.root, "X-y@a.test", &o.delimiters)
                .unwrap(),
            PathBuf::from("/home/x/.maildir")
        );
        assert_eq!(o.helper.program, PathBuf::from("/opt/w"));
        assert_eq!(o.nonlocal_stage.as_deref(), Some("out"));

        let bad = Config::from_str_named("[stage-x]\nMAILDIR_ROOT = /m\nMAILDIR = %z\n", "b.conf")
            .unwrap();
        let err = Options::from_config(&bad, "x").unwrap_err().to_string();
        assert!(
            err.contains("MAILDIR") && err.contains("unknown %z"),
            "{err}"
        );
        let none = Config::from_str_named("[stage-x]\nPROGRAM = p\n", "n.conf").unwrap();
        let err = Options::from_config(&none, "x").unwrap_err().to_string();
        assert!(err.contains("MAILDIR_ROOT"), "{err}");
    }
}
