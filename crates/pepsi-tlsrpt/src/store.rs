//! The tables of TLS reporting (pepsi-0025): the counts the relay stage keeps
//! (`tls_report_result`), the reports sent (`tls_report_sent`) and received
//! (`tls_report_received`). Plain statements with bound values only.

use chrono::NaiveDate;
use sqlx::{PgPool, Row as _};

use crate::report::{Counted, Report};

/// The recipient domains with counts for `day`.
pub async fn domains_of(pool: &PgPool, day: NaiveDate) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT DISTINCT domain FROM pepsi.tls_report_result WHERE day = $1 ORDER BY 1",
    )
    .bind(day)
    .fetch_all(pool)
    .await
}

/// The counts of `domain` on `day`.
pub async fn results(
    pool: &PgPool,
    day: NaiveDate,
    domain: &str,
) -> Result<Vec<Counted>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT policy_type, policy_string, mx_host, receiving_ip, result_type, sessions, detail \
         FROM pepsi.tls_report_result WHERE day = $1 AND domain = $2 \
         ORDER BY policy_type, policy_string, mx_host, receiving_ip, result_type",
    )
    .bind(day)
    .bind(domain)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(Counted {
                policy_type: r.try_get("policy_type")?,
                policy_string: r.try_get("policy_string")?,
                mx_host: r.try_get("mx_host")?,
                receiving_ip: r.try_get("receiving_ip")?,
                result_type: r.try_get("result_type")?,
                sessions: r.try_get::<i64, _>("sessions")?.max(0) as u64,
                detail: r.try_get("detail")?,
            })
        })
        .collect()
}

pub async fn was_sent(
    pool: &PgPool,
    day: NaiveDate,
    domain: &str,
    rua: &str,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pepsi.tls_report_sent \
         WHERE day = $1 AND domain = $2 AND rua = $3)",
    )
    .bind(day)
    .bind(domain)
    .bind(rua)
    .fetch_one(pool)
    .await
}

pub async fn mark_sent(
    pool: &PgPool,
    day: NaiveDate,
    domain: &str,
    rua: &str,
    report_id: &str,
    queue_id: Option<i64>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO pepsi.tls_report_sent (day, domain, rua, report_id, queue_id) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(day)
    .bind(domain)
    .bind(rua)
    .bind(report_id)
    .bind(queue_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// Queues a report mail as local mail from `from` to `to`; its row id.
pub async fn queue(pool: &PgPool, from: &str, to: &str, raw: &[u8]) -> Result<i64, sqlx::Error> {
    let (headers, body) = pepsi_contract::message::split(raw);
    sqlx::query_scalar(
        "SELECT pepsi.workqueue_add($1, ARRAY[$2], $3, $4, '{}'::jsonb, NULL, '127.0.0.1'::inet)",
    )
    .bind(from)
    .bind(to)
    .bind(headers)
    .bind(body)
    .fetch_one(pool)
    .await
}

/// Deletes counts older than `retention`; how many rows went.
pub async fn forget_results(
    pool: &PgPool,
    retention: std::time::Duration,
) -> Result<u64, sqlx::Error> {
    let days = (retention.as_secs() / 86_400).max(1) as i32;
    Ok(sqlx::query(
        "DELETE FROM pepsi.tls_report_result \
         WHERE day < (now() AT TIME ZONE 'UTC')::date - $1",
    )
    .bind(days)
    .execute(pool)
    .await?
    .rows_affected())
}

/// Keeps a received report; false when the same organisation's report id was kept before.
pub async fn receive(pool: &PgPool, report: &Report, source: &str) -> anyhow::Result<bool> {
    let json = serde_json::to_value(report)?;
    let source: String = source.chars().take(2000).collect();
    let added = sqlx::query(
        "INSERT INTO pepsi.tls_report_received \
         (organization, report_id, start_at, end_at, report, source) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (organization, report_id) DO NOTHING",
    )
    .bind(&report.organization_name)
    .bind(&report.report_id)
    .bind(report.date_range.start_datetime)
    .bind(report.date_range.end_datetime)
    .bind(&json)
    .bind(&source)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(added == 1)
}

/// The reports received whose range ended within `days`, newest first, with their source.
pub async fn received(pool: &PgPool, days: u32) -> anyhow::Result<Vec<(Report, String)>> {
    let rows = sqlx::query(
        "SELECT report, source FROM pepsi.tls_report_received \
         WHERE end_at > now() - make_interval(days => $1) ORDER BY end_at DESC, received_id DESC",
    )
    .bind(days.min(36_500) as i32)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            let json: serde_json::Value = r.try_get("report")?;
            Ok((serde_json::from_value(json)?, r.try_get("source")?))
        })
        .collect()
}
