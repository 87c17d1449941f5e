//! The common end of every delivery stage: the retry policy, and how a pass's per-recipient
//! results (delivered, failed for good, failed for now) become exactly one terminal helper.
//!
//! A delivery stage (Maildir, LMTP, SMTP relays) tries each recipient and hands the results
//! to [`conclude`]. The decision itself is [`plan`], a pure function of the policy, the clock
//! and the row, tested as a table; `conclude` only applies it through the stage contract:
//!
//! - permanent failures become one bounce clone at BOUNCE_STAGE (`state.bounce.kind =
//!   "permanent"`, per-recipient details under `bounce.recipients`);
//! - delivered recipients that asked for NOTIFY=SUCCESS become a success clone when
//!   ORIGINATE_SUCCESS_DSN is on;
//! - transient failures keep the row, paused with exponential backoff (`attempts`,
//!   `last_error` in state); once the message is older than DELAY_WARNING a delay clone goes
//!   out, once (`delay_sent`); once it is older than MAX_LIFETIME (counted from
//!   `received_at`) the transient failures are bounced as expired (4.4.7).
//!
//! Clones carry tokens derived from the row id and attempt, so a re-run pass cannot send the
//! same notification twice. The bounce stage applies the NOTIFY filter; this module does not.

use std::time::Duration;

use chrono::{DateTime, Utc};
use pepsi_smtp::{ClientError, Envelope, Phase, RcptOutcome, Recipient, Reply};
use serde_json::{Map, Value};

use pepsi_conf::config::{Config, ConfigError};
use pepsi_contract::stage::{CloneSpec, StageContext, StageError, Terminal};
use pepsi_contract::state::{
    Bounce, BounceDetail, BounceKind, DeliveryScratch, Dsn, Origin, StateError,
};

/// Why one recipient was not delivered, as the bounce stage reports it (`state.bounce`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failure {
    /// Human-readable reason, e.g. "mailbox full".
    pub diagnostic: String,
    /// RFC 3463 code, e.g. "5.2.2".
    pub enhanced_status: Option<String>,
    /// The remote reply code when a peer answered.
    pub smtp_code: Option<u16>,
    pub remote_mta: Option<String>,
    pub reply_text: Option<String>,
    /// Where it failed: "connect", "MAIL", "RCPT", "DATA", "delivery" …
    pub phase: Option<String>,
}

impl Failure {
    /// A delivery attempt stopped at ATTEMPT_TIMEOUT (`limit`): transient, 4.4.2, so the
    /// recipient waits for its retry.
    pub fn attempt_timed_out(limit: std::time::Duration) -> Failure {
        Failure::new(
            format!(
                "the delivery attempt took longer than ATTEMPT_TIMEOUT ({}s): stopped, to be \
                 tried again",
                limit.as_secs()
            ),
            "4.4.2",
        )
    }

    pub fn new(diagnostic: impl Into<String>, enhanced_status: &str) -> Self {
        Failure {
            diagnostic: diagnostic.into(),
            enhanced_status: Some(enhanced_status.to_owned()),
            ..Failure::default()
        }
    }

    /// The fields of `state.bounce` (and of one `bounce.recipients` entry).
    pub fn to_detail(&self) -> BounceDetail {
        BounceDetail {
            diagnostic: Some(self.diagnostic.clone()),
            enhanced_status: self.enhanced_status.clone(),
            smtp_code: self.smtp_code,
            remote_mta: self.remote_mta.clone(),
            reply_text: self.reply_text.clone(),
            phase: self.phase.clone(),
            ..BounceDetail::default()
        }
    }

    /// One line for `state.last_error` and logs.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        if let Some(code) = self.smtp_code {
            s.push_str(&format!("{code} "));
        }
        if let Some(status) = &self.enhanced_status {
            s.push_str(&format!("{status} "));
        }
        s.push_str(&self.diagnostic);
        if let Some(mta) = &self.remote_mta {
            s.push_str(&format!(" (from {mta})"));
        }
        s
    }
}

impl Failure {
    /// What the server's refusal at `phase` means, as `state.bounce` records it.
    pub fn from_reply(phase: Phase, reply: &Reply, remote_mta: &str) -> Failure {
        Failure {
            diagnostic: format!("{} (in reply to {phase})", reply.text()),
            enhanced_status: Some(reply.status()),
            smtp_code: Some(reply.code),
            remote_mta: Some(remote_mta.to_owned()),
            reply_text: Some(reply.to_string()),
            phase: Some(phase.as_str().to_owned()),
        }
    }

