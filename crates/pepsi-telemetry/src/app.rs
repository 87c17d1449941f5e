//! The HTTP surface: `POST /v1/traces` and `POST /v1/metrics` (OTLP/HTTP with protobuf
//! bodies), `GET /healthz`. Each export is checked in this order, and the first failure
//! answers: the bearer token (401), the media type and encoding (415), the size (413), the
//! time the body takes to arrive (408), the protobuf (400); then the rows are stored in one
//! transaction (503 when the database does not take them) and the answer is the protobuf
//! `Export*ServiceResponse`, with `partial_success` when items were rejected. Every error
//! body is JSON, `{"error": "..."}`, naming what was wrong. A refusal before the body was
//! read reads and drops a bounded part of it first (a connection closed on unread data is
//! reset, and the client would see the reset rather than the answer), then closes the
//! connection.

use std::io::Read as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message as _;
use sqlx::PgPool;

use crate::convert;
use crate::store;
use crate::tokens::Tokens;

/// How much of a refused request's body is read and dropped before the answer, and for how
/// long: a connection closed on unread data is reset, and the client would see that reset
/// instead of the answer. Beyond these the connection is closed all the same.
const DRAIN_LIMIT: usize = 256 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// The media type of OTLP/HTTP's binary encoding.
pub const PROTOBUF: &str = "application/x-protobuf";

/// The client's address, which the accept loop puts on each request.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// What the handlers share.
pub struct App {
    pub pool: PgPool,
    pub tokens: Tokens,
    pub max_body: usize,
    pub request_timeout: Duration,
}

/// The routes.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/metrics", post(metrics))
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .method_not_allowed_fallback(wrong_method)
        .with_state(app)
}

fn error(status: StatusCode, text: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": text.into() }).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn not_found(req: Request) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no such endpoint: {}; the receiver serves POST /v1/traces, POST /v1/metrics and GET /healthz",
            req.uri().path()
        ),
    )
}

async fn wrong_method(req: Request) -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} is not served on {}: exports are POSTed, /healthz is read with GET",
            req.method(),
            req.uri().path()
        ),
    )
}

async fn healthz(State(app): State<Arc<App>>) -> Response {
    match store::healthy(&app.pool).await {
        Ok(()) => (
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"status":"ok"}"#,
        )
            .into_response(),
        Err(e) => {
            tracing::warn!("/healthz: the database does not answer: {e}");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the database does not answer",
            )
        }
    }
}

/// What an export carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    fn items(self) -> &'static str {
        match self {
            Signal::Traces => "spans",
            Signal::Metrics => "data points",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Signal::Traces => "ExportTraceServiceRequest",
            Signal::Metrics => "ExportMetricsServiceRequest",
        }
    }
}

async fn traces(State(app): State<Arc<App>>, req: Request) -> Response {
    export(&app, req, Signal::Traces).await
}

async fn metrics(State(app): State<Arc<App>>, req: Request) -> Response {
    export(&app, req, Signal::Metrics).await
}

fn peer(req: &Request) -> String {
    req.extensions()
        .get::<Peer>()
        .map_or_else(|| "-".to_owned(), |p| p.0.to_string())
}

fn unauthorized(headers: &HeaderMap) -> Response {
    let (challenge, text) = if headers.contains_key(header::AUTHORIZATION) {
        (
            r#"Bearer realm="pepsi-telemetry", error="invalid_token""#,
            "the bearer token is not accepted here",
        )
    } else {
        (
            r#"Bearer realm="pepsi-telemetry""#,
            "a bearer token is required: send Authorization: Bearer <token>",
        )
    };
    let mut r = error(StatusCode::UNAUTHORIZED, text);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    r
}

/// The media type of `Content-Type`, lower-cased, without parameters.
fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let media = value.split(';').next().unwrap_or("").trim();
    Some(media.to_ascii_lowercase())
}

/// Why an export is refused before its body is decoded: the status and the error text.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    text: String,
}

impl Refusal {
    fn new(status: StatusCode, text: impl Into<String>) -> Refusal {
        Refusal {
            status,
            text: text.into(),
        }
    }

    /// The JSON error; the connection is closed after it, since the body may not have been
    /// read to its end.
    fn response(self) -> Response {
        closing(error(self.status, self.text))
    }
}

/// `r` with `Connection: close`.
fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Reads and drops what comes of `body` within DRAIN_LIMIT and DRAIN_TIME.
async fn drain(mut body: Body) {
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                seen += data.len();
                if seen > DRAIN_LIMIT {
                    break;
                }
            }
        }
    })
    .await;
}

/// Whether the body is gzip, or why the headers do not describe a body this receiver reads.
fn check_headers(headers: &HeaderMap) -> Result<bool, Refusal> {
    match media_type(headers).as_deref() {
        Some(PROTOBUF) => {}
        Some("application/json") => {
            return Err(Refusal::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Content-Type application/json: OTLP's JSON encoding is not taken here; export with protobuf (OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)",
            ));
        }
        Some(other) => {
            return Err(Refusal::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Content-Type {other:?}: expected {PROTOBUF}"),
            ));
        }
        None => {
            return Err(Refusal::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("no Content-Type: expected {PROTOBUF}"),
            ));
        }
    }
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase());
    match encoding.as_deref() {
        None | Some("" | "identity") => Ok(false),
        Some("gzip") => Ok(true),
        Some(other) => Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Encoding {other:?}: expected gzip or none"),
        )),
    }
}

