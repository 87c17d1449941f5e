//! pepsi-stage-secretary: the confirm-to-send secretary (docs/secretary.md). For the
//! recipients whose mailbox has a `secretary` setting, mail from a sender the mailbox does not
//! trust waits here until the sender confirms (a link to pepsi-httpd's page, a reply to the
//! challenge, or paid postage) or the owner decides; it expires after the setting's
//! `expire_days`.
//!
//! Reads: the envelope, `auth_user`, the header block (`Load::Headers`), `state.auth` (the
//! ingress's SPF, DKIM and DMARC verdicts), `state.secretary`, the recipients' `secretary`
//! settings, `pepsi.whitelist` and the secretary's tables. Writes: `state.secretary`
//! (`docs/state.md`). Side effects: `secretary_held` and `secretary_challenge` rows, an order
//! at the operator's GNU Taler merchant backend when postage is offered, the challenge queued
//! with a null envelope sender at CHALLENGE_STAGE (default `init`; token
//! `secretary:challenge:<id>`, so a pass run again queues it once), and
//! `pepsi.secretary_confirm` for a reply or a paid order. Terminal helpers: `advance` (on, or
//! released), `advance_to` JUNK_STAGE, `pause` (held: until the expiry, and at least every
//! RECHECK, or POSTAGE_POLL while an order is open), `finish` (discarded, expired).
//!
//! A message with several recipients is split first: each recipient whose mail is held or
//! filed as junk gets a row of its own, pending here again, so a held row has one recipient.
//! The decisions are [`plan`]'s, pure; this file is the I/O around them.

use std::cell::RefCell;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::settings;
use pepsi_contract::settings::secretary::{SECRETARY_SETTING, Secretary};
use pepsi_contract::stage::edges::Declare;
use pepsi_contract::stage::{Load, RoundMemo, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::{Auth, Secretary as Mark};
use pepsi_secretary::store::{self, How};
use pepsi_secretary::taler::{Merchant, OrderStatus};
use pepsi_secretary::{mail, token};
use serde_json::Map;
use sqlx::Row as _;

use crate::plan::{Decision, Reason};

pub mod plan;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-secretary",
        exec: "pepsi-stage-secretary",
    };
    pub const PROGRAM: &str = "pepsi-stage-secretary";
}

/// Where challenges enter the graph unless CHALLENGE_STAGE says otherwise.
pub const DEFAULT_CHALLENGE_STAGE: &str = "init";
/// RECHECK unless set: how long a held row sleeps before it looks at its decision again.
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(600);
/// POSTAGE_POLL unless set: how often an open order is asked about.
pub const DEFAULT_POSTAGE_POLL: Duration = Duration::from_secs(30);
/// MAX_CHALLENGES_PER_HOUR unless set, per mailbox.
pub const DEFAULT_MAX_CHALLENGES_PER_HOUR: u32 = 30;

/// One `[stage-<name>]` section, read at start.
#[derive(Debug, Clone)]
pub struct Options {
    pub challenge_stage: String,
    /// JUNK_STAGE: where mail the setting files as junk goes; without one it goes on with
    /// `state.junk` set.
    pub junk_stage: Option<String>,
    /// HOSTNAME (else `[pepsi] HOSTNAME`): the domain of challenges' Message-IDs.
    pub hostname: String,
    pub recheck: Duration,
    pub postage_poll: Duration,
    pub max_challenges_per_hour: u32,
    /// TALER_MERCHANT_URL with TALER_MERCHANT_TOKEN (a secrets.d fragment) and
    /// TALER_TIMEOUT: the backend postage orders are made at.
    pub merchant: Option<Merchant>,
}

