//! What the system is doing now, read from the database in one place: the dispatcher's
//! cumulative counters (`pepsi.stage_stats`, `pepsi.dispatch_stats`), the live shape of
//! `pepsi.workqueue` (rows per stage and status, the oldest message per stage) and the final
//! outcomes the mail log recorded in the last hour. pepsi-httpd's `/metrics` renders it,
//! `pepsi-status` prints it; both read the same numbers through the same statements.
//! `pepsi-status` also reads here who holds the dispatcher's lock (`dispatcher`), the
//! outcomes of the last five minutes and hour (`recent_outcomes`) and the failed rows
//! (`failures`).
//!
//! Only reads; every statement is a constant.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Row as _};

use crate::queue::{self, Filter};

/// One stage's cumulative counters (`pepsi.stage_stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StageCounters {
    pub stage: String,
    /// Messages the stage has handled (fused hops included).
    pub messages: i64,
    /// Time its workers spent on them.
    pub processing_ms: i64,
    /// Workers killed for running over MAX_RUNTIME.
    pub kills: i64,
    /// Workers that exited unexpectedly.
    pub crashes: i64,
}

/// The dispatcher's own counters (`pepsi.dispatch_stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DispatchCounters {
    /// Stage passes completed.
    pub stages_total: i64,
    /// Messages that left the pipeline.
    pub messages_total: i64,
    /// Messages that ended failed or timed out.
    pub messages_failed: i64,
    /// Serialization or deadlock retries observed.
    pub serialization_failures: i64,
}

/// Rows of the queue at one stage in one status (held apart from paused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueCount {
    pub stage: String,
    pub status: String,
    pub rows: i64,
}

/// The oldest row at a stage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Oldest {
    pub stage: String,
    /// Seconds since that row's message was received.
    pub age_seconds: f64,
}

/// Final outcomes of one kind at one stage in the last hour (the mail log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutcomeCount {
    /// The stage that recorded it (empty when none was).
    pub stage: String,
    /// delivered, bounced, expired or dropped.
    pub event: String,
    pub rows: i64,
}

/// Everything one look at the database reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Snapshot {
    pub stages: Vec<StageCounters>,
    pub dispatch: DispatchCounters,
    pub queue: Vec<QueueCount>,
    pub oldest: Vec<Oldest>,
    pub outcomes: Vec<OutcomeCount>,
    pub ingress: Vec<IngressCount>,
    pub destinations: Vec<DestinationCount>,
    /// Sessions the TLS reports received in the last week count, per result.
    pub tls_reports: Vec<TlsReportCount>,
}

/// Reads a snapshot: five read-only statements, not one transaction (the figures are a
/// moment apart, as a scrape's are).
pub async fn snapshot(pool: &PgPool) -> Result<Snapshot, sqlx::Error> {
    Ok(Snapshot {
        stages: stage_counters(pool).await?,
        dispatch: dispatch_counters(pool).await?,
        queue: queue_counts(pool).await?,
        oldest: oldest(pool).await?,
        outcomes: outcomes_last_hour(pool).await?,
        ingress: ingress_counters(pool).await?,
        destinations: destinations_last_hour(pool).await?,
        tls_reports: tls_reports_last_week(pool).await?,
    })
}

/// Sessions of one result in the TLS reports (RFC 8460) other senders made about our
/// domains, received in the last week (`pepsi.tls_report_received`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TlsReportCount {
    /// `success`, or an RFC 8460 result type (reports are checked for those on import).
    pub result: String,
    pub sessions: i64,
}

/// The results of the TLS reports received in the last week.
pub async fn tls_reports_last_week(pool: &PgPool) -> Result<Vec<TlsReportCount>, sqlx::Error> {
    let rows = sqlx::query(
        "WITH p AS (SELECT pol FROM pepsi.tls_report_received r, \
                   jsonb_array_elements(r.report->'policies') pol \
                   WHERE r.received_at > now() - interval '7 days') \
         SELECT 'success' AS result, \
                coalesce(sum((pol->'summary'->>'total-successful-session-count')::bigint), 0)::bigint \
         FROM p \
         UNION ALL \
         SELECT d->>'result-type', sum((d->>'failed-session-count')::bigint)::bigint \
         FROM p, jsonb_array_elements(coalesce(pol->'failure-details', '[]'::jsonb)) d \
         GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(TlsReportCount {
                result: r.try_get(0)?,
                sessions: r.try_get(1)?,
            })
        })
        .collect()
}

/// One of the ingress's counters (`pepsi.ingress_stats`, summed over its processes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IngressCount {
    /// sessions, messages, recipients, connections_refused or refused.
    pub counter: String,
    /// Empty, or the command and status of a refusal (`RCPT 5.1.1`), or why a connection
    /// was turned away.
    pub reason: String,
    pub value: i64,
}