    /// A conversation step that failed, as `state.bounce` records it. `remote_mta` names
    /// the peer.
    pub fn from_client(e: &ClientError, remote_mta: &str) -> Failure {
        if let ClientError::Refused { phase, reply } = e {
            return Failure::from_reply(*phase, reply, remote_mta);
        }
        Failure {
            diagnostic: e.to_string(),
            enhanced_status: Some(e.status()),
            smtp_code: None,
            remote_mta: Some(remote_mta.to_owned()),
            reply_text: None,
            phase: Some(e.phase().as_str().to_owned()),
        }
    }
}

/// Where a delivered recipient's copy went, for the mail log: the mailbox (a local
/// delivery) or the next server's final reply and name (a relay).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delivery {
    pub mailbox: Option<String>,
    pub reply: Option<String>,
    pub remote_mta: Option<String>,
}

impl Delivery {
    /// A delivery with nothing known about where it went.
    pub const UNKNOWN: Delivery = Delivery {
        mailbox: None,
        reply: None,
        remote_mta: None,
    };

    /// The mail log's `detail`: the fields that are known.
    pub fn to_detail(&self) -> serde_json::Value {
        let mut m = Map::new();
        for (k, v) in [
            ("mailbox", &self.mailbox),
            ("reply", &self.reply),
            ("remote_mta", &self.remote_mta),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), serde_json::Value::String(v.clone()));
            }
        }
        serde_json::Value::Object(m)
    }
}

/// The result of one delivery attempt for one recipient.
#[derive(Debug, Clone, PartialEq)]
pub enum RcptResult {
    Delivered(Delivery),
    Permanent(Failure),
    Transient(Failure),
}

impl RcptResult {
    /// What became of a recipient in a transaction: accepted → delivered, 5xx → permanent,
    /// 4xx and every connection failure → transient.
    pub fn from_outcome(outcome: &RcptOutcome, remote_mta: &str) -> RcptResult {
        match outcome {
            RcptOutcome::Accepted(reply) => RcptResult::Delivered(Delivery {
                mailbox: None,
                reply: Some(reply.to_string()),
                remote_mta: Some(remote_mta.to_owned()),
            }),
            RcptOutcome::Refused { phase, reply } => {
                let f = Failure::from_reply(*phase, reply, remote_mta);
                if reply.is_permanent() {
                    RcptResult::Permanent(f)
                } else {
                    RcptResult::Transient(f)
                }
            }
            RcptOutcome::Failed(e) if e.is_temporary() => {
                RcptResult::Transient(Failure::from_client(e, remote_mta))
            }
            RcptOutcome::Failed(e) => RcptResult::Permanent(Failure::from_client(e, remote_mta)),
        }
    }
}

/// The envelope of a queued message: `state.dsn` gives RET/ENVID and each recipient's
/// NOTIFY/ORCPT (by position), `state.origin.smtputf8` whether the message is UTF-8.
/// Either key may be absent; a malformed one is an error naming it.
pub fn envelope(
    mail_from: &str,
    rcpt_to: &[String],
    state: &Map<String, Value>,
) -> Result<Envelope, StateError> {
    let dsn = Dsn::from_state(state)?.unwrap_or_default();
    let origin = Origin::from_state(state)?.unwrap_or_default();
    Ok(Envelope {
        mail_from: mail_from.to_owned(),
        recipients: rcpt_to
            .iter()
            .enumerate()
            .map(|(i, address)| {
                let per = dsn.rcpt(i);
                Recipient {
                    address: address.clone(),
                    notify: per
                        .and_then(|r| r.notify.as_ref())
                        .map(|n| n.iter().map(|s| s.to_ascii_uppercase()).collect()),
                    orcpt: per.and_then(|r| r.orcpt.clone()),
                }
            })
            .collect(),
        ret: dsn.ret.map(|r| r.as_str().to_owned()),
        envid: dsn.envid,
        utf8_message: origin.smtputf8,
    })
}

