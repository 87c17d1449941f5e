//! Queue administration: what the operator tools read from `pepsi.workqueue` and the actions
//! they take on its rows (retry, hold, release, delete, bounce).
//!
//! Reads are prepared statements whose filters are bound parameters; every action is one
//! stored function of `procedures.sql` (`pepsi.workqueue_retry` …) called in a transaction of
//! its own that also writes the action's `pepsi.event_log` row through `audit::record`. This
//! module never notifies by itself: the caller calls `notify` once its actions committed.
//! It never builds SQL text from input, and never touches a running row unless forced.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row as _};

use pepsi_conf::config::Config;
use pepsi_contract::audit::{self, Actor};

pub mod json;
pub mod table;

/// The statuses a listing can filter on: the column's values, with held rows apart from
/// `paused` (a hold is a paused row with `state.held`).
pub const STATUSES: [&str; 6] = ["pending", "running", "paused", "held", "failed", "timeout"];

/// The conditions of a listing; `None` means any.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub stage: Option<String>,
    /// One of `STATUSES`.
    pub status: Option<String>,
    /// Part of the envelope sender, any letter case.
    pub sender: Option<String>,
    /// Part of any envelope recipient, any letter case.
    pub recipient: Option<String>,
    /// A recipient domain: some recipient's domain (after its last `@`) is exactly this, any
    /// letter case.
    pub domain: Option<String>,
    /// Only rows received at least this long ago.
    pub older_than: Option<Duration>,
}

/// One queue row as a listing shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueRow {
    pub id: i64,
    pub stage: String,
    /// The column's value (`paused` for a held row).
    pub status: String,
    pub held: bool,
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub received_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub timeout: Option<DateTime<Utc>>,
    /// Seconds since `received_at`, by the database's clock.
    pub age_secs: f64,
    /// `state.attempts`.
    pub attempts: Option<i64>,
    /// `state.last_error`.
    pub last_error: Option<String>,
    /// `state.dispatch_error`.
    pub dispatch_error: Option<String>,
}

impl QueueRow {
    /// `held` for a held row, else the status.
    pub fn display_status(&self) -> &str {
        if self.held { "held" } else { &self.status }
    }

    /// When a paused row becomes due again; `None` for every other row, held ones included.
    pub fn next_retry(&self) -> Option<DateTime<Utc>> {
        (self.status == "paused" && !self.held)
            .then_some(self.timeout)
            .flatten()
    }

    fn from_row(r: &PgRow) -> Result<QueueRow, sqlx::Error> {
        Ok(QueueRow {
            id: r.try_get("workqueue_id")?,
            stage: r.try_get("stage")?,
            status: r.try_get("status")?,
            held: r.try_get("held")?,
            mail_from: r.try_get("mail_from")?,
            rcpt_to: r.try_get("rcpt_to")?,
            received_at: r.try_get("received_at")?,
            updated_at: r.try_get("updated_at")?,
            timeout: r.try_get("timeout")?,
            age_secs: r.try_get("age")?,
            attempts: r.try_get("attempts")?,
            last_error: r.try_get("last_error")?,
            dispatch_error: r.try_get("dispatch_error")?,
        })
    }
}

/// The columns of `QueueRow`, from `pepsi.workqueue w`.
macro_rules! row_columns {
    () => {
        "w.workqueue_id, w.stage, w.status::text AS status, \
         (w.status = 'paused' AND w.state ? 'held') AS held, \
         w.mail_from, w.rcpt_to, w.received_at, w.updated_at, w.timeout, \
         extract(epoch FROM now() - w.received_at)::float8 AS age, \
         CASE WHEN jsonb_typeof(w.state -> 'attempts') = 'number' \
              THEN (w.state ->> 'attempts')::numeric::int8 END AS attempts, \
         CASE WHEN jsonb_typeof(w.state -> 'last_error') = 'string' \
              THEN w.state ->> 'last_error' ELSE (w.state -> 'last_error')::text END AS last_error, \
         CASE WHEN jsonb_typeof(w.state -> 'dispatch_error') = 'string' \
              THEN w.state ->> 'dispatch_error' ELSE (w.state -> 'dispatch_error')::text END AS dispatch_error"
    };
}