fn too_large(max: usize) -> Refusal {
    Refusal::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the body is larger than MAX_BODY ({max} bytes): export smaller batches"),
    )
}

/// The request's body, decoded from gzip when it is, at most `max_body` bytes either way.
async fn read_body(
    app: &App,
    headers: &HeaderMap,
    mut body: Body,
    gzip: bool,
) -> Result<Bytes, Refusal> {
    let max = app.max_body;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > (max + DRAIN_LIMIT) as u64) {
        // Not worth reading: the connection is closed after the answer.
        return Err(too_large(max));
    }
    // Read to the end, keeping at most `max` bytes: past it the rest is read and dropped
    // (up to DRAIN_LIMIT), so that the client reads the 413 rather than a reset.
    let mut kept = Vec::new();
    let mut seen = 0usize;
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                Refusal::new(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}"),
                )
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            seen = seen.saturating_add(data.len());
            if seen <= max {
                kept.extend_from_slice(&data);
            } else if seen > max + DRAIN_LIMIT {
                break;
            }
        }
        Ok::<(), Refusal>(())
    };
    match tokio::time::timeout(app.request_timeout, read).await {
        Err(_) => {
            return Err(Refusal::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within REQUEST_TIMEOUT ({:?})",
                    app.request_timeout
                ),
            ));
        }
        Ok(Err(refusal)) => return Err(refusal),
        Ok(Ok(())) => {}
    }
    if seen > max {
        return Err(too_large(max));
    }
    let raw = Bytes::from(kept);
    if !gzip {
        return Ok(raw);
    }
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(raw.as_ref())
        .take(max as u64 + 1)
        .read_to_end(&mut plain)
        .map_err(|e| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("Content-Encoding gzip, but the body is not gzip: {e}"),
            )
        })?;
    if plain.len() > max {
        return Err(too_large(max));
    }
    Ok(plain.into())
}

fn protobuf(bytes: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, PROTOBUF)], bytes).into_response()
}

fn unavailable(signal: Signal, e: &sqlx::Error) -> Response {
    tracing::error!("cannot store the {}: {e}", signal.items());
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the {} cannot be stored now (the database); try again later",
            signal.items()
        ),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    r
}

async fn export(app: &App, req: Request, signal: Signal) -> Response {
    let client = peer(&req);
    let (parts, body) = req.into_parts();
    let authorization = parts
        .headers
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if !app.tokens.authorizes(authorization) {
        tracing::info!(%client, "{} refused: no accepted bearer token", parts.uri.path());
        drain(body).await;
        return closing(unauthorized(&parts.headers));
    }
    let gzip = match check_headers(&parts.headers) {
        Ok(gzip) => gzip,
        Err(r) => {
            tracing::info!(%client, "{} refused: {}", parts.uri.path(), r.text);
            drain(body).await;
            return r.response();
        }
    };
    let bytes = match read_body(app, &parts.headers, body, gzip).await {
        Ok(b) => b,
        Err(r) => {
            tracing::info!(%client, status = r.status.as_u16(), "{} refused: {}", parts.uri.path(), r.text);
            return r.response();
        }
    };
    let bad = |e: prost::DecodeError| {
        tracing::info!(%client, "{}: not a {}: {e}", parts.uri.path(), signal.message());
        error(
            StatusCode::BAD_REQUEST,
            format!("the body is not a protobuf {}: {e}", signal.message()),
        )
    };
    match signal {
        Signal::Traces => {
            let request = match ExportTraceServiceRequest::decode(bytes) {
                Ok(r) => r,
                Err(e) => return bad(e),
            };
            let converted = convert::spans(request);
            let stored = match store::insert_spans(&app.pool, &converted.rows).await {
                Ok(n) => n,
                Err(e) => return unavailable(signal, &e),
            };
            let partial = converted.error_message(signal.items()).map(|message| {
                tracing::warn!(%client, "{message}");
                ExportTracePartialSuccess {
                    rejected_spans: converted.rejected,
                    error_message: message,
                }
            });
            tracing::debug!(
                %client,
                received = converted.rows.len(),
                stored,
                rejected = converted.rejected,
                "spans"
            );
            protobuf(
                ExportTraceServiceResponse {
                    partial_success: partial,
                }
                .encode_to_vec(),
            )
        }
        Signal::Metrics => {
            let request = match ExportMetricsServiceRequest::decode(bytes) {
                Ok(r) => r,
                Err(e) => return bad(e),
            };
            let converted = convert::metrics(request);
            let stored = match store::insert_metrics(&app.pool, &converted.rows).await {
                Ok(n) => n,
                Err(e) => return unavailable(signal, &e),
            };
            let partial = converted.error_message(signal.items()).map(|message| {
                tracing::warn!(%client, "{message}");
                ExportMetricsPartialSuccess {
                    rejected_data_points: converted.rejected,
                    error_message: message,
                }
            });
            tracing::debug!(
                %client,
                stored,
                rejected = converted.rejected,
                "data points"
            );
            protobuf(
                ExportMetricsServiceResponse {
                    partial_success: partial,
                }
                .encode_to_vec(),
            )
        }
    }
}
