//! The queue: listing with filters, one message, and the operator actions of pepsi-queue —
//! retry, hold, release, delete, bounce — on one row or in bulk by filter. Every action goes
//! through `pepsi_admin::queue::apply` (the same stored functions, one row per transaction
//! with its `event_log` row, the administrator as actor), and the dispatcher is woken once
//! after the changes committed. The JSON shapes are pepsi-queue's `--json` documents.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use pepsi_admin::queue::{self, Action, AdminError, Outcome, json as qjson};
use pepsi_conf::config::Scope;
use pepsi_contract::overlay::DbOverlay;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Body, Pairs, Principal};
use crate::query;

/// The longest `reason` accepted.
const MAX_REASON: usize = 500;

pub async fn list(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let (filter, limit) = query::queue_listing(&pairs).map_err(ApiError::bad_request)?;
    let counts = queue::summary(&state.pool, &filter).await?;
    let rows = queue::list(&state.pool, &filter, limit).await?;
    Ok(Json(qjson::list_json(&counts, &rows, Some(limit))))
}

fn parse_id(text: &str) -> ApiResult<i64> {
    text.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ApiError::bad_request(format!("id: {text:?} is not a queue row id")))
}

pub async fn show(
    State(state): State<AppState>,
    _who: Principal,
    Path(id): Path<String>,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let id = parse_id(&id)?;
    let mut body = false;
    for (k, v) in &pairs {
        match (k.as_str(), v.as_str()) {
            ("body", "yes" | "true" | "1") => body = true,
            ("body", "no" | "false" | "0") => body = false,
            ("body", other) => {
                return Err(ApiError::bad_request(format!(
                    "body: {other:?} is not yes or no"
                )));
            }
            (other, _) => {
                return Err(ApiError::bad_request(format!(
                    "unknown parameter {other:?} (expected: body)"
                )));
            }
        }
    }
    let m = queue::show(&state.pool, id, body)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("there is no queue row {id}")))?;
    Ok(Json(qjson::show_json(&m)))
}

/// The body of an action on one row.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActRequest {
    /// Act on a running row too (only when its worker is gone).
    #[serde(default)]
    force: bool,
    /// hold: why; bounce: the diagnostic the DSN gives the sender.
    reason: Option<String>,
}

/// The body of a bulk action.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkRequest {
    /// The rows: the queue filter's fields (`sender`, `recipient`, `domain`, `stage`,
    /// `status`, `min_age`), at least one.
    filter: BTreeMap<String, String>,
    #[serde(default)]
    force: bool,
    reason: Option<String>,
    /// At most this many rows (oldest first); at most BULK_LIMIT.
    limit: Option<i64>,
}

/// The action named in the path.
fn action_named(name: &str, reason: Option<String>) -> ApiResult<ActionKind> {
    if let Some(r) = &reason
        && (r.chars().count() > MAX_REASON || r.chars().any(char::is_control))
    {
        return Err(ApiError::bad_request(format!(
            "reason: at most {MAX_REASON} characters, no control characters"
        )));
    }
    Ok(match name {
        "retry" => ActionKind::Plain(Action::Retry),
        "hold" => ActionKind::Plain(Action::Hold { reason }),
        "release" => ActionKind::Plain(Action::Release),
        "delete" => ActionKind::Plain(Action::Delete),
        "bounce" => ActionKind::Bounce {
            reason: reason.unwrap_or_else(|| {
                "the message was returned by the mail system administrator".into()
            }),
        },
        other => {
            return Err(ApiError::not_found(format!(
                "no queue action {other:?} (retry, hold, release, delete, bounce)"
            )));
        }
    })
}

enum ActionKind {
    Plain(Action),
    /// Needs each row's stage and its BOUNCE_STAGE.
    Bounce {
        reason: String,
    },
}

/// What happened to one row, and how the API words its error.
fn error_text(e: &AdminError) -> String {
    match e {
        AdminError::NotFound(id) => format!("there is no queue row {id}"),
        AdminError::Running { message, .. } => {
            format!("{message}; not changed (force only a row whose worker is gone)")
        }
        AdminError::Refused { message, .. } => message.clone(),
        AdminError::Database { id, source } => {
            tracing::error!("queue action on row {id}: {source}");
            format!("row {id}: database error (the server log has the cause)")
        }
    }
}