/// The `Filter` conditions, on parameters $1..$6.
macro_rules! filter_where {
    () => {
        " WHERE ($1::text IS NULL OR w.stage = $1) \
           AND ($2::text IS NULL OR $2 = CASE WHEN w.status = 'paused' AND w.state ? 'held' \
                                             THEN 'held' ELSE w.status::text END) \
           AND ($3::text IS NULL OR strpos(lower(w.mail_from), lower($3)) > 0) \
           AND ($4::text IS NULL OR EXISTS (SELECT 1 FROM unnest(w.rcpt_to) AS r(a) \
                                            WHERE strpos(lower(r.a), lower($4)) > 0)) \
           AND ($5::float8 IS NULL OR w.received_at <= now() - make_interval(secs => $5)) \
           AND ($6::text IS NULL OR EXISTS (SELECT 1 FROM unnest(w.rcpt_to) AS d(a) \
                                            WHERE lower(substring(d.a FROM '@([^@]*)$')) = lower($6))) "
    };
}

fn bind_filter<'q>(
    q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    f: &'q Filter,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    q.bind(f.stage.as_deref())
        .bind(f.status.as_deref())
        .bind(f.sender.as_deref())
        .bind(f.recipient.as_deref())
        .bind(f.older_than.map(|d| d.as_secs_f64()))
        .bind(f.domain.as_deref())
}

impl Filter {
    /// True when no condition is set: the filter matches every row.
    pub fn is_empty(&self) -> bool {
        self.stage.is_none()
            && self.status.is_none()
            && self.sender.is_none()
            && self.recipient.is_none()
            && self.domain.is_none()
            && self.older_than.is_none()
    }
}

/// The rows matching `filter`, oldest first, at most `limit`.
pub async fn list(
    pool: &PgPool,
    filter: &Filter,
    limit: i64,
) -> Result<Vec<QueueRow>, sqlx::Error> {
    let q = sqlx::query(concat!(
        "SELECT ",
        row_columns!(),
        " FROM pepsi.workqueue w",
        filter_where!(),
        "ORDER BY w.received_at, w.workqueue_id LIMIT $7"
    ));
    let rows = bind_filter(q, filter).bind(limit).fetch_all(pool).await?;
    rows.iter().map(QueueRow::from_row).collect()
}

/// How many rows matching `filter` there are per (stage, status), `held` apart from
/// `paused`; sorted by stage, then status in `STATUSES` order.
pub async fn summary(
    pool: &PgPool,
    filter: &Filter,
) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
    let q = sqlx::query(concat!(
        "SELECT w.stage, CASE WHEN w.status = 'paused' AND w.state ? 'held' THEN 'held' \
                 ELSE w.status::text END AS st, count(*) AS n FROM pepsi.workqueue w",
        filter_where!(),
        "GROUP BY 1, 2"
    ));
    let rows = bind_filter(q, filter).fetch_all(pool).await?;
    let mut out = rows
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect::<Result<Vec<(String, String, i64)>, sqlx::Error>>()?;
    let rank = |s: &str| {
        STATUSES
            .iter()
            .position(|x| *x == s)
            .unwrap_or(STATUSES.len())
    };
    out.sort_by(|a, b| a.0.cmp(&b.0).then(rank(&a.1).cmp(&rank(&b.1))));
    Ok(out)
}

/// One message in full, as `show` prints it.
#[derive(Debug, Clone)]
pub struct Message {
    pub row: QueueRow,
    pub state: Value,
    pub headers: Vec<u8>,
    pub body_id: i64,
    pub body_size: i64,
    /// Only when asked for.
    pub body: Option<Vec<u8>>,
    pub auth_user: Option<String>,
    pub client_addr: Option<String>,
    pub sender_key: String,
}

/// Row `id` with its state and header block (and body when `with_body`); `None` when there
/// is no such row.
pub async fn show(pool: &PgPool, id: i64, with_body: bool) -> Result<Option<Message>, sqlx::Error> {
    let row = sqlx::query(concat!(
        "SELECT ",
        row_columns!(),
        ", w.state, w.headers, w.body_id, octet_length(b.body)::int8 AS body_size, \
         CASE WHEN $2 THEN b.body END AS body, w.auth_user, host(w.client_addr) AS client_addr, \
         w.sender_key \
         FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) \
         WHERE w.workqueue_id = $1"
    ))
    .bind(id)
    .bind(with_body)
    .fetch_optional(pool)
    .await?;
    let Some(r) = row else { return Ok(None) };
    Ok(Some(Message {
        row: QueueRow::from_row(&r)?,
        state: r.try_get("state")?,
        headers: r.try_get("headers")?,
        body_id: r.try_get("body_id")?,
        body_size: r.try_get("body_size")?,
        body: r.try_get("body")?,
        auth_user: r.try_get("auth_user")?,
        client_addr: r.try_get("client_addr")?,
        sender_key: r.try_get("sender_key")?,
    }))
}

