//! Logging in and out. A login checks the Argon2id hash (on the blocking pool; an unknown
//! name costs the same as a wrong password), counts failures per client address and per
//! name (429 once either reaches its limit), and on success stores the digest of a fresh
//! secret as a session row and sets the secret as an HttpOnly, SameSite=Strict cookie. The
//! answer carries the CSRF token the client sends back on every mutating request.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pepsi_common::password;
use serde::Deserialize;
use serde_json::json;

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Body, ClientAddr, Principal, Via, now};
use crate::throttle::address_key;
use crate::{credentials, store};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Login {
    name: String,
    password: String,
}

fn cookie(state: &AppState, value: &str, max_age: u64) -> Result<HeaderValue, ApiError> {
    let secure = if state.settings.secure_cookie {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}",
        credentials::COOKIE
    ))
    .map_err(ApiError::internal)
}

pub async fn login(
    State(state): State<AppState>,
    client: ClientAddr,
    Body(req): Body<Login>,
) -> ApiResult<Response> {
    if req.name.len() > 64 || req.password.len() > password::MAX_PASSWORD_LEN {
        return Err(ApiError::bad_request(
            "name (64) or password (1024 bytes) is longer than allowed",
        ));
    }
    let addr = address_key(client.ip());
    let name = req.name.trim().to_owned();
    {
        let t = state.throttle.lock().unwrap_or_else(|e| e.into_inner());
        let wait = [
            t.by_address.blocked(&addr, now()),
            t.by_account.blocked(&name, now()),
        ]
        .into_iter()
        .flatten()
        .max();
        if let Some(wait) = wait {
            return Err(ApiError::throttled(wait.as_secs().max(1)));
        }
    }
    let hash = if credentials::valid_admin_name(&name) {
        store::admin_hash(&state.pool, &name).await?
    } else {
        None
    };
    let known = hash.is_some();
    let hash = hash.unwrap_or_else(|| password::dummy_hash().to_owned());
    let pw = req.password.into_bytes();
    let ok = tokio::task::spawn_blocking(move || password::check_hash(&hash, &pw))
        .await
        .unwrap_or(false)
        && known;
    let actor = crate::extract::actor_named(&name);
    if !ok {
        {
            let mut t = state.throttle.lock().unwrap_or_else(|e| e.into_inner());
            t.by_address.fail(&addr, now());
            t.by_account.fail(&name, now());
        }
        let why = if known {
            "wrong password"
        } else {
            "unknown or disabled administrator"
        };
        store::login_failed(&state.pool, &actor, &name, client.ip(), why).await?;
        tracing::info!(name = name.as_str(), client = %client.ip(), "login refused");
        return Err(ApiError::unauthorized("wrong name or password"));
    }
    state
        .throttle
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .by_account
        .clear(&name);
    let secret = credentials::new_secret();
    store::create_session(
        &state.pool,
        &actor,
        &credentials::digest(&secret),
        &name,
        client.ip(),
    )
    .await?;
    let max_age = state.settings.session_max_age.as_secs();
    let body = json!({
        "name": name,
        "csrf_token": credentials::csrf_token(&secret),
        "idle_timeout_seconds": state.settings.session_idle.as_secs(),
        "max_age_seconds": max_age,
    });
    let mut r = (StatusCode::OK, Json(body)).into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, cookie(&state, &secret, max_age)?);
    Ok(r)
}

pub async fn logout(State(state): State<AppState>, who: Principal) -> ApiResult<Response> {
    let Via::Session { secret } = &who.via else {
        return Err(ApiError::bad_request(
            "logout ends a browser session; an API token is revoked by deleting its row",
        ));
    };
    store::delete_session(&state.pool, &who.actor(), &credentials::digest(secret)).await?;
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, cookie(&state, "", 0)?);
    Ok(r)
}

pub async fn whoami(who: Principal) -> Json<serde_json::Value> {
    let (via, csrf) = match &who.via {
        Via::Session { secret } => ("session", Some(credentials::csrf_token(secret))),
        Via::Token { .. } => ("token", None),
    };
    Json(json!({"name": who.name, "via": via, "csrf_token": csrf}))
}