/// Backoff and lifetime limits shared by the delivery stages.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Pause after the first transient failure.
    pub initial: Duration,
    /// Each further pause is this many times the previous one …
    pub factor: f64,
    /// … up to this.
    pub max_interval: Duration,
    /// Age after which one delay DSN goes out; `None` turns delay notices off.
    pub delay_warning: Option<Duration>,
    /// Age after which transient failures are bounced as expired.
    pub max_lifetime: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_secs(300),
            factor: 2.0,
            max_interval: Duration::from_secs(3600),
            delay_warning: Some(Duration::from_secs(4 * 3600)),
            max_lifetime: Duration::from_secs(5 * 86400),
        }
    }
}

impl RetryPolicy {
    /// Reads RETRY_INITIAL, RETRY_FACTOR, RETRY_MAX_INTERVAL, DELAY_WARNING (`0` = off) and
    /// MAX_LIFETIME from `[stage-<stage>]`, falling back to `[pepsi]`, then to the defaults.
    pub fn from_config(cfg: &Config, stage: &str) -> Result<Self, ConfigError> {
        let s = cfg.stage_section_named(stage).or_global();
        let d = RetryPolicy::default();
        let dur = |opt: &str, default: Duration| -> Result<Duration, ConfigError> {
            Ok(s.duration_opt(opt)?.unwrap_or(default))
        };
        let parse_factor = |v: &str| match v.trim().parse::<f64>() {
            Ok(f) if (1.0..=100.0).contains(&f) => Ok(f),
            _ => Err("a number from 1 to 100".to_owned()),
        };
        let factor = s
            .parse_opt("RETRY_FACTOR", parse_factor)?
            .unwrap_or(d.factor);
        let initial = dur("RETRY_INITIAL", d.initial)?.max(Duration::from_secs(1));
        let warning = dur("DELAY_WARNING", d.delay_warning.unwrap_or_default())?;
        Ok(RetryPolicy {
            initial,
            factor,
            max_interval: dur("RETRY_MAX_INTERVAL", d.max_interval)?.max(initial),
            delay_warning: (!warning.is_zero()).then_some(warning),
            max_lifetime: dur("MAX_LIFETIME", d.max_lifetime)?,
        })
    }

    /// The pause after the `attempts`-th failed attempt (1 = the first), before jitter.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(64) as i32;
        let secs = self.initial.as_secs_f64() * self.factor.powi(exp);
        Duration::from_secs_f64(secs.min(self.max_interval.as_secs_f64()))
    }
}

/// `1d2h`, `5m`, `30s`: the way the configuration writes durations.
fn format_duration(d: Duration) -> String {
    let mut left = d.as_secs();
    let mut out = String::new();
    for (unit, secs) in [("d", 86400), ("h", 3600), ("m", 60), ("s", 1)] {
        if left >= secs {
            out.push_str(&format!("{}{unit}", left / secs));
            left %= secs;
        }
    }
    if out.is_empty() { "0s".into() } else { out }
}

/// What the row knows that the decision needs.
#[derive(Debug, Clone)]
pub struct RowFacts {
    pub id: i64,
    pub received_at: DateTime<Utc>,
    /// `state.attempts` before this pass (0 when absent).
    pub attempts: u32,
    /// `state.delay_sent` (false when absent).
    pub delay_sent: bool,
    /// Per recipient: did it ask for NOTIFY=SUCCESS?
    pub wants_success: Vec<bool>,
    /// ORIGINATE_SUCCESS_DSN of the stage.
    pub originate_success: bool,
}

/// The decision for one pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Every recipient is settled: delete the row, spawning the notifications (if any).
    Finish { notifications: Vec<Notification> },
    /// Some recipients wait: keep those (`None` = all), pause with `scratch` merged into the
    /// state, spawn the notifications.
    Pause {
        keep: Option<Vec<usize>>,
        after: Duration,
        scratch: DeliveryScratch,
        notifications: Vec<Notification>,
    },
}

/// A notification to spawn: recipients (indices) and the `state.bounce` to give it.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    pub token: String,
    pub recipients: Vec<usize>,
    pub bounce: Bounce,
}