/// The stage and status of row `id`, or `None` when there is no such row.
pub async fn stage_of(pool: &PgPool, id: i64) -> Result<Option<(String, String)>, sqlx::Error> {
    let r = sqlx::query("SELECT stage, status::text FROM pepsi.workqueue WHERE workqueue_id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await?;
    r.map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).transpose()
}

/// The ids a bulk retry takes, in id order: failed and timed-out rows, plus paused (not
/// held) ones unless `failed_only`; at `stage` when given.
pub async fn retry_candidates(
    pool: &PgPool,
    stage: Option<&str>,
    failed_only: bool,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT workqueue_id FROM pepsi.workqueue \
         WHERE ($1::text IS NULL OR stage = $1) \
           AND (status IN ('failed', 'timeout') \
                OR (NOT $2 AND status = 'paused' AND NOT state ? 'held')) \
         ORDER BY workqueue_id",
    )
    .bind(stage)
    .bind(failed_only)
    .fetch_all(pool)
    .await
}

/// The ids of at most `limit` rows matching `filter`, oldest first: what a bulk action by
/// filter takes.
pub async fn select_ids(
    pool: &PgPool,
    filter: &Filter,
    limit: i64,
) -> Result<Vec<i64>, sqlx::Error> {
    let q = sqlx::query_scalar(concat!(
        "SELECT w.workqueue_id FROM pepsi.workqueue w",
        filter_where!(),
        "ORDER BY w.received_at, w.workqueue_id LIMIT $7"
    ));
    let q = q
        .bind(filter.stage.as_deref())
        .bind(filter.status.as_deref())
        .bind(filter.sender.as_deref())
        .bind(filter.recipient.as_deref())
        .bind(filter.older_than.map(|d| d.as_secs_f64()))
        .bind(filter.domain.as_deref());
    q.bind(limit).fetch_all(pool).await
}

/// The BOUNCE_STAGE of `stage` in `cfg` (the file with the global overlay applied: what the
/// workers see), which must itself be a configured stage; row `id` is named in the refusal.
pub fn bounce_target(cfg: &Config, id: i64, stage: &str) -> Result<String, AdminError> {
    bounce_stage_of(cfg, stage).map_err(|why| AdminError::Refused {
        id,
        message: format!("row {id} is at stage {stage}, and {why}"),
    })
}

/// An operator action on one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Pending now at the same stage.
    Retry,
    /// Parked until released.
    Hold { reason: Option<String> },
    /// A held row becomes pending.
    Release,
    /// The row is removed.
    Delete,
    /// Rerouted from `stage` to its `bounce_stage` with a permanent `state.bounce`.
    Bounce {
        stage: String,
        bounce_stage: String,
        reason: String,
    },
}

impl Action {
    /// The `event_log.action` name.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Retry => "queue.retry",
            Action::Hold { .. } => "queue.hold",
            Action::Release => "queue.release",
            Action::Delete => "queue.delete",
            Action::Bounce { .. } => "queue.bounce",
        }
    }
}

/// What an action did to a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Changed; what changed (the stored function's report, also in the event_log row).
    Changed(Value),
    /// Nothing to do, and why (already pending, already held, not held).
    Unchanged(String),
}

/// Why an action was not taken.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("there is no queue row {0}")]
    NotFound(i64),
    /// A worker holds the row; `--force` would override.
    #[error("{message}")]
    Running { id: i64, message: String },
    /// The action does not apply to this row.
    #[error("{message}")]
    Refused { id: i64, message: String },
    #[error("row {id}: {source}")]
    Database {
        id: i64,
        #[source]
        source: sqlx::Error,
    },
}

impl AdminError {
    /// True when the database refused for lack of privileges (the wrong role).
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, AdminError::Database { source: sqlx::Error::Database(e), .. }
            if e.code().as_deref() == Some("42501"))
    }
}

