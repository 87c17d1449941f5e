//! The configuration's database overrides (`pepsi.config_override`), with the semantics of
//! `pepsi-config` (docs/config.md): the stored rows, the effective values of a program with
//! where each comes from (a `secrets.d/` value never shown), and set / unset, set checked
//! first by every program's own parser and the stage graph's rules
//! (`pepsi_stage_validate::check_override` over `AppState::checks` and `stage_edges`).
//!
//! Reads use the httpd pool (SELECT on the table); writes use the pool of
//! `CONFIG_DATABASE_URL` alone, since only the pepsi-config role may write the table, and
//! answer 409 without it. The input's checks and the writes with their event_log rows are
//! `pepsi_admin::admin`'s, the same code pepsi-config runs.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use pepsi_admin::admin;
use pepsi_conf::config::{Config, OverrideRow, Scope, program_check, shown_values};
use pepsi_contract::overlay::load_overrides;
use pepsi_stage_validate::{Tables, check_override};
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Body, Pairs, Principal};
use crate::query;

fn scope_of(text: Option<&str>) -> ApiResult<Scope> {
    Ok(admin::override_scope(text.unwrap_or("global"))?)
}

/// The file configuration with the stored overrides that apply to `scope` on top: what a
/// program working for `scope` reads.
async fn effective(state: &AppState, scope: &Scope) -> ApiResult<Config> {
    let rows = load_overrides(&state.pool, scope)
        .await
        .map_err(ApiError::internal)?;
    Ok(state.cfg.with_overrides(&rows, scope))
}

/// The pool that may write `pepsi.config_override`.
fn writer(state: &AppState) -> ApiResult<&PgPool> {
    state.config_pool.as_ref().ok_or_else(|| {
        ApiError::conflict(
            "configuration overrides cannot be changed here: [pepsi-httpd] CONFIG_DATABASE_URL \
             (a connection as the pepsi-config database role) is not set (docs/httpd.md)",
        )
    })
}

/// `GET /api/config/overrides[?scope=]`: the stored rows (`pepsi-config overrides --json`).
pub async fn list(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let scope = query::overrides_query(&pairs).map_err(ApiError::bad_request)?;
    let key = match scope {
        Some(text) => Some(scope_of(Some(&text))?.to_db_string()),
        None => None,
    };
    let rows = admin::list_overrides(&state.pool, key.as_deref()).await?;
    Ok(Json(json!({ "overrides": rows })))
}

/// `GET /api/config/effective[?program=&section=&scope=]`: the values as `pepsi-config show
/// --json` gives them, and the named programs whose parser fails on them.
pub async fn effective_values(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let q = query::effective_query(&pairs).map_err(ApiError::bad_request)?;
    let scope = scope_of(q.scope.as_deref())?;
    let programs = q
        .programs
        .iter()
        .map(|name| {
            program_check(state.checks, name)
                .map_err(|e| ApiError::bad_request(format!("program: {e}")))
        })
        .collect::<ApiResult<Vec<_>>>()?;
    let cfg = effective(&state, &scope).await?;
    // The parsers may read files the configuration names: off the async workers.
    let sections = q.sections;
    let shown = tokio::task::spawn_blocking(move || shown_values(&cfg, &programs, &sections))
        .await
        .map_err(ApiError::internal)?;
    let problems: Vec<Value> = shown
        .problems
        .iter()
        .map(|(program, error)| json!({"program": program, "error": error}))
        .collect();
    Ok(Json(json!({
        "scope": scope.to_db_string(),
        "values": shown.values,
        "problems": problems,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Set {
    scope: Option<String>,
    section: String,
    option: String,
    value: String,
    /// Store an option no parser looks up at start (one read later, per message).
    #[serde(default)]
    force: bool,
}

/// `PUT /api/config/overrides`: `pepsi-config set`; 422 for a value a program would refuse
/// or that would leave an edge of the stage graph without its stage.
pub async fn set(
    State(state): State<AppState>,
    who: Principal,
    Body(req): Body<Set>,
) -> ApiResult<Json<Value>> {
    let pool = writer(&state)?.clone();
    let scope = scope_of(req.scope.as_deref())?;
    let (section, option) = admin::override_names(&req.section, &req.option)?;
    admin::override_value(&req.value)?;
    let base = effective(&state, &scope).await?;
    let row = OverrideRow {
        scope: scope.to_db_string(),
        section: section.clone(),
        option: option.clone(),
        value: req.value.clone(),
    };
    let tables = Tables {
        checks: state.checks,
        edges: state.stage_edges,
    };
    let force = req.force;
    let candidate = row.clone();
    let check_scope = scope.clone();
    tokio::task::spawn_blocking(move || {
        check_override(&base, &candidate, &check_scope, &tables, force)
    })
    .await
    .map_err(ApiError::internal)??;
    let previous = admin::put_override(
        &pool,
        &who.actor(),
        &row.scope,
        &section,
        &option,
        &row.value,
    )
    .await?;
    Ok(Json(json!({
        "scope": row.scope,
        "section": section,
        "option": option,
        "value": row.value,
        "previous": previous,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unset {
    scope: Option<String>,
    section: String,
    option: String,
}

/// `DELETE /api/config/overrides`: `pepsi-config unset`; 404 when there is no such row.
pub async fn unset(
    State(state): State<AppState>,
    who: Principal,
    Body(req): Body<Unset>,
) -> ApiResult<StatusCode> {
    let pool = writer(&state)?;
    let scope = scope_of(req.scope.as_deref())?;
    let (section, option) = admin::override_names(&req.section, &req.option)?;
    admin::delete_override(pool, &who.actor(), &scope.to_db_string(), &section, &option).await?;
    Ok(StatusCode::NO_CONTENT)
}
