//! What every route takes: the shared state and the extractors —
//! who is asking (`Principal`: a live session, or an API token), the JSON body (`Body`,
//! bounded by MAX_BODY_SIZE, fields checked by serde) and the query string (`Pairs`).
//!
//! Authentication: `Authorization: Bearer pepsi_<id>_<secret>` (an API token), else the
//! `pepsi_session` cookie. A cookie-authenticated request that changes something (any
//! method but GET and HEAD) must carry the session's CSRF token in `X-CSRF-Token` (403
//! without it); a bearer token is not sent by a browser on its own, so it needs none.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{FromRef, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, header};
use pepsi_conf::config::{Config, ProgramCheck};
use pepsi_contract::audit::Actor;
use pepsi_contract::stage::edges::StageEdges;
use serde::de::DeserializeOwned;
use sqlx::PgPool;

use crate::credentials;
use crate::error::ApiError;
use crate::options::HttpdOptions;
use crate::store;
use crate::throttle::Throttle;

/// The program name recorded in the event log.
pub const PROGRAM: &str = "pepsi-httpd";

/// What every request can reach.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub cfg: Arc<Config>,
    pub options: Arc<HttpdOptions>,
    pub throttle: Arc<Mutex<Throttles>>,
    /// LOGIN_CONCURRENCY permits: a password check holds one while it runs.
    pub login_slots: Arc<tokio::sync::Semaphore>,
    /// The last /metrics rendering served without a credential and when it was built
    /// (METRICS_CACHE); the lock also makes such scrapes build one at a time.
    pub metrics_cache: Arc<tokio::sync::Mutex<Option<(Instant, String)>>>,
    /// Earlier readings of the stage counters, for the pipeline's throughput.
    pub samples: Arc<Mutex<crate::pipeline::Samples>>,
    /// The last reading of the stages' pass times (`latency::REFRESH`); the lock also makes
    /// the readings one at a time.
    pub latency: Arc<tokio::sync::Mutex<crate::latency::Cache>>,
    /// Every program's configuration parser (the root package's `pepsi::checks`), which an
    /// override must pass before it is stored.
    pub checks: &'static [ProgramCheck],
    /// Every stage program's declaration of its edges (the root package's
    /// `pepsi::programs::STAGE_EDGES`), which the pipeline graph is drawn from and an
    /// override's effect on the stage graph is judged by.
    pub stage_edges: &'static [StageEdges],
    /// The pool of `CONFIG_DATABASE_URL` (the pepsi-config role), the only one that writes
    /// `pepsi.config_override`; `None` when the option is not set.
    pub config_pool: Option<PgPool>,
}

/// Failed-login counters per client address and per account.
pub struct Throttles {
    pub by_address: Throttle,
    pub by_account: Throttle,
}

impl Throttles {
    pub fn new(s: &HttpdOptions) -> Self {
        Self {
            by_address: Throttle::new(s.login_window, s.login_max_per_address, 100_000),
            by_account: Throttle::new(s.login_window, s.login_max_per_account, 100_000),
        }
    }
}

impl FromRef<AppState> for PgPool {
    fn from_ref(s: &AppState) -> PgPool {
        s.pool.clone()
    }
}

/// The client's address, set by the accept loop on every request: the TCP peer, or behind
/// a trusted proxy the address it forwarded (`client_ip`).
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

/// The client a request is from: `peer` itself, unless `peer` is inside `trusted` (a
/// reverse proxy, TRUSTED_PROXIES): then the last hop of the `X-Forwarded-For` values
/// (`forwarded`, header lines in order) that is not itself a trusted proxy. Hops are read
/// from the right, where each proxy appends the address it saw, so whatever a client put
/// in the header itself is never reached; a hop that is not an address ends the walk at
/// the hop before it (the proxy's own view), and no header means the peer.
pub fn client_ip<'h>(
    peer: IpAddr,
    forwarded: impl Iterator<Item = &'h str>,
    trusted: &[ipnet::IpNet],
) -> IpAddr {
    let is_trusted = |ip: IpAddr| crate::options::any_contains(trusted, ip);
    if !is_trusted(peer) {
        return peer;
    }
    let hops: Vec<&str> = forwarded.flat_map(|v| v.split(',')).collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Some(ip) = parse_hop(hop.trim()) else {
            return client;
        };
        client = ip;
        if !is_trusted(ip) {
            return ip;
        }
    }
    client
}

