//! The HTTP application: every route (the JSON API under /api/, the pages, /metrics), the
//! fallbacks and the request time limit. What the routes share (state, authentication, body
//! and query extractors) is `crate::extract`.

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

use crate::error::ApiError;
use crate::extract::AppState;
use crate::{api, metrics, pages};

/// Bounds every request's time: one not answered within REQUEST_TIMEOUT gets 503.
async fn time_limit(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    match tokio::time::timeout(state.options.request_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the request took longer than REQUEST_TIMEOUT",
        )
        .into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route (docs/api.md lists them)")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route does not take that method (docs/api.md)",
    )
}

/// Our MTA-STS policy (RFC 8461 §3.3), for whichever `mta-sts.<domain>` the request
/// names: every domain of this server has the same MX hosts. 404 when none is configured.
async fn mta_sts_policy(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    match &state.options.mta_sts {
        Some(policy) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; charset=utf-8",
            )],
            policy.to_text(),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; charset=utf-8",
            )],
            "no MTA-STS policy is configured ([pepsi-httpd] MTA_STS_MODE)\n",
        )
            .into_response(),
    }
}

async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({"status": "ok"}))
}

/// Every route.
pub fn router(state: AppState) -> Router {
    let max_body = state.options.max_body;
    Router::new()
        .route("/healthz", get(healthz))
        .route("/.well-known/mta-sts.txt", get(mta_sts_policy))
        .route("/tlsrpt", post(crate::tlsrpt::upload))
        .route("/metrics", get(metrics::metrics))
        .route("/api/login", post(api::session::login))
        .route("/api/logout", post(api::session::logout))
        .route("/api/session", get(api::session::whoami))
        .route("/api/queue", get(api::queue::list))
        .route("/api/queue/bulk/{action}", post(api::queue::bulk))
        .route("/api/queue/{id}", get(api::queue::show))
        .route("/api/queue/{id}/{action}", post(api::queue::act))
        .route(
            "/api/accounts",
            get(api::accounts::list).post(api::accounts::create),
        )
        .route(
            "/api/accounts/{address}",
            axum::routing::delete(api::accounts::delete),
        )
        .route(
            "/api/accounts/{address}/password",
            put(api::accounts::set_password),
        )
        .route("/api/aliases", get(api::settings::list_aliases))
        .route(
            "/api/aliases/{address}",
            put(api::settings::put_alias).delete(api::settings::delete_alias),
        )
        .route("/api/domains", get(api::settings::list_domains))
        .route(
            "/api/domains/{domain}",
            put(api::settings::put_domain).delete(api::settings::delete_domain),
        )
        .route("/api/settings", get(api::settings::list_settings))
        .route("/api/settings/names", get(api::settings::setting_names))
        .route("/api/settings/{address}", get(api::settings::show_address))
        .route(
            "/api/settings/{key}/{name}",
            put(api::settings::put_setting).delete(api::settings::delete_setting),
        )
        .route(
            "/api/config/overrides",
            get(api::config::list)
                .put(api::config::set)
                .delete(api::config::unset),
        )
        .route("/api/config/effective", get(api::config::effective_values))
        .route("/api/mail-log", get(api::logs::mail_log))
        .route("/api/events", get(api::logs::events))
        .route("/api/pipeline", get(api::pipeline::pipeline))
        .route("/api/journey", get(api::journey::journey))
        .route("/api/setup", get(api::setup::status))
        .route("/api/setup/admin", post(api::setup::first_admin))
        .route("/api/setup/dns-check", get(api::setup::dns_check))
        .route(
            "/api/setup/tasks",
            get(api::setup::list).post(api::setup::submit),
        )
        .route("/setup", get(crate::setup_page::setup_page))
        .route("/", get(pages::root))
        .route("/login", get(pages::login_page))
        .route("/pipeline", get(pages::pipeline_page))
        .route("/pipeline/graph", get(pages::graph_fragment))
        .route("/journey", get(crate::journey_page::journey_page))
        .route("/ui/{name}", get(pages::asset))
        .merge(api::lists::routes())
        .merge(api::archive::routes())
        .merge(api::secure_links::routes())
        .merge(api::secretary::routes())
        .merge(crate::moderate::routes())
        .merge(crate::lists::routes(&state))
        .merge(crate::archive::routes(&state))
        .merge(crate::secure::routes(&state))
        .merge(crate::secretary::routes(&state))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(state.clone(), time_limit))
        .with_state(state)
}