impl Options {
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Options> {
        let s = cfg.stage_section_named(stage);
        let file = cfg.file().display().to_string();
        let target = |option: &str| cfg.stage_target(stage, option, None);
        let positive =
            |option: &str, default: Duration| cfg.stage_positive_duration(stage, option, default);
        let merchant = match s.string_opt("TALER_MERCHANT_URL")? {
            Some(url) if !url.trim().is_empty() => Some(
                Merchant::new(
                    &url,
                    s.string_opt("TALER_MERCHANT_TOKEN")?,
                    positive("TALER_TIMEOUT", Duration::from_secs(10))?,
                )
                .map_err(|e| anyhow::anyhow!("{file}: [stage-{stage}] TALER_MERCHANT_URL: {e}"))?,
            ),
            _ => None,
        };
        Ok(Options {
            challenge_stage: target("CHALLENGE_STAGE")?
                .unwrap_or_else(|| DEFAULT_CHALLENGE_STAGE.to_owned()),
            junk_stage: target("JUNK_STAGE")?,
            hostname: cfg.name_option(&s, "HOSTNAME")?,
            recheck: positive("RECHECK", DEFAULT_RECHECK)?,
            postage_poll: positive("POSTAGE_POLL", DEFAULT_POSTAGE_POLL)?,
            max_challenges_per_hour: s
                .number_opt("MAX_CHALLENGES_PER_HOUR")?
                .unwrap_or(DEFAULT_MAX_CHALLENGES_PER_HOUR),
            merchant,
        })
    }
}

/// Per mailbox, its setting as the round read it (`None`: no secretary).
type Round = RoundMemo<String, Option<Secretary>>;

/// The stage: the extension delimiters that make a mailbox, the public origin of the
/// confirmation page (`[pepsi] SECRETARY_URL`, else `SECURE_LINK_URL`; without either a
/// challenge asks for a reply only), and the round's settings answers.
pub struct SecretaryStage {
    local: LocalRecipients,
    base: Option<String>,
    round: RefCell<Round>,
}

/// A held row's record and its challenge, as the wake-up reads them.
struct HeldNow {
    held_id: i64,
    status: String,
    expires_at: DateTime<Utc>,
    decided_by: Option<String>,
    order_id: Option<String>,
    confirmed_at: Option<DateTime<Utc>>,
    token_hash: Option<Vec<u8>>,
}

const HELD_NOW: &str = "SELECT h.held_id, h.status, h.expires_at, h.decided_by, c.order_id, \
     c.confirmed_at, c.token_hash \
     FROM pepsi.secretary_held h LEFT JOIN pepsi.secretary_challenge c USING (challenge_id) \
     WHERE h.queue_id = $1";

fn mark(m: Mark) -> Map<String, serde_json::Value> {
    let mut merge = Map::new();
    m.insert_into(&mut merge);
    merge
}

fn until(expires: DateTime<Utc>, most: Duration) -> Duration {
    let left = (expires - Utc::now()).to_std().unwrap_or(Duration::ZERO);
    left.min(most).max(Duration::from_secs(1))
}

