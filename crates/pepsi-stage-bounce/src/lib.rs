//! pepsi-stage-bounce: turns a message a delivery stage could not deliver (or delivered, or
//! is still retrying) into an RFC 3464 delivery status notification to its original sender,
//! and sends that on through the graph as a new null-sender message.
//!
//! Reads: the envelope, `state.bounce` (what to report), `state.dsn` (RFC 3461 NOTIFY, ORCPT,
//! RET, ENVID), `state.last_error`, `state.crypto.decrypted` (a message decrypted here returns
//! only the header block it arrived with, never the plaintext), `received_at`, the header
//! block (`Load::Headers`) and, only for a failure notice that returns the full message, the
//! body.
//! Writes: the row becomes the DSN — headers and body replaced, `mail_from` = "" (null
//! sender), `rcpt_to` = [original sender], `state` replaced by `{}`, `received_at` = now.
//! Terminal helpers: `rewrite_recipients` (advance to NEXT_STAGE with the DSN), `finish`
//! (nothing to send: null sender, a report or auto-reply, no recipient asked for this
//! notification) and `fail` (a misconfigured stage or malformed state, left for an operator
//! with `state.bounce_error`). Never `reroute`: a bounce is never itself bounced.
//!
//! Why `Load::Headers` and not `Load::Full`: the body is needed only for a failure notice
//! whose RET (or the `RETURN` default) is FULL, and then only when the message fits within
//! `MAX_RETURN_SIZE`. Every other pass — delay and success notices, RET=HDRS, the drops —
//! needs the header block alone, and a body can be many megabytes. So the stage loads the
//! headers and calls `StageContext::fetch_body(limit)` in that one case: a single SELECT
//! that transfers the body only when it is within the limit, so an oversized message never
//! crosses the wire just to be left out.
//!
//! The decisions are pure functions tested as tables: `request` (the state read into a
//! request, the NOTIFY filter), `original` (is the message a report or an auto-reply),
//! `dsn` (the notification's text). This file is the thin I/O layer on the stage contract.

use std::process::ExitCode;

use chrono::Utc;
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use serde_json::Map;

pub mod dsn;
pub mod options;
pub mod original;
pub mod request;

use dsn::{Dsn, Returned};
use options::Options;
use request::{Kind, Ret};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-bounce",
        exec: "pepsi-stage-bounce",
    };
    pub const PROGRAM: &str = "pepsi-stage-bounce";
}

/// The bounce stage.
pub struct Bounce;

/// Leaves the message failed for an operator, saying why: a bounce stage never reroutes.
fn give_up(ctx: &StageContext<'_>, reason: String) -> Result<Terminal, StageError> {
    tracing::error!(
        id = ctx.id(),
        stage = ctx.stage(),
        "cannot build a delivery status notification: {reason}"
    );
    let mut state = Map::new();
    pepsi_contract::state::BounceError(reason).insert_into(&mut state);
    ctx.fail(state)
}

