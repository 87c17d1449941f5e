//! Committing a pass: the recorded content changes and the terminal outcome become one
//! statement. For advance, pause and fail that is one UPDATE naming exactly the columns
//! the stage touched (a changed body first gets a body row of its own: copy-on-write);
//! the clone-spawning terminals call their stored functions. A fused chain commits once, with
//! every hop's changes; a batch commits its advances, pauses, fails and finishes in one
//! statement (`commit_many`).
//!
//! The SQL is assembled from the constant fragments below only, never from input, and each
//! shape is a prepared statement of its own.

use serde_json::{Map, Value};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgPool, Row as _};

use super::context::{Changes, CloneSpec, Outcome, Row};
use super::{StageContext, StageError};
use crate::db::with_retry;

/// Why a pass's write found no row to change: taken back (by a dispatcher repair or an
/// operator), or claimed by a dispatcher epoch that has since been fenced (docs/ha.md).
pub(crate) const LOST_ROW: &str = "no longer running (taken back by the dispatcher or deleted), \
     or its dispatcher was fenced: another one took over";

const DELETE: &str = "DELETE FROM pepsi.workqueue WHERE workqueue_id = $1 AND status = 'running' AND pepsi.claim_held(claim_epoch)";
const FINISH_WITH: &str = "SELECT pepsi.workqueue_finish_with_clones($1, $2)";
const PAUSE_WITH: &str = "SELECT pepsi.workqueue_pause($1, $2, $3, $4, $5)";

// The mail log rides in the statement that commits the pass (one INSERT, no round trip of
// its own): the entries travel as one JSON array parameter (`mail_log::Entry`s), and are
// inserted only for a row the statement actually wrote.
macro_rules! log_insert {
    ($id:literal, $source:literal, $param:literal) => {
        concat!(
            "INSERT INTO pepsi.mail_log (workqueue_id, stage, event, mail_from, rcpt_to, detail) \
             SELECT ", $id, ", e.stage, e.event, e.mail_from, \
             ARRAY(SELECT jsonb_array_elements_text(e.rcpt_to)), COALESCE(e.detail, '{}'::jsonb) \
             FROM ", $source, " jsonb_to_recordset(", $param, ") \
             AS e(stage text, event text, mail_from text, rcpt_to jsonb, detail jsonb)"
        )
    };
}

const DELETE_LOGGED: &str = concat!(
    "WITH gone AS (DELETE FROM pepsi.workqueue WHERE workqueue_id = $1 AND status = 'running' AND pepsi.claim_held(claim_epoch) \
     RETURNING workqueue_id), logged AS (",
    log_insert!("gone.workqueue_id", "gone CROSS JOIN", "$2"),
    ") SELECT count(*) FROM gone"
);
const FINISH_WITH_LOGGED: &str = concat!(
    "WITH f AS (SELECT pepsi.workqueue_finish_with_clones($1, $2)), logged AS (",
    log_insert!("$1::int8", "", "$3"),
    ") SELECT count(*) FROM f"
);
const PAUSE_WITH_LOGGED: &str = concat!(
    "WITH f AS (SELECT pepsi.workqueue_pause($1, $2, $3, $4, $5)), logged AS (",
    log_insert!("$1::int8", "", "$6"),
    ") SELECT count(*) FROM f"
);