/// Decides what a pass with `results` (one per recipient, in order) ends with.
pub fn plan(
    policy: &RetryPolicy,
    now: DateTime<Utc>,
    row: &RowFacts,
    rcpt_to: &[String],
    results: &[RcptResult],
    stage: &str,
) -> Plan {
    let age = (now - row.received_at).to_std().unwrap_or_default();
    let expired = age >= policy.max_lifetime;
    let attempt = row.attempts + 1;

    let mut failed: Vec<(usize, Failure)> = Vec::new();
    let mut waiting: Vec<(usize, Failure)> = Vec::new();
    let mut success: Vec<usize> = Vec::new();
    for (i, r) in results.iter().enumerate() {
        match r {
            RcptResult::Delivered(_) => {
                if row.originate_success && row.wants_success.get(i).copied().unwrap_or(false) {
                    success.push(i);
                }
            }
            RcptResult::Permanent(f) => failed.push((i, f.clone())),
            RcptResult::Transient(f) if expired => {
                let mut f = f.clone();
                f.diagnostic = format!(
                    "delivery time expired after {}; last error: {}",
                    format_duration(policy.max_lifetime),
                    f.summary()
                );
                f.enhanced_status = Some("4.4.7".into());
                failed.push((i, f));
            }
            RcptResult::Transient(f) => waiting.push((i, f.clone())),
        }
    }

    let mut notifications = Vec::new();
    if !failed.is_empty() {
        notifications.push(notification(
            format!("{}:bounce:{attempt}", row.id),
            BounceKind::Permanent,
            &failed,
            rcpt_to,
            stage,
        ));
    }
    if !success.is_empty() {
        notifications.push(Notification {
            token: format!("{}:success:{attempt}", row.id),
            recipients: success,
            bounce: Bounce::new(BounceKind::Success).stage(stage),
        });
    }
    if waiting.is_empty() {
        return Plan::Finish { notifications };
    }

    let mut scratch = DeliveryScratch {
        attempts: Some(attempt),
        last_error: Some(waiting[0].1.summary()),
        delay_sent: None,
    };
    let warn = policy.delay_warning.is_some_and(|w| age >= w);
    if warn && !row.delay_sent {
        let mut delay = notification(
            format!("{}:delay", row.id),
            BounceKind::Delay,
            &waiting,
            rcpt_to,
            stage,
        );
        let until = row.received_at
            + chrono::Duration::from_std(policy.max_lifetime).unwrap_or(chrono::Duration::MAX);
        delay.bounce.will_retry_until = Some(until.to_rfc3339());
        notifications.push(delay);
        scratch.delay_sent = Some(true);
    }
    let keep = (waiting.len() < results.len()).then(|| waiting.iter().map(|(i, _)| *i).collect());
    // Never sleep past the lifetime: the last attempt happens when the message expires.
    let left = policy
        .max_lifetime
        .saturating_sub(age)
        .max(Duration::from_secs(1));
    let after = jitter(policy.backoff(attempt), row.id).min(left);
    Plan::Pause {
        keep,
        after,
        scratch,
        notifications,
    }
}

/// A `state.bounce` for `who` (index, failure): the first failure at top level, each
/// recipient's own under `recipients`.
fn notification(
    token: String,
    kind: BounceKind,
    who: &[(usize, Failure)],
    rcpt_to: &[String],
    stage: &str,
) -> Notification {
    let mut bounce = Bounce::new(kind)
        .stage(stage)
        .with_detail(who[0].1.to_detail());
    bounce.recipients = who
        .iter()
        .map(|(i, f)| (rcpt_to[*i].clone(), f.to_detail()))
        .collect();
    Notification {
        token,
        recipients: who.iter().map(|(i, _)| *i).collect(),
        bounce,
    }
}

/// Up to +10 % spread, fixed per row, so messages deferred together do not return together.
fn jitter(d: Duration, id: i64) -> Duration {
    let spread = (id.unsigned_abs().wrapping_mul(2_654_435_761) % 1000) as f64 / 10_000.0;
    d.mul_f64(1.0 + spread)
}

/// Applies [`plan`] to the message in `ctx`: the one terminal helper of a delivery pass.
/// `results` has one entry per recipient of the row, in order. A row whose recipients are
/// all done goes on to NEXT_STAGE when the section names one, else finishes.
pub fn conclude(
    ctx: &StageContext<'_>,
    policy: &RetryPolicy,
    results: &[RcptResult],
) -> Result<Terminal, StageError> {
    conclude_then(ctx, policy, results, false)
}