impl Stage for Bounce {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Headers;
    // A notice is composed here and queued as a new row: local work, so its passes batch.
    const BATCH: bool = true;
    type Section = Options;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Bounce)
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Ok(Options::from_config(cfg, &cfg.stage_section_named(name))?)
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let id = ctx.id();
        if ctx.mail_from().is_empty() {
            tracing::info!(id, rcpt = ?ctx.rcpt_to(), "no notification: the message has a null sender; dropped");
            let log = outcome_log(
                ctx,
                Some("the message has the null sender: a notification is never returned"),
            );
            return Ok(ctx.finish()?.log(log));
        }
        if ctx.options().next_stage.is_none() {
            let reason = format!(
                "[stage-{}] has no NEXT_STAGE to send the notification to",
                ctx.options().name
            );
            return give_up(ctx, reason);
        }
        if let Some(why) = original::loop_reason(ctx.headers()?) {
            tracing::info!(
                id,
                from = ctx.mail_from(),
                "no notification: {why}; dropped"
            );
            let log = outcome_log(ctx, Some(&format!("no notification: {why}")));
            return Ok(ctx.finish()?.log(log));
        }
        let mut request = match request::parse(ctx.state(), ctx.rcpt_to()) {
            Ok(r) => r,
            Err(e) => return give_up(ctx, e),
        };
        // A failure report is the message's final outcome for its recipients, whether or
        // not anyone asked for the notice; recorded before the row becomes the DSN.
        let log = outcome_log(ctx, None);
        let kind = request.kind;
        let (wanted, unwanted): (Vec<_>, Vec<_>) = std::mem::take(&mut request.recipients)
            .into_iter()
            .partition(|r| {
                request::wanted(kind, r.notify.as_deref(), options.delay_without_notify)
            });
        if !unwanted.is_empty() {
            let skipped: Vec<&str> = unwanted.iter().map(|r| r.address.as_str()).collect();
            tracing::info!(
                id,
                kind = kind.name(),
                ?skipped,
                "recipients whose NOTIFY excludes this notification"
            );
        }
        if wanted.is_empty() {
            tracing::info!(
                id,
                kind = kind.name(),
                from = ctx.mail_from(),
                "no notification: no recipient asked for it; finished"
            );
            return Ok(ctx.finish()?.log(log));
        }

        let content = original::content(ctx.state());
        let headers = match &content {
            original::Content::Decrypted {
                original_headers: Some(h),
            } => h.clone(),
            _ => ctx.headers()?.to_vec(),
        };
        if content != original::Content::AsReceived && request.ret == Some(Ret::Full) {
            tracing::info!(
                id,
                "the message was decrypted here: only the header block it arrived with is returned"
            );
        }
        let ret = request.ret.unwrap_or(options.default_return);
        // RFC 3461 §4.3: only a notice of failure returns the full message; never the
        // plaintext of a message decrypted here (a decryption oracle for the sender).
        let (body, too_large) = if kind == Kind::Permanent
            && ret == Ret::Full
            && content == original::Content::AsReceived
        {
            let room = options
                .max_return_size
                .saturating_sub(headers.len() as u64 + 2);
            match ctx.fetch_body(room).await? {
                Some(body) => (Some(body.to_vec()), None),
                None => (None, Some(options.max_return_size)),
            }
        } else {
            (None, None)
        };
        let returned = match &body {
            Some(body) => Returned::Full {
                headers: &headers,
                body,
            },
            None => Returned::Headers {
                headers: &headers,
                too_large,
            },
        };

        let now = Utc::now();
        let arrival = ctx.received_at();
        let sender = ctx.mail_from().to_owned();
        let stamp = now.timestamp_micros();
        let message_id = format!("{stamp}.{id}.dsn@{}", options.hostname);
        let boundary_seed = format!("=_pepsi-dsn-{id}-{stamp}");
        let raw = dsn::build(&Dsn {
            kind,
            hostname: &options.hostname,
            to: &sender,
            envid: request.envid.as_deref(),
            arrival,
            now,
            message_id: &message_id,
            boundary_seed: &boundary_seed,
            recipients: &wanted,
            retry_until: options
                .max_lifetime
                .and_then(|l| chrono::Duration::from_std(l).ok())
                .map(|l| arrival + l),
            returned,
        });
        let (dsn_headers, dsn_body) = pepsi_contract::message::split(&raw);
        let reported: Vec<&str> = wanted.iter().map(|r| r.address.as_str()).collect();
        tracing::info!(
            id, kind = kind.name(), to = %sender, ?reported, routed_by = ?request.stage,
            returned = if body.is_some() { "full" } else { "headers" },
            "delivery status notification built"
        );
        ctx.set_headers(dsn_headers.to_vec());
        ctx.set_body(dsn_body.to_vec());
        ctx.set_mail_from("");
        ctx.replace_state(Map::new());
        ctx.reset_received_at();
        Ok(ctx.rewrite_recipients(vec![sender], Map::new())?.log(log))
    }
}

