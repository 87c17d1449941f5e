//! The settings layer as the API edits it (`pepsi.settings`, docs/local.md): aliases
//! (`alias` rows of an address), catch-alls (`catchall` rows of `@domain`, reached through
//! the same routes with `@domain` as the address) and local domains (`local_domain` rows of
//! `@domain`). Domains of `[pepsi] LOCAL_DOMAINS` are listed too, marked as coming from the
//! configuration file, and cannot be deleted here. And every setting Pepsi reads
//! (`admin::KNOWN_SETTINGS`) with the semantics of `pepsi-settings` set, unset, list, show
//! and names: the checks of key and value and the lookup are `pepsi_admin::admin`'s.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use pepsi_admin::admin::{self, KNOWN_SETTINGS, MAX_ALIAS_TARGETS};
use pepsi_contract::local::{LOCAL_DOMAIN_SETTING, LocalRecipients};
use pepsi_contract::settings::address_list;
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
    let status = put_status(created);
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
    let status = put_status(created);
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

/// `GET /api/settings[?name=&limit=]`: the stored rows of every known setting, or of those
/// named (`pepsi-settings list --json`).
pub async fn list_settings(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let (wanted, limit) = query::settings_query(&pairs).map_err(ApiError::bad_request)?;
    let names: Vec<&str> = if wanted.is_empty() {
        KNOWN_SETTINGS.iter().map(|k| k.name).collect()
    } else {
        wanted
            .iter()
            .map(|n| admin::known_setting(n).map(|k| k.name))
            .collect::<Result<_, _>>()?
    };
    let rows = admin::list_settings(&state.pool, &names, limit).await?;
    Ok(Json(json!({"settings": rows, "limit": limit})))
}

/// `GET /api/settings/names`: the settings Pepsi reads, with the shape of their rows.
pub async fn setting_names(_who: Principal) -> Json<Value> {
    Json(json!({ "settings": KNOWN_SETTINGS }))
}

/// `GET /api/settings/{address}`: the mailbox and what applies to the address, each value
/// with the row it comes from (`pepsi-settings show --json`).
pub async fn show_address(
    State(state): State<AppState>,
    _who: Principal,
    Path(address): Path<String>,
) -> ApiResult<Json<admin::AddressSettings>> {
    Ok(Json(admin::applied_settings(&state.pool, &address).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingValue {
    /// `true`, a list of addresses, one string of comma-separated addresses, or the
    /// object of a `vacation` setting.
    value: Value,
}

/// The operator's words `admin::setting_value` reads, from a JSON value.
fn words(value: &Value) -> ApiResult<Vec<String>> {
    let bad = || {
        ApiError::bad_request(
            "value: expected true, a list of addresses, a string of comma-separated addresses, or an object (vacation)",
        )
    };
    match value {
        Value::Bool(b) => Ok(vec![b.to_string()]),
        // An automatic reply's object, checked by `admin::setting_value` as the CLI's is.
        Value::Object(_) => Ok(vec![value.to_string()]),
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
            .collect(),
        _ => Err(bad()),
    }
}

/// `PUT /api/settings/{key}/{name}`: `pepsi-settings set` (201 new, 200 replaced).
pub async fn put_setting(
    State(state): State<AppState>,
    who: Principal,
    Path((key, name)): Path<(String, String)>,
    Body(req): Body<SettingValue>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let known = admin::known_setting(&name)?;
    let key = admin::setting_key(known, &key)?;
    let value = admin::setting_value(known, &words(&req.value)?)?;
    let created = admin::put_setting(&state.pool, &who.actor(), &key, known.name, &value).await?;
    let status = put_status(created);
    Ok((
        status,
        Json(json!({"address": key, "name": known.name, "value": value})),
    ))
}

/// `DELETE /api/settings/{key}/{name}`: `pepsi-settings unset`; 404 when there is no row.
pub async fn delete_setting(
    State(state): State<AppState>,
    who: Principal,
    Path((key, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let known = admin::known_setting(&name)?;
    let key = admin::setting_key(known, &key)?;
    admin::delete_setting(&state.pool, &who.actor(), &key, known.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The status of a PUT of a setting: 201 when it made the row, 200 when it replaced one.
fn put_status(created: bool) -> StatusCode {
    if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}
