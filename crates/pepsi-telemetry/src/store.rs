//! The receiver's SQL, as the `pepsi-telemetry` role: the rows of one request in one
//! transaction (a span already stored is skipped, so a client's retry is harmless), the
//! retention sweep in bounded batches, and the checks of start and `/healthz`. It touches
//! `pepsi.telemetry_span`, `pepsi.telemetry_metric` and reads `pepsi.schema_patch`, the only
//! tables its role may (pepsi-setup's privilege matrix); every statement is a prepared one.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::convert::{MetricRow, SpanRow};
use crate::options::Database;

/// The patch that made the tables (crates/pepsi-setup/db/pepsi-0027.sql).
pub const PATCH: &str = "pepsi-0027";

/// How long one statement may run; the server cancels it after this.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens the pool and checks that the database has the telemetry tables.
pub async fn connect(database: &Database, max_connections: u32) -> anyhow::Result<PgPool> {
    let options = database
        .0
        .clone()
        .application_name("pepsi-telemetry")
        .options([(
            "statement_timeout",
            STATEMENT_TIMEOUT.as_millis().to_string(),
        )]);
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot connect to the database as {}: {e}",
                database.describe()
            )
        })?;
    let applied: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pepsi.schema_patch WHERE patch_name = $1)",
    )
    .bind(PATCH)
    .fetch_one(&pool)
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "the database {} cannot be read as the telemetry role (run pepsi-setup db on the Pepsi host): {e}",
            database.describe()
        )
    })?;
    if !applied {
        anyhow::bail!(
            "the database {} lacks patch {PATCH} (the telemetry tables): run pepsi-setup db on the Pepsi host",
            database.describe()
        );
    }
    Ok(pool)
}

/// Whether the database answers.
pub async fn healthy(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query_scalar::<_, i32>("SELECT 1")
        .fetch_one(pool)
        .await
        .map(drop)
}

/// Stores `rows` in one transaction; returns how many were new (a span stored before, by
/// an earlier try of the same request, is skipped).
pub async fn insert_spans(pool: &PgPool, rows: &[SpanRow]) -> Result<u64, sqlx::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut tx = pool.begin().await?;
    let column = |f: fn(&SpanRow) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
    let done = sqlx::query(
        "INSERT INTO pepsi.telemetry_span (trace_id, span_id, parent_span_id, name, service, \
         host, stage, queue_id, message_id, outcome, start_time, end_time, attributes, \
         status_code, status_message) \
         SELECT * FROM UNNEST($1::bytea[], $2::bytea[], $3::bytea[], $4::text[], $5::text[], \
         $6::text[], $7::text[], $8::int8[], $9::text[], $10::text[], $11::timestamptz[], \
         $12::timestamptz[], $13::jsonb[], $14::int2[], $15::text[]) \
         ON CONFLICT (trace_id, span_id) DO NOTHING",
    )
    .bind(rows.iter().map(|r| r.trace_id.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.span_id.clone()).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|r| r.parent_span_id.clone())
            .collect::<Vec<_>>(),
    )
    .bind(rows.iter().map(|r| r.name.clone()).collect::<Vec<_>>())
    .bind(column(|r| r.service.clone()))
    .bind(column(|r| r.host.clone()))
    .bind(column(|r| r.stage.clone()))
    .bind(rows.iter().map(|r| r.queue_id).collect::<Vec<_>>())
    .bind(column(|r| r.message_id.clone()))
    .bind(column(|r| r.outcome.clone()))
    .bind(rows.iter().map(|r| r.start_time).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.end_time).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| &r.attributes).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.status_code).collect::<Vec<_>>())
    .bind(column(|r| r.status_message.clone()))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// A PostgreSQL array literal of `values` (`{1.5,Infinity,NaN}`), cast to the array type by