/// The ingress's counters.
pub async fn ingress_counters(pool: &PgPool) -> Result<Vec<IngressCount>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT counter, reason, value FROM pepsi.ingress_stats ORDER BY counter, reason",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(IngressCount {
                counter: r.try_get(0)?,
                reason: r.try_get(1)?,
                value: r.try_get(2)?,
            })
        })
        .collect()
}

/// How many destination domains [`destinations_last_hour`] names; the rest are `other`.
pub const TOP_DESTINATIONS: i64 = 20;

/// Final outcomes of one kind for one destination domain in the last hour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DestinationCount {
    /// The recipient domain: one of the [`TOP_DESTINATIONS`] busiest, else `other`.
    pub domain: String,
    /// delivered, bounced, expired or dropped.
    pub event: String,
    /// Recipients, not messages.
    pub recipients: i64,
}

/// The mail log's last hour per recipient domain and event, the busiest domains by name and
/// the rest together as `other`: a bounded set of labels whatever the traffic.
pub async fn destinations_last_hour(pool: &PgPool) -> Result<Vec<DestinationCount>, sqlx::Error> {
    let rows = sqlx::query(
        "WITH r AS (SELECT lower(split_part(rcpt, '@', 2)) AS domain, l.event \
                    FROM pepsi.mail_log l, unnest(l.rcpt_to) AS rcpt \
                    WHERE l.at > now() - interval '1 hour'), \
              top AS (SELECT domain FROM r GROUP BY domain ORDER BY count(*) DESC, domain LIMIT $1) \
         SELECT CASE WHEN r.domain IN (SELECT domain FROM top) THEN r.domain ELSE 'other' END AS d, \
                r.event, count(*) \
         FROM r GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .bind(TOP_DESTINATIONS)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(DestinationCount {
                domain: r.try_get(0)?,
                event: r.try_get(1)?,
                recipients: r.try_get(2)?,
            })
        })
        .collect()
}

/// `pepsi.stage_stats`, by stage name.
pub async fn stage_counters(pool: &PgPool) -> Result<Vec<StageCounters>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT stage, messages, processing_ms, kills, crashes FROM pepsi.stage_stats \
         ORDER BY stage",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(StageCounters {
                stage: r.try_get(0)?,
                messages: r.try_get(1)?,
                processing_ms: r.try_get(2)?,
                kills: r.try_get(3)?,
                crashes: r.try_get(4)?,
            })
        })
        .collect()
}

/// `pepsi.dispatch_stats` (zeros before the dispatcher first wrote it).
pub async fn dispatch_counters(pool: &PgPool) -> Result<DispatchCounters, sqlx::Error> {
    let row = sqlx::query(
        "SELECT stages_total, messages_total, messages_failed, serialization_failures \
         FROM pepsi.dispatch_stats WHERE id = 1",
    )
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        None => DispatchCounters::default(),
        Some(r) => DispatchCounters {
            stages_total: r.try_get(0)?,
            messages_total: r.try_get(1)?,
            messages_failed: r.try_get(2)?,
            serialization_failures: r.try_get(3)?,
        },
    })
}

/// Rows per stage and status (held apart from paused), as `queue::summary` counts them.
pub async fn queue_counts(pool: &PgPool) -> Result<Vec<QueueCount>, sqlx::Error> {
    Ok(queue::summary(pool, &Filter::default())
        .await?
        .into_iter()
        .map(|(stage, status, rows)| QueueCount {
            stage,
            status,
            rows,
        })
        .collect())
}

/// The age of the oldest row at each stage.
pub async fn oldest(pool: &PgPool) -> Result<Vec<Oldest>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT stage, extract(epoch FROM now() - min(received_at))::float8 \
         FROM pepsi.workqueue GROUP BY stage ORDER BY stage",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Oldest {
                stage: r.try_get(0)?,
                age_seconds: r.try_get::<f64, _>(1)?.max(0.0),
            })
        })
        .collect()
}

/// The mail log's outcomes of the last hour per stage and event.
pub async fn outcomes_last_hour(pool: &PgPool) -> Result<Vec<OutcomeCount>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT COALESCE(stage, ''), event, count(*) FROM pepsi.mail_log \
         WHERE at > now() - interval '1 hour' GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(OutcomeCount {
                stage: r.try_get(0)?,
                event: r.try_get(1)?,
                rows: r.try_get(2)?,
            })
        })
        .collect()
}