/// Runs `kind` on each of `ids`; returns the results and how many changed and failed.
async fn run(
    state: &AppState,
    who: &Principal,
    ids: &[i64],
    kind: &ActionKind,
    force: bool,
    bulk: bool,
) -> ApiResult<(Vec<Value>, Vec<Result<Outcome, AdminError>>)> {
    let actor = who.actor();
    let cfg = match kind {
        ActionKind::Bounce { .. } => Some(
            state
                .cfg
                .with_db_overlay(&state.pool, &Scope::Global)
                .await
                .map_err(ApiError::internal)?,
        ),
        ActionKind::Plain(_) => None,
    };
    let mut entries = Vec::with_capacity(ids.len());
    let mut outcomes = Vec::with_capacity(ids.len());
    for &id in ids {
        let action = match (kind, &cfg) {
            (ActionKind::Plain(a), _) => Ok(a.clone()),
            (ActionKind::Bounce { reason }, Some(cfg)) => {
                match queue::stage_of(&state.pool, id).await? {
                    None => Err(AdminError::NotFound(id)),
                    Some((stage, _)) => {
                        queue::bounce_target(cfg, id, &stage).map(|bounce_stage| Action::Bounce {
                            stage,
                            bounce_stage,
                            reason: reason.clone(),
                        })
                    }
                }
            }
            (ActionKind::Bounce { .. }, None) => {
                unreachable!("the configuration is read for bounce")
            }
        };
        let result = match action {
            Ok(a) => queue::apply(&state.pool, &actor, id, &a, force).await,
            Err(e) => Err(e),
        };
        let entry = match &result {
            Err(AdminError::Running { .. } | AdminError::NotFound(_)) if bulk => {
                qjson::skipped_json(id)
            }
            r => qjson::result_json(id, r, &r.as_ref().err().map(error_text).unwrap_or_default()),
        };
        entries.push(entry);
        outcomes.push(result);
    }
    if outcomes
        .iter()
        .any(|o| matches!(o, Ok(Outcome::Changed(_))))
    {
        // Committed already; a lost wake-up only delays the claim to the next heartbeat.
        if let Err(e) = queue::notify(&state.pool).await {
            tracing::warn!("cannot wake the dispatcher after a queue action: {e}");
        }
    }
    Ok((entries, outcomes))
}

fn action_name(kind: &ActionKind) -> &'static str {
    match kind {
        ActionKind::Plain(a) => a.name(),
        ActionKind::Bounce { .. } => "queue.bounce",
    }
}

pub async fn act(
    State(state): State<AppState>,
    who: Principal,
    Path((id, action)): Path<(String, String)>,
    Body(req): Body<ActRequest>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let id = parse_id(&id)?;
    let kind = action_named(&action, req.reason)?;
    let (entries, outcomes) = run(&state, &who, &[id], &kind, req.force, false).await?;
    let status = match &outcomes[0] {
        Ok(_) => StatusCode::OK,
        Err(AdminError::NotFound(_)) => StatusCode::NOT_FOUND,
        Err(AdminError::Running { .. } | AdminError::Refused { .. }) => StatusCode::CONFLICT,
        Err(AdminError::Database { .. }) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut doc = json!({
        "action": action_name(&kind),
        "changed": usize::from(matches!(outcomes[0], Ok(Outcome::Changed(_)))),
        "errors": usize::from(outcomes[0].is_err()),
        "results": entries,
    });
    if let Err(e) = &outcomes[0] {
        doc["error"] = json!(error_text(e));
    }
    Ok((status, Json(doc)))
}

pub async fn bulk(
    State(state): State<AppState>,
    who: Principal,
    Path(action): Path<String>,
    Body(req): Body<BulkRequest>,
) -> ApiResult<Json<Value>> {
    let kind = action_named(&action, req.reason)?;
    let pairs: Vec<(String, String)> = req.filter.into_iter().collect();
    let filter =
        query::queue_filter(&pairs).map_err(|e| ApiError::bad_request(format!("filter.{e}")))?;
    if filter.is_empty() {
        return Err(ApiError::bad_request(
            "filter: a bulk action needs at least one condition (sender, recipient, domain, stage, status, min_age)",
        ));
    }
    let max = state.options.bulk_limit;
    let limit = match req.limit {
        None => max,
        Some(n) if (1..=max).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "limit: {n} is not from 1 to {max} (BULK_LIMIT)"
            )));
        }
    };
    let total = queue::summary(&state.pool, &filter)
        .await?
        .iter()
        .map(|c| c.2)
        .sum::<i64>();
    let ids = queue::select_ids(&state.pool, &filter, limit).await?;
    let (entries, outcomes) = run(&state, &who, &ids, &kind, req.force, true).await?;
    let changed = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Outcome::Changed(_))))
        .count();
    let errors = outcomes
        .iter()
        .filter(|o| {
            matches!(
                o,
                Err(AdminError::Refused { .. } | AdminError::Database { .. })
            )
        })
        .count();
    Ok(Json(json!({
        "action": action_name(&kind),
        "matched": total,
        "selected": ids.len(),
        "truncated": (ids.len() as i64) < total,
        "changed": changed,
        "errors": errors,
        "results": entries,
    })))
}