/// Writes the pass's `outcome` with every change of the chain. Errors when the row is gone
/// or no longer running (the dispatcher took it back), leaving the database as it was.
pub(crate) async fn commit(
    ctx: &mut StageContext<'_>,
    outcome: &Outcome,
) -> Result<(), StageError> {
    let id = ctx.row.id;
    let pool = ctx.pool;
    let log = log_json(&ctx.mail_log);
    let affected = match outcome {
        Outcome::Finish => match &log {
            None => with_retry(|| sqlx::query(DELETE).bind(id).execute(pool))
                .await?
                .rows_affected(),
            Some(log) => {
                let n: i64 = with_retry(|| {
                    sqlx::query_scalar(DELETE_LOGGED)
                        .bind(id)
                        .bind(log)
                        .fetch_one(pool)
                })
                .await?;
                n as u64
            }
        },
        Outcome::FinishWith { clones } => {
            // The stored function clones the stored row: earlier hops' writes go first.
            ctx.flush().await?;
            let clones = clones_json(clones, &ctx.changes.state);
            with_retry(|| {
                let q = sqlx::query(if log.is_some() {
                    FINISH_WITH_LOGGED
                } else {
                    FINISH_WITH
                })
                .bind(id)
                .bind(&clones);
                match &log {
                    Some(log) => q.bind(log),
                    None => q,
                }
                .execute(pool)
            })
            .await?;
            1
        }
        Outcome::PauseWith { secs, keep, clones } => {
            ctx.flush().await?;
            let clones = clones_json(clones, &ctx.changes.state);
            let keep: Option<Vec<i32>> =
                keep.as_ref().map(|k| k.iter().map(|&i| i as i32).collect());
            let merge = Value::Object(ctx.changes.state.clone());
            with_retry(|| {
                let q = sqlx::query(if log.is_some() {
                    PAUSE_WITH_LOGGED
                } else {
                    PAUSE_WITH
                })
                .bind(id)
                .bind(&merge)
                .bind(secs)
                .bind(&keep)
                .bind(&clones);
                match &log {
                    Some(log) => q.bind(log),
                    None => q,
                }
                .execute(pool)
            })
            .await?;
            1
        }
        Outcome::Advance { stage } => {
            let changes = ctx.all_changes();
            update(
                pool,
                &ctx.row,
                &changes,
                ctx.advanced_status(stage),
                Some(stage),
                None,
                log.as_ref(),
            )
            .await?
        }
        Outcome::Pause { secs } => {
            let changes = ctx.all_changes();
            let moved = ctx.needs_flush().then_some(&ctx.row.stage);
            update(
                pool,
                &ctx.row,
                &changes,
                "paused",
                moved,
                Some(*secs),
                log.as_ref(),
            )
            .await?
        }
        Outcome::Fail => {
            let changes = ctx.all_changes();
            let moved = ctx.needs_flush().then_some(&ctx.row.stage);
            update(
                pool,
                &ctx.row,
                &changes,
                "failed",
                moved,
                None,
                log.as_ref(),
            )
            .await?
        }
    };
    if affected != 1 {
        return Err(StageError::NotRunning {
            id,
            status: LOST_ROW.into(),
        });
    }
    Ok(())
}

impl StageContext<'_> {
    /// Writes the carried changes and the current stage, leaving the row running: from here
    /// on the row is where the unfused pipeline would have it at this hop. (Here, not in
    /// `context`, so the context knows nothing of the SQL that commits it.)
    pub(crate) async fn flush(&mut self) -> Result<(), StageError> {
        if !self.needs_flush() {
            return Ok(());
        }
        let carried = std::mem::take(&mut self.carried);
        flush(self.pool, &self.row, &carried).await?;
        self.stored_stage = self.row.stage.clone();
        Ok(())
    }
}

/// Writes a fused chain's `carried` changes and the row's current stage, keeping it running.
async fn flush(pool: &PgPool, row: &Row, carried: &Changes) -> Result<(), StageError> {
    let affected = update(pool, row, carried, "running", Some(&row.stage), None, None).await?;
    if affected != 1 {
        return Err(StageError::NotRunning {
            id: row.id,
            status: LOST_ROW.into(),
        });
    }
    Ok(())
}

/// A batched pass's commit, deferred to the batch's one statement: advance, pause and fail
/// with any change but a new body, and a plain finish.
#[derive(Debug)]
pub(crate) struct Deferred {
    pub id: i64,
    /// The new status, or [`FINISHED`]: the row is deleted.
    pub status: &'static str,
    pub stage: Option<String>,
    pub pause_secs: Option<f64>,
    pub state: Option<Value>,
    pub replace_state: bool,
    pub received_now: bool,
    pub headers: Option<Vec<u8>>,
    pub mail_from: Option<String>,
    pub rcpt_to: Option<Value>,
    /// Mail log entries (a JSON array), inserted with the batch's statement.
    pub log: Option<Value>,
}

