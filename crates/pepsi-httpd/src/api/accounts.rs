//! Mailbox accounts (`pepsi.mailbox_account`, `pepsi.mailbox_password`): list, create,
//! delete, set a password. Passwords are hashed here (Argon2id, on the blocking pool) and
//! only the hash is stored; the writes and their event_log rows are
//! `pepsi_admin::admin`'s.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use pepsi_admin::{admin, password};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Body, Pairs, Principal};
use crate::query;

/// The shortest password accepted for a mailbox.
const MIN_PASSWORD_LEN: usize = 8;

async fn hash(pw: String) -> ApiResult<String> {
    if pw.len() < MIN_PASSWORD_LEN || pw.len() > password::MAX_PASSWORD_LEN {
        return Err(ApiError::bad_request(format!(
            "password: {MIN_PASSWORD_LEN} to {} bytes",
            password::MAX_PASSWORD_LEN
        )));
    }
    tokio::task::spawn_blocking(move || password::hash_password(pw.as_bytes()))
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)
}

pub async fn list(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let (search, limit) = query::accounts_query(&pairs).map_err(ApiError::bad_request)?;
    let rows = admin::list_accounts(&state.pool, search.as_deref(), limit).await?;
    Ok(Json(json!({"accounts": rows, "limit": limit})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Create {
    address: String,
    /// Without one the mailbox receives mail but cannot log in.
    password: Option<String>,
    #[serde(default = "yes")]
    enabled: bool,
}

fn yes() -> bool {
    true
}

pub async fn create(
    State(state): State<AppState>,
    who: Principal,
    Body(req): Body<Create>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let address = admin::address(&req.address, "address")?;
    let hashed = match req.password {
        Some(pw) => Some(hash(pw).await?),
        None => None,
    };
    admin::create_account(
        &state.pool,
        &who.actor(),
        &address,
        hashed.as_deref(),
        req.enabled,
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"address": address, "enabled": req.enabled, "has_password": hashed.is_some()})),
    ))
}

pub async fn delete(
    State(state): State<AppState>,
    who: Principal,
    Path(address): Path<String>,
) -> ApiResult<StatusCode> {
    let address = admin::address(&address, "address")?;
    admin::delete_account(&state.pool, &who.actor(), &address).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetPassword {
    password: String,
}

pub async fn set_password(
    State(state): State<AppState>,
    who: Principal,
    Path(address): Path<String>,
    Body(req): Body<SetPassword>,
) -> ApiResult<StatusCode> {
    let address = admin::address(&address, "address")?;
    let hashed = hash(req.password).await?;
    admin::set_account_password(&state.pool, &who.actor(), &address, &hashed).await?;
    Ok(StatusCode::NO_CONTENT)
}