/// The mail log entries of a failure report: one per failed recipient, `expired` for
/// 4.4.7 and `bounced` otherwise, with the DSN's status and the details the failing stage
/// recorded; `dropped` instead when `dropped` says why no report goes out. Nothing for a
/// delay or success notice (not a final outcome: the delivery stage logged the success).
fn outcome_log(
    ctx: &StageContext<'_>,
    dropped: Option<&str>,
) -> Vec<pepsi_contract::mail_log::Entry> {
    use pepsi_contract::mail_log::Event;
    let Ok(request) = request::parse(ctx.state(), ctx.rcpt_to()) else {
        return match dropped {
            Some(why) => vec![ctx.log_entry(
                Event::Dropped,
                ctx.rcpt_to().to_vec(),
                serde_json::json!({"reason": why}),
            )],
            None => Vec::new(),
        };
    };
    if request.kind != Kind::Permanent {
        return match dropped {
            Some(why) if ctx.state().get("bounce").is_none() => vec![ctx.log_entry(
                Event::Dropped,
                ctx.rcpt_to().to_vec(),
                serde_json::json!({"reason": why}),
            )],
            _ => Vec::new(),
        };
    }
    request
        .recipients
        .iter()
        .map(|r| {
            let event = match dropped {
                Some(_) => Event::Dropped,
                None if r.status == "4.4.7" => Event::Expired,
                None => Event::Bounced,
            };
            let mut detail = serde_json::json!({
                "status": r.status,
                "diagnostic": r.diagnostic,
                "remote_mta": r.remote_mta,
                "smtp_code": r.smtp_code,
                "reply": r.reply_text,
                "failed_at": request.stage,
            });
            if let (Some(why), Some(m)) = (dropped, detail.as_object_mut()) {
                m.insert("reason".into(), why.into());
            }
            if let Some(m) = detail.as_object_mut() {
                m.retain(|_, v| !v.is_null());
            }
            ctx.log_entry(event, vec![r.address.clone()], detail)
        })
        .collect()
}

const LONG_ABOUT: &str = "\
Pepsi stage that turns a failed, delayed or delivered message into an RFC 3464 delivery status
notification (DSN) to its original sender.

A delivery stage routes a message here (its BOUNCE_STAGE) with state.bounce saying what happened
(kind permanent, delay or success; the remote reply; per-recipient details). For each recipient
the RFC 3461 NOTIFY decides whether it is reported. The row then becomes the DSN: a
multipart/report with a human explanation, a message/delivery-status part and the original's
headers (or the whole message for a failure with RET=FULL, up to MAX_RETURN_SIZE), sent with a
null sender to the original sender, with state cleared, at NEXT_STAGE. A message that
pepsi-stage-decrypt opened returns only the header block it arrived with, whatever RET says:
its row holds the plaintext, which must not go to whoever set the envelope sender.

No DSN is sent (the message is finished and the reason logged) for a null sender, for a message
that is itself a delivery or disposition report or an Auto-Submitted: auto-replied answer, or
when no recipient asked for this kind of notification. A malformed state leaves the message
failed with state.bounce_error, for an operator; a bounce is never bounced. A bad option stops
the worker at start, naming it.

Options of the stage's [stage-<name>] section:
  NEXT_STAGE            where the DSN goes (required)
  HOSTNAME              Reporting-MTA and MAILER-DAEMON@ domain (default [pepsi] HOSTNAME,
                        else the system host name)
  RETURN                headers | full: what a failure returns when the client gave no RET
                        (default headers)
  MAX_RETURN_SIZE       above this size only the headers are returned (default 100k)
  DELAY_WITHOUT_NOTIFY  yes | no: delay notices for recipients without NOTIFY (default yes)
  MAX_LIFETIME          announces Will-Retry-Until = arrival + this in delay notices

See docs/bounce.md.";

const ABOUT: &str = "Pepsi stage that turns a failed, delayed or delivered message into an RFC 3464 \
     delivery status notification to its sender";

/// The command line of `pepsi-stage-bounce`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, LONG_ABOUT)
}

/// Entry point of the `pepsi-stage-bounce` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<Bounce>(&constants::CONFIG_SOURCE, ABOUT, LONG_ABOUT)
}
