//! pepsi-stage-auto-pay: pays the postage a recipient's secretary asks of a user's mail
//! (docs/auto-pay.md). An incoming challenge carrying a postage request (`X-Pepsi-Postage`, a
//! `taler://pay/` URI, and `X-Pepsi-Postage-Amount`, as pepsi-stage-secretary writes them),
//! addressed to a user whose `auto_pay` setting consents, from an address the user wrote to
//! within WINDOW (their whitelist learnt it from their own mail: origin `sent`) and whose
//! domain vouched for it (SPF or DKIM aligned, or DMARC pass: `state.auth`), is paid
//! within the setting's limits by `pepsi-helper-auto-pay`, which runs the user's own wallet
//! as the user.
//!
//! Reads: the envelope, the header block (`Load::Headers`), `state.auto_pay`, the recipient's
//! `auto_pay` setting, `pepsi.whitelist` and `pepsi.auto_pay_payment`. Writes:
//! `state.auto_pay` (`docs/state.md`). Side effects: the payment through the helper, its row
//! in `auto_pay_payment` (paid, refused or failed; one per user, merchant and order, so a
//! challenge seen twice is paid once), and for a refusal a notice to the user queued at
//! NOTICE_STAGE (default `init`; token `auto-pay:notice:<id>`). Terminal helpers: `advance`
//! (anything not paid: the user sees the challenge and may answer it), `advance_to`
//! FILED_STAGE or `finish` (a paid challenge is filed away).
//!
//! The installed program is set-group-id `pepsi-auto-pay`, the one group that may run the
//! helper; it is therefore never folded into the shared binary. The decisions are [`plan`]'s,
//! pure; this file is the I/O around them.

use std::cell::RefCell;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chrono::Utc;
use mail_builder::MessageBuilder;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use mail_builder::mime::MimePart;
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::settings;
use pepsi_contract::settings::auto_pay::{AUTO_PAY_SETTING, AutoPay};
use pepsi_contract::settings::secretary::Amount;
use pepsi_contract::stage::edges::Declare;
use pepsi_contract::stage::{Load, RoundMemo, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::AutoPay as Mark;
use pepsi_helper_auto_pay::protocol::{Outcome, Request};
use serde_json::Map;

use crate::plan::{Postage, Refusal};

pub mod plan;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-auto-pay",
        exec: "pepsi-stage-auto-pay",
    };
    pub const PROGRAM: &str = "pepsi-stage-auto-pay";
    /// The helper, found beside this program unless HELPER names another.
    pub const DEFAULT_HELPER: &str = "pepsi-helper-auto-pay";
}

/// Where notices enter the graph unless NOTICE_STAGE says otherwise.
pub const DEFAULT_NOTICE_STAGE: &str = "init";
/// WINDOW unless set: how recent the user's mail to the payee must be.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
/// HELPER_TIMEOUT unless set.
pub const DEFAULT_HELPER_TIMEOUT: Duration = Duration::from_secs(90);

/// One `[stage-<name>]` section, read at start.
#[derive(Debug, Clone)]
pub struct Options {
    pub helper: PathBuf,
    pub helper_timeout: Duration,
    pub window: Duration,
    pub notice_stage: String,
    /// FILED_STAGE: where a paid challenge goes (a Maildir delivery into a folder); without
    /// one it is not delivered (the payment's row and `pepsi-whitelist payments` keep it).
    pub filed_stage: Option<String>,
    /// HOSTNAME (else `[pepsi] HOSTNAME`): the domain of notices' Message-IDs.
    pub hostname: String,
}