/// The role and the database of this connection (`current_user`, `current_database()`).
pub async fn session(pool: &PgPool) -> Result<(String, String), sqlx::Error> {
    sqlx::query_as("SELECT current_user::text, current_database()::text")
        .fetch_one(pool)
        .await
}

/// The advisory lock pepsi-dispatch holds for as long as it runs (`pg_try_advisory_lock(k1,
/// k2)` on a session of its own, named `pepsi-dispatch HOST pid PID`); the key pair is the
/// dispatcher's `LOCK_KEY`. Whoever holds it in this database is the running dispatcher.
pub const DISPATCH_LOCK: (i32, i32) = (0x7065_7073, 1);

/// The PostgreSQL session holding [`DISPATCH_LOCK`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockHolder {
    /// The server backend's pid (not the dispatcher's own).
    pub backend_pid: i32,
    /// The session's application_name: `pepsi-dispatch HOST pid PID`.
    pub application_name: String,
    /// The client's address; none over a unix socket or when the role may not see it.
    pub client_addr: Option<String>,
    /// When the session started; none when the role may not see it.
    pub since: Option<DateTime<Utc>>,
}

/// The session holding the dispatcher's lock in this database, if any: the dispatcher runs
/// exactly when there is one. pg_locks is readable by every role.
pub async fn dispatcher(pool: &PgPool) -> Result<Option<LockHolder>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT l.pid, COALESCE(a.application_name, '') AS app, a.client_addr::text AS addr, \
                a.backend_start \
         FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted \
           AND l.classid = $1::int8::oid AND l.objid = $2::int8::oid AND l.objsubid = 2 \
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         LIMIT 1",
    )
    .bind(i64::from(DISPATCH_LOCK.0))
    .bind(i64::from(DISPATCH_LOCK.1))
    .fetch_optional(pool)
    .await?;
    row.map(|r| {
        Ok(LockHolder {
            backend_pid: r.try_get(0)?,
            application_name: r.try_get(1)?,
            client_addr: r.try_get(2)?,
            since: r.try_get(3)?,
        })
    })
    .transpose()
}

/// Final outcomes of one kind the mail log recorded recently, over every stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecentOutcome {
    /// delivered, bounced, expired or dropped.
    pub event: String,
    pub last_5_minutes: i64,
    pub last_hour: i64,
}

/// What left the pipeline in the last five minutes and the last hour, per event, from the
/// mail log (written in the commit that decided each outcome, so exact to the row; empty
/// when `MAIL_LOG` is off).
pub async fn recent_outcomes(pool: &PgPool) -> Result<Vec<RecentOutcome>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT event, count(*) FILTER (WHERE at > now() - interval '5 minutes'), count(*) \
         FROM pepsi.mail_log WHERE at > now() - interval '1 hour' GROUP BY event ORDER BY event",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(RecentOutcome {
                event: r.try_get(0)?,
                last_5_minutes: r.try_get(1)?,
                last_hour: r.try_get(2)?,
            })
        })
        .collect()
}

/// A row left failed or timed out for an operator (or the failure bouncer).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    pub id: i64,
    pub stage: String,
    /// failed or timeout.
    pub status: String,
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub received_at: DateTime<Utc>,
    /// The row's last change: when it failed, for a row nobody touched since.
    pub updated_at: DateTime<Utc>,
    /// `state.dispatch_error`: why the dispatcher failed it (a crash, MAX_RUNTIME).
    pub dispatch_error: Option<String>,
    /// `state.last_error`: the last delivery attempt's error.
    pub last_error: Option<String>,
}

/// The failed and timed-out rows, most recently changed first, at most `limit`.
pub async fn failures(pool: &PgPool, limit: i64) -> Result<Vec<Failure>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT workqueue_id, stage, status::text, mail_from, rcpt_to, received_at, updated_at, \
                CASE WHEN jsonb_typeof(state -> 'dispatch_error') = 'string' \
                     THEN state ->> 'dispatch_error' ELSE (state -> 'dispatch_error')::text END, \
                CASE WHEN jsonb_typeof(state -> 'last_error') = 'string' \
                     THEN state ->> 'last_error' ELSE (state -> 'last_error')::text END \
         FROM pepsi.workqueue WHERE status IN ('failed', 'timeout') \
         ORDER BY updated_at DESC, workqueue_id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Failure {
                id: r.try_get(0)?,
                stage: r.try_get(1)?,
                status: r.try_get(2)?,
                mail_from: r.try_get(3)?,
                rcpt_to: r.try_get(4)?,
                received_at: r.try_get(5)?,
                updated_at: r.try_get(6)?,
                dispatch_error: r.try_get(7)?,
                last_error: r.try_get(8)?,
            })
        })
        .collect()
}
