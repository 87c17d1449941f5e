//! Committing a pass: the recorded content changes and the terminal outcome become one
//! statement. For advance, pause and fail that is one UPDATE naming exactly the columns
//! the stage touched (a changed body first gets a body row of its own: copy-on-write);
//! the clone-spawning terminals call their stored functions.
//!
//! The SQL is assembled from the constant fragments below only, never from input, and each
//! shape is a prepared statement of its own.

use serde_json::{Map, Value};
use sqlx::PgPool;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use super::StageError;
use super::context::{Changes, CloneSpec, Outcome, Row};
use crate::db::with_retry;

const DELETE: &str = "DELETE FROM pepsi.workqueue WHERE workqueue_id = $1 AND status = 'running'";
const FINISH_WITH: &str = "SELECT pepsi.workqueue_finish_with_clones($1, $2)";
const PAUSE_WITH: &str = "SELECT pepsi.workqueue_pause($1, $2, $3, $4, $5)";

/// Writes `outcome` and `changes` for `row`. Errors when the row is gone or no longer
/// running (the dispatcher took it back), leaving the database as it was.
pub(crate) async fn commit(
    pool: &PgPool,
    row: &Row,
    changes: &Changes,
    outcome: &Outcome,
) -> Result<(), StageError> {
    let id = row.id;
    let affected = match outcome {
        Outcome::Finish => with_retry(|| sqlx::query(DELETE).bind(id).execute(pool))
            .await?
            .rows_affected(),
        Outcome::FinishWith { clones } => {
            let clones = clones_json(clones, &changes.state);
            with_retry(|| {
                sqlx::query(FINISH_WITH)
                    .bind(id)
                    .bind(&clones)
                    .execute(pool)
            })
            .await?;
            1
        }
        Outcome::PauseWith { secs, keep, clones } => {
            let clones = clones_json(clones, &changes.state);
            let keep: Option<Vec<i32>> =
                keep.as_ref().map(|k| k.iter().map(|&i| i as i32).collect());
            let merge = Value::Object(changes.state.clone());
            with_retry(|| {
                sqlx::query(PAUSE_WITH)
                    .bind(id)
                    .bind(&merge)
                    .bind(secs)
                    .bind(&keep)
                    .bind(&clones)
                    .execute(pool)
            })
            .await?;
            1
        }
        Outcome::Advance { stage } => {
            update(pool, row, changes, "pending", Some(stage), None).await?
        }
        Outcome::Pause { secs } => update(pool, row, changes, "paused", None, Some(*secs)).await?,
        Outcome::Fail => update(pool, row, changes, "failed", None, None).await?,
    };
    if affected != 1 {
        return Err(StageError::NotRunning {
            id,
            status: "no longer running (taken back by the dispatcher or deleted)".into(),
        });
    }
    Ok(())
}

fn clones_json(clones: &[CloneSpec], extra_state: &Map<String, Value>) -> Value {
    Value::Array(clones.iter().map(|c| c.to_json(extra_state)).collect())
}

/// The UPDATE text for a given set of touched columns. Placeholders: $1 id, $2 status,
/// then in order whichever of stage, pause seconds, state (merged, or replaced), headers,
/// mail_from, rcpt_to and body are present.
pub(crate) fn update_sql(changes: &Changes, stage: bool, pause: bool) -> String {
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
    if changes.body {
        let body = next();
        format!(
            "WITH fresh AS (INSERT INTO pepsi.workqueue_body (body) VALUES (${body}) RETURNING body_id) \
             UPDATE pepsi.workqueue SET {set}, body_id = (SELECT body_id FROM fresh) \
             WHERE workqueue_id = $1 AND status = 'running'"
        )
    } else {
        format!("UPDATE pepsi.workqueue SET {set} WHERE workqueue_id = $1 AND status = 'running'")
    }
}

async fn update(
    pool: &PgPool,
    row: &Row,
    changes: &Changes,
    status: &str,
    stage: Option<&String>,
    pause_secs: Option<f64>,
) -> Result<u64, StageError> {
    let sql = update_sql(changes, stage.is_some(), pause_secs.is_some());
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
        q
    };
    Ok(with_retry(|| bind().execute(pool)).await?.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(changes: Changes, stage: bool, pause: bool, expected: &str) {
        assert_eq!(update_sql(&changes, stage, pause), expected);
    }

    #[test]
    fn update_names_exactly_the_touched_columns() {
        let base =
            "UPDATE pepsi.workqueue SET status = $2::pepsi.workqueue_status, updated_at = now()";
        let tail = "WHERE workqueue_id = $1 AND status = 'running'";
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
             WHERE workqueue_id = $1 AND status = 'running'",
        );
    }

    #[test]
    fn a_replaced_state_is_assigned_not_merged_even_when_empty() {
        let base =
            "UPDATE pepsi.workqueue SET status = $2::pepsi.workqueue_status, updated_at = now()";
        let tail = "WHERE workqueue_id = $1 AND status = 'running'";
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
