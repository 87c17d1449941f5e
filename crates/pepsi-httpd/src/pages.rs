//! The HTML of pepsi-httpd, server-rendered with maud: the login page and the live pipeline
//! page (`GET /pipeline`: the stage graph drawn by `svg`, the figures of `GET
//! /api/pipeline`, the stages' pass times), the graph alone for the page to redraw (`GET
//! /pipeline/graph`), and the pages' scripts and style sheet (`/ui/…`, files of `ui/`
//! compiled in: no build chain). The journey page is `journey_page`.
//!
//! The pages act only through the JSON API — login is `POST /api/login`, with its
//! throttling, from `ui/login.js` — so a browser gets no rule the API does not have. A page
//! without a live session answers 401 with the login form in place, which reloads the page
//! once the session exists. Every page is sent with a Content-Security-Policy that lets it
//! run this server's script and nothing inline, and is never cached.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{DOCTYPE, Markup, html};

use crate::api::pipeline::current;
use crate::credentials;
use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Principal, Via, authenticate};

/// How often the pipeline page asks for fresh figures.
pub const REFRESH_MS: u64 = 3000;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The static files of `ui/`: (name, content type, text).
const ASSETS: [(&str, &str, &str); 5] = [
    (
        "pepsi.css",
        "text/css; charset=utf-8",
        include_str!("../ui/pepsi.css"),
    ),
    (
        "login.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/login.js"),
    ),
    (
        "pipeline.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/pipeline.js"),
    ),
    (
        "journey.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/journey.js"),
    ),
    (
        "setup.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/setup.js"),
    ),
];

fn with_headers(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut r = (status, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

pub(crate) fn page(status: StatusCode, markup: Markup) -> Response {
    with_headers(status, "text/html; charset=utf-8", markup.into_string())
}

/// The frame of every page.
pub(crate) fn frame(title: &str, script: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Pepsi" }
                link rel="stylesheet" href="/ui/pepsi.css";
                script src=(format!("/ui/{script}")) defer {}
            }
            body { (content) }
        }
    }
}

pub(crate) fn login_markup(message: Option<&str>) -> Markup {
    frame(
        "Log in",
        "login.js",
        html! {
            main.login {
                h1 { "Pepsi administration" }
                form #login-form {
                    label { "Name" input #login-name name="name" autocomplete="username" required autofocus; }
                    label { "Password" input #login-password name="password" type="password" autocomplete="current-password" required; }
                    button #login-submit type="submit" { "Log in" }
                    p #login-message role="alert" { @if let Some(m) = message { (m) } }
                }
                p.hint { "An administrator is made with " code { "pepsi-httpd admin-add NAME" } "." }
            }
        },
    )
}

/// Who is asking, or why nobody: the page answers with the login form rather than failing.
pub struct Viewer(pub(crate) Result<Option<Principal>, ApiError>);

impl FromRequestParts<AppState> for Viewer {
    type Rejection = Infallible;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Infallible> {
        Ok(Viewer(authenticate(parts, state).await))
    }
}

/// `GET /`: the pipeline page.
pub async fn root() -> Redirect {
    Redirect::to("/pipeline")
}

/// `GET /login`.
pub async fn login_page() -> Response {
    page(StatusCode::OK, login_markup(None))
}

/// `GET /pipeline`: the page, or 401 with the login form.
pub async fn pipeline_page(State(state): State<AppState>, Viewer(who): Viewer) -> Response {
    let who = match who {
        Ok(Some(p)) => p,
        Ok(None) => return page(StatusCode::UNAUTHORIZED, login_markup(None)),
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            return page(StatusCode::UNAUTHORIZED, login_markup(Some(&e.message)));
        }
        Err(e) => return e.into_response(),
    };
    let (graph, doc) = match current(&state).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let csrf = match &who.via {
        Via::Session { secret } => credentials::csrf_token(secret),
        Via::Token { .. } => String::new(),
    };
    let figure = |v: &serde_json::Value| v.as_i64().unwrap_or(0);
    let markup = frame(
        "Pipeline",
        "pipeline.js",
        html! {
            header.bar {
                h1 { "Pepsi pipeline" }
                a href="/journey" { "Journeys" }
                span #updated role="status" { "as of " (doc["generated_at"].as_str().unwrap_or_default()) }
                span.who { "logged in as " b { (who.name) } }
                @if matches!(who.via, Via::Session { .. }) {
                    button #logout type="button" { "Log out" }
                }
            }
            main #pipeline data-csrf=(csrf) data-refresh-ms=(REFRESH_MS) {
                p.summary {
                    "Rows in the queue: " b #total-rows { (figure(&doc["totals"]["rows"])) }
                    " · failed or timed out: " b #failed-rows { (figure(&doc["totals"]["failed_rows"])) }
                    " · “done”, “kills” and “crashes” count since the counters began (the dispatcher's, kept across its restarts); “last min” is what each stage finished in the last "
                    span #window { (figure(&doc["window_seconds"])) } " s (measured over "
                    span #span { (doc["throughput_seconds"].as_f64().unwrap_or(0.0).round()) } " s)."
                }
                ul #problems {
                    @for p in doc["problems"].as_array().into_iter().flatten() {
                        li { (p.as_str().unwrap_or_default()) }
                    }
                }
                div #graph { (crate::svg::render(&graph, &doc)) }
                p.legend {
                    span.key.next { "NEXT_STAGE" } span.key.branch { "branch" } span.key.bounce { "BOUNCE_STAGE" }
                    " Click a stage for its rows, a row for its state and history."
                }
                (latency_table(&doc["latency"]))
                section #rows hidden {
                    h2 { "Stage " span #rows-stage {} " " small #rows-count {} }
                    table #rows-table {
                        thead { tr { th { "id" } th { "status" } th { "sender" } th { "recipients" } th { "age" } th { "attempts" } th { "last error" } th { "journey" } } }
                        tbody {}
                    }
                }
                section #detail hidden {
                    h2 { "Row " span #detail-id {} " " a #detail-journey href="/journey" { "its journey" } }
                    dl #detail-facts {}
                    h3 { "State" }
                    pre #detail-state {}
                    h3 { "Header block" }
                    pre #detail-headers {}
                    h3 { "Event history" }
                    table #detail-events {
                        thead { tr { th { "at" } th { "actor" } th { "action" } th { "detail" } } }
                        tbody {}
                    }
                    h3 { "Mail log" }
                    table #detail-mail-log {
                        thead { tr { th { "at" } th { "stage" } th { "event" } th { "detail" } th { "journey" } } }
                        tbody {}
                    }
                }
            }
        },
    );
    page(StatusCode::OK, markup)
}