impl Deferred {
    /// The deferred form of the pass's commit, or `None` when it must commit on its own (a
    /// clone-spawning terminal, a new body).
    pub fn of(ctx: &StageContext<'_>, outcome: &Outcome) -> Option<Deferred> {
        let (status, stage, pause_secs) = match outcome {
            Outcome::Advance { stage } => (ctx.advanced_status(stage), Some(stage.clone()), None),
            Outcome::Pause { secs } => ("paused", None, Some(secs.max(0.0))),
            Outcome::Fail => ("failed", None, None),
            // As `commit`: a finish writes nothing of the chain, it deletes the row.
            Outcome::Finish => {
                return Some(Deferred {
                    id: ctx.row.id,
                    status: FINISHED,
                    stage: None,
                    pause_secs: None,
                    state: None,
                    replace_state: false,
                    received_now: false,
                    headers: None,
                    mail_from: None,
                    rcpt_to: None,
                    log: log_json(&ctx.mail_log),
                });
            }
            _ => return None,
        };
        let changes = ctx.all_changes();
        if changes.body {
            return None;
        }
        let stage = stage.or_else(|| ctx.needs_flush().then(|| ctx.row.stage.clone()));
        Some(Deferred {
            id: ctx.row.id,
            status,
            stage,
            pause_secs,
            state: (changes.state_replaced || !changes.state.is_empty())
                .then(|| Value::Object(changes.state.clone())),
            replace_state: changes.state_replaced,
            received_now: changes.received_now,
            headers: changes
                .headers
                .then(|| ctx.row.headers.clone().unwrap_or_default()),
            mail_from: changes.mail_from.then(|| ctx.row.mail_from.clone()),
            rcpt_to: changes
                .rcpt_to
                .then(|| Value::from(ctx.row.rcpt_to.clone())),
            log: log_json(&ctx.mail_log),
        })
    }
}

/// The `Deferred::status` of a finished pass.
pub(crate) const FINISHED: &str = "finished";

// One statement for every deferred row of a batch, whatever its outcome: finished rows are
// deleted (the body trigger fires per row, as for a single DELETE); for the others the
// target stage, pause and each content column ride per row (NULL: unchanged). rcpt_to
// travels as a JSON array, since a text[][] must be rectangular.
const COMMIT_MANY: &str = concat!(
    "WITH u AS ( \
       SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::float8[], $5::jsonb[], \
                            $6::bool[], $7::bool[], $8::bytea[], $9::text[], $10::jsonb[], $11::jsonb[]) \
       AS u(id, status, stage, pause_secs, state, replace_state, received_now, headers, mail_from, rcpt_to, log)), \
     gone AS ( \
       DELETE FROM pepsi.workqueue w USING u \
       WHERE w.workqueue_id = u.id AND u.status = 'finished' AND w.status = 'running' AND ",
    claim_held_many!("w.claim_epoch"),
    " RETURNING w.workqueue_id), \
     moved AS ( \
       UPDATE pepsi.workqueue w SET \
       status = u.status::pepsi.workqueue_status, updated_at = now(), \
       stage = COALESCE(u.stage, w.stage), \
       timeout = CASE WHEN u.pause_secs IS NULL THEN NULL ELSE now() + make_interval(secs => u.pause_secs) END, \
       state = CASE WHEN u.replace_state THEN u.state WHEN u.state IS NULL THEN w.state ELSE w.state || u.state END, \
       received_at = CASE WHEN u.received_now THEN now() ELSE w.received_at END, \
       headers = COALESCE(u.headers, w.headers), \
       mail_from = COALESCE(u.mail_from, w.mail_from), \
       rcpt_to = CASE WHEN u.rcpt_to IS NULL THEN w.rcpt_to \
                      ELSE ARRAY(SELECT jsonb_array_elements_text(u.rcpt_to)) END \
       FROM u WHERE w.workqueue_id = u.id AND u.status <> 'finished' AND w.status = 'running' AND ",
    claim_held_many!("w.claim_epoch"),
    " RETURNING w.workqueue_id), \
     done AS (SELECT workqueue_id FROM gone UNION ALL SELECT workqueue_id FROM moved), \
     logged AS (",
    log_insert!(
        "d.workqueue_id",
        "done d JOIN u ON u.id = d.workqueue_id AND u.log IS NOT NULL CROSS JOIN LATERAL",
        "u.log"
    ),
    ") SELECT workqueue_id FROM done"
);

