//! `GET /journey`: a message's journey as a page, for an administrator — a search by queue
//! row, Message-ID or trace id (`?queue=`, `?message_id=`, `?trace=`, as `GET /api/journey`
//! takes them), and the trace found drawn as a timeline: one row per span in the order
//! they began, with its host, program, stage, outcome, start, duration and the time its
//! queue row waited before it, and a bar on the trace's time axis (inline SVG: the CSP
//! allows no inline style). Retries and interrupted passes are marked.
//!
//! Everything a span holds came from a host over the network (through pepsi-telemetry), so
//! every splice is escaped by maud and nothing of it reaches a script. Like every page it
//! answers 401 with the login form in place without a session.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};

use crate::api::journey::{MAX_SPANS, find, not_found_text};
use crate::credentials;
use crate::error::ApiError;
use crate::extract::{AppState, Pairs, Principal, Via};
use crate::journey::{self, Journey, Lookup, Span};
use crate::latency::show_ms;
use crate::pages::{Viewer, frame, login_markup, page};

/// The width of the time axis in SVG units.
const AXIS: f64 = 1000.0;

/// What the page shows below the search.
enum Body {
    /// No lookup yet.
    Hint,
    /// A parameter was wrong: why.
    Refused(String),
    /// Telemetry has no span for the lookup.
    Nothing(Lookup),
    Found(Lookup, Box<Journey>),
}

/// `GET /journey`: the page, or 401 with the login form.
pub async fn journey_page(
    State(state): State<AppState>,
    Viewer(who): Viewer,
    pairs: Result<Pairs, ApiError>,
) -> Response {
    let who = match who {
        Ok(Some(p)) => p,
        Ok(None) => return page(StatusCode::UNAUTHORIZED, login_markup(None)),
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            return page(StatusCode::UNAUTHORIZED, login_markup(Some(&e.message)));
        }
        Err(e) => return e.into_response(),
    };
    // The search forms send their one field; an empty one is no lookup.
    let lookup = pairs.map_err(|e| e.message).and_then(|Pairs(p)| {
        let filled: Vec<(String, String)> = p
            .into_iter()
            .filter(|(_, v)| !v.trim().is_empty())
            .collect();
        journey::lookup(&filled)
    });
    let (status, body) = match lookup {
        Err(why) => (StatusCode::BAD_REQUEST, Body::Refused(why)),
        Ok(None) => (StatusCode::OK, Body::Hint),
        Ok(Some(l)) => match find(&state.pool, &l).await {
            Ok(Some(j)) => (StatusCode::OK, Body::Found(l, Box::new(j))),
            Ok(None) => (StatusCode::NOT_FOUND, Body::Nothing(l)),
            Err(e) => return ApiError::from(e).into_response(),
        },
    };
    page(status, markup(&who, &body))
}

/// The value a search field shows: the lookup's own.
fn value_of(body: &Body, name: &str) -> String {
    match body {
        Body::Found(l, _) | Body::Nothing(l) => {
            let (k, v) = l.parameter();
            if k == name { v } else { String::new() }
        }
        _ => String::new(),
    }
}

fn markup(who: &Principal, body: &Body) -> Markup {
    let csrf = match &who.via {
        Via::Session { secret } => credentials::csrf_token(secret),
        Via::Token { .. } => String::new(),
    };
    frame(
        "Journey",
        "journey.js",
        html! {
            header.bar {
                h1 { "Message journey" }
                a href="/pipeline" { "Pipeline" }
                span.who { "logged in as " b { (who.name) } }
                @if matches!(who.via, Via::Session { .. }) {
                    button #logout type="button" { "Log out" }
                }
            }
            main #journey data-csrf=(csrf) {
                section #search {
                    form.lookup method="get" action="/journey" {
                        label { "Queue row" input #search-queue name="queue" inputmode="numeric" value=(value_of(body, "queue")); }
                        button type="submit" { "Find" }
                    }
                    form.lookup method="get" action="/journey" {
                        label { "Message-ID" input #search-message-id name="message_id" value=(value_of(body, "message_id")); }
                        button type="submit" { "Find" }
                    }
                    form.lookup method="get" action="/journey" {
                        label { "Trace id" input #search-trace name="trace" size="34" value=(value_of(body, "trace")); }
                        button type="submit" { "Find" }
                    }
                }
                @match body {
                    Body::Hint => p.hint {
                        "Find a message by its queue row id, its Message-ID (with or without the angle brackets) or its trace id (32 hexadecimal digits). "
                        "The spans come from pepsi.telemetry_span, which pepsi-telemetry fills with what the hosts export."
                    },
                    Body::Refused(why) => p #journey-error .problem role="alert" { (why) },
                    Body::Nothing(l) => section #nothing {
                        h2 { "Nothing found for " (l.describe()) }
                        p role="status" { (not_found_text(l)) "." }
                    },
                    Body::Found(l, j) => (timeline(l, j)),
                }
            }
        },
    )
}