impl SecretaryStage {
    /// A row that waited here is passing again: the decision, if there is one, else the
    /// expiry, else an open order's state; else it sleeps again.
    async fn wake(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
        held: &Mark,
    ) -> Result<Terminal, StageError> {
        let id = ctx.id();
        let now: Option<HeldNow> = sqlx::query(HELD_NOW)
            .bind(id)
            .fetch_optional(ctx.pool())
            .await?
            .map(|r| -> Result<HeldNow, sqlx::Error> {
                Ok(HeldNow {
                    held_id: r.try_get("held_id")?,
                    status: r.try_get("status")?,
                    expires_at: r.try_get("expires_at")?,
                    decided_by: r.try_get("decided_by")?,
                    order_id: r.try_get("order_id")?,
                    confirmed_at: r.try_get("confirmed_at")?,
                    token_hash: r.try_get("token_hash")?,
                })
            })
            .transpose()?;
        let Some(now) = now else {
            // The record is gone (an operator removed it): the mail is not lost.
            tracing::warn!(id, "held mail without its secretary_held row goes on");
            return ctx.advance_with(mark(Mark {
                mailbox: held.mailbox.clone(),
                released: Some("record-missing".into()),
                ..Mark::default()
            }));
        };
        match now.status.as_str() {
            "released" => {
                tracing::info!(id, held_id = now.held_id, by = ?now.decided_by, "held mail released");
                return ctx.advance_with(mark(Mark {
                    mailbox: held.mailbox.clone(),
                    released: now.decided_by.or(Some("released".into())),
                    ..Mark::default()
                }));
            }
            "held" => {}
            status => {
                tracing::info!(id, held_id = now.held_id, status, "held mail dropped");
                return ctx.finish();
            }
        }
        if now.expires_at <= Utc::now() {
            sqlx::query(
                "UPDATE pepsi.secretary_held SET status = 'expired', decided_at = now(), \
                 decided_by = 'expiry' WHERE held_id = $1 AND status = 'held'",
            )
            .bind(now.held_id)
            .execute(ctx.pool())
            .await?;
            tracing::info!(id, held_id = now.held_id, "held mail expired unconfirmed");
            return ctx.finish();
        }
        let open_order = now.confirmed_at.is_none() && now.order_id.is_some();
        if let (true, Some(merchant), Some(order), Some(hash)) = (
            open_order,
            &options.merchant,
            &now.order_id,
            &now.token_hash,
        ) {
            match merchant.order_status(order).await {
                Ok(OrderStatus::Paid) => {
                    let c = store::confirm(ctx.pool(), hash, How::Postage).await?;
                    tracing::info!(id, order, released = c.released, "postage paid");
                    return ctx.advance_with(mark(Mark {
                        mailbox: held.mailbox.clone(),
                        released: Some(How::Postage.as_str().into()),
                        ..Mark::default()
                    }));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(id, order, "postage order not checked: {e}"),
            }
        }
        let most = if open_order && options.merchant.is_some() {
            options.postage_poll.min(options.recheck)
        } else {
            options.recheck
        };
        ctx.pause(mark(held.clone()), until(now.expires_at, most))
    }

    /// The `secretary` settings of `mailboxes` not yet known this round, in one query.
    async fn learn(&self, ctx: &StageContext<'_>, mailboxes: &[String]) -> Result<(), StageError> {
        settings::learn_round(
            ctx.pool(),
            &self.round,
            mailboxes,
            SECRETARY_SETTING,
            false,
            Secretary::from_value,
        )
        .await
        .map_err(StageError::Database)
    }

    /// Holds this one-recipient row for `mailbox`: asks the sender when `ask` (once per
    /// period), records the held message and sleeps.
    #[allow(clippy::too_many_arguments)]
    async fn hold(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
        setting: &Secretary,
        mailbox: &str,
        sender: &str,
        mut reason: Reason,
    ) -> Result<Terminal, StageError> {
        let id = ctx.id();
        let pool = ctx.pool();
        let now = Utc::now();
        let expires = now + TimeDelta::days(i64::from(setting.expire_days));
        let headers = ctx.headers()?.to_vec();
        let mut challenge_id: Option<i64> = None;
        if reason == Reason::Challenged {
            let open: Option<i64> = sqlx::query_scalar(
                "SELECT challenge_id FROM pepsi.secretary_challenge \
                 WHERE mailbox = $1 AND sender = $2 AND confirmed_at IS NULL \
                   AND created_at > now() - make_interval(days => $3) AND expires_at > now() \
                 ORDER BY created_at DESC LIMIT 1",
            )
            .bind(mailbox)
            .bind(sender)
            .bind(setting.challenge_days as i32)
            .fetch_optional(pool)
            .await?;
            challenge_id = match open {
                Some(c) => Some(c),
                None => {
                    let recent: i64 = sqlx::query_scalar(
                        "SELECT count(*) FROM pepsi.secretary_challenge \
                         WHERE mailbox = $1 AND created_at > now() - interval '1 hour'",
                    )
                    .bind(mailbox)
                    .fetch_one(pool)
                    .await?;
                    if recent >= i64::from(options.max_challenges_per_hour) {
                        tracing::warn!(
                            id,
                            mailbox,
                            sender,
                            recent,
                            "no challenge: the mailbox's hourly limit is reached"
                        );
                        reason = Reason::Limited;
                        None
                    } else {
                        Some(
                            self.challenge(
                                options, ctx, setting, mailbox, sender, expires, &headers,
                            )
                            .await?,
                        )
                    }
                }
            };
        }
        let subject: String = pepsi_contract::message::field_values(&headers, "Subject")
            .into_iter()
            .next()
            .map(|s| pepsi_conf::text::one_line(&s).chars().take(200).collect())
            .unwrap_or_default();
        sqlx::query(
            "INSERT INTO pepsi.secretary_held \
               (queue_id, mailbox, sender, mail_from, subject, size, reason, challenge_id, expires_at) \
             SELECT $1, $2, $3, $4, $5, octet_length(q.headers) + octet_length(b.body), $6, $7, $8 \
               FROM pepsi.workqueue q JOIN pepsi.workqueue_body b USING (body_id) \
              WHERE q.workqueue_id = $1 \
             ON CONFLICT (queue_id) DO NOTHING",
        )
        .bind(id)
        .bind(mailbox)
        .bind(sender)
        .bind(ctx.mail_from())
        .bind(&subject)
        .bind(reason.as_str())
        .bind(challenge_id)
        .bind(expires)
        .execute(pool)
        .await?;
        tracing::info!(
            id,
            mailbox,
            sender,
            reason = reason.as_str(),
            challenge_id,
            "mail held by the secretary"
        );
        let m = Mark {
            held: Some(reason.as_str().into()),
            mailbox: Some(mailbox.into()),
            ..Mark::default()
        };
        let most =
            if challenge_id.is_some() && setting.postage.is_some() && options.merchant.is_some() {
                options.postage_poll.min(options.recheck)
            } else {
                options.recheck
            };
        ctx.pause(mark(m), until(expires, most))
    }

    /// Makes a challenge for (mailbox, sender), with a postage order when the setting offers
    /// one and a backend is configured, and queues its mail. Returns the challenge's id.
    #[allow(clippy::too_many_arguments)]
    async fn challenge(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
        setting: &Secretary,
        mailbox: &str,
        sender: &str,
        expires: DateTime<Utc>,
        headers: &[u8],
    ) -> Result<i64, StageError> {
        let id = ctx.id();
        let token = token::Token::new().map_err(StageError::Temporary)?;
        let mut order: Option<(String, String, String)> = None;
        if let (Some(amount), Some(merchant)) = (setting.postage_amount(), &options.merchant) {
            let summary = format!("Postage for your message to {mailbox}");
            let made = async {
                let order_id = merchant.create_order(&amount, &summary).await?;
                match merchant.order_status(&order_id).await? {
                    OrderStatus::Unpaid { pay_uri } => {
                        Ok::<_, pepsi_secretary::taler::TalerError>(Some((order_id, pay_uri)))
                    }
                    _ => Ok(None),
                }
            };
            match made.await {
                Ok(Some((order_id, pay_uri))) => {
                    order = Some((order_id, pay_uri, amount.to_string()))
                }
                Ok(None) => {}
                // The sender can still confirm: the challenge goes without postage.
                Err(e) => tracing::warn!(id, mailbox, "no postage order: {e}"),
            }
        } else if setting.postage.is_some() {
            tracing::warn!(
                id,
                mailbox,
                "postage offered but the stage has no TALER_MERCHANT_URL"
            );
        }
        let challenge_id: i64 = sqlx::query_scalar(
            "INSERT INTO pepsi.secretary_challenge \
               (mailbox, sender, token_hash, expires_at, order_id, pay_uri, amount) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING challenge_id",
        )
        .bind(mailbox)
        .bind(sender)
        .bind(token.digest())
        .bind(expires)
        .bind(order.as_ref().map(|o| &o.0))
        .bind(order.as_ref().map(|o| &o.1))
        .bind(order.as_ref().map(|o| &o.2))
        .fetch_one(ctx.pool())
        .await?;
        let link = match &self.base {
            Some(base) => token::confirm_url(base, &token),
            None => "(reply to this message to confirm)".to_owned(),
        };
        let message_id = token::message_id(&token, &options.hostname);
        let original_id = pepsi_contract::message::field_values(headers, "Message-ID")
            .into_iter()
            .next()
            .map(|v| {
                v.trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_owned()
            })
            .filter(|v| !v.is_empty() && !v.contains(['<', '>', ' ', '\r', '\n']));
        let subject = pepsi_contract::message::field_values(headers, "Subject")
            .into_iter()
            .next()
            .unwrap_or_default();
        let raw = mail::challenge(&mail::Challenge {
            owner: mailbox,
            sender,
            subject: &subject,
            original_id: original_id.as_deref(),
            link: &link,
            message_id: &message_id,
            expires,
            postage: order.as_ref().map(|o| (o.2.as_str(), o.1.as_str())),
            now: Utc::now(),
        })
        .map_err(|e| StageError::Permanent(format!("challenge: {e}")))?;
        let queued = ctx
            .enqueue_new(
                &options.challenge_stage,
                "",
                &[sender.to_owned()],
                &raw,
                mark(Mark {
                    made: Some("challenge".into()),
                    ..Mark::default()
                }),
                Some(&format!("secretary:challenge:{challenge_id}")),
            )
            .await?;
        tracing::info!(id, mailbox, sender, challenge_id, queued = ?queued, postage = order.is_some(), "challenge queued");
        Ok(challenge_id)
    }
}

impl Stage for SecretaryStage {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Headers;
    type Section = Options;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        let pepsi = cfg.section("pepsi");
        let (name, value) = match pepsi.string_opt("SECRETARY_URL")? {
            Some(v) if !v.trim().is_empty() => ("SECRETARY_URL", Some(v)),
            _ => ("SECURE_LINK_URL", pepsi.string_opt("SECURE_LINK_URL")?),
        };
        let base = pepsi_conf::config::https_origin(
            name,
            "the public base of pepsi-httpd's confirmation page",
            value.as_deref(),
        )
        .map_err(|e| anyhow::anyhow!("{}: {e}", cfg.file().display()))?;
        Ok(SecretaryStage {
            local: LocalRecipients::from_config(cfg)?,
            base,
            round: RefCell::default(),
        })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    /// NEXT_STAGE for mail that goes on, CHALLENGE_STAGE (default `init`) where challenges
    /// enter the graph, and JUNK_STAGE when set.
    fn edges(d: &mut Declare<'_>) {
        d.next();
        let challenge = d
            .option("CHALLENGE_STAGE")
            .unwrap_or_else(|| DEFAULT_CHALLENGE_STAGE.to_owned());
        d.branch("CHALLENGE_STAGE", challenge, "challenge");
        if let Some(junk) = d.option("JUNK_STAGE") {
            d.branch("JUNK_STAGE", junk, "junk");
        }
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let own = Mark::from_state(ctx.state())?.unwrap_or_default();
        if own.made.is_some() {
            return ctx.advance();
        }
        if own.held.is_some() {
            return self.wake(options, ctx, &own).await;
        }
        let rcpts = ctx.rcpt_to().to_vec();
        let mailboxes: Vec<String> = rcpts.iter().map(|r| self.local.mailbox_key(r)).collect();
        self.learn(ctx, &mailboxes).await?;
        let settings: Vec<Option<Secretary>> = {
            let mut round = self.round.borrow_mut();
            mailboxes
                .iter()
                .map(|m| round.get(m).cloned().flatten())
                .collect()
        };
        if settings.iter().all(Option::is_none) {
            return ctx.advance();
        }
        let headers = ctx.headers()?.to_vec();
        let mail_from = ctx.mail_from().to_owned();
        let from = pepsi_contract::message::from_addresses(&headers);
        // A From address no whitelist entry can hold is no sender to ask or to trust.
        let check = pepsi_contract::whitelist::check(from.first().map(String::as_str))
            .filter(|c| pepsi_contract::whitelist::entry(&c.address).is_ok());
        let automated = plan::automated(&mail_from, &headers);
        // The mailboxes whose whitelist holds the sender, read now: a confirmation since the
        // whitelist stage passed counts.
        let trusted: Vec<String> = match &check {
            Some(c) => {
                sqlx::query_scalar(
                    "SELECT DISTINCT mailbox FROM pepsi.whitelist \
                     WHERE mailbox = ANY($1) AND sender = ANY($2)",
                )
                .bind(&mailboxes)
                .bind(c.keys())
                .fetch_all(ctx.pool())
                .await?
            }
            None => Vec::new(),
        };
        // A reply to a challenge confirms it, when it comes from the sender asked to the
        // mailbox that asked, and is not itself automatic.
        let mut confirmed: Vec<String> = Vec::new();
        if let (Some(tok), Some(c), None) = (token::answered_token(&headers), &check, &automated) {
            let view = store::challenge(ctx.pool(), &tok).await?;
            if let Some(v) =
                view.filter(|v| v.sender == c.address && mailboxes.contains(&v.mailbox))
            {
                let answer = store::confirm(ctx.pool(), &tok.digest(), How::Reply).await?;
                if answer.changed || answer.confirmed_by.is_some() {
                    tracing::info!(id = ctx.id(), mailbox = %v.mailbox, sender = %v.sender, released = answer.released, "challenge confirmed by a reply");
                    confirmed.push(v.mailbox);
                }
            }
        }
        let aligned = check.as_ref().is_some_and(|c| {
            let auth = Auth::from_state(ctx.state()).ok().flatten();
            auth.is_some_and(|a| a.vouches_for(c.domain.trim_start_matches('@')))
        });
        let submitted = ctx.auth_user().is_some_and(|u| !u.is_empty());
        let report = plan::is_report(&mail_from, &headers);
        let decisions: Vec<Decision> = settings
            .iter()
            .zip(&mailboxes)
            .map(|(s, m)| match s {
                None => Decision::Pass,
                Some(setting) => plan::decide(&plan::Input {
                    setting,
                    submitted,
                    trusted: trusted.contains(m) || confirmed.contains(m),
                    report,
                    automated: automated.as_ref(),
                    aligned,
                    has_from: check.is_some(),
                }),
            })
            .collect();
        let others: Vec<usize> = (0..decisions.len())
            .filter(|&i| decisions[i] != Decision::Pass)
            .collect();
        if others.is_empty() {
            return ctx.advance();
        }
        if rcpts.len() > 1 {
            // Each recipient not passing gets a row of its own, decided again here; this
            // row keeps those that pass, or the first of the others.
            let split: Vec<usize> = if others.len() == rcpts.len() {
                others[1..].to_vec()
            } else {
                others.clone()
            };
            let ids = ctx.split_off_each(&split).await?;
            tracing::info!(id = ctx.id(), rows = ?ids, "recipients split off for the secretary");
            if others.len() != rcpts.len() {
                return ctx.advance();
            }
        }
        let i = others[0];
        let setting = settings[i]
            .as_ref()
            .expect("a decision other than pass has a setting");
        let mailbox = &mailboxes[i];
        let sender = check
            .as_ref()
            .map(|c| c.address.clone())
            .unwrap_or_default();
        match decisions[i] {
            Decision::Pass => ctx.advance(),
            Decision::Junk(reason) => {
                tracing::info!(id = ctx.id(), %mailbox, reason = reason.as_str(), "filed as junk by the secretary");
                let mut merge = Map::new();
                pepsi_contract::state::Junk(true).insert_into(&mut merge);
                match &options.junk_stage {
                    Some(junk) => ctx.reroute(junk, merge),
                    None => ctx.advance_with(merge),
                }
            }
            Decision::Hold(reason) => {
                self.hold(options, ctx, setting, mailbox, &sender, reason)
                    .await
            }
            Decision::Challenge => {
                self.hold(options, ctx, setting, mailbox, &sender, Reason::Challenged)
                    .await
            }
        }
    }

