//! `pepsi-list maintain`: one pass of the lists' periodic work (docs/lists.md, "Periodic
//! work"), run by the `pepsi-list-maintain.timer` every few minutes:
//!
//! - to each member whose delivery bounces disabled (`by_bounces`), a warning every
//!   `bounce_warning_interval`; after `bounce_warnings` of them the member is removed;
//! - bounce scores that went stale (`bounce_info_stale_after`) set back to 0;
//! - requests waiting past `expires_at` (`list_pending`) deleted; held posts past theirs
//!   deleted with an `expire` decision; expired member links and ended confirmation windows
//!   deleted;
//! - digests due by their period sent (`send_due_digests`).
//!
//! Idempotent and safe from two hosts at once: each list is done in one transaction that
//! first takes a transaction-level advisory lock on the list (a second run skips a list
//! the first holds), and each warning is queued with an at-most-once token
//! (`pepsi.list_queue_mail`), so no two runs ever send the same warning. The pure
//! decisions (`step`, `warning`) are tested as tables; the SQL is here beside them.

use chrono::{DateTime, Utc};
use mail_builder::MessageBuilder;
use mail_builder::headers::date::Date;
use mail_builder::headers::raw::Raw;
use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_conf::config::Config;
use pepsi_contract::audit;
use serde::Serialize;
use serde_json::json;
use sqlx::{PgConnection, PgPool, Row as _};

use crate::store::Who;

/// The name maintain's rows carry as actor and moderator.
pub const ACTOR: &str = "pepsi-list maintain";

/// Where the list stage's copies start unless its `DELIVER_STAGE` says otherwise (the list
/// stage's own default, `pepsi_stage_list::DEFAULT_DELIVER_STAGE`).
pub const DEFAULT_DELIVER_STAGE: &str = "aliases";

/// The most warnings and removals of one list per pass; the rest wait for the next.
pub const MAX_MEMBERS_PER_PASS: i64 = 1000;

/// The most expired requests or held posts of one list deleted per pass.
pub const MAX_EXPIRED_PER_PASS: i64 = 10_000;

/// What the configuration says about the mail maintain sends.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where warnings start (the list stage's DELIVER_STAGE); `None`: no stage runs
    /// pepsi-stage-list, and no warning is sent (members are not removed either, since
    /// they were never warned).
    pub deliver_stage: Option<String>,
    /// The domain of the warnings' Message-IDs (the list stage's HOSTNAME).
    pub hostname: String,
    /// `[pepsi] LIST_WEB_URL`: the one-click unsubscribe links of the digests sent here.
    pub web_url: Option<String>,
}

impl Settings {
    /// Reads the list stage `stage`'s DELIVER_STAGE and HOSTNAME (`None`: there is no
    /// list stage).
    pub fn from_config(cfg: &Config, stage: Option<&str>) -> anyhow::Result<Settings> {
        let Some(stage) = stage else {
            return Ok(Settings {
                deliver_stage: None,
                hostname: cfg.name_option(&cfg.section("pepsi"), "HOSTNAME")?,
                web_url: None,
            });
        };
        let section = cfg.stage_section_named(stage);
        let deliver = section
            .string_opt("DELIVER_STAGE")?
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| DEFAULT_DELIVER_STAGE.to_owned());
        let Some(deliver) = cfg.stage(&deliver) else {
            anyhow::bail!(
                "{}: [stage-{stage}] DELIVER_STAGE = {deliver}: there is no [stage-{deliver}] \
                 to send the bounce warnings to",
                cfg.file().display()
            );
        };
        Ok(Settings {
            deliver_stage: Some(deliver.to_string()),
            hostname: cfg.name_option(&section, "HOSTNAME")?,
            web_url: cfg
                .section("pepsi")
                .string_opt("LIST_WEB_URL")?
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty()),
        })
    }
}

/// What is due for a member disabled by bounces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Send warning number n (1-based).
    Warn(i32),
    /// Every warning went out and the last interval passed: remove the member.
    Remove,
}

/// The step due for a member with `warnings_sent` of the list's `bounce_warnings` sent (the
/// caller asks only when `bounce_warning_interval` has passed since the last one).
pub fn step(warnings_sent: i32, bounce_warnings: i32) -> Step {
    if warnings_sent < bounce_warnings {
        Step::Warn(warnings_sent.max(0) + 1)
    } else {
        Step::Remove
    }
}