/// As [`conclude`], for a stage whose NEXT_STAGE is where the mail it does not handle goes
/// (the list stage passes on the recipients that are no list's): a row whose recipients are
/// all done finishes, whatever NEXT_STAGE says.
pub fn conclude_here(
    ctx: &StageContext<'_>,
    policy: &RetryPolicy,
    results: &[RcptResult],
) -> Result<Terminal, StageError> {
    conclude_then(ctx, policy, results, true)
}

fn conclude_then(
    ctx: &StageContext<'_>,
    policy: &RetryPolicy,
    results: &[RcptResult],
    finish_here: bool,
) -> Result<Terminal, StageError> {
    if results.len() != ctx.rcpt_to().len() {
        return Err(StageError::Invalid(format!(
            "{} delivery results for {} recipients",
            results.len(),
            ctx.rcpt_to().len()
        )));
    }
    let state = ctx.state();
    let scratch = DeliveryScratch::from_state(state)?;
    let facts = RowFacts {
        id: ctx.id(),
        received_at: ctx.received_at(),
        attempts: scratch.attempts.unwrap_or(0),
        delay_sent: scratch.delay_sent.unwrap_or(false),
        wants_success: (0..results.len())
            .map(|i| pepsi_contract::stage::notify_includes(state, i, "SUCCESS"))
            .collect(),
        originate_success: ctx.options().originate_success_dsn,
    };
    let stage = ctx.options().name.clone();
    let decided = plan(policy, Utc::now(), &facts, ctx.rcpt_to(), results, &stage);
    let bounce_stage = ctx.options().bounce_stage.clone();
    let specs = |notifications: Vec<Notification>| -> Result<Vec<CloneSpec>, StageError> {
        if notifications.is_empty() {
            return Ok(Vec::new());
        }
        let target = bounce_stage
            .clone()
            .ok_or_else(|| StageError::NoBounceStage(stage.to_string()))?;
        Ok(notifications
            .into_iter()
            .map(|c| {
                let mut state = Map::new();
                c.bounce.insert_into(&mut state);
                CloneSpec::new(target.clone())
                    .token(c.token)
                    .recipients(c.recipients)
                    .state(state)
            })
            .collect())
    };
    // Every delivered recipient is a final outcome, whatever happens to the others; the
    // failures are logged by the bounce stage that reports them.
    let delivered: Vec<pepsi_contract::mail_log::Entry> = results
        .iter()
        .zip(ctx.rcpt_to())
        .filter_map(|(r, rcpt)| match r {
            RcptResult::Delivered(d) => Some(ctx.log_entry(
                pepsi_contract::mail_log::Event::Delivered,
                vec![rcpt.clone()],
                d.to_detail(),
            )),
            _ => None,
        })
        .collect();
    let terminal = match decided {
        Plan::Finish { notifications } if notifications.is_empty() && finish_here => ctx.finish(),
        Plan::Finish { notifications } if notifications.is_empty() => ctx.advance_or_finish(),
        Plan::Finish { notifications } => ctx.finish_with(specs(notifications)?),
        Plan::Pause {
            keep,
            after,
            scratch,
            notifications,
        } => ctx.pause_with(scratch.to_state(), after, keep, specs(notifications)?),
    }?;
    Ok(terminal.log(delivered))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn facts(age_secs: i64, attempts: u32, delay_sent: bool) -> (RowFacts, DateTime<Utc>) {
        let now = Utc::now();
        (
            RowFacts {
                id: 7,
                received_at: now - chrono::Duration::seconds(age_secs),
                attempts,
                delay_sent,
                wants_success: vec![true, false, false],
                originate_success: true,
            },
            now,
        )
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            initial: Duration::from_secs(60),
            factor: 2.0,
            max_interval: Duration::from_secs(600),
            delay_warning: Some(Duration::from_secs(3600)),
            max_lifetime: Duration::from_secs(86400),
        }
    }

    const D: RcptResult = RcptResult::Delivered(Delivery::UNKNOWN);
    fn p() -> RcptResult {
        RcptResult::Permanent(Failure::new("no such user", "5.1.1"))
    }
    fn t() -> RcptResult {
        RcptResult::Transient(Failure::new("mailbox locked", "4.2.0"))
    }

    /// (age, attempts, delay_sent, results) → (kind, keep, clone kinds with recipients,
    /// attempts written, delay_sent written)
    #[test]
    fn decision_table() {
        type Case = (
            i64,
            u32,
            bool,
            Vec<RcptResult>,
            &'static str,
            Option<Vec<usize>>,
            Vec<(&'static str, Vec<usize>)>,
        );
        let rcpt: Vec<String> = ["a@x", "b@x", "c@x"].map(String::from).into();
        let cases: Vec<Case> = vec![
            // all delivered; a success DSN for the one that asked
            (
                0,
                0,
                false,
                vec![D, D, D],
                "finish",
                None,
                vec![("success", vec![0])],
            ),
            // one permanent failure: bounce it, the rest done
            (
                0,
                0,
                false,
                vec![D, p(), D],
                "finish",
                None,
                vec![("success", vec![0]), ("permanent", vec![1])],
            ),
            // all transient, young: pause all, no notice
            (10, 0, false, vec![t(), t(), t()], "pause", None, vec![]),
            // mixed: keep the waiting one, bounce the failed, success for the delivered
            (
                10,
                2,
                false,
                vec![D, p(), t()],
                "pause",
                Some(vec![2]),
                vec![("permanent", vec![1]), ("success", vec![0])],
            ),
            // older than DELAY_WARNING: one delay notice
            (
                7200,
                3,
                false,
                vec![D, t(), t()],
                "pause",
                Some(vec![1, 2]),
                vec![("success", vec![0]), ("delay", vec![1, 2])],
            ),
            // delay notice already sent: none again
            (7200, 4, true, vec![t(), t(), t()], "pause", None, vec![]),
            // past MAX_LIFETIME: transient become expired bounces
            (
                90000,
                9,
                true,
                vec![D, t(), t()],
                "finish",
                None,
                vec![("permanent", vec![1, 2]), ("success", vec![0])],
            ),
        ];
        for (n, (age, attempts, sent, results, kind, keep, want)) in cases.into_iter().enumerate() {
            let (f, now) = facts(age, attempts, sent);
            let got = plan(&policy(), now, &f, &rcpt, &results, "deliver");
            let (got_kind, got_keep, notifications, scratch) = match got {
                Plan::Finish { notifications } => {
                    ("finish", None, notifications, DeliveryScratch::default())
                }
                Plan::Pause {
                    keep,
                    notifications,
                    scratch,
                    after,
                } => {
                    assert!(
                        after >= policy().backoff(attempts + 1),
                        "case {n}: {after:?}"
                    );
                    ("pause", keep, notifications, scratch)
                }
            };
            assert_eq!(got_kind, kind, "case {n}");
            assert_eq!(got_keep, keep, "case {n}");
            let mut got_notifications: Vec<(&str, Vec<usize>)> = notifications
                .iter()
                .map(|c| (c.bounce.kind.name(), c.recipients.clone()))
                .collect();
            let mut want = want;
            got_notifications.sort();
            want.sort();
            assert_eq!(got_notifications, want, "case {n}");
            if kind == "pause" {
                assert_eq!(scratch.attempts, Some(attempts + 1), "case {n}");
                assert_eq!(
                    scratch.delay_sent.is_some(),
                    want.iter().any(|(k, _)| *k == "delay"),
                    "case {n}"
                );
            }
        }
    }

    #[test]
    fn expired_failures_say_so_and_bounces_name_each_recipient() {
        let (f, now) = facts(90000, 9, true);
        let rcpt: Vec<String> = ["a@x", "b@x", "c@x"].map(String::from).into();
        let Plan::Finish { notifications } =
            plan(&policy(), now, &f, &rcpt, &[p(), t(), D], "lmtp")
        else {
            panic!("expected finish");
        };
        let bounce = &notifications
            .iter()
            .find(|c| c.bounce.kind == BounceKind::Permanent)
            .unwrap()
            .bounce
            .to_value();
        assert_eq!(bounce["stage"], "lmtp");
        assert_eq!(bounce["recipients"]["a@x"]["enhanced_status"], "5.1.1");
        assert_eq!(bounce["recipients"]["b@x"]["enhanced_status"], "4.4.7");
        let diag = bounce["recipients"]["b@x"]["diagnostic"].as_str().unwrap();
        assert!(diag.starts_with("delivery time expired after 1d"), "{diag}");
        assert!(diag.contains("4.2.0 mailbox locked"), "{diag}");
    }

    /// The bounce and scratch JSON a pass writes keep the shape stored before
    /// `pepsi_contract::state` existed (and that the bounce stage reads).
    #[test]
    fn notification_and_scratch_json_keep_their_stored_shape() {
        use serde_json::json;
        let (f, now) = facts(7200, 0, false);
        let rcpt: Vec<String> = ["a@x", "b@x", "c@x"].map(String::from).into();
        let refused = Failure {
            diagnostic: "no such user".into(),
            enhanced_status: Some("5.1.1".into()),
            smtp_code: Some(550),
            remote_mta: Some("mx.example.org".into()),
            reply_text: Some("550 5.1.1 <b@x> no such user".into()),
            phase: Some("RCPT".into()),
        };
        let results = [D, RcptResult::Permanent(refused), t()];
        let Plan::Pause {
            scratch,
            notifications,
            ..
        } = plan(&policy(), now, &f, &rcpt, &results, "relay")
        else {
            panic!("expected pause");
        };
        assert_eq!(
            Value::Object(scratch.to_state()),
            json!({"attempts": 1, "last_error": "4.2.0 mailbox locked", "delay_sent": true})
        );
        let by_kind = |k: BounceKind| {
            notifications
                .iter()
                .find(|c| c.bounce.kind == k)
                .unwrap()
                .bounce
                .to_value()
        };
        let remote = json!({"diagnostic": "no such user", "enhanced_status": "5.1.1",
            "smtp_code": 550, "remote_mta": "mx.example.org",
            "reply_text": "550 5.1.1 <b@x> no such user", "phase": "RCPT"});
        let mut permanent = remote.clone();
        permanent["kind"] = json!("permanent");
        permanent["stage"] = json!("relay");
        permanent["recipients"] = json!({ "b@x": remote });
        assert_eq!(by_kind(BounceKind::Permanent), permanent);
        assert_eq!(
            by_kind(BounceKind::Success),
            json!({"kind": "success", "stage": "relay"})
        );
        let delay = by_kind(BounceKind::Delay);
        let until = (f.received_at + chrono::Duration::seconds(86400)).to_rfc3339();
        assert_eq!(
            delay,
            json!({"kind": "delay", "stage": "relay", "diagnostic": "mailbox locked",
                "enhanced_status": "4.2.0", "will_retry_until": until,
                "recipients": {"c@x": {"diagnostic": "mailbox locked",
                    "enhanced_status": "4.2.0"}}})
        );
    }

    #[test]
    fn backoff_grows_and_stops_at_the_maximum_and_never_passes_the_lifetime() {
        let pol = policy();
        let secs: Vec<u64> = (1..=6).map(|a| pol.backoff(a).as_secs()).collect();
        assert_eq!(secs, vec![60, 120, 240, 480, 600, 600]);
        // 30 s before expiry the pause is cut to the time left
        let (f, now) = facts(86400 - 30, 5, true);
        let rcpt = vec!["a@x".to_string()];
        let Plan::Pause { after, .. } = plan(&pol, now, &f, &rcpt, &[t()], "x") else {
            panic!("expected pause");
        };
        assert!(after <= Duration::from_secs(30), "{after:?}");
    }

    #[test]
    fn policy_reads_the_stage_then_the_global_section() {
        let cfg = Config::from_str_named(
            "[pepsi]\nMAX_LIFETIME = 2d\nRETRY_INITIAL = 1m\n\
             [stage-lmtp]\nRETRY_INITIAL = 30s\nDELAY_WARNING = 0\nRETRY_FACTOR = 3\n",
            "test.conf",
        )
        .unwrap();
        let pol = RetryPolicy::from_config(&cfg, "lmtp").unwrap();
        assert_eq!(pol.initial, Duration::from_secs(30));
        assert_eq!(pol.factor, 3.0);
        assert_eq!(pol.delay_warning, None);
        assert_eq!(pol.max_lifetime, Duration::from_secs(2 * 86400));
        let other = RetryPolicy::from_config(&cfg, "maildir").unwrap();
        assert_eq!(other.initial, Duration::from_secs(60));
        assert_eq!(other.delay_warning, RetryPolicy::default().delay_warning);

        let bad = Config::from_str_named("[stage-x]\nRETRY_FACTOR = 0.5\n", "bad.conf").unwrap();
        let err = RetryPolicy::from_config(&bad, "x").unwrap_err().to_string();
        assert!(
            err.contains("RETRY_FACTOR") && err.contains("bad.conf"),
            "{err}"
        );
    }

    #[test]
    fn outcomes_become_delivery_results() {
        let r = |lines: &[&str]| pepsi_smtp::reply::parse_reply(lines).unwrap();
        let refused = RcptOutcome::Refused {
            phase: Phase::Rcpt,
            reply: r(&["550 5.1.1 <b@x> no such user"]),
        };
        let RcptResult::Permanent(f) = RcptResult::from_outcome(&refused, "lmtp.test") else {
            panic!("550 is permanent");
        };
        assert_eq!(f.smtp_code, Some(550));
        assert_eq!(f.enhanced_status.as_deref(), Some("5.1.1"));
        assert_eq!(
            f.reply_text.as_deref(),
            Some("550 5.1.1 <b@x> no such user")
        );
        assert_eq!(f.phase.as_deref(), Some("RCPT"));
        assert_eq!(f.remote_mta.as_deref(), Some("lmtp.test"));
        assert_eq!(
            f.diagnostic,
            "<b@x> no such user (in reply to RCPT TO command)"
        );
        let deferred = RcptOutcome::Refused {
            phase: Phase::DataEnd,
            reply: r(&["452 mailbox full"]),
        };
        let RcptResult::Transient(f) = RcptResult::from_outcome(&deferred, "x") else {
            panic!("452 is transient");
        };
        assert_eq!(f.enhanced_status.as_deref(), Some("4.0.0"));
        assert_eq!(f.phase.as_deref(), Some("DATA"));
        let lost = RcptOutcome::Failed(ClientError::Connect {
            target: "127.0.0.1:1".into(),
            detail: "Connection refused".into(),
        });
        let RcptResult::Transient(f) = RcptResult::from_outcome(&lost, "127.0.0.1") else {
            panic!("a refused connection is transient");
        };
        assert_eq!(f.phase.as_deref(), Some("connect"));
        assert_eq!(f.enhanced_status.as_deref(), Some("4.4.1"));
        assert!(
            f.diagnostic.contains("Connection refused"),
            "{}",
            f.diagnostic
        );
        assert_eq!(
            RcptResult::from_outcome(&RcptOutcome::Accepted(r(&["250 2.0.0 ok"])), "x"),
            RcptResult::Delivered(Delivery {
                mailbox: None,
                reply: Some("250 2.0.0 ok".into()),
                remote_mta: Some("x".into()),
            })
        );
    }

    #[test]
    fn envelope_reads_the_dsn_state() {
        let state = json!({
            "dsn": {"ret": "HDRS", "envid": "id+1", "rcpt": [
                {"notify": ["success", "FAILURE"], "orcpt": "rfc822;a+x@example.org"},
                {"notify": null, "orcpt": null}
            ]},
            "origin": {"smtputf8": true}
        });
        let rcpt = vec!["a@x".to_owned(), "b@x".to_owned(), "c@x".to_owned()];
        let env = envelope("s@x", &rcpt, state.as_object().unwrap()).unwrap();
        assert_eq!(env.ret.as_deref(), Some("HDRS"));
        assert_eq!(env.envid.as_deref(), Some("id+1"));
        assert!(env.utf8_message);
        assert_eq!(
            env.recipients[0].notify,
            Some(vec!["SUCCESS".into(), "FAILURE".into()])
        );
        assert_eq!(
            env.recipients[1],
            Recipient {
                address: "b@x".into(),
                ..Default::default()
            }
        );
        assert_eq!(env.recipients[2].address, "c@x");
        let bare = envelope("", &rcpt[..1], &Map::new()).unwrap();
        assert_eq!(bare.recipients[0].notify, None);
        assert!(!bare.utf8_message);
        let bad = json!({"dsn": {"rcpt": [{"notify": "SUCCESS"}]}});
        let err = envelope("", &rcpt[..1], bad.as_object().unwrap()).unwrap_err();
        assert!(
            err.to_string().starts_with("state.dsn.rcpt[0].notify: "),
            "{err}"
        );
    }
}
