//! Logging in and out. A login counts itself per client address and per name (from the
//! client's network: `throttle::account_key`) before anything else (429 once either has
//! reached its limit; a login that succeeds gives its count back, so failures are what is
//! left), then waits for one of LOGIN_CONCURRENCY turns (503 past LOGIN_QUEUE_TIMEOUT,
//! uncounted) and checks the Argon2id hash on the blocking pool (an unknown name costs the
//! same as a wrong password), and on success stores the digest of a fresh secret as a
//! session row and sets the secret as an HttpOnly, SameSite=Strict cookie. The answer
//! carries the CSRF token the client sends back on every mutating request.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pepsi_admin::password;
use serde::Deserialize;
use serde_json::json;

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Body, ClientAddr, Principal, Via, now};
use crate::throttle::{Reservation, account_key, address_key};
use crate::{credentials, store};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Login {
    name: String,
    password: String,
}

/// The attempt a login counted before checking its password.
struct Reserved {
    address: Reservation,
    account: Reservation,
}

fn cookie(state: &AppState, value: &str, max_age: u64) -> Result<HeaderValue, ApiError> {
    let secure = if state.options.secure_cookie {
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
    let account = account_key(&name, client.ip());
    // The attempt is counted before its password is checked, under the same lock as the
    // check of the limits: concurrent attempts cannot all pass it (security review #7).
    let reserved = {
        let mut t = state.throttle.lock().unwrap_or_else(|e| e.into_inner());
        let wait = [
            t.by_address.blocked(&addr, now()),
            t.by_account.blocked(&account, now()),
        ]
        .into_iter()
        .flatten()
        .max();
        if let Some(wait) = wait {
            return Err(ApiError::throttled(wait.as_secs().max(1)));
        }
        Reserved {
            address: t.by_address.reserve(&addr, now()),
            account: t.by_account.reserve(&account, now()),
        }
    };
    let give_back = |state: &AppState, r: Reserved| {
        let mut t = state.throttle.lock().unwrap_or_else(|e| e.into_inner());
        t.by_address.release(&addr, r.address);
        t.by_account.release(&account, r.account);
    };
    // At most LOGIN_CONCURRENCY Argon2id checks run at once; a login that cannot get a turn
    // within LOGIN_QUEUE_TIMEOUT is answered 503, not checked, and not counted.
    let slot = match tokio::time::timeout(
        state.options.login_queue_timeout,
        state.login_slots.clone().acquire_owned(),
    )
    .await
    {
        Ok(Ok(permit)) => permit,
        Ok(Err(e)) => {
            give_back(&state, reserved);
            return Err(ApiError::internal(format!("the login semaphore: {e}")));
        }
        Err(_) => {
            give_back(&state, reserved);
            tracing::warn!(client = %client.ip(), "login refused: LOGIN_CONCURRENCY checks busy for LOGIN_QUEUE_TIMEOUT");
            return Err(ApiError::busy(
                "too many logins are being checked at once: try again in a moment",
                1,
            ));
        }
    };
    let hash = if credentials::valid_admin_name(&name) {
        match store::admin_hash(&state.pool, &name).await {
            Ok(h) => h,
            Err(e) => {
                give_back(&state, reserved);
                return Err(e.into());
            }
        }
    } else {
        None
    };
    let known = hash.is_some();
    let hash = hash.unwrap_or_else(|| password::dummy_hash().to_owned());
    let pw = req.password.into_bytes();
    // The permit goes with the check: a client that hangs up does not free its slot before
    // the hashing it started has ended.
    let ok = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        password::check_hash(&hash, &pw)
    })
    .await
    .unwrap_or(false)
        && known;
    let actor = crate::extract::actor_named(&name);
    if !ok {
        let why = if known {
            "wrong password"
        } else {
            "unknown or disabled administrator"
        };
        store::login_failed(&state.pool, &actor, &name, client.ip(), why).await?;
        tracing::info!(name = name.as_str(), client = %client.ip(), "login refused");
        return Err(ApiError::unauthorized("wrong name or password"));
    }
    give_back(&state, reserved);
    state
        .throttle
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .by_account
        .clear(&account);
    let (secret, set_cookie) = start_session(&state, &actor, &name, client.ip()).await?;
    let body = json!({
        "name": name,
        "csrf_token": credentials::csrf_token(&secret),
        "idle_timeout_seconds": state.options.session_idle.as_secs(),
        "max_age_seconds": state.options.session_max_age.as_secs(),
    });
    let mut r = (StatusCode::OK, Json(body)).into_response();
    r.headers_mut().insert(header::SET_COOKIE, set_cookie);
    Ok(r)
}

/// A new session for administrator `name`: its row, its secret and the `Set-Cookie` value
/// that hands the secret to the browser. The login and the setup's first administrator.
pub(crate) async fn start_session(
    state: &AppState,
    actor: &pepsi_contract::audit::Actor,
    name: &str,
    ip: std::net::IpAddr,
) -> ApiResult<(String, HeaderValue)> {
    let secret = credentials::new_secret();
    store::create_session(&state.pool, actor, &credentials::digest(&secret), name, ip).await?;
    let set_cookie = cookie(state, &secret, state.options.session_max_age.as_secs())?;
    Ok((secret, set_cookie))
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
