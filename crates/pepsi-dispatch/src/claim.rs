//! The dispatcher's SQL: the one batched claim, and the few repairs it makes (paused rows
//! due, orphans at start-up, rows handed back, rows failed or timed out by force).
//!
//! Each is one call of a stored function of procedures.sql (THE DISPATCHER there), with
//! bound parameters and arrays, one round trip; nothing is built from input.

use std::time::Duration;

use sqlx::PgPool;

use pepsi_contract::db::with_retry;

/// One claim for every stage with spare capacity (`pepsi.dispatch_claim`): per stage
/// `n_fifo` oldest rows, then `n_fair` rows ranked by sender lead. Besides the claimed rows
/// (with an id) it returns every sender it saw waiting (id NULL), so the accounting learns of
/// senders that have not been served yet.
const CLAIM: &str = "SELECT workqueue_id, stage, sender_key \
                     FROM pepsi.dispatch_claim($1, $2, $3, $4, $5, $6, $7, $8)";

/// What one stage asks of a claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Want {
    pub stage: String,
    pub n_fifo: i32,
    pub n_fair: i32,
    pub cost: f64,
}

/// A claimed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub workqueue_id: i64,
    pub stage: String,
    pub sender_key: String,
}

/// What a claim returns: the rows, the (stage, sender) pairs seen waiting, and the stages
/// where rows it chose were being claimed by another dispatcher (MODE shared): more may be
/// pending there than it got.
#[derive(Debug, Default)]
pub struct ClaimResult {
    pub rows: Vec<Claimed>,
    pub waiting: Vec<(String, String)>,
    pub contended: Vec<String>,
}

/// Claims rows for every stage in `wants` in one statement.
pub async fn claim(
    pool: &PgPool,
    wants: &[Want],
    leads: &[(String, String, f64)],
    max_senders: i64,
) -> Result<ClaimResult, sqlx::Error> {
    let stages: Vec<&str> = wants.iter().map(|w| w.stage.as_str()).collect();
    let fifo: Vec<i32> = wants.iter().map(|w| w.n_fifo).collect();
    let fair: Vec<i32> = wants.iter().map(|w| w.n_fair).collect();
    let cost: Vec<f64> = wants.iter().map(|w| w.cost).collect();
    let l_stage: Vec<&str> = leads.iter().map(|l| l.0.as_str()).collect();
    let l_sender: Vec<&str> = leads.iter().map(|l| l.1.as_str()).collect();
    let l_lead: Vec<f64> = leads.iter().map(|l| l.2).collect();
    let rows = with_retry(|| {
        sqlx::query_as::<_, (Option<i64>, String, Option<String>)>(CLAIM)
            .bind(&stages)
            .bind(&fifo)
            .bind(&fair)
            .bind(&cost)
            .bind(&l_stage)
            .bind(&l_sender)
            .bind(&l_lead)
            .bind(max_senders)
            .fetch_all(pool)
    })
    .await?;
    let mut result = ClaimResult::default();
    for (id, stage, sender_key) in rows {
        match (id, sender_key) {
            (Some(workqueue_id), sender_key) => result.rows.push(Claimed {
                workqueue_id,
                stage,
                sender_key: sender_key.unwrap_or_default(),
            }),
            (None, Some(sender_key)) => result.waiting.push((stage, sender_key)),
            (None, None) => result.contended.push(stage),
        }
    }
    Ok(result)
}

/// Paused rows whose time has come become pending; returns how many.
pub async fn requeue_due(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let n: i32 =
        with_retry(|| sqlx::query_scalar("SELECT pepsi.dispatch_requeue_due()").fetch_one(pool))
            .await?;
    Ok(count(n))
}

/// Seconds until the earliest paused row is due (None when nothing is paused), at most a
/// day. Rows held by an operator (`pepsi-queue hold`: a far-future timeout) count like any
/// other and simply never come due; a timeout of `infinity` written by hand is skipped, since
/// `infinity - now()` raises before PostgreSQL 17 and would blind the dispatcher to every
/// other paused row.
pub async fn next_due(pool: &PgPool) -> Result<Option<f64>, sqlx::Error> {
    let secs: Option<f64> = sqlx::query_scalar("SELECT pepsi.dispatch_next_due()")
        .fetch_one(pool)
        .await?;
    Ok(secs.map(clamp_due))
}

/// The longest the dispatcher waits for a due time (the heartbeat comes sooner anyway).
const MAX_DUE_WAIT: f64 = 86_400.0;

/// `secs` made safe for `Duration::from_secs_f64`: within 0..=MAX_DUE_WAIT, NaN as 0.
fn clamp_due(secs: f64) -> f64 {
    if secs.is_nan() {
        0.0
    } else {
        secs.clamp(0.0, MAX_DUE_WAIT)
    }
}

/// At start-up, rows left `running` by the dispatchers of epochs `gone` (known dead, their
/// workers with them) or by no epoch go back to `pending`; returns how many.
pub async fn take_over(pool: &PgPool, gone: &[i64]) -> Result<u64, sqlx::Error> {
    let n: i32 = with_retry(|| {
        sqlx::query_scalar("SELECT pepsi.dispatch_take_over($1)")
            .bind(gone)
            .fetch_one(pool)
    })
    .await?;
    Ok(count(n))
}

/// Running rows not among `held` become pending: this dispatcher's own once unchanged for
/// `grace`, and (`fenced_after` given: the maintenance leader) those of a fenced or stopped
/// earlier one once unchanged for `fenced_after`; returns how many.
pub async fn reconcile(
    pool: &PgPool,
    held: &[i64],
    grace: Duration,
    fenced_after: Option<Duration>,
) -> Result<u64, sqlx::Error> {
    let n: i32 = with_retry(|| {
        sqlx::query_scalar("SELECT pepsi.dispatch_reconcile($1, $2, $3)")
            .bind(held)
            .bind(grace.as_secs_f64())
            .bind(fenced_after.map(|d| d.as_secs_f64()))
            .fetch_one(pool)
    })
    .await?;
    Ok(count(n))
}

