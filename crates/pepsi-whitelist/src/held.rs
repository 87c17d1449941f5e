//! `pepsi-whitelist held` and `payments`: the secretary's held mail of a mailbox (list,
//! release, discard), the postage auto-pay paid for it, and the owners' digest of held mail
//! (docs/secretary.md). What a held message is and how a decision is made are
//! `pepsi_secretary::store`'s; this module prints and checks whose mail it is.

use anyhow::Context as _;
use chrono::{TimeDelta, Utc};
use clap::{Args, Subcommand};
use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_contract::audit;
use pepsi_contract::settings::secretary::Secretary;
use pepsi_secretary::store::{self, DecideError, Decision};
use pepsi_secretary::{mail, token};
use serde::Serialize;
use sqlx::PgPool;

use crate::Run;

/// How long the owner's page link in a digest works.
pub const OWNER_LINK_DAYS: i64 = 7;

#[derive(Debug, Args)]
pub struct HeldArgs {
    #[command(subcommand)]
    action: Option<HeldAction>,
    /// With `list`: decided messages too (released, discarded, expired), not only those
    /// still held
    #[arg(long, global = true)]
    all: bool,
    /// One JSON document instead of the table
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum HeldAction {
    /// The held messages (the default).
    List,
    /// Deliver held messages (the sender is not added to the whitelist).
    Release(Ids),
    /// Drop held messages, without a word to their senders.
    Discard(Ids),
    /// Mail each owner whose mailbox holds mail not yet in a digest a list of it, when the
    /// setting's digest_days have passed since the last (operators only; for a timer).
    Digest(DigestArgs),
}

#[derive(Debug, Args)]
struct Ids {
    /// The held messages' ids (the first column of `held list`)
    #[arg(required = true, value_name = "ID")]
    ids: Vec<i64>,
}

#[derive(Debug, Args)]
struct DigestArgs {
    /// Print whom a digest would go to and send none
    #[arg(long)]
    dry_run: bool,
}

impl HeldArgs {
    /// `held digest`: every owner's, not one mailbox's.
    pub fn is_digest(&self) -> bool {
        matches!(self.action, Some(HeldAction::Digest(_)))
    }
}

/// `held`: what it does with the mailbox's held mail.
pub async fn held(run: &Run, a: HeldArgs, operator: bool) -> Result<(), Failure> {
    match a.action.unwrap_or(HeldAction::List) {
        HeldAction::List => list(run, a.all, a.json).await,
        HeldAction::Release(ids) => decide(run, &ids.ids, Decision::Release, a.json).await,
        HeldAction::Discard(ids) => decide(run, &ids.ids, Decision::Discard, a.json).await,
        HeldAction::Digest(d) if operator => digest(run, d.dry_run).await,
        HeldAction::Digest(_) => Err(Failure::Invalid(
            "held digest mails every owner: only root or an operator may run it".into(),
        )),
    }
}

async fn list(run: &Run, all: bool, json: bool) -> Result<(), Failure> {
    let rows = store::held(&run.pool, Some(&run.mailbox), all, store::MAX_LISTED).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows).context("JSON")?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("{}: no held mail", run.mailbox);
        return Ok(());
    }
    println!("{}: {} held", run.mailbox, rows.len());
    println!(
        "{:>6}  {:16}  {:9}  {:15}  {:30}  SUBJECT",
        "ID", "HELD", "STATUS", "REASON", "SENDER"
    );
    for r in &rows {
        println!(
            "{:>6}  {:16}  {:9}  {:15}  {:30}  {}",
            r.held_id,
            r.held_at.format("%Y-%m-%d %H:%M"),
            r.status,
            r.reason,
            r.sender,
            mail::shown_subject(&r.subject)
        );
    }
    Ok(())
}

async fn decide(run: &Run, ids: &[i64], decision: Decision, json: bool) -> Result<(), Failure> {
    let by = format!(
        "owner:{}",
        run.actor.os_user.as_deref().unwrap_or(run.mailbox.as_str())
    );
    let mut done = Vec::new();
    for &id in ids {
        match store::decide(&run.pool, id, Some(&run.mailbox), decision, &by).await {
            Ok(d) => {
                if d.changed {
                    let mut conn = run.pool.acquire().await?;
                    audit::record(
                        &mut conn,
                        &run.actor,
                        &format!("secretary.{}", decision.as_str()),
                        None,
                        serde_json::json!({"held_id": id, "mailbox": run.mailbox, "sender": d.sender}),
                    )
                    .await?;
                }
                if !json {
                    println!(
                        "{id}: {}",
                        if d.changed {
                            d.status.clone()
                        } else {
                            format!("already {}", d.status)
                        }
                    );
                }
                done.push(d);
            }
            Err(DecideError::NotFound(id)) => {
                return Err(Failure::Invalid(format!(
                    "no held message {id} for {}",
                    run.mailbox
                )));
            }
            Err(DecideError::Database(e)) => return Err(e.into()),
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&done).context("JSON")?);
    }
    Ok(())
}

