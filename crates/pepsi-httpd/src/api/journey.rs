//! `GET /api/journey`: a message's journey — the spans of its trace in
//! `pepsi.telemetry_span`, found by queue row, Message-ID or trace id (`crate::journey`
//! parses the lookup and builds the timeline). The journey page reads the same through
//! `find`.

use axum::Json;
use axum::extract::State;
use sqlx::PgPool;

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Pairs, Principal};
use crate::journey::{self, Journey, Lookup, SpanRow};

/// The most spans of one trace shown; a trace with more is `truncated`.
pub const MAX_SPANS: i64 = 2000;
/// The most traces one lookup lists (the one shown and the others).
pub const MAX_TRACES: i64 = 50;

/// The traces `lookup` matches, the one that began last first (by its earliest matching
/// span).
async fn traces(pool: &PgPool, lookup: &Lookup) -> Result<Vec<Vec<u8>>, sqlx::Error> {
    match lookup {
        Lookup::Trace(t) => Ok(vec![t.to_vec()]),
        Lookup::Queue(id) => {
            sqlx::query_scalar(
                "SELECT trace_id FROM pepsi.telemetry_span WHERE queue_id = $1 \
                 GROUP BY trace_id ORDER BY min(start_time) DESC, trace_id LIMIT $2",
            )
            .bind(id)
            .bind(MAX_TRACES)
            .fetch_all(pool)
            .await
        }
        Lookup::MessageId(bare) => {
            sqlx::query_scalar(
                "SELECT trace_id FROM pepsi.telemetry_span WHERE message_id = ANY($1::text[]) \
                 GROUP BY trace_id ORDER BY min(start_time) DESC, trace_id LIMIT $2",
            )
            .bind(Lookup::message_id_forms(bare).to_vec())
            .bind(MAX_TRACES)
            .fetch_all(pool)
            .await
        }
    }
}

/// The spans of one trace, at most `MAX_SPANS`, and whether there were more.
async fn spans(pool: &PgPool, trace: &[u8]) -> Result<(Vec<SpanRow>, bool), sqlx::Error> {
    let mut out: Vec<SpanRow> = sqlx::query_as(
        "SELECT trace_id, span_id, parent_span_id, name, service, host, stage, queue_id, \
                message_id, outcome, start_time, end_time, attributes, status_code, status_message \
         FROM pepsi.telemetry_span WHERE trace_id = $1 \
         ORDER BY start_time, end_time, span_id LIMIT $2",
    )
    .bind(trace)
    .bind(MAX_SPANS + 1)
    .fetch_all(pool)
    .await?;
    let truncated = out.len() as i64 > MAX_SPANS;
    out.truncate(MAX_SPANS as usize);
    Ok((out, truncated))
}

/// The journey `lookup` names: its newest trace with the others listed, or None when
/// telemetry holds no span for it.
pub async fn find(pool: &PgPool, lookup: &Lookup) -> Result<Option<Journey>, sqlx::Error> {
    let found = traces(pool, lookup).await?;
    let Some(first) = found.first() else {
        return Ok(None);
    };
    let others = found[1..].iter().map(|t| journey::hex(t)).collect();
    let (rows, truncated) = spans(pool, first).await?;
    Ok(journey::build(first, others, rows, truncated))
}

/// What the answer says when nothing was found, and what to check.
pub fn not_found_text(lookup: &Lookup) -> String {
    format!(
        "no spans for {} in pepsi.telemetry_span: check that the hosts export traces \
         (their telemetry client is configured and running) and that the receiver, \
         pepsi-telemetry, runs and writes to this database; spans arrive in batches, a few \
         seconds after the pass",
        lookup.describe()
    )
}

pub async fn journey(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Journey>> {
    let lookup = journey::lookup(&pairs)
        .map_err(ApiError::bad_request)?
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "no lookup: give one of {} (a queue row id, a Message-ID with or without its \
                 angle brackets, a trace id of 32 hexadecimal digits)",
                journey::PARAMETERS.join(", ")
            ))
        })?;
    let found = find(&state.pool, &lookup).await?;
    found
        .map(Json)
        .ok_or_else(|| ApiError::not_found(not_found_text(&lookup)))
}