/// A duration as a person reads it: `7 days`, `1 day 12 hours`, `3 hours`.
pub fn human(secs: i64) -> String {
    let days = secs / 86_400;
    let hours = (secs % 86_400) / 3_600;
    let unit = |n: i64, one: &str| format!("{n} {one}{}", if n == 1 { "" } else { "s" });
    match (days, hours) {
        (0, 0) => unit(((secs + 59) / 60).max(1), "minute"),
        (0, h) => unit(h, "hour"),
        (d, 0) => unit(d, "day"),
        (d, h) => format!("{} {}", unit(d, "day"), unit(h, "hour")),
    }
}

/// What a warning says.
#[derive(Debug, Clone, PartialEq)]
pub struct Warning<'a> {
    pub list: &'a str,
    pub display_name: &'a str,
    pub member: &'a str,
    pub score: f64,
    pub threshold: f64,
    /// This warning's number and how many there are.
    pub number: i32,
    pub of: i32,
    pub interval_secs: i64,
}

/// The command address `suffix` (`-owner`, `-leave`) of `list`.
fn command_address(list: &str, suffix: &str) -> String {
    use pepsi_conf::address::{domain_part, local_part};
    match domain_part(list) {
        Some(domain) => format!("{}{suffix}@{domain}", local_part(list)),
        None => list.to_owned(),
    }
}

/// The subject and text of a bounce warning.
pub fn warning(w: &Warning<'_>) -> (String, String) {
    let name = if w.display_name.is_empty() {
        w.list.to_owned()
    } else {
        format!("{} ({})", w.display_name, w.list)
    };
    let subject = format!("Your delivery from {} is disabled", w.list);
    let left = w.of - w.number;
    let removal = human(w.interval_secs * i64::from(left + 1));
    let text = format!(
        "Mail from the mailing list {name} to {member} has failed too often (bounce score \
         {score:.2}, limit {threshold:.2}), so the list has stopped sending you its posts.\n\
         \n\
         This is warning {number} of {of}. Unless delivery is turned back on, {member} will \
         be removed from the list in about {removal}.\n\
         \n\
         To stay on the list, write to its owners at {owner} and ask them to turn delivery \
         back on once your mailbox takes mail again.\n\
         To leave the list now, send a message to {leave}.\n",
        member = w.member,
        score = w.score,
        threshold = w.threshold,
        number = w.number,
        of = w.of,
        owner = command_address(w.list, "-owner"),
        leave = command_address(w.list, "-leave"),
    );
    (subject, text)
}

/// The at-most-once token of warning `number` to `member` of list `list_id`, for the
/// disabling that began at `disabled_at` (a member disabled again later is warned again).
pub fn warning_token(list_id: i64, member: &str, disabled_at: i64, number: i32) -> String {
    format!("list-warn:{list_id}:{disabled_at}:{number}:{member}")
}

/// A warning sent.
#[derive(Debug, Clone, Serialize)]
pub struct Warned {
    pub address: String,
    pub warning: i32,
    pub of: i32,
    pub queue_id: i64,
}

/// What one pass did to one list.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ListDone {
    pub list: String,
    /// Another run held the list: nothing was done to it by this one.
    pub busy: bool,
    pub warned: Vec<Warned>,
    /// Members removed after their last warning.
    pub removed: Vec<String>,
    /// Members due a warning that was not sent: no list stage in the configuration.
    pub not_warned: Vec<String>,
    /// Bounce scores set back to 0 because they went stale.
    pub scores_reset: u64,
    /// Requests (`list_pending`) deleted past their expiry.
    pub pending_expired: u64,
    /// Held posts deleted past their expiry, by id.
    pub held_expired: Vec<i64>,
}