/// `payments`: what auto-pay paid or refused for the mailbox.
pub async fn payments(run: &Run, json: bool) -> Result<(), Failure> {
    let rows = store::payments(&run.pool, Some(&run.mailbox), store::MAX_LISTED).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows).context("JSON")?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("{}: no payments", run.mailbox);
        return Ok(());
    }
    println!("{}: {} payments", run.mailbox, rows.len());
    println!(
        "{:16}  {:7}  {:>16}  {:30}  REASON",
        "WHEN", "STATUS", "AMOUNT", "PAYEE"
    );
    for p in &rows {
        println!(
            "{:16}  {:7}  {:>16}  {:30}  {}",
            p.created_at.format("%Y-%m-%d %H:%M"),
            p.status,
            p.amount,
            p.payee,
            p.reason.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

/// One digest sent (or, under --dry-run, due).
#[derive(Debug, Serialize)]
struct Sent {
    mailbox: String,
    messages: usize,
    queue_id: Option<i64>,
}

/// The mailboxes with held mail no digest listed yet, and their settings.
async fn due(pool: &PgPool) -> Result<Vec<(String, serde_json::Value)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT s.address, s.value FROM pepsi.settings s \
         WHERE s.name = 'secretary' AND EXISTS ( \
             SELECT 1 FROM pepsi.secretary_held h \
             WHERE h.mailbox = s.address AND h.status = 'held' AND h.digested_at IS NULL) \
         ORDER BY s.address",
    )
    .fetch_all(pool)
    .await
}

async fn digest(run: &Run, dry_run: bool) -> Result<(), Failure> {
    let hostname = run
        .cfg
        .name_option(&run.cfg.section("pepsi"), "HOSTNAME")
        .context("[pepsi] HOSTNAME")?;
    let pepsi = run.cfg.section("pepsi");
    let origin = match pepsi.string_opt("SECRETARY_URL")? {
        Some(v) if !v.trim().is_empty() => ("SECRETARY_URL", Some(v)),
        _ => ("SECURE_LINK_URL", pepsi.string_opt("SECURE_LINK_URL")?),
    };
    let base = pepsi_conf::config::https_origin(
        origin.0,
        "the public base of pepsi-httpd's pages",
        origin.1.as_deref(),
    )
    .map_err(Failure::Invalid)?;
    let mut sent = Vec::new();
    for (mailbox, value) in due(&run.pool).await? {
        let Ok(setting) = Secretary::from_value(&value) else {
            tracing::warn!(%mailbox, "secretary setting not valid: no digest");
            continue;
        };
        if setting.digest_days == 0 {
            continue;
        }
        let last: Option<chrono::DateTime<Utc>> = sqlx::query_scalar(
            "SELECT max(digested_at) FROM pepsi.secretary_held WHERE mailbox = $1",
        )
        .bind(&mailbox)
        .fetch_one(&run.pool)
        .await?;
        if last.is_some_and(|t| Utc::now() - t < TimeDelta::days(i64::from(setting.digest_days))) {
            continue;
        }
        let rows = store::held(&run.pool, Some(&mailbox), false, store::MAX_LISTED).await?;
        if rows.is_empty() {
            continue;
        }
        if dry_run {
            sent.push(Sent {
                mailbox,
                messages: rows.len(),
                queue_id: None,
            });
            continue;
        }
        let mut tx = run.pool.begin().await?;
        let page = match &base {
            Some(base) => {
                let t = token::Token::new().map_err(|e| anyhow::anyhow!(e))?;
                sqlx::query(
                    "INSERT INTO pepsi.secretary_owner_link (mailbox, token_hash, expires_at) \
                     VALUES ($1, $2, now() + make_interval(days => $3))",
                )
                .bind(&mailbox)
                .bind(t.digest())
                .bind(OWNER_LINK_DAYS as i32)
                .execute(&mut *tx)
                .await?;
                Some(format!("{base}{}", store::owner_path(&t)))
            }
            None => None,
        };
        let entries: Vec<mail::DigestEntry<'_>> = rows
            .iter()
            .map(|r| mail::DigestEntry {
                held_id: r.held_id,
                sender: &r.sender,
                subject: &r.subject,
                held_at: r.held_at,
                expires: r.expires_at,
                reason: &r.reason,
            })
            .collect();
        let domain = pepsi_conf::address::parts(&mailbox)
            .map(|(_, d)| d.to_owned())
            .unwrap_or_else(|| hostname.clone());
        let from = format!("postmaster@{domain}");
        let now = Utc::now();
        let message_id = format!("{}.digest@{hostname}", now.timestamp_micros());
        let raw = mail::digest(&mail::Digest {
            owner: &mailbox,
            from: &from,
            entries: &entries,
            page: page.as_deref(),
            message_id: &message_id,
            now,
        })
        .context("digest")?;
        let (headers, body) = pepsi_contract::message::split(&raw);
        let state = serde_json::json!({"secretary": {"made": "digest"}});
        let id: i64 = sqlx::query_scalar(
            "SELECT pepsi.workqueue_add('', ARRAY[$1], $2, $3, $4, NULL, '127.0.0.1'::inet)",
        )
        .bind(&mailbox)
        .bind(headers)
        .bind(body)
        .bind(&state)
        .fetch_one(&mut *tx)
        .await?;
        let ids: Vec<i64> = rows.iter().map(|r| r.held_id).collect();
        sqlx::query("UPDATE pepsi.secretary_held SET digested_at = now() WHERE held_id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        sent.push(Sent {
            mailbox,
            messages: rows.len(),
            queue_id: Some(id),
        });
    }
    if !dry_run && !sent.is_empty() {
        pepsi_contract::db::wake_dispatcher(&run.pool, None).await?;
    }
    for s in &sent {
        match s.queue_id {
            Some(id) => println!(
                "{}: digest of {} held (queue row {id})",
                s.mailbox, s.messages
            ),
            None => println!("{}: a digest of {} held is due", s.mailbox, s.messages),
        }
    }
    if sent.is_empty() {
        println!("no digest due");
    }
    Ok(())
}