/// Commits `rows` in one statement; returns the ids it wrote (a row missing from the answer
/// was no longer running).
pub(crate) async fn commit_many(
    pool: &PgPool,
    rows: &[Deferred],
) -> Result<std::collections::HashSet<i64>, StageError> {
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let statuses: Vec<&str> = rows.iter().map(|r| r.status).collect();
    let stages: Vec<Option<&str>> = rows.iter().map(|r| r.stage.as_deref()).collect();
    let pauses: Vec<Option<f64>> = rows.iter().map(|r| r.pause_secs).collect();
    let states: Vec<Option<&Value>> = rows.iter().map(|r| r.state.as_ref()).collect();
    let replaces: Vec<bool> = rows.iter().map(|r| r.replace_state).collect();
    let nows: Vec<bool> = rows.iter().map(|r| r.received_now).collect();
    let headers: Vec<Option<&[u8]>> = rows.iter().map(|r| r.headers.as_deref()).collect();
    let froms: Vec<Option<&str>> = rows.iter().map(|r| r.mail_from.as_deref()).collect();
    let rcpts: Vec<Option<&Value>> = rows.iter().map(|r| r.rcpt_to.as_ref()).collect();
    let logs: Vec<Option<&Value>> = rows.iter().map(|r| r.log.as_ref()).collect();
    let written: Vec<i64> = with_retry(|| {
        sqlx::query_scalar(COMMIT_MANY)
            .bind(&ids)
            .bind(&statuses)
            .bind(&stages)
            .bind(&pauses)
            .bind(&states)
            .bind(&replaces)
            .bind(&nows)
            .bind(&headers)
            .bind(&froms)
            .bind(&rcpts)
            .bind(&logs)
            .fetch_all(pool)
    })
    .await?;
    Ok(written.into_iter().collect())
}

/// The entries as the statements take them, or `None` when there are none.
fn log_json(entries: &[crate::mail_log::Entry]) -> Option<Value> {
    (!entries.is_empty()).then(|| serde_json::to_value(entries).unwrap_or(Value::Null))
}

fn clones_json(clones: &[CloneSpec], extra_state: &Map<String, Value>) -> Value {
    Value::Array(clones.iter().map(|c| c.to_json(extra_state)).collect())
}

/// The UPDATE text for a given set of touched columns. Placeholders: $1 id, $2 status,
/// then in order whichever of stage, pause seconds, state (merged, or replaced), headers,
/// mail_from, rcpt_to and body are present.
pub(crate) fn update_sql(changes: &Changes, stage: bool, pause: bool, log: bool) -> String {
    let mut n = 2;
    let mut next = || {
        n += 1;
        n
    };
    let mut sets = vec![
        "status = $2::pepsi.workqueue_status".to_owned(),
        "updated_at = now()".to_owned(),
    ];
    if stage {
        sets.push(format!("stage = ${}", next()));
    }
    if pause {
        sets.push(format!(
            "timeout = now() + make_interval(secs => ${})",
            next()
        ));
    } else {
        sets.push("timeout = NULL".to_owned());
    }
    if changes.state_replaced {
        sets.push(format!("state = ${}", next()));
    } else if !changes.state.is_empty() {
        sets.push(format!("state = state || ${}", next()));
    }
    if changes.received_now {
        sets.push("received_at = now()".to_owned());
    }
    if changes.headers {
        sets.push(format!("headers = ${}", next()));
    }
    if changes.mail_from {
        sets.push(format!("mail_from = ${}", next()));
    }
    if changes.rcpt_to {
        sets.push(format!("rcpt_to = ${}", next()));
    }
    let set = sets.join(", ");
    let (fresh, body_set) = if changes.body {
        let body = next();
        (
            format!(
                "fresh AS (INSERT INTO pepsi.workqueue_body (body) VALUES (${body}) RETURNING body_id)"
            ),
            ", body_id = (SELECT body_id FROM fresh)",
        )
    } else {
        (String::new(), "")
    };
    let update = format!(
        "UPDATE pepsi.workqueue SET {set}{body_set} WHERE workqueue_id = $1 AND status = 'running' AND pepsi.claim_held(claim_epoch)"
    );
    if log {
        // The log's parameter is the last; the row count comes back as the query's one value.
        let insert = log_insert!("w.workqueue_id", "w CROSS JOIN", "$LOG")
            .replace("$LOG", &format!("${}", next()));
        let with = if fresh.is_empty() {
            String::new()
        } else {
            format!("{fresh}, ")
        };
        format!(
            "WITH {with}w AS ({update} RETURNING workqueue_id), logged AS ({insert}) SELECT count(*) FROM w"
        )
    } else if changes.body {
        format!("WITH {fresh} {update}")
    } else {
        update
    }
}