/// Applies `action` to row `id` in one transaction together with its event_log row. A
/// running row is refused unless `force`. Nothing is notified: call `notify` afterwards.
pub async fn apply(
    pool: &PgPool,
    actor: &Actor,
    id: i64,
    action: &Action,
    force: bool,
) -> Result<Outcome, AdminError> {
    let result = pepsi_contract::db::with_retry(|| async {
        let mut tx = pool.begin().await?;
        let report: Value = match action {
            Action::Retry => {
                sqlx::query_scalar("SELECT pepsi.workqueue_retry($1, $2)")
                    .bind(id)
                    .bind(force)
                    .fetch_one(&mut *tx)
                    .await?
            }
            Action::Hold { reason } => {
                sqlx::query_scalar("SELECT pepsi.workqueue_hold($1, $2, $3)")
                    .bind(id)
                    .bind(force)
                    .bind(reason.as_deref())
                    .fetch_one(&mut *tx)
                    .await?
            }
            Action::Release => {
                sqlx::query_scalar("SELECT pepsi.workqueue_release($1)")
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await?
            }
            Action::Delete => {
                sqlx::query_scalar("SELECT pepsi.workqueue_delete($1, $2)")
                    .bind(id)
                    .bind(force)
                    .fetch_one(&mut *tx)
                    .await?
            }
            Action::Bounce {
                stage,
                bounce_stage,
                reason,
            } => {
                sqlx::query_scalar("SELECT pepsi.workqueue_bounce($1, $2, $3, $4, $5)")
                    .bind(id)
                    .bind(stage)
                    .bind(bounce_stage)
                    .bind(reason)
                    .bind(force)
                    .fetch_one(&mut *tx)
                    .await?
            }
        };
        conclude(
            tx,
            actor,
            action.name(),
            id,
            report,
            json!({"force": force}),
        )
        .await
    })
    .await;
    result.map_err(|e| match &e {
        sqlx::Error::Database(db) => {
            let message = db.message().to_owned();
            match db.code().as_deref() {
                Some("P0002") => AdminError::NotFound(id),
                Some("55006") => AdminError::Running { id, message },
                Some("55000") => AdminError::Refused { id, message },
                _ => AdminError::Database { id, source: e },
            }
        }
        _ => AdminError::Database { id, source: e },
    })
}

/// Wakes the dispatcher after actions committed (the contract in procedures.sql).
pub async fn notify(pool: &PgPool) -> Result<(), sqlx::Error> {
    pepsi_contract::db::notify_workqueue(pool).await
}

// ----- the failure bouncer --------------------------------------------------------------
// pepsi-failure-bouncer's reads and steps: `pepsi.failure_candidates` and one stored
// function per step (procedures.sql, THE FAILURE BOUNCER), each in a transaction of its own
// with its event_log row. Like the operator actions, nothing is notified here.

/// A failed or timed-out row the failure bouncer considers.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedRow {
    pub id: i64,
    pub stage: String,
    /// `failed` or `timeout`.
    pub status: String,
    pub mail_from: String,
    pub state: Value,
}

/// Failed and timed-out rows unchanged for `grace`, not given up, oldest change first, at
/// most `limit`.
pub async fn failure_candidates(
    pool: &PgPool,
    grace: Duration,
    limit: i64,
) -> Result<Vec<FailedRow>, sqlx::Error> {
    let rows = sqlx::query("SELECT * FROM pepsi.failure_candidates($1, $2::int4)")
        .bind(grace.as_secs_f64())
        .bind(limit.clamp(0, i64::from(i32::MAX)))
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| {
            Ok(FailedRow {
                id: r.try_get("workqueue_id")?,
                stage: r.try_get("stage")?,
                status: r.try_get("status")?,
                mail_from: r.try_get("mail_from")?,
                state: r.try_get("state")?,
            })
        })
        .collect()
}

/// One step of the failure bouncer on a row, with the `state.failure_bouncer` it leaves.
#[derive(Debug, Clone, PartialEq)]
pub enum FailureStep {
    /// Pending again at its stage.
    Retry { record: Value },
    /// To `bounce_stage` with a permanent `state.bounce` whose diagnostic is `reason`.
    Bounce {
        bounce_stage: String,
        reason: String,
        record: Value,
    },
    /// Deleted: the null sender, nobody to return it to.
    Drop,
    /// Left as it is, marked given up.
    GiveUp { record: Value },
}

impl FailureStep {
    /// The `event_log.action` name.
    pub fn name(&self) -> &'static str {
        match self {
            FailureStep::Retry { .. } => "failure.retry",
            FailureStep::Bounce { .. } => "failure.bounce",
            FailureStep::Drop => "failure.drop",
            FailureStep::GiveUp { .. } => "failure.give_up",
        }
    }
}