impl Options {
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Options> {
        let s = cfg.stage_section_named(stage);
        let target = |option: &str| cfg.stage_target(stage, option, None);
        let positive =
            |option: &str, default: Duration| cfg.stage_positive_duration(stage, option, default);
        let helper = s
            .string_opt("HELPER")?
            .filter(|h| !h.trim().is_empty())
            .unwrap_or_else(|| constants::DEFAULT_HELPER.to_owned());
        Ok(Options {
            helper: pepsi_conf::cli::locate_program(&helper),
            helper_timeout: positive("HELPER_TIMEOUT", DEFAULT_HELPER_TIMEOUT)?,
            window: positive("WINDOW", DEFAULT_WINDOW)?,
            notice_stage: target("NOTICE_STAGE")?
                .unwrap_or_else(|| DEFAULT_NOTICE_STAGE.to_owned()),
            filed_stage: target("FILED_STAGE")?,
            hostname: cfg.name_option(&s, "HOSTNAME")?,
        })
    }
}

/// Per mailbox, its setting as the round read it (`None`: no consent).
type Round = RoundMemo<String, Option<AutoPay>>;

/// The stage: the extension delimiters that make a mailbox, and the round's settings.
pub struct AutoPayStage {
    local: LocalRecipients,
    round: RefCell<Round>,
}

fn mark(m: Mark) -> Map<String, serde_json::Value> {
    let mut merge = Map::new();
    m.insert_into(&mut merge);
    merge
}

/// The notice of a refusal or failure to the user: what was asked, by whom, and why it was
/// not paid. Pure.
pub fn notice(
    user: &str,
    payee: &str,
    asked: &str,
    reason: &str,
    message_id: &str,
    now: chrono::DateTime<Utc>,
) -> std::io::Result<Vec<u8>> {
    let domain = pepsi_conf::address::parts(user)
        .map(|(_, d)| d.to_owned())
        .unwrap_or_default();
    let text = format!(
        "{payee} asks postage of {asked} before your message is delivered.\r\n\
         It was not paid for you: {reason}.\r\n\
         \r\n\
         The request itself is in your mailbox: you may pay it with your wallet or\r\n\
         confirm as it says. Your limits are your auto_pay setting; what was paid\r\n\
         is listed by `pepsi-whitelist payments`.\r\n"
    );
    let encoding = if text.is_ascii() { "7bit" } else { "8bit" };
    MessageBuilder::new()
        .from(format!("postmaster@{domain}"))
        .to(user)
        .subject(format!("Postage not paid: {payee} asks {asked}"))
        .date(Date::new(now.timestamp()))
        .message_id(message_id)
        .header("Auto-Submitted", Raw::new("auto-generated"))
        .body(MimePart::new("text/plain", text).transfer_encoding(encoding))
        .write_to_vec()
}

/// Records what became of `postage` for `login` (once per merchant and order).
async fn record<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    login: &str,
    payee: &str,
    postage: &Postage,
    status: &str,
    reason: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO pepsi.auto_pay_payment \
           (login, payee, merchant, order_id, currency, value, status, reason) \
         VALUES ($1, $2, $3, $4, $5, $6::numeric, $7, $8) \
         ON CONFLICT (login, merchant, order_id) DO NOTHING",
    )
    .bind(login)
    .bind(payee)
    .bind(&postage.merchant)
    .bind(&postage.order_id)
    .bind(postage.amount.currency())
    .bind(postage.amount.value_text())
    .bind(status)
    .bind(reason.map(|r| r.chars().take(1000).collect::<String>()))
    .execute(executor)
    .await?;
    Ok(())
}

impl AutoPayStage {
    /// Records a refusal or failure for `login` and queues the user's notice; the challenge
    /// goes on to the user.
    #[allow(clippy::too_many_arguments)]
    async fn refuse(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
        login: &str,
        payee: &str,
        postage: Option<&Postage>,
        status: &str,
        reason: &str,
    ) -> Result<Terminal, StageError> {
        let id = ctx.id();
        if let Some(p) = postage {
            record(ctx.pool(), login, payee, p, status, Some(reason)).await?;
        }
        let asked = postage
            .map(|p| p.amount.to_string())
            .unwrap_or_else(|| "an amount".into());
        let now = Utc::now();
        let message_id = format!(
            "{}.{id}.auto-pay@{}",
            now.timestamp_micros(),
            options.hostname
        );
        let raw = notice(login, payee, &asked, reason, &message_id, now)
            .map_err(|e| StageError::Permanent(format!("notice: {e}")))?;
        ctx.enqueue_new(
            &options.notice_stage,
            "",
            &[login.to_owned()],
            &raw,
            mark(Mark {
                made: Some("notice".into()),
                ..Mark::default()
            }),
            Some(&format!("auto-pay:notice:{id}")),
        )
        .await?;
        tracing::info!(id, login, payee, status, reason, "postage not paid");
        ctx.advance_with(mark(Mark {
            refused: Some(reason.to_owned()),
            ..Mark::default()
        }))
    }