/// One `X-Forwarded-For` hop: an address, maybe with a port (`192.0.2.1:443`,
/// `[2001:db8::1]:443`); IPv4-mapped IPv6 as IPv4.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let ip = hop
        .parse::<IpAddr>()
        .ok()
        .or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip()))?;
    Some(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    })
}

impl ClientAddr {
    pub fn ip(&self) -> IpAddr {
        self.0.ip()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<ClientAddr>()
            .copied()
            .ok_or_else(|| ApiError::internal("a request without its client address"))
    }
}

/// How a request authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// The session cookie; the secret is kept for logout and the CSRF token.
    Session { secret: String },
    /// An API token (its public id).
    Token { id: String },
}

/// The administrator a request acts for.
#[derive(Debug, Clone)]
pub struct Principal {
    pub name: String,
    pub via: Via,
}

impl Principal {
    /// The event log's actor: the administrator, through pepsi-httpd.
    pub fn actor(&self) -> Actor {
        actor_named(&self.name)
    }
}

/// The event log's actor for administrator `name` acting through pepsi-httpd.
pub fn actor_named(name: &str) -> Actor {
    Actor {
        program: PROGRAM.into(),
        principal: Some(name.to_owned()),
        os_user: None,
        os_uid: None,
    }
}

/// Who is asking, or why nobody: `Ok(None)` when no credential was presented.
pub async fn authenticate(parts: &Parts, state: &AppState) -> Result<Option<Principal>, ApiError> {
    if let Some(auth) = parts.headers.get(header::AUTHORIZATION) {
        let text = auth.to_str().unwrap_or_default();
        let token = text
            .strip_prefix("Bearer ")
            .ok_or_else(|| ApiError::unauthorized("Authorization must be `Bearer <token>`"))?;
        let (id, secret) = credentials::parse_token(token.trim()).ok_or_else(|| {
            ApiError::unauthorized("the bearer token is not a pepsi-httpd API token")
        })?;
        let name = store::check_token(&state.pool, id, &credentials::digest(secret))
            .await?
            .ok_or_else(|| {
                ApiError::unauthorized("the API token is unknown, expired or revoked")
            })?;
        return Ok(Some(Principal {
            name,
            via: Via::Token { id: id.to_owned() },
        }));
    }
    let cookies: Vec<&str> = parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let present = cookies
        .iter()
        .any(|c| c.contains(&format!("{}=", credentials::COOKIE)));
    let Some(secret) = cookies
        .iter()
        .find_map(|c| credentials::session_from_cookie_header(c))
    else {
        return if present {
            Err(ApiError::unauthorized(
                "the session cookie is malformed: log in again",
            ))
        } else {
            Ok(None)
        };
    };
    let s = &state.options;
    let name = store::touch_session(
        &state.pool,
        &credentials::digest(secret),
        s.session_idle,
        s.session_max_age,
    )
    .await?
    .ok_or_else(|| ApiError::unauthorized("the session has expired or is unknown: log in again"))?;
    Ok(Some(Principal {
        name,
        via: Via::Session {
            secret: secret.to_owned(),
        },
    }))
}

