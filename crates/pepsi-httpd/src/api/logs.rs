//! The two logs, read only: the mail log (what became of each message, `pepsi.mail_log`)
//! and the audit log (`pepsi.event_log`), newest first.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Pairs, Principal};
use crate::query;

pub async fn mail_log(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let (search, limit) = query::mail_log_search(&pairs).map_err(ApiError::bad_request)?;
    let rows = pepsi_contract::mail_log::search(&state.pool, &search, limit).await?;
    Ok(Json(json!({"entries": rows, "limit": limit})))
}

pub async fn events(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let (action, row, limit) = query::events_query(&pairs).map_err(ApiError::bad_request)?;
    let rows = sqlx::query(
        "SELECT event_id, at, actor, action, workqueue_id, detail FROM pepsi.event_log \
         WHERE ($1::text IS NULL OR action = $1) AND ($3::int8 IS NULL OR workqueue_id = $3) \
         ORDER BY event_id DESC LIMIT $2",
    )
    .bind(action.as_deref())
    .bind(limit)
    .bind(row)
    .fetch_all(&state.pool)
    .await?;
    let events = rows
        .iter()
        .map(|r| {
            Ok(json!({
                "event_id": r.try_get::<i64, _>("event_id")?,
                "at": r.try_get::<chrono::DateTime<chrono::Utc>, _>("at")?,
                "actor": r.try_get::<String, _>("actor")?,
                "action": r.try_get::<String, _>("action")?,
                "workqueue_id": r.try_get::<Option<i64>, _>("workqueue_id")?,
                "detail": r.try_get::<Value, _>("detail")?,
            }))
        })
        .collect::<Result<Vec<Value>, sqlx::Error>>()?;
    Ok(Json(json!({"events": events, "limit": limit})))
}
