//! The settings layer as the API edits it (`pepsi.settings`, docs/local.md): aliases
//! (`alias` rows of an address), catch-alls (`catchall` rows of `@domain`, reached through
//! the same routes with `@domain` as the address) and local domains (`local_domain` rows of
//! `@domain`). Domains of `[pepsi] LOCAL_DOMAINS` are listed too, marked as coming from the
//! configuration file, and cannot be deleted here.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use pepsi_common::admin::{self, MAX_ALIAS_TARGETS};
use pepsi_common::local::{LOCAL_DOMAIN_SETTING, LocalRecipients};
use pepsi_common::settings::address_list;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Body, Pairs, Principal};
use crate::query;

/// The settings key and name an alias path segment stands for: an address's `alias`, or a
/// domain's `catchall` (`@domain`).
fn alias_key(text: &str) -> ApiResult<(String, &'static str)> {
    match text.strip_prefix('@') {
        Some(d) => Ok((format!("@{}", admin::domain(d, "domain")?), "catchall")),
        None => Ok((admin::address(text, "address")?, "alias")),
    }
}

pub async fn list_aliases(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let limit = query::limit_only(&pairs).map_err(ApiError::bad_request)?;
    let rows = admin::list_settings(&state.pool, &["alias", "catchall"], limit).await?;
    let aliases: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "address": r.address,
                "kind": r.name,
                "targets": address_list(&r.value).unwrap_or_default(),
                "updated_at": r.updated_at,
            })
        })
        .collect();
    Ok(Json(json!({"aliases": aliases, "limit": limit})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    targets: Vec<String>,
}

pub async fn put_alias(
    State(state): State<AppState>,
    who: Principal,
    Path(address): Path<String>,
    Body(req): Body<Targets>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let (key, name) = alias_key(&address)?;
    if req.targets.is_empty() || req.targets.len() > MAX_ALIAS_TARGETS {
        return Err(ApiError::bad_request(format!(
            "targets: 1 to {MAX_ALIAS_TARGETS} addresses"
        )));
    }
    let mut targets = Vec::with_capacity(req.targets.len());
    for (i, t) in req.targets.iter().enumerate() {
        targets.push(admin::address(t, &format!("targets[{i}]"))?);
    }
    let created =
        admin::put_setting(&state.pool, &who.actor(), &key, name, &json!(targets)).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(json!({"address": key, "kind": name, "targets": targets})),
    ))
}

pub async fn delete_alias(
    State(state): State<AppState>,
    who: Principal,
    Path(address): Path<String>,
) -> ApiResult<StatusCode> {
    let (key, name) = alias_key(&address)?;
    admin::delete_setting(&state.pool, &who.actor(), &key, name).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn list_domains(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let limit = query::limit_only(&pairs).map_err(ApiError::bad_request)?;
    let configured = LocalRecipients::from_config(&state.cfg).map_err(ApiError::internal)?;
    let mut domains: Vec<Value> = configured
        .configured_domains()
        .map(|d| json!({"domain": d, "source": "config"}))
        .collect();
    for r in admin::list_settings(&state.pool, &[LOCAL_DOMAIN_SETTING], limit).await? {
        if r.value == json!(true)
            && let Some(d) = r.address.strip_prefix('@')
            && !configured.is_configured_local(d)
        {
            domains.push(json!({"domain": d, "source": "settings", "updated_at": r.updated_at}));
        }
    }
    Ok(Json(json!({"domains": domains, "limit": limit})))
}

pub async fn put_domain(
    State(state): State<AppState>,
    who: Principal,
    Path(domain): Path<String>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let d = admin::domain(&domain, "domain")?;
    let (key, name) = admin::local_domain_key(&d);
    let created = admin::put_setting(&state.pool, &who.actor(), &key, name, &json!(true)).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(json!({"domain": d, "source": "settings"}))))
}

pub async fn delete_domain(
    State(state): State<AppState>,
    who: Principal,
    Path(domain): Path<String>,
) -> ApiResult<StatusCode> {
    let d = admin::domain(&domain, "domain")?;
    let configured = LocalRecipients::from_config(&state.cfg).map_err(ApiError::internal)?;
    if configured.is_configured_local(&d) {
        return Err(ApiError::conflict(format!(
            "{d} is listed in [pepsi] LOCAL_DOMAINS of the configuration file: remove it there"
        )));
    }
    let (key, name) = admin::local_domain_key(&d);
    admin::delete_setting(&state.pool, &who.actor(), &key, name).await?;
    Ok(StatusCode::NO_CONTENT)
}