async fn update(
    pool: &PgPool,
    row: &Row,
    changes: &Changes,
    status: &str,
    stage: Option<&String>,
    pause_secs: Option<f64>,
    log: Option<&Value>,
) -> Result<u64, StageError> {
    let sql = update_sql(
        changes,
        stage.is_some(),
        pause_secs.is_some(),
        log.is_some(),
    );
    let state = Value::Object(changes.state.clone());
    let bind = || -> Query<'_, sqlx::Postgres, PgArguments> {
        // Assembled from this module's constant fragments only (see update_sql).
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(row.id)
            .bind(status);
        if let Some(stage) = stage {
            q = q.bind(stage);
        }
        if let Some(secs) = pause_secs {
            q = q.bind(secs.max(0.0));
        }
        if changes.state_replaced || !changes.state.is_empty() {
            q = q.bind(&state);
        }
        if changes.headers {
            q = q.bind(row.headers.as_deref().unwrap_or_default());
        }
        if changes.mail_from {
            q = q.bind(&row.mail_from);
        }
        if changes.rcpt_to {
            q = q.bind(&row.rcpt_to);
        }
        if changes.body {
            q = q.bind(row.body.as_deref().unwrap_or_default());
        }
        if let Some(log) = log {
            q = q.bind(log);
        }
        q
    };
    if log.is_some() {
        let n: i64 = with_retry(|| async { bind().fetch_one(pool).await?.try_get(0) }).await?;
        return Ok(n as u64);
    }
    Ok(with_retry(|| bind().execute(pool)).await?.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(changes: Changes, stage: bool, pause: bool, expected: &str) {
        assert_eq!(update_sql(&changes, stage, pause, false), expected);
    }

    #[test]
    fn update_names_exactly_the_touched_columns() {
        let base =
            "UPDATE pepsi.workqueue SET status = $2::pepsi.workqueue_status, updated_at = now()";
        let tail =
            "WHERE workqueue_id = $1 AND status = 'running' AND pepsi.claim_held(claim_epoch)";
        check(
            Changes::default(),
            false,
            false,
            &format!("{base}, timeout = NULL {tail}"),
        );
        check(
            Changes::default(),
            true,
            false,
            &format!("{base}, stage = $3, timeout = NULL {tail}"),
        );
        let mut state = Map::new();
        state.insert("k".into(), Value::Bool(true));
        check(
            Changes {
                state: state.clone(),
                ..Changes::default()
            },
            false,
            true,
            &format!(
                "{base}, timeout = now() + make_interval(secs => $3), state = state || $4 {tail}"
            ),
        );
        check(
            Changes {
                headers: true,
                rcpt_to: true,
                ..Changes::default()
            },
            true,
            false,
            &format!("{base}, stage = $3, timeout = NULL, headers = $4, rcpt_to = $5 {tail}"),
        );
        check(
            Changes {
                body: true,
                mail_from: true,
                ..Changes::default()
            },
            true,
            false,
            "WITH fresh AS (INSERT INTO pepsi.workqueue_body (body) VALUES ($5) RETURNING body_id) \
             UPDATE pepsi.workqueue SET status = $2::pepsi.workqueue_status, updated_at = now(), stage = $3, \
             timeout = NULL, mail_from = $4, body_id = (SELECT body_id FROM fresh) \
             WHERE workqueue_id = $1 AND status = 'running' AND pepsi.claim_held(claim_epoch)",
        );
    }

    #[test]
    fn a_replaced_state_is_assigned_not_merged_even_when_empty() {
        let base =
            "UPDATE pepsi.workqueue SET status = $2::pepsi.workqueue_status, updated_at = now()";
        let tail =
            "WHERE workqueue_id = $1 AND status = 'running' AND pepsi.claim_held(claim_epoch)";
        check(
            Changes {
                state_replaced: true,
                ..Changes::default()
            },
            true,
            false,
            &format!("{base}, stage = $3, timeout = NULL, state = $4 {tail}"),
        );
        let mut state = Map::new();
        state.insert("k".into(), Value::Bool(true));
        check(
            Changes {
                state,
                state_replaced: true,
                received_now: true,
                mail_from: true,
                ..Changes::default()
            },
            true,
            false,
            &format!(
                "{base}, stage = $3, timeout = NULL, state = $4, received_at = now(), mail_from = $5 {tail}"
            ),
        );
    }
}
