//! One row of `pepsi.telemetry_span` (pepsi-0027.sql), the one type for it: what
//! pepsi-telemetry makes of an exported span and stores, and what pepsi-httpd reads back for a
//! journey. Pure: the statements stay with their crates.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row as _;
use sqlx::postgres::PgRow;

/// A stored span: the ids as octets, the `pepsi.*` attributes the receiver lifts into columns,
/// and every attribute (the resource's included) in `attributes`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRow {
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    pub parent_span_id: Option<Vec<u8>>,
    pub name: String,
    /// The resource's `service.name` and `host.name`.
    pub service: Option<String>,
    pub host: Option<String>,
    pub stage: Option<String>,
    pub queue_id: Option<i64>,
    pub message_id: Option<String>,
    pub outcome: Option<String>,
    pub start_time: DateTime<Utc>,
    pub end_time: DateTime<Utc>,
    pub attributes: Value,
    /// OTLP's status: 0 unset, 1 ok, 2 error.
    pub status_code: i16,
    pub status_message: Option<String>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for SpanRow {
    fn from_row(r: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(SpanRow {
            trace_id: r.try_get("trace_id")?,
            span_id: r.try_get("span_id")?,
            parent_span_id: r.try_get("parent_span_id")?,
            name: r.try_get("name")?,
            service: r.try_get("service")?,
            host: r.try_get("host")?,
            stage: r.try_get("stage")?,
            queue_id: r.try_get("queue_id")?,
            message_id: r.try_get("message_id")?,
            outcome: r.try_get("outcome")?,
            start_time: r.try_get("start_time")?,
            end_time: r.try_get("end_time")?,
            attributes: r.try_get("attributes")?,
            status_code: r.try_get("status_code")?,
            status_message: r.try_get("status_message")?,
        })
    }
}