/// The stages' pass-time percentiles of the pipeline document's `latency` (`crate::latency`);
/// `ui/pipeline.js` rewrites the body with every poll.
fn latency_table(latency: &serde_json::Value) -> Markup {
    let ms = |v: &serde_json::Value| v.as_f64().map(crate::latency::show_ms).unwrap_or_default();
    let window = crate::latency::show_window(latency["window_seconds"].as_u64().unwrap_or(0));
    let stages = latency["stages"].as_array().cloned().unwrap_or_default();
    html! {
        section #latency {
            h2 { "Pass times " small { "over the last " span #latency-window { (window) } " (LATENCY_WINDOW), from the telemetry spans; interrupted passes counted apart" } }
            p #latency-note role="status" {
                @if let Some(e) = latency["error"].as_str() { (e) }
                @else if stages.is_empty() { "No stage pass in the window: the hosts export no traces, or pepsi-telemetry is not running." }
            }
            table #latency-table {
                thead { tr { th { "stage" } th { "passes" } th { "p50" } th { "p90" } th { "p99" } th { "interrupted" } } }
                tbody {
                    @for s in &stages {
                        tr data-stage=(s["stage"].as_str().unwrap_or_default()) {
                            td { (s["stage"].as_str().unwrap_or_default()) }
                            td { (s["passes"].as_i64().unwrap_or(0)) }
                            td { (ms(&s["p50_ms"])) }
                            td { (ms(&s["p90_ms"])) }
                            td { (ms(&s["p99_ms"])) }
                            td { (s["interrupted"].as_i64().unwrap_or(0)) }
                        }
                    }
                }
            }
        }
    }
}

/// `GET /pipeline/graph`: the graph's SVG alone, for the page to swap in when the graph
/// changed. A session or token, as for the API.
pub async fn graph_fragment(State(state): State<AppState>, _who: Principal) -> ApiResult<Response> {
    let (graph, doc) = current(&state).await?;
    Ok(with_headers(
        StatusCode::OK,
        "text/html; charset=utf-8",
        crate::svg::render(&graph, &doc).into_string(),
    ))
}

/// `GET /ui/{name}`: the page's script and style sheet; no credential (they hold no data).
pub async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().copied().find(|(n, _, _)| *n == name) {
        Some((_, content_type, text)) => {
            with_headers(StatusCode::OK, content_type, text.to_owned())
        }
        None => {
            ApiError::not_found(format!("there is no file {name:?} under /ui/")).into_response()
        }
    }
}