    /// The paid challenge is filed away.
    fn file(
        &self,
        options: &Options,
        ctx: &StageContext<'_>,
        paid: &Amount,
    ) -> Result<Terminal, StageError> {
        let m = mark(Mark {
            paid: Some(paid.to_string()),
            ..Mark::default()
        });
        match &options.filed_stage {
            Some(stage) => ctx.reroute(stage, m),
            None => ctx.finish(),
        }
    }
}

impl Stage for AutoPayStage {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Headers;
    type Section = Options;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(AutoPayStage {
            local: LocalRecipients::from_config(cfg)?,
            round: RefCell::default(),
        })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    /// NEXT_STAGE, NOTICE_STAGE (default `init`) where notices enter the graph, and
    /// FILED_STAGE when set.
    fn edges(d: &mut Declare<'_>) {
        d.next();
        let notice = d
            .option("NOTICE_STAGE")
            .unwrap_or_else(|| DEFAULT_NOTICE_STAGE.to_owned());
        d.branch("NOTICE_STAGE", notice, "notice");
        if let Some(filed) = d.option("FILED_STAGE") {
            d.branch("FILED_STAGE", filed, "filed");
        }
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        if Mark::from_state(ctx.state())?.is_some() {
            return ctx.advance();
        }
        // A challenge answers one person's mail: it has one recipient.
        let [rcpt] = ctx.rcpt_to() else {
            return ctx.advance();
        };
        let login = self.local.mailbox_key(rcpt);
        let learned = settings::learn_round(
            ctx.pool(),
            &self.round,
            std::slice::from_ref(&login),
            AUTO_PAY_SETTING,
            false,
            AutoPay::from_value,
        )
        .await;
        learned.map_err(StageError::Database)?;
        let Some(setting) = self.round.borrow_mut().get(&login).cloned().flatten() else {
            return ctx.advance();
        };
        let headers = ctx.headers()?.to_vec();
        let payee = pepsi_contract::message::from_addresses(&headers)
            .into_iter()
            .next()
            .map(|a| a.to_ascii_lowercase())
            .unwrap_or_default();
        let postage = match plan::postage(&headers) {
            Ok(None) => return ctx.advance(),
            Ok(Some(p)) => p,
            Err(why) => {
                let reason = Refusal::Malformed(why).reason();
                return self
                    .refuse(options, ctx, &login, &payee, None, "refused", &reason)
                    .await;
            }
        };
        let id = ctx.id();
        // Paid before (a pass run again, the same challenge twice): filed, not paid twice.
        let before: Option<String> = sqlx::query_scalar(
            "SELECT status FROM pepsi.auto_pay_payment \
             WHERE login = $1 AND merchant = $2 AND order_id = $3",
        )
        .bind(&login)
        .bind(&postage.merchant)
        .bind(&postage.order_id)
        .fetch_optional(ctx.pool())
        .await?;
        match before.as_deref() {
            Some("paid") => return self.file(options, ctx, &postage.amount),
            Some(_) => return ctx.advance(),
            None => {}
        }
        let wrote_lately: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pepsi.whitelist \
              WHERE mailbox = $1 AND sender = $2 AND origin = 'sent' \
                AND seen_at > now() - make_interval(secs => $3))",
        )
        .bind(&login)
        .bind(&payee)
        .bind(options.window.as_secs_f64())
        .fetch_one(ctx.pool())
        .await?;
        // A challenge in a correspondent's name proves nothing unless their domain vouched
        // for it: anyone may write a From line and a link to their own merchant.
        let vouched = pepsi_conf::address::parts(&payee).is_some_and(|(_, domain)| {
            pepsi_contract::state::Auth::from_state(ctx.state())
                .ok()
                .flatten()
                .is_some_and(|auth| auth.vouches_for(domain))
        });
        let refusal = if !vouched {
            Some(Refusal::Unauthenticated(payee.clone()))
        } else if payee.is_empty() || !wrote_lately {
            Some(Refusal::UnknownPayee(payee.clone()))
        } else {
            None
        };
        if let Some(refusal) = refusal {
            let reason = refusal.reason();
            return self
                .refuse(
                    options,
                    ctx,
                    &login,
                    &payee,
                    Some(&postage),
                    "refused",
                    &reason,
                )
                .await;
        }
        // One payment of a user at a time: the month's sum is read and the payment made
        // under the user's lock, so two challenges at once cannot both fit the last room.
        let mut tx = ctx.pool().begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('pepsi.auto_pay ' || $1))")
            .bind(&login)
            .execute(&mut *tx)
            .await?;
        let spent: String = sqlx::query_scalar(
            "SELECT COALESCE(sum(value), 0)::text FROM pepsi.auto_pay_payment \
             WHERE login = $1 AND currency = $2 AND status = 'paid' \
               AND created_at >= date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'",
        )
        .bind(&login)
        .bind(postage.amount.currency())
        .fetch_one(&mut *tx)
        .await?;
        let spent_units = Amount::parse(&format!("{}:{spent}", postage.amount.currency()))
            .map(|a| a.units)
            .map_err(|e| StageError::Permanent(format!("the month's payments: {e}")))?;
        if let Err(refusal) = plan::budget(&setting, &postage.amount, spent_units) {
            drop(tx);
            let reason = refusal.reason();
            return self
                .refuse(
                    options,
                    ctx,
                    &login,
                    &payee,
                    Some(&postage),
                    "refused",
                    &reason,
                )
                .await;
        }
        let request = Request {
            login: login.clone(),
            uri: postage.uri.clone(),
            amount: postage.amount.to_string(),
        };
        let outcome = match pepsi_helper_auto_pay::client::pay(
            &options.helper,
            &request,
            options.helper_timeout,
        )
        .await
        {
            Ok(o) => o,
            // The helper did not answer (gone, timed out, crashed): the pass is tried again;
            // an order paid meanwhile is recorded then, when the wallet finds it paid.
            Err(e) if e.is_temporary() => {
                return Err(StageError::Temporary(format!(
                    "{}: {e}",
                    options.helper.display()
                )));
            }
            Err(e) => Outcome::Refused(e.to_string()),
        };
        let (status, reason) = match &outcome {
            Outcome::Paid => ("paid", None),
            Outcome::Refused(why) => ("refused", Some(why.clone())),
            Outcome::Failed(why) => ("failed", Some(why.clone())),
        };
        if status == "paid" {
            record(&mut *tx, &login, &payee, &postage, "paid", None).await?;
            tx.commit().await?;
            tracing::info!(id, %login, %payee, amount = %postage.amount, order = %postage.order_id, "postage paid");
            return self.file(options, ctx, &postage.amount);
        }
        drop(tx);
        let reason = format!("the wallet did not pay: {}", reason.unwrap_or_default());
        self.refuse(
            options,
            ctx,
            &login,
            &payee,
            Some(&postage),
            status,
            &reason,
        )
        .await
    }

    /// The round's answers are forgotten: the next round reads the settings afresh.
    async fn before_commit(&self) -> Result<(), StageError> {
        self.round.borrow_mut().clear();
        Ok(())
    }
}