    /// The round's answers are forgotten: the next round reads the settings afresh.
    async fn before_commit(&self) -> Result<(), StageError> {
        self.round.borrow_mut().clear();
        Ok(())
    }
}

const ABOUT: &str = "\
Pepsi stage: the confirm-to-send secretary. For each recipient whose mailbox has a \
`secretary` setting (pepsi-settings set ADDRESS secretary '{}'), mail from a sender the \
mailbox's whitelist does not hold waits at this stage. The sender is asked to confirm, once \
per challenge_days, only when SPF or DKIM passed for the From domain (or DMARC passed), and \
never for a list's, bulk or automatic message (RFC 3834): those are held without a word, or \
filed as junk, or delivered, as the setting's unauthenticated and automated say. The \
challenge (Auto-Submitted: auto-replied, a null envelope sender, nothing of the message but \
its subject) carries a link to pepsi-httpd's confirmation page ([pepsi] SECRETARY_URL, else \
SECURE_LINK_URL) and may be answered by a reply; where the setting offers postage and \
TALER_MERCHANT_URL names a GNU Taler merchant backend, it also carries a taler://pay/ URI, and \
a paid order confirms. Confirming releases every held message of that sender to that mailbox \
and adds the sender to the whitelist; unconfirmed mail expires after expire_days. The owner \
releases or discards held mail with pepsi-whitelist held, or from the page a digest links to.

Options of [stage-<name>]:
  CHALLENGE_STAGE          init   the stage challenges start at
  JUNK_STAGE                      where mail filed as junk goes (without one: on, with state.junk)
  HOSTNAME                        the domain of challenges' Message-IDs ([pepsi] HOSTNAME)
  RECHECK                  10m    how often a held message looks at its decision again
  POSTAGE_POLL             30s    how often an open postage order is asked about
  MAX_CHALLENGES_PER_HOUR  30     challenges one mailbox may send in an hour
  TALER_MERCHANT_URL              the merchant backend's instance URL (postage)
  TALER_MERCHANT_TOKEN            its access token (put it in a secrets.d fragment)
  TALER_TIMEOUT            10s    the deadline of a request to the backend
  NEXT_STAGE                      as for every stage

See docs/secretary.md.";

/// The command line of `pepsi-stage-secretary`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-secretary` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<SecretaryStage>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_table() {
        let cfg = |t: &str| Config::from_str_named(t, "s.conf").unwrap();
        let o = Options::from_config(
            &cfg("[pepsi]\nHOSTNAME = mx.example.test\n[stage-init]\nPROGRAM = x\n[stage-s]\n"),
            "s",
        )
        .unwrap();
        assert_eq!(
            (
                o.challenge_stage.as_str(),
                o.junk_stage.as_deref(),
                o.recheck,
                o.postage_poll,
                o.max_challenges_per_hour
            ),
            ("init", None, DEFAULT_RECHECK, DEFAULT_POSTAGE_POLL, 30)
        );
        assert!(o.merchant.is_none());
        let o = Options::from_config(
            &cfg(
                "[pepsi]\nHOSTNAME = h.test\n[stage-j]\nPROGRAM = x\n[stage-in]\nPROGRAM = x\n\
                  [stage-s]\nCHALLENGE_STAGE = in\nJUNK_STAGE = j\nRECHECK = 1m\n\
                  TALER_MERCHANT_URL = http://127.0.0.1:9/instances/a\n",
            ),
            "s",
        )
        .unwrap();
        assert_eq!(o.junk_stage.as_deref(), Some("j"));
        assert_eq!(o.recheck, Duration::from_secs(60));
        assert_eq!(
            o.merchant.unwrap().base(),
            "http://127.0.0.1:9/instances/a/"
        );
        for (text, error) in [
            (
                "[stage-s]\nCHALLENGE_STAGE = nowhere\n",
                "CHALLENGE_STAGE = nowhere: there is no [stage-nowhere]",
            ),
            ("[stage-s]\nJUNK_STAGE = nowhere\n", "JUNK_STAGE = nowhere"),
            (
                "[stage-init]\nPROGRAM = x\n[stage-s]\nRECHECK = 0s\n",
                "RECHECK must be above 0",
            ),
            (
                "[stage-init]\nPROGRAM = x\n[stage-s]\nTALER_MERCHANT_URL = ftp://x\n",
                "TALER_MERCHANT_URL",
            ),
        ] {
            let e = Options::from_config(&cfg(&format!("[pepsi]\nHOSTNAME = h.test\n{text}")), "s")
                .unwrap_err()
                .to_string();
            assert!(e.contains(error), "{text}: {e}");
        }
    }
}