/// A cookie-authenticated request that may change something must carry the CSRF token.
fn check_csrf(parts: &Parts, principal: &Principal) -> Result<(), ApiError> {
    let Via::Session { secret } = &principal.via else {
        return Ok(());
    };
    if matches!(parts.method, Method::GET | Method::HEAD) {
        return Ok(());
    }
    let sent = parts
        .headers
        .get(credentials::CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if credentials::same(sent.as_bytes(), credentials::csrf_token(secret).as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "missing or wrong X-CSRF-Token: a request authenticated by the session cookie must carry the csrf_token that login returned",
        ))
    }
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let principal = authenticate(parts, state).await?.ok_or_else(|| {
            ApiError::unauthorized(
                "authentication required: log in (POST /api/login) or send Authorization: Bearer <token>",
            )
        })?;
        check_csrf(parts, &principal)?;
        Ok(principal)
    }
}

/// A JSON request body of type `T`: at most MAX_BODY_SIZE (413), `application/json` when
/// not empty (415), unknown or missing fields refused by `T`'s serde derive (400). An empty
/// body reads as `{}`.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let json_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .eq_ignore_ascii_case("application/json")
            });
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the request body is larger than MAX_BODY_SIZE",
                ),
                status => ApiError::new(status, format!("cannot read the request body: {e}")),
            })?;
        let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            if json_type != Some(true) {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "the request body must be JSON with Content-Type: application/json",
                ));
            }
            &bytes
        };
        serde_json::from_slice(bytes)
            .map(Body)
            .map_err(|e| ApiError::bad_request(format!("bad request body: {e}")))
    }
}

/// The query string as (name, value) pairs, percent-decoded; a parameter given twice is
/// refused.
pub struct Pairs(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for Pairs {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let q = parts.uri.query().unwrap_or_default();
        let pairs: Vec<(String, String)> = serde_urlencoded_pairs(q)
            .map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
        for (i, (k, _)) in pairs.iter().enumerate() {
            if pairs[..i].iter().any(|(j, _)| j == k) {
                return Err(ApiError::bad_request(format!(
                    "parameter {k:?} is given more than once"
                )));
            }
        }
        if pairs.len() > 32 {
            return Err(ApiError::bad_request("more than 32 query parameters"));
        }
        Ok(Pairs(pairs))
    }
}

fn serde_urlencoded_pairs(q: &str) -> Result<Vec<(String, String)>, String> {
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(
        &format!("/?{q}").parse().map_err(|e| format!("{e}"))?,
    )
    .map(|axum::extract::Query(v)| v)
    .map_err(|e| e.body_text())
}

/// The clock the throttles run on.
pub fn now() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_behind_a_trusted_proxy_is_the_last_untrusted_forwarded_hop() {
        let trusted: Vec<ipnet::IpNet> = ["127.0.0.1", "10.0.0.0/8"]
            .iter()
            .map(|c| crate::options::parse_block(c).unwrap())
            .collect();
        // (peer, X-Forwarded-For lines, the client)
        let cases: [(&str, &[&str], &str); 10] = [
            ("192.0.2.1", &["203.0.113.9"], "192.0.2.1"),
            ("127.0.0.1", &[], "127.0.0.1"),
            ("127.0.0.1", &["203.0.113.9"], "203.0.113.9"),
            ("127.0.0.1", &["1.1.1.1, 203.0.113.9"], "203.0.113.9"),
            ("127.0.0.1", &["203.0.113.9, 10.1.2.3"], "203.0.113.9"),
            (
                "127.0.0.1",
                &["198.51.100.1", "203.0.113.9, 10.1.2.3"],
                "203.0.113.9",
            ),
            ("127.0.0.1", &["10.0.0.5, 10.1.2.3"], "10.0.0.5"),
            ("127.0.0.1", &["spoofed, 203.0.113.9:5000"], "203.0.113.9"),
            ("127.0.0.1", &["203.0.113.9, unknown"], "127.0.0.1"),
            (
                "127.0.0.1",
                &["[2001:db8::7]:443, ::ffff:10.0.0.1"],
                "2001:db8::7",
            ),
        ];
        for (peer, lines, want) in cases {
            let got = client_ip(peer.parse().unwrap(), lines.iter().copied(), &trusted);
            assert_eq!(got, want.parse::<IpAddr>().unwrap(), "{peer} {lines:?}");
        }
    }
}