const ABOUT: &str = "\
Pepsi stage: pays the postage a recipient's secretary asks of a user's mail. A challenge \
(from a confirm-to-send secretary such as pepsi-stage-secretary) carrying X-Pepsi-Postage (a \
taler://pay/ URI) and X-Pepsi-Postage-Amount, addressed to a user whose auto_pay setting \
consents (pepsi-settings set ADDRESS auto_pay '{\"per_payment\": \"KUDOS:1\", \"per_month\": \
\"KUDOS:10\"}'), from an address the user wrote to within WINDOW whose domain vouched for it \
(SPF or DKIM aligned, or DMARC pass, as the ingress verified), is paid within those limits \
by pepsi-helper-auto-pay, which runs the user's own wallet with the user's ids. A paid \
challenge is filed away (FILED_STAGE, or not delivered); a refusal (over a limit, an unknown \
payee, a malformed request, the wallet's no) is recorded, reported to the user in a notice, \
and the challenge delivered so the user may answer it. Every payment is a row of \
pepsi.auto_pay_payment (pepsi-whitelist payments).

Options of [stage-<name>]:
  HELPER          pepsi-helper-auto-pay   the helper (beside this program, then on PATH)
  HELPER_TIMEOUT  90s    the deadline of one payment
  WINDOW          7d     how recent the user's own mail to the payee must be
  NOTICE_STAGE    init   the stage notices start at
  FILED_STAGE            where a paid challenge goes (else it is not delivered)
  HOSTNAME               the domain of notices' Message-IDs ([pepsi] HOSTNAME)
  NEXT_STAGE             as for every stage