/// the statement: a histogram's bounds or counts travel as one text each, since one
/// UNNEST cannot take arrays of differing lengths.
fn array_literal<T: Copy>(values: &[T], show: fn(T) -> String) -> String {
    let items: Vec<String> = values.iter().map(|&v| show(v)).collect();
    format!("{{{}}}", items.join(","))
}

fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        v.to_string()
    }
}

/// Stores `rows` in one transaction; returns how many.
pub async fn insert_metrics(pool: &PgPool, rows: &[MetricRow]) -> Result<u64, sqlx::Error> {
    if rows.is_empty() {
        return Ok(0);
    }
    let mut tx = pool.begin().await?;
    let column = |f: fn(&MetricRow) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
    let done = sqlx::query(
        "INSERT INTO pepsi.telemetry_metric (name, service, host, kind, unit, attributes, time, \
         value, count, sum, bounds, bucket_counts) \
         SELECT n, s, h, k, u, a, t, v, c, su, b::float8[], bc::int8[] \
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[], \
         $7::timestamptz[], $8::float8[], $9::int8[], $10::float8[], $11::text[], $12::text[]) \
         AS r(n, s, h, k, u, a, t, v, c, su, b, bc)",
    )
    .bind(rows.iter().map(|r| r.name.clone()).collect::<Vec<_>>())
    .bind(column(|r| r.service.clone()))
    .bind(column(|r| r.host.clone()))
    .bind(
        rows.iter()
            .map(|r| r.kind.as_str().to_owned())
            .collect::<Vec<_>>(),
    )
    .bind(column(|r| r.unit.clone()))
    .bind(rows.iter().map(|r| &r.attributes).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.time).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.value).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.count).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.sum).collect::<Vec<_>>())
    .bind(column(|r| {
        r.bounds.as_deref().map(|b| array_literal(b, float))
    }))
    .bind(column(|r| {
        r.bucket_counts
            .as_deref()
            .map(|c| array_literal(c, |n: i64| n.to_string()))
    }))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// What one retention sweep deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub spans: u64,
    pub points: u64,
}

/// Deletes the spans that ended and the points taken before `cutoff`, `batch` rows per
/// statement (each its own short transaction, so a large backlog never holds long locks
/// nor one long transaction), until none is left.
pub async fn sweep(pool: &PgPool, cutoff: DateTime<Utc>, batch: u32) -> Result<Swept, sqlx::Error> {
    let limit = i64::from(batch);
    let mut swept = Swept::default();
    loop {
        let n = sqlx::query(
            "DELETE FROM pepsi.telemetry_span WHERE (trace_id, span_id) IN \
             (SELECT trace_id, span_id FROM pepsi.telemetry_span WHERE end_time < $1 LIMIT $2)",
        )
        .bind(cutoff)
        .bind(limit)
        .execute(pool)
        .await?
        .rows_affected();
        swept.spans += n;
        if n < u64::from(batch) {
            break;
        }
        tokio::task::yield_now().await;
    }
    loop {
        let n = sqlx::query(
            "DELETE FROM pepsi.telemetry_metric WHERE metric_id IN \
             (SELECT metric_id FROM pepsi.telemetry_metric WHERE time < $1 LIMIT $2)",
        )
        .bind(cutoff)
        .bind(limit)
        .execute(pool)
        .await?
        .rows_affected();
        swept.points += n;
        if n < u64::from(batch) {
            break;
        }
        tokio::task::yield_now().await;
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_literals_postgresql_reads() {
        assert_eq!(
            array_literal(&[0.5, 1.0, 2.5e9], float),
            "{0.5,1,2500000000}"
        );
        assert_eq!(
            array_literal(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY], float),
            "{NaN,Infinity,-Infinity}"
        );
        assert_eq!(array_literal(&[] as &[f64], float), "{}");
        assert_eq!(
            array_literal(&[0i64, 7, 1 << 40], |n| n.to_string()),
            "{0,7,1099511627776}"
        );
    }
}
