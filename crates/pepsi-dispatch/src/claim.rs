//! The dispatcher's SQL: the one batched claim, and the few repairs it makes (paused rows
//! due, orphans at start-up, rows handed back, rows failed or timed out by force).
//!
//! Fixed statements with bound arrays; nothing is built from input.

use sqlx::PgPool;

use pepsi_common::db::with_retry;

/// One claim for every stage with spare capacity. Per stage: `n_fifo` oldest rows, then
/// `n_fair` rows ranked by sender lead (a sender's k-th row ranks at lead + (k-1) × cost),
/// walking at most $8 distinct senders by skip-scan. Only the dispatcher makes this
/// transition, so no row lock dance is needed. Besides the claimed rows (with an id) it
/// returns every sender it saw waiting (id NULL), so the accounting learns of senders that
/// have not been served yet.
const CLAIM: &str = r#"
WITH want AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::float8[]) AS w(stage, n_fifo, n_fair, cost)
),
lead AS (
    SELECT * FROM unnest($5::text[], $6::text[], $7::float8[]) AS l(stage, sender_key, lead)
),
fifo AS (
    SELECT c.workqueue_id FROM want w CROSS JOIN LATERAL (
        SELECT q.workqueue_id FROM pepsi.workqueue q
        WHERE q.stage = w.stage AND q.status = 'pending'
        ORDER BY q.workqueue_id LIMIT w.n_fifo) c
),
senders AS (
    SELECT w.stage, s.sender_key FROM want w CROSS JOIN LATERAL (
        WITH RECURSIVE k(sender_key) AS (
            (SELECT q.sender_key FROM pepsi.workqueue q
             WHERE q.stage = w.stage AND q.status = 'pending' ORDER BY q.sender_key LIMIT 1)
            UNION ALL
            SELECT (SELECT q.sender_key FROM pepsi.workqueue q
                    WHERE q.stage = w.stage AND q.status = 'pending' AND q.sender_key > k.sender_key
                    ORDER BY q.sender_key LIMIT 1)
            FROM k WHERE k.sender_key IS NOT NULL
        )
        SELECT k.sender_key FROM k WHERE k.sender_key IS NOT NULL LIMIT $8
    ) s
    WHERE w.n_fair > 0
),
cand AS (
    SELECT s.stage, c.workqueue_id, COALESCE(l.lead, 0) + (c.rn - 1) * w.cost AS vkey
    FROM senders s
    JOIN want w ON w.stage = s.stage
    LEFT JOIN lead l ON l.stage = s.stage AND l.sender_key = s.sender_key
    CROSS JOIN LATERAL (
        SELECT q.workqueue_id, row_number() OVER (ORDER BY q.workqueue_id) AS rn
        FROM pepsi.workqueue q
        WHERE q.stage = s.stage AND q.sender_key = s.sender_key AND q.status = 'pending'
        ORDER BY q.workqueue_id LIMIT w.n_fair + w.n_fifo) c
),
fair AS (
    SELECT x.workqueue_id FROM (
        SELECT c.stage, c.workqueue_id,
               row_number() OVER (PARTITION BY c.stage ORDER BY c.vkey, c.workqueue_id) AS r
        FROM cand c WHERE c.workqueue_id NOT IN (SELECT f.workqueue_id FROM fifo f)
    ) x JOIN want w ON w.stage = x.stage
    WHERE x.r <= w.n_fair
),
claimed AS (
    UPDATE pepsi.workqueue q SET status = 'running', updated_at = now()
    WHERE q.workqueue_id = ANY (ARRAY(SELECT workqueue_id FROM fifo UNION SELECT workqueue_id FROM fair))
      AND q.status = 'pending'
    RETURNING q.workqueue_id, q.stage, q.sender_key
)
SELECT workqueue_id, stage, sender_key FROM claimed
UNION ALL
SELECT NULL, stage, sender_key FROM senders
"#;

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

/// What a claim returns: the rows, and the (stage, sender) pairs seen waiting.
#[derive(Debug, Default)]
pub struct ClaimResult {
    pub rows: Vec<Claimed>,
    pub waiting: Vec<(String, String)>,
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
        sqlx::query_as::<_, (Option<i64>, String, String)>(CLAIM)
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
        match id {
            Some(workqueue_id) => result.rows.push(Claimed {
                workqueue_id,
                stage,
                sender_key,
            }),
            None => result.waiting.push((stage, sender_key)),
        }
    }
    Ok(result)
}

/// Paused rows whose time has come become pending; returns how many.
pub async fn requeue_due(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let r = with_retry(|| {
        sqlx::query(
            "UPDATE pepsi.workqueue SET status = 'pending', timeout = NULL, updated_at = now() \
             WHERE status = 'paused' AND timeout <= now()",
        )
        .execute(pool)
    })
    .await?;
    Ok(r.rows_affected())
}

/// Seconds until the earliest paused row is due (None when nothing is paused), at most a
/// day. Rows held by an operator (`pepsi-queue hold`: a far-future timeout) count like any
/// other and simply never come due; a timeout of `infinity` written by hand is skipped, since
/// `infinity - now()` raises before PostgreSQL 17 and would blind the dispatcher to every
/// other paused row.
pub async fn next_due(pool: &PgPool) -> Result<Option<f64>, sqlx::Error> {
    let secs: Option<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM min(timeout) - now())::float8 FROM pepsi.workqueue \
         WHERE status = 'paused' AND isfinite(timeout)",
    )
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

/// At start-up, rows left `running` by a previous dispatcher go back to `pending`.
pub async fn reset_orphans(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let r = with_retry(|| {
        sqlx::query("UPDATE pepsi.workqueue SET status = 'pending', updated_at = now() WHERE status = 'running'")
            .execute(pool)
    })
    .await?;
    Ok(r.rows_affected())
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
    let r = with_retry(|| {
        sqlx::query(
            "UPDATE pepsi.workqueue SET status = 'pending', updated_at = now() \
             WHERE workqueue_id = ANY($1) AND ($2::text IS NULL OR stage = $2) AND status = 'running'",
        )
        .bind(ids)
        .bind(stage)
        .execute(pool)
    })
    .await?;
    Ok(r.rows_affected())
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
    let r = with_retry(|| {
        sqlx::query(
            "UPDATE pepsi.workqueue SET status = $3::pepsi.workqueue_status, \
               timeout = CASE WHEN $3 = 'paused' THEN now() + make_interval(secs => $5) END, \
               state = state || jsonb_build_object('dispatch_error', $4::text), updated_at = now() \
             WHERE workqueue_id = $1 AND ($2::text IS NULL OR stage = $2) AND status = 'running'",
        )
        .bind(id)
        .bind(stage)
        .bind(status)
        .bind(reason)
        .bind(retry)
        .execute(pool)
    })
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Sweeps orphaned bodies and old clone tokens.
pub async fn gc(pool: &PgPool) -> Result<(i32, i32), sqlx::Error> {
    let bodies: i32 = sqlx::query_scalar("SELECT pepsi.workqueue_body_gc()")
        .fetch_one(pool)
        .await?;
    let tokens: i32 = sqlx::query_scalar("SELECT pepsi.clone_token_gc()")
        .fetch_one(pool)
        .await?;
    Ok((bodies, tokens))
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