/// This dispatcher stopped cleanly: no worker of its epoch is left.
pub async fn stopped(pool: &PgPool, epoch: i64) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pepsi.dispatch_stopped($1)")
        .bind(epoch)
        .execute(pool)
        .await?;
    Ok(())
}

/// Rows handed back untouched (never started, or held by a stopped worker) become pending
/// again, as long as they are still running (at `stage`, when given: the caller passes it
/// when another worker may hold the row at a later stage).
pub async fn hand_back(
    pool: &PgPool,
    stage: Option<&str>,
    ids: &[i64],
) -> Result<u64, sqlx::Error> {
    if ids.is_empty() {
        return Ok(0);
    }
    let n: i32 = with_retry(|| {
        sqlx::query_scalar("SELECT pepsi.dispatch_hand_back($1, $2)")
            .bind(ids)
            .bind(stage)
            .fetch_one(pool)
    })
    .await?;
    Ok(count(n))
}

/// A row count as the functions return it (never negative).
fn count(n: i32) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// How the dispatcher ends a row a worker could not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forced {
    /// Terminal: `failed`, for an operator.
    Failed,
    /// Terminal: `timeout` (no answer within MAX_RUNTIME).
    Timeout,
    /// Paused for a retry after the given seconds (a temporary failure).
    Retry(u32),
}

/// Sets row `id` (still running; at `stage` when given) to the forced status, recording
/// `reason` in `state.dispatch_error`; returns whether the row was changed. Without a stage
/// the row may have moved on inside its worker's pass (a fused chain writes its stage as it
/// goes).
pub async fn force(
    pool: &PgPool,
    id: i64,
    stage: Option<&str>,
    forced: Forced,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let (status, retry): (&str, f64) = match forced {
        Forced::Failed => ("failed", 0.0),
        Forced::Timeout => ("timeout", 0.0),
        Forced::Retry(secs) => ("paused", f64::from(secs)),
    };
    let ids = [id];
    let n: i32 = with_retry(|| {
        sqlx::query_scalar(
            "SELECT pepsi.dispatch_force($1, $2, $3::pepsi.workqueue_status, $4, $5)",
        )
        .bind(&ids[..])
        .bind(stage)
        .bind(status)
        .bind(reason)
        .bind(retry)
        .fetch_one(pool)
    })
    .await?;
    Ok(n == 1)
}

/// Sweeps orphaned bodies and old clone tokens.
pub async fn gc(pool: &PgPool) -> Result<(i32, i32, i32), sqlx::Error> {
    let bodies: i32 = sqlx::query_scalar("SELECT pepsi.workqueue_body_gc()")
        .fetch_one(pool)
        .await?;
    let tokens: i32 = sqlx::query_scalar("SELECT pepsi.clone_token_gc()")
        .fetch_one(pool)
        .await?;
    let replies: i32 = sqlx::query_scalar("SELECT pepsi.autoreply_gc()")
        .fetch_one(pool)
        .await?;
    Ok((bodies, tokens, replies))
}

/// Deletes mail log rows older than `keep` (the retention of `[pepsi] MAIL_LOG_RETENTION`)
/// through the one function allowed to (the log is append-only); returns how many.
pub async fn mail_log_expire(pool: &PgPool, keep: std::time::Duration) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT pepsi.mail_log_expire(make_interval(secs => $1))")
        .bind(keep.as_secs_f64())
        .fetch_one(pool)
        .await
}

/// Whether this session's role may vacuum the queue tables: it owns them (or is a member of
/// their owner, or a superuser), or holds MAINTAIN on both (PostgreSQL 17 and later).
pub async fn can_vacuum(pool: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT bool_and(pg_has_role(c.relowner, 'USAGE') OR CASE WHEN \
         current_setting('server_version_num')::int >= 170000 THEN \
         has_table_privilege(c.oid, 'MAINTAIN') ELSE false END) \
         FROM pg_class c WHERE c.oid IN ('pepsi.workqueue'::regclass, 'pepsi.workqueue_body'::regclass)",
    )
    .fetch_one(pool)
    .await
}

/// Vacuums the queue and its bodies: the dead row versions every claim, advance and finish
/// leaves are removed from the table and from the claim's indexes.
/// VACUUM is not bounded by `[database] STATEMENT_TIMEOUT` (a large queue may take longer,
/// and it holds no lock a claim or a pass waits for): its session lifts the limit, then
/// resets it before the connection goes back to the pool.
pub async fn vacuum(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    sqlx::query("SET statement_timeout = 0")
        .execute(&mut *conn)
        .await?;
    let vacuumed = sqlx::query("VACUUM pepsi.workqueue, pepsi.workqueue_body")
        .execute(&mut *conn)
        .await;
    sqlx::query("RESET statement_timeout")
        .execute(&mut *conn)
        .await?;
    vacuumed?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_times_are_clamped_to_what_a_duration_can_hold() {
        let cases = [
            (-5.0, 0.0),
            (0.0, 0.0),
            (1.5, 1.5),
            (2.5e11, MAX_DUE_WAIT),
            (f64::INFINITY, MAX_DUE_WAIT),
            (f64::NEG_INFINITY, 0.0),
            (f64::NAN, 0.0),
        ];
        for (secs, want) in cases {
            let got = clamp_due(secs);
            assert_eq!(got, want, "{secs}");
            let _ = std::time::Duration::from_secs_f64(got);
        }
    }
}