impl ListDone {
    fn changed(&self) -> bool {
        !self.warned.is_empty()
            || !self.removed.is_empty()
            || self.scores_reset > 0
            || self.pending_expired > 0
            || !self.held_expired.is_empty()
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Done {
    pub lists: Vec<ListDone>,
    pub member_links_expired: u64,
    pub confirm_windows_deleted: u64,
    pub digests_sent: u64,
}

/// One pass over every list, then the tables of no one list. The dispatcher is woken
/// when warnings were queued.
pub async fn run(pool: &PgPool, who: &Who, settings: &Settings) -> Result<Done, Failure> {
    let lists: Vec<(i64, String)> =
        sqlx::query_as("SELECT list_id, address FROM pepsi.mailing_list ORDER BY list_id")
            .fetch_all(pool)
            .await?;
    let mut done = Done::default();
    for (list_id, address) in lists {
        let mut tx = pool.begin().await?;
        let mut list = ListDone {
            list: address.clone(),
            ..ListDone::default()
        };
        let locked: bool = sqlx::query_scalar(
            "SELECT pg_try_advisory_xact_lock(hashtextextended('pepsi-list maintain ' || $1, 0))",
        )
        .bind(list_id)
        .fetch_one(&mut *tx)
        .await?;
        // The list row shared: a concurrent delete waits for this pass to finish.
        let exists: Option<i64> = sqlx::query_scalar(
            "SELECT list_id FROM pepsi.mailing_list WHERE list_id = $1 FOR SHARE",
        )
        .bind(list_id)
        .fetch_optional(&mut *tx)
        .await?;
        if !locked {
            list.busy = true;
        } else if exists.is_some() {
            bounce_steps(&mut tx, settings, list_id, &address, &mut list).await?;
            expire(&mut tx, list_id, &address, &mut list).await?;
        }
        if list.changed() {
            audit::record(
                &mut tx,
                &who.actor,
                "list.maintain",
                None,
                serde_json::to_value(&list).unwrap_or_default(),
            )
            .await?;
        }
        tx.commit().await?;
        if exists.is_some() {
            done.lists.push(list);
        }
    }
    done.member_links_expired =
        sqlx::query("DELETE FROM pepsi.list_member_link WHERE expires_at < now()")
            .execute(pool)
            .await?
            .rows_affected();
    // A window is kept one window past its end: a limit reading the window before the
    // current one still finds it.
    done.confirm_windows_deleted = sqlx::query(
        "DELETE FROM pepsi.list_confirm_rate r USING pepsi.mailing_list l \
          WHERE r.list_id = l.list_id AND r.window_start + 2 * l.confirm_window < now()",
    )
    .execute(pool)
    .await?
    .rows_affected();
    done.digests_sent = send_due_digests(pool, settings).await?;
    if done.lists.iter().any(|l| !l.warned.is_empty()) {
        // procedures.sql's NOTIFY contract: the warnings' rows are there either way; a lost
        // wake-up only waits for the dispatcher's next claim.
        if let Err(e) = pepsi_contract::db::notify_workqueue(pool).await {
            tracing::warn!(error = %e, "could not wake the dispatcher");
        }
    }
    Ok(done)
}

/// The digests due by period: every list's open digest whose `digest_period` has passed
/// since its first post, sent (`pepsi_list_digest::store::send_due`: each marked sent in the
/// transaction that queues its rows, so a digest goes out once); the number sent. Digests
/// by size go out from the list stage as posts arrive. Without a list stage they wait.
async fn send_due_digests(pool: &PgPool, settings: &Settings) -> Result<u64, Failure> {
    let Some(deliver_stage) = settings.deliver_stage.as_deref() else {
        return Ok(0);
    };
    let route = pepsi_list_digest::Route {
        deliver_stage,
        hostname: &settings.hostname,
        web_url: settings.web_url.as_deref(),
    };
    let sent = pepsi_list_digest::store::send_due(pool, &route).await?;
    for s in &sent {
        tracing::info!(list = %s.list, volume = s.volume, number = s.number, posts = s.posts,
            mime = s.mime_members, plain = s.plain_members, "digest sent");
    }
    Ok(sent.len() as u64)
}

async fn event(
    tx: &mut PgConnection,
    list_id: i64,
    address: &str,
    event: &str,
    detail: serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(list_id)
    .bind(address)
    .bind(event)
    .bind(detail)
    .bind(ACTOR)
    .execute(tx)
    .await?;
    Ok(())
}

/// Warnings and removals of members disabled by bounces, and stale scores set back to 0.
async fn bounce_steps(
    tx: &mut PgConnection,
    settings: &Settings,
    list_id: i64,
    list: &str,
    done: &mut ListDone,
) -> Result<(), Failure> {
    let rows = sqlx::query(
        "SELECT s.address, s.warnings_sent, s.score::float8 AS score, \
                extract(epoch FROM s.disabled_at)::int8 AS disabled_at, \
                l.bounce_warnings, l.bounce_score_threshold::float8 AS threshold, \
                extract(epoch FROM l.bounce_warning_interval)::int8 AS interval_secs, \
                l.display_name \
           FROM pepsi.list_bounce_score s \
           JOIN pepsi.mailing_list l ON l.list_id = s.list_id \
           JOIN pepsi.list_member m \
             ON m.list_id = s.list_id AND m.address = s.address AND m.role = 'member' \
          WHERE s.list_id = $1 AND m.delivery_status = 'by_bounces' \
            AND s.disabled_at IS NOT NULL \
            AND (s.last_warning_at IS NULL \
                 OR s.last_warning_at + l.bounce_warning_interval <= now()) \
          ORDER BY s.address LIMIT $2 \
          FOR UPDATE OF s, m",
    )
    .bind(list_id)
    .bind(MAX_MEMBERS_PER_PASS)
    .fetch_all(&mut *tx)
    .await?;
    for r in rows {
        let address: String = r.try_get("address")?;
        let sent: i32 = r.try_get("warnings_sent")?;
        let of: i32 = r.try_get("bounce_warnings")?;
        match step(sent, of) {
            Step::Warn(number) => {
                let Some(stage) = &settings.deliver_stage else {
                    done.not_warned.push(address);
                    continue;
                };
                let display_name: String = r.try_get("display_name")?;
                let w = Warning {
                    list,
                    display_name: &display_name,
                    member: &address,
                    score: r.try_get("score")?,
                    threshold: r.try_get("threshold")?,
                    number,
                    of,
                    interval_secs: r.try_get("interval_secs")?,
                };
                let disabled_at: i64 = r.try_get("disabled_at")?;
                let token = warning_token(list_id, &address, disabled_at, number);
                let raw = compose(settings, list, &w, &token)?;
                let (headers, body) = pepsi_contract::message::split(&raw);
                let queue_id: Option<i64> = sqlx::query_scalar(
                    "SELECT pepsi.list_queue_mail($1, $2, $3, ARRAY[$4], $5, $6, $7)",
                )
                .bind(list)
                .bind(stage)
                .bind(command_address(list, "-bounces"))
                .bind(&address)
                .bind(headers)
                .bind(body)
                .bind(&token)
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE pepsi.list_bounce_score SET warnings_sent = $3, \
                            last_warning_at = now() WHERE list_id = $1 AND address = $2",
                )
                .bind(list_id)
                .bind(&address)
                .bind(number)
                .execute(&mut *tx)
                .await?;
                // A used token: this warning went out before (a run whose update was lost
                // cannot be, both are in one transaction; a token is never reused).
                let Some(queue_id) = queue_id else {
                    continue;
                };
                event(
                    tx,
                    list_id,
                    &address,
                    "member.warn",
                    json!({"list": list, "why": "bounces", "warning": number, "of": of,
                           "queue_id": queue_id}),
                )
                .await?;
                done.warned.push(Warned {
                    address,
                    warning: number,
                    of,
                    queue_id,
                });
            }
            Step::Remove => {
                if of > 0 && settings.deliver_stage.is_none() {
                    // Never warned here: not removed either.
                    done.not_warned.push(address);
                    continue;
                }
                sqlx::query(
                    "DELETE FROM pepsi.list_member \
                      WHERE list_id = $1 AND address = $2 AND role = 'member'",
                )
                .bind(list_id)
                .bind(&address)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "DELETE FROM pepsi.list_bounce_score WHERE list_id = $1 AND address = $2",
                )
                .bind(list_id)
                .bind(&address)
                .execute(&mut *tx)
                .await?;
                event(
                    tx,
                    list_id,
                    &address,
                    "member.remove",
                    json!({"list": list, "why": "bounces", "warnings_sent": sent,
                           "role": "member"}),
                )
                .await?;
                done.removed.push(address);
            }
        }
    }
    // As the list stage counts: stale once the last counted bounce is older than
    // bounce_info_stale_after. Disabled members keep theirs (their warnings go on).
    done.scores_reset = sqlx::query(
        "UPDATE pepsi.list_bounce_score s SET score = 0 FROM pepsi.mailing_list l \
          WHERE s.list_id = $1 AND l.list_id = s.list_id AND s.disabled_at IS NULL \
            AND s.score > 0 AND s.last_bounce_on + l.bounce_info_stale_after < current_date",
    )
    .bind(list_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    Ok(())
}

/// A warning as the list's message: from the list's `-request` address, replies to its
/// owners, `Auto-Submitted: auto-generated`, the list's `List-Id`.
fn compose(
    settings: &Settings,
    list: &str,
    w: &Warning<'_>,
    token: &str,
) -> Result<Vec<u8>, Failure> {
    let (subject, text) = warning(w);
    let now = Utc::now();
    let id = token_digest(token);
    let list_id = list.replacen('@', ".", 1);
    MessageBuilder::new()
        .from(command_address(list, "-request"))
        .reply_to(command_address(list, "-owner"))
        .to(w.member)
        .subject(subject)
        .date(Date::new(now.timestamp()))
        .message_id(format!(
            "{}.{id}.warn@{}",
            now.timestamp_micros(),
            settings.hostname
        ))
        .header("Auto-Submitted", Raw::new("auto-generated"))
        .header("List-Id", Raw::new(format!("<{list_id}>")))
        .text_body(text)
        .write_to_vec()
        .map_err(|e| Failure::Other(anyhow::anyhow!("writing a bounce warning: {e}")))
}

/// A Message-ID part made from a warning's token (FNV-1a, 64 bits, in hex): unique per
/// warning without putting the member's address in the Message-ID.
fn token_digest(token: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in token.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Requests and held posts of the list past their expiry.
async fn expire(
    tx: &mut PgConnection,
    list_id: i64,
    list: &str,
    done: &mut ListDone,
) -> Result<(), Failure> {
    done.pending_expired = sqlx::query(
        "DELETE FROM pepsi.list_pending WHERE pending_id IN \
           (SELECT pending_id FROM pepsi.list_pending \
             WHERE list_id = $1 AND expires_at < now() ORDER BY pending_id LIMIT $2)",
    )
    .bind(list_id)
    .bind(MAX_EXPIRED_PER_PASS)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let held: Vec<(i64, String, String, String, DateTime<Utc>)> = sqlx::query_as(
        "DELETE FROM pepsi.list_held_message WHERE held_id IN \
           (SELECT held_id FROM pepsi.list_held_message \
             WHERE list_id = $1 AND expires_at < now() ORDER BY held_id LIMIT $2 \
             FOR UPDATE SKIP LOCKED) \
         RETURNING held_id, sender, message_id, subject, held_at",
    )
    .bind(list_id)
    .bind(MAX_EXPIRED_PER_PASS)
    .fetch_all(&mut *tx)
    .await?;
    for (id, sender, message_id, subject, held_at) in held {
        sqlx::query(
            "INSERT INTO pepsi.list_moderation_decision \
             (list_id, subject_kind, sender, message_id, action, moderator, reason) \
             VALUES ($1, 'post', $2, $3, 'expire', $4, 'held_lifetime passed')",
        )
        .bind(list_id)
        .bind(&sender)
        .bind(&message_id)
        .bind(ACTOR)
        .execute(&mut *tx)
        .await?;
        event(
            tx,
            list_id,
            &sender,
            "post.expire",
            json!({"list": list, "held_id": id, "subject": subject,
                   "message_id": message_id, "held_at": held_at}),
        )
        .await?;
        done.held_expired.push(id);
    }
    Ok(())
}

/// The text `maintain` prints: a line per list that changed or was busy, then the rest, or
/// one line saying nothing was due.
pub fn render(done: &Done) -> String {
    let mut out = String::new();
    for l in &done.lists {
        if l.busy {
            out.push_str(&format!(
                "{}: busy (another maintain run holds it)\n",
                l.list
            ));
            continue;
        }
        let mut parts: Vec<String> = Vec::new();
        for w in &l.warned {
            parts.push(format!(
                "bounce warning {} of {} to {}",
                w.warning, w.of, w.address
            ));
        }
        for a in &l.removed {
            parts.push(format!("{a} removed after bounces"));
        }
        for a in &l.not_warned {
            parts.push(format!("{a} due a warning, not sent (no list stage)"));
        }
        if l.scores_reset > 0 {
            parts.push(format!("{} stale bounce scores reset", l.scores_reset));
        }
        if l.pending_expired > 0 {
            parts.push(format!("{} requests expired", l.pending_expired));
        }
        if !l.held_expired.is_empty() {
            let ids: Vec<String> = l.held_expired.iter().map(i64::to_string).collect();
            parts.push(format!("held posts expired: {}", ids.join(", ")));
        }
        for p in parts {
            out.push_str(&format!("{}: {p}\n", l.list));
        }
    }
    if done.member_links_expired > 0 {
        out.push_str(&format!(
            "{} member links expired\n",
            done.member_links_expired
        ));
    }
    if done.confirm_windows_deleted > 0 {
        out.push_str(&format!(
            "{} confirmation windows deleted\n",
            done.confirm_windows_deleted
        ));
    }
    if done.digests_sent > 0 {
        out.push_str(&format!("{} digests sent\n", done.digests_sent));
    }
    if out.is_empty() {
        out = format!("nothing due on {} lists\n", done.lists.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_table() {
        let cases: &[(i32, i32, Step)] = &[
            (0, 3, Step::Warn(1)),
            (1, 3, Step::Warn(2)),
            (2, 3, Step::Warn(3)),
            (3, 3, Step::Remove),
            (4, 3, Step::Remove),
            (0, 0, Step::Remove),
            (-1, 1, Step::Warn(1)),
        ];
        for (sent, of, want) in cases {
            assert_eq!(step(*sent, *of), *want, "{sent} of {of}");
        }
    }

    #[test]
    fn human_table() {
        let cases: &[(i64, &str)] = &[
            (7 * 86_400, "7 days"),
            (86_400, "1 day"),
            (86_400 + 12 * 3_600, "1 day 12 hours"),
            (3_600, "1 hour"),
            (3 * 3_600 + 59, "3 hours"),
            (90, "2 minutes"),
            (0, "1 minute"),
        ];
        for (secs, want) in cases {
            assert_eq!(human(*secs), *want, "{secs}");
        }
    }

    #[test]
    fn warnings_table() {
        let w = |number: i32, of: i32, display_name: &'static str| Warning {
            list: "team@example.org",
            display_name,
            member: "bob@example.net",
            score: 5.5,
            threshold: 5.0,
            number,
            of,
            interval_secs: 7 * 86_400,
        };
        let cases: &[(Warning<'_>, &[&str])] = &[
            (
                w(1, 3, "The Team"),
                &[
                    "The Team (team@example.org)",
                    "bob@example.net",
                    "bounce score 5.50, limit 5.00",
                    "warning 1 of 3",
                    "in about 21 days",
                    "team-owner@example.org",
                    "team-leave@example.org",
                ],
            ),
            (
                w(3, 3, ""),
                &[
                    "mailing list team@example.org to",
                    "warning 3 of 3",
                    "in about 7 days",
                ],
            ),
        ];
        for (warning_in, wants) in cases {
            let (subject, text) = warning(warning_in);
            assert_eq!(subject, "Your delivery from team@example.org is disabled");
            for want in *wants {
                assert!(text.contains(want), "{want:?} not in {text}");
            }
        }
    }

    #[test]
    fn render_table() {
        let quiet = Done {
            lists: vec![ListDone {
                list: "team@example.org".into(),
                ..ListDone::default()
            }],
            ..Done::default()
        };
        let busy = Done {
            lists: vec![ListDone {
                list: "team@example.org".into(),
                busy: true,
                ..ListDone::default()
            }],
            ..Done::default()
        };
        let lots = Done {
            lists: vec![ListDone {
                list: "team@example.org".into(),
                warned: vec![Warned {
                    address: "bob@example.net".into(),
                    warning: 2,
                    of: 3,
                    queue_id: 9,
                }],
                removed: vec!["carol@example.net".into()],
                pending_expired: 2,
                held_expired: vec![4, 5],
                ..ListDone::default()
            }],
            member_links_expired: 1,
            ..Done::default()
        };
        let cases: &[(&Done, &str)] = &[
            (&quiet, "nothing due on 1 lists\n"),
            (
                &busy,
                "team@example.org: busy (another maintain run holds it)\n",
            ),
            (
                &lots,
                "team@example.org: bounce warning 2 of 3 to bob@example.net\n\
                 team@example.org: carol@example.net removed after bounces\n\
                 team@example.org: 2 requests expired\n\
                 team@example.org: held posts expired: 4, 5\n\
                 1 member links expired\n",
            ),
        ];
        for (done, want) in cases {
            assert_eq!(render(done), *want);
        }
    }

    #[test]
    fn tokens_differ_by_disabling_and_number() {
        let a = warning_token(1, "bob@example.net", 100, 1);
        assert_eq!(a, "list-warn:1:100:1:bob@example.net");
        assert_ne!(a, warning_token(1, "bob@example.net", 200, 1));
        assert_ne!(a, warning_token(1, "bob@example.net", 100, 2));
        assert_ne!(a, warning_token(2, "bob@example.net", 100, 1));
    }
}
