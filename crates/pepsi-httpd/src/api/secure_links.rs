//! Secure links (docs/api.md, "Secure links"; docs/secure-link.md, "The admin API"): the
//! links, one with its access log, revoke and extend. Input is checked and the changes are
//! made by `pepsi_secure_link::admin`, as the operator tool `pepsi-secure-link` makes them:
//! one transaction each, with its access-log line and its `event_log` row, the administrator
//! as actor. Nothing here can read a message: the key's other half is only in the
//! recipient's link.
//!
//! Status codes: 400 for input that is not valid (the message names it), 404 for a link that
//! is not there, 409 for one revoked or purged already.

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use pepsi_secure_link::admin::{self, Detail, Filter, Link, Listing};
use pepsi_secure_link::store::{Error, Refusal};
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Body, Pairs, Principal};

/// The routes of the secure-link API.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/secure-links", get(list))
        .route("/api/secure-links/{link_id}", get(show))
        .route("/api/secure-links/{link_id}/revoke", post(revoke))
        .route("/api/secure-links/{link_id}/extend", post(extend))
}

fn link_id(text: &str) -> ApiResult<String> {
    admin::link_id(text)
        .map(str::to_owned)
        .map_err(ApiError::bad_request)
}

/// `e` as the API answers it.
async fn refused(state: &AppState, link_id: &str, e: Error) -> ApiError {
    match e {
        Error::Refused(Refusal::Unknown) => ApiError::not_found(format!("no link {link_id}")),
        Error::Refused(r) => ApiError::conflict(admin::why(&state.pool, link_id, r).await),
        Error::Invalid(m) => ApiError::bad_request(m),
        Error::Db(e) => e.into(),
        other => ApiError::internal(other),
    }
}

async fn list(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Listing>> {
    let filter = Filter::from_pairs(&pairs).map_err(ApiError::bad_request)?;
    let links = admin::list(&state.pool, &filter)
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(Listing {
        links,
        limit: filter.limit,
    }))
}

async fn show(
    State(state): State<AppState>,
    _who: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Detail>> {
    let id = link_id(&id)?;
    match admin::detail(&state.pool, &id).await {
        Ok(d) => Ok(Json(d)),
        Err(e) => Err(refused(&state, &id, e).await),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Revoke {
    /// Who revoked it, as the access log records it; the administrator's name by default.
    by: Option<String>,
}

async fn revoke(
    State(state): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<Revoke>,
) -> ApiResult<Json<Link>> {
    let id = link_id(&id)?;
    let by = match req.by.as_deref().map(str::trim) {
        None => who.name.clone(),
        Some(b) if !b.is_empty() && b.len() <= 320 && !b.chars().any(char::is_control) => {
            b.to_owned()
        }
        Some(b) => {
            return Err(ApiError::bad_request(format!(
                "by {b:?} is not a name: 1 to 320 bytes, no control characters"
            )));
        }
    };
    let mut tx = state.pool.begin().await?;
    if let Err(e) = admin::revoke(&mut tx, &who.actor(), &id, &by).await {
        drop(tx);
        return Err(refused(&state, &id, e).await);
    }
    tx.commit().await?;
    changed(&state, &id).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Extend {
    /// The new expiry, RFC 3339.
    until: Option<String>,
    /// Or the new expiry in days from now.
    days: Option<i64>,
}

async fn extend(
    State(state): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<Extend>,
) -> ApiResult<Json<Link>> {
    let id = link_id(&id)?;
    let until = admin::until(req.until.as_deref(), req.days, chrono::Utc::now())
        .map_err(ApiError::bad_request)?;
    let mut tx = state.pool.begin().await?;
    if let Err(e) = admin::extend(&mut tx, &who.actor(), &id, until).await {
        drop(tx);
        return Err(refused(&state, &id, e).await);
    }
    tx.commit().await?;
    changed(&state, &id).await
}

/// The link as a change left it.
async fn changed(state: &AppState, link_id: &str) -> ApiResult<Json<Link>> {
    match admin::get(&state.pool, link_id).await {
        Ok(l) => Ok(Json(l)),
        Err(e) => Err(refused(state, link_id, e).await),
    }
}