/// The summary line's list of the queue rows a trace touched.
fn queue_rows(j: &Journey) -> Vec<i64> {
    let mut rows: Vec<i64> = j.spans.iter().filter_map(|s| s.queue_id).collect();
    rows.sort_unstable();
    rows.dedup();
    rows
}

fn message_ids(j: &Journey) -> Vec<&str> {
    let mut ids: Vec<&str> = j
        .spans
        .iter()
        .filter_map(|s| s.message_id.as_deref())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn timeline(l: &Lookup, j: &Journey) -> Markup {
    let total = j.duration_ms.max(0.001);
    html! {
        section #trace data-trace=(j.trace_id) {
            h2 { "Trace " code #trace-id { (j.trace_id) } }
            p.summary {
                b { (j.spans.len()) } " spans from " (j.start.to_rfc3339()) ", over " b { (show_ms(j.duration_ms)) } "."
                " Queue rows: "
                @for (i, q) in queue_rows(j).iter().enumerate() {
                    @if i > 0 { ", " }
                    a href=(format!("/journey?queue={q}")) { (q) }
                }
                "."
                @for m in message_ids(j) {
                    " Message-ID: " code.message-id { (m) } "."
                }
            }
            @if j.truncated {
                p.problem { "The trace has more spans than the " (MAX_SPANS) " shown: the first ones by start." }
            }
            @if !j.traces.is_empty() {
                p #other-traces {
                    "Other traces of " (l.describe()) ", the newest first: "
                    @for (i, t) in j.traces.iter().enumerate() {
                        @if i > 0 { ", " }
                        a href=(format!("/journey?trace={t}")) { code { (t) } }
                    }
                }
            }
            table #journey-spans {
                thead { tr {
                    th { "#" } th { "host" } th { "program" } th { "stage" } th { "queue row" }
                    th { "outcome" } th { "start" } th { "duration" } th { "waited" } th.bar { "timeline" }
                } }
                tbody {
                    @for (i, s) in j.spans.iter().enumerate() { (span_row(i, s, total)) }
                }
            }
            p.legend {
                "Start is from the trace's first span. Waited is the queue row's time between the end of its previous span and this one's start; "
                "dispatch is the part after the dispatcher claimed the row (pepsi.dispatch_wait_ms). "
                span.badge.retry { "retry" } " a stage the row had passed before; "
                span.badge.interrupted { "interrupted" } " a pass cut short by a killed worker."
            }
        }
    }
}

fn span_row(i: usize, s: &Span, total: f64) -> Markup {
    let stage = s.stage.as_deref().unwrap_or("ingress");
    let outcome = s.outcome.as_deref().unwrap_or("");
    let x = s.offset_ms / total * AXIS;
    let w = (s.duration_ms / total * AXIS).max(2.0);
    let wait = s.wait_ms.filter(|w| *w > 0.0).map(|w| {
        let from = ((s.offset_ms - w) / total * AXIS).max(0.0);
        (from, x - from)
    });
    let outcome_class = match outcome {
        "failed" | "deferred" | "interrupted" => outcome,
        _ => "ok",
    };
    html! {
        tr.span.retry[s.is_retry()].interrupted[s.interrupted]
            data-stage=(stage) data-outcome=(outcome) data-span=(s.span_id) title=(s.name) {
            td { (i + 1) }
            td { (s.host.as_deref().unwrap_or("")) }
            td { (s.program.as_deref().unwrap_or("")) }
            td.stage {
                span.stage-name { (stage) }
                @if let Some(f) = &s.fused_into { " " small { "fused into " (f) } }
                @if s.is_retry() { " " span.badge.retry { "retry " (s.attempt - 1) } }
            }
            td { @if let Some(q) = s.queue_id { a href=(format!("/journey?queue={q}")) { (q) } } }
            td.outcome {
                @if s.interrupted { span.badge.interrupted { "interrupted" } }
                @else { (outcome) }
                @if let Some(m) = &s.status_message { " " small.error { (m) } }
            }
            td title=(s.start.to_rfc3339()) { "+" (show_ms(s.offset_ms)) }
            td { (show_ms(s.duration_ms)) }
            td {
                @if let Some(w) = s.wait_ms { (show_ms(w)) }
                @if let Some(d) = s.dispatch_wait_ms { br; small { "dispatch " (show_ms(d)) } }
            }
            td.bar {
                svg.bar viewBox=(format!("0 0 {AXIS} 14")) preserveAspectRatio="none" width="100%" height="14" {
                    @if let Some((from, width)) = wait {
                        rect.wait x=(format!("{from:.2}")) y="5" width=(format!("{width:.2}")) height="4" {}
                    }
                    rect class=(format!("pass {outcome_class}")) x=(format!("{x:.2}")) y="1" width=(format!("{w:.2}")) height="12" {
                        title { (stage) " " (outcome) ": " (show_ms(s.duration_ms)) }
                    }
                }
            }
        }
    }
}