/// Takes `step` on `row` (only if it is still as seen: failed or timed out at that stage)
/// and writes its event_log row with `detail` added, in one transaction.
pub async fn apply_failure_step(
    pool: &PgPool,
    actor: &Actor,
    row: &FailedRow,
    step: &FailureStep,
    detail: Value,
) -> Result<Outcome, sqlx::Error> {
    pepsi_contract::db::with_retry(|| async {
        let mut tx = pool.begin().await?;
        let report: Value = match step {
            FailureStep::Retry { record } => {
                sqlx::query_scalar("SELECT pepsi.failure_retry($1, $2, $3, $4)")
                    .bind(row.id)
                    .bind(&row.stage)
                    .bind(&row.status)
                    .bind(record)
                    .fetch_one(&mut *tx)
                    .await?
            }
            FailureStep::Bounce {
                bounce_stage,
                reason,
                record,
            } => {
                sqlx::query_scalar("SELECT pepsi.failure_bounce($1, $2, $3, $4, $5, $6)")
                    .bind(row.id)
                    .bind(&row.stage)
                    .bind(&row.status)
                    .bind(bounce_stage)
                    .bind(reason)
                    .bind(record)
                    .fetch_one(&mut *tx)
                    .await?
            }
            FailureStep::Drop => {
                sqlx::query_scalar("SELECT pepsi.failure_drop($1, $2, $3)")
                    .bind(row.id)
                    .bind(&row.stage)
                    .bind(&row.status)
                    .fetch_one(&mut *tx)
                    .await?
            }
            FailureStep::GiveUp { record } => {
                sqlx::query_scalar("SELECT pepsi.failure_give_up($1, $2, $3, $4)")
                    .bind(row.id)
                    .bind(&row.stage)
                    .bind(&row.status)
                    .bind(record)
                    .fetch_one(&mut *tx)
                    .await?
            }
        };
        conclude(tx, actor, step.name(), row.id, report, detail.clone()).await
    })
    .await
}

/// Ends an action's transaction on its stored function's `report`: rolled back, and
/// `Unchanged` with the report's note, when it changed nothing; else the event_log row
/// `action` (the report without `changed`, with the keys of `extra` added) and the commit.
async fn conclude(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    actor: &Actor,
    action: &str,
    id: i64,
    report: Value,
    extra: Value,
) -> Result<Outcome, sqlx::Error> {
    if report["changed"] != json!(true) {
        tx.rollback().await?;
        let note = report["note"]
            .as_str()
            .unwrap_or("nothing to do")
            .to_owned();
        return Ok(Outcome::Unchanged(note));
    }
    let mut detail = report.clone();
    if let (Value::Object(map), Value::Object(extra)) = (&mut detail, extra) {
        map.remove("changed");
        map.extend(extra);
    }
    audit::record(&mut tx, actor, action, Some(id), detail).await?;
    tx.commit().await?;
    Ok(Outcome::Changed(report))
}

/// The BOUNCE_STAGE of `stage` in `cfg` (the file with the global overlay, as the workers
/// see it), which must itself be a configured stage; the error says why there is none.
/// pepsi-queue's `bounce` and the failure bouncer both return rows through it.
pub fn bounce_stage_of(cfg: &Config, stage: &str) -> Result<String, String> {
    let section = cfg.stage_section_named(stage);
    let target = pepsi_contract::stage::edges::bounce_stage(&section)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!("[stage-{stage}] has no BOUNCE_STAGE: nowhere to send the bounce")
        })?;
    if cfg.stage(&target).is_none() {
        return Err(format!(
            "[stage-{stage}] BOUNCE_STAGE = {target}, but there is no [stage-{target}] section"
        ));
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_str_named(text, "test.conf").unwrap()
    }

    #[test]
    fn bounce_target_needs_a_bounce_stage_that_exists() {
        let c = cfg("[stage-relay]\nPROGRAM = x\nBOUNCE_STAGE = bounce\n\
                     [stage-bounce]\nPROGRAM = y\n\
                     [stage-init]\nPROGRAM = x\n\
                     [stage-odd]\nPROGRAM = x\nBOUNCE_STAGE = nowhere\n");
        assert_eq!(bounce_target(&c, 1, "relay").unwrap(), "bounce");
        let cases = [
            (
                "init",
                "row 1 is at stage init, and [stage-init] has no BOUNCE_STAGE",
            ),
            ("gone", "[stage-gone] has no BOUNCE_STAGE"),
            (
                "odd",
                "BOUNCE_STAGE = nowhere, but there is no [stage-nowhere] section",
            ),
        ];
        for (stage, want) in cases {
            let err = bounce_target(&c, 1, stage).unwrap_err().to_string();
            assert!(err.contains(want), "{stage}: {err}");
        }
    }
}