Installed set-group-id pepsi-auto-pay, the group that may run the helper. See \
docs/auto-pay.md.";

/// The command line of `pepsi-stage-auto-pay`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-auto-pay` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<AutoPayStage>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_table() {
        let cfg = |t: &str| Config::from_str_named(t, "a.conf").unwrap();
        let o = Options::from_config(
            &cfg("[pepsi]\nHOSTNAME = mx.a.test\n[stage-init]\nPROGRAM = x\n[stage-a]\n"),
            "a",
        )
        .unwrap();
        assert_eq!(
            (
                o.notice_stage.as_str(),
                o.filed_stage.as_deref(),
                o.window,
                o.helper_timeout
            ),
            ("init", None, DEFAULT_WINDOW, DEFAULT_HELPER_TIMEOUT)
        );
        assert!(
            o.helper.ends_with("pepsi-helper-auto-pay"),
            "{}",
            o.helper.display()
        );
        for (text, error) in [
            (
                "[stage-a]\nNOTICE_STAGE = nowhere\n",
                "NOTICE_STAGE = nowhere: there is no [stage-nowhere]",
            ),
            (
                "[stage-init]\nPROGRAM = x\n[stage-a]\nFILED_STAGE = gone\n",
                "FILED_STAGE = gone",
            ),
            (
                "[stage-init]\nPROGRAM = x\n[stage-a]\nWINDOW = 0s\n",
                "WINDOW must be above 0",
            ),
        ] {
            let e = Options::from_config(&cfg(&format!("[pepsi]\nHOSTNAME = h.test\n{text}")), "a")
                .unwrap_err()
                .to_string();
            assert!(e.contains(error), "{text}: {e}");
        }
    }

    #[test]
    fn a_notice_says_who_asked_what_and_why_not() {
        let raw = notice(
            "alice@a.test",
            "bob@b.test",
            "KUDOS:5",
            "KUDOS:5 is above your limit of KUDOS:1 a payment",
            "1.auto-pay@mx.a.test",
            "2026-12-06T10:00:00Z".parse().unwrap(),
        )
        .unwrap();
        let text = String::from_utf8(raw).unwrap();
        for want in [
            "From: <postmaster@a.test>",
            "To: <alice@a.test>",
            "Subject: Postage not paid: bob@b.test asks KUDOS:5",
            "Auto-Submitted: auto-generated",
            "above your limit of KUDOS:1 a payment",
        ] {
            assert!(text.contains(want), "{want}\n{text}");
        }
    }
}
