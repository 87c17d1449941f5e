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
//!
//! A body is trimmed to MAX_ITEMS, decoded and converted on a blocking thread, as many at
//! once as there are processors, so that a large one never holds up the others' I/O.
//! `/healthz`, which needs no token, asks the database at most once every [`HEALTH_TTL`]
//! however many ask it, and every answer without a token closes its connection: a client
//! without a token can neither keep the pool busy nor keep connections open.

use std::future::Future;
use std::io::Read as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
use tokio::sync::{Mutex, Semaphore};

use crate::convert::{self, Converted, Limits};
use crate::options::Options;
use crate::store;
use crate::tokens::Tokens;
use crate::trim::{self, Trimmed};

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

/// How long `/healthz` answers from the database's last answer.
pub const HEALTH_TTL: Duration = Duration::from_secs(2);

/// How long `/healthz` waits for the database.
const HEALTH_WAIT: Duration = Duration::from_secs(5);

/// How many times MAX_BODY the attributes of one request's rows may come to.
const ATTRIBUTE_BYTES_PER_BODY_BYTE: usize = 16;

/// What the handlers share.
pub struct App {
    pub pool: PgPool,
    pub tokens: Tokens,
    pub max_body: usize,
    pub request_timeout: Duration,
    /// MAX_ITEMS.
    pub max_items: usize,
    pub limits: Limits,
    pub health: Health,
    /// Bodies decoded and converted at once.
    pub converting: Semaphore,
}

impl App {
    pub fn new(pool: PgPool, tokens: Tokens, options: &Options) -> App {
        let processors = std::thread::available_parallelism().map_or(2, |n| n.get());
        App {
            pool,
            tokens,
            max_body: options.max_body,
            request_timeout: options.request_timeout,
            max_items: options.max_items,
            limits: Limits {
                attributes: options.max_attributes,
                attribute_bytes: options
                    .max_body
                    .saturating_mul(ATTRIBUTE_BYTES_PER_BODY_BYTE),
            },
            health: Health::new(HEALTH_TTL),
            converting: Semaphore::new(processors),
        }
    }
}

/// The last answer of a health check, given again to whoever asks within its time to live;
/// one check at a time, the others waiting for its answer.
pub struct Health {
    ttl: Duration,
    last: Mutex<Option<(Instant, bool)>>,
}

impl Health {
    pub fn new(ttl: Duration) -> Health {
        Health {
            ttl,
            last: Mutex::new(None),
        }
    }

    /// The last answer when it is younger than the time to live, else `probe`'s.
    pub async fn check<F: Future<Output = bool>>(&self, probe: impl FnOnce() -> F) -> bool {
        let mut last = self.last.lock().await;
        if let Some((at, healthy)) = *last
            && at.elapsed() < self.ttl
        {
            return healthy;
        }
        let healthy = probe().await;
        *last = Some((Instant::now(), healthy));
        healthy
    }
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
    closing(error(
        StatusCode::NOT_FOUND,
        format!(
            "no such endpoint: {}; the receiver serves POST /v1/traces, POST /v1/metrics and GET /healthz",
            req.uri().path()
        ),
    ))
}

async fn wrong_method(req: Request) -> Response {
    closing(error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} is not served on {}: exports are POSTed, /healthz is read with GET",
            req.method(),
            req.uri().path()
        ),
    ))
}

async fn healthz(State(app): State<Arc<App>>) -> Response {
    let healthy = app
        .health
        .check(|| async {
            match tokio::time::timeout(HEALTH_WAIT, store::healthy(&app.pool)).await {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    tracing::warn!("/healthz: the database does not answer: {e}");
                    false
                }
                Err(_) => {
                    tracing::warn!("/healthz: the database did not answer within {HEALTH_WAIT:?}");
                    false
                }
            }
        })
        .await;
    closing(if healthy {
        (
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"status":"ok"}"#,
        )
            .into_response()
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the database does not answer",
        )
    })
}

/// What an export carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    fn item(self) -> &'static str {
        match self {
            Signal::Traces => "span",
            Signal::Metrics => "data point",
        }
    }

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
    match signal {
        Signal::Traces => {
            let converted = match decoded::<ExportTraceServiceRequest, _>(
                app,
                signal,
                bytes,
                trim::traces,
                convert::spans,
            )
            .await
            {
                Ok(c) => c,
                Err(r) => return refused(&client, parts.uri.path(), r),
            };
            let stored = match store::insert_spans(&app.pool, &converted.rows).await {
                Ok(n) => n,
                Err(e) => return unavailable(signal, &e),
            };
            let partial = settled(&client, signal, &converted, stored).map(|error_message| {
                ExportTracePartialSuccess {
                    rejected_spans: converted.rejected,
                    error_message,
                }
            });
            protobuf(
                ExportTraceServiceResponse {
                    partial_success: partial,
                }
                .encode_to_vec(),
            )
        }
        Signal::Metrics => {
            let converted = match decoded::<ExportMetricsServiceRequest, _>(
                app,
                signal,
                bytes,
                trim::metrics,
                convert::metrics,
            )
            .await
            {
                Ok(c) => c,
                Err(r) => return refused(&client, parts.uri.path(), r),
            };
            let stored = match store::insert_metrics(&app.pool, &converted.rows).await {
                Ok(n) => n,
                Err(e) => return unavailable(signal, &e),
            };
            let partial = settled(&client, signal, &converted, stored).map(|error_message| {
                ExportMetricsPartialSuccess {
                    rejected_data_points: converted.rejected,
                    error_message,
                }
            });
            protobuf(
                ExportMetricsServiceResponse {
                    partial_success: partial,
                }
                .encode_to_vec(),
            )
        }
    }
}

/// The answer to a request refused after its body was read (undecodable, not OTLP).
fn refused(client: &impl std::fmt::Display, path: &str, r: Refusal) -> Response {
    tracing::info!(%client, "{path}: {}", r.text);
    error(r.status, r.text)
}

/// Logs what a request brought; the partial-success message when some of it was rejected.
fn settled<R>(
    client: &impl std::fmt::Display,
    signal: Signal,
    converted: &Converted<R>,
    stored: u64,
) -> Option<String> {
    tracing::debug!(
        %client,
        received = converted.rows.len(),
        stored,
        rejected = converted.rejected,
        "{}",
        signal.items()
    );
    converted
        .error_message(signal.item(), signal.items())
        .inspect(|message| tracing::warn!(%client, "{message}"))
}

/// `bytes` trimmed to MAX_ITEMS, decoded and converted, on a blocking thread; the items
/// beyond MAX_ITEMS are counted as rejected, after those rejected for what they are.
async fn decoded<M, R>(
    app: &App,
    signal: Signal,
    bytes: Bytes,
    trim: fn(&[u8], usize) -> Result<Trimmed, String>,
    convert: fn(M, &Limits) -> Converted<R>,
) -> Result<Converted<R>, Refusal>
where
    M: prost::Message + Default + 'static,
    R: Send + 'static,
{
    let (max_items, limits) = (app.max_items, app.limits);
    let not_the_message = move |e: String| {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not a protobuf {}: {e}", signal.message()),
        )
    };
    let _slot = app
        .converting
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let work = tokio::task::spawn_blocking(move || {
        let trimmed = trim(&bytes, max_items).map_err(not_the_message)?;
        drop(bytes);
        let request =
            M::decode(trimmed.bytes.as_slice()).map_err(|e| not_the_message(e.to_string()))?;
        drop(trimmed.bytes);
        let mut converted = convert(request, &limits);
        converted.reject(trimmed.beyond, || {
            format!(
                "{} {} beyond MAX_ITEMS ({max_items} a request); export smaller batches",
                trimmed.beyond,
                if trimmed.beyond == 1 {
                    signal.item()
                } else {
                    signal.items()
                }
            )
        });
        Ok(converted)
    });
    match work.await {
        Ok(result) => result,
        Err(e) => {
            tracing::error!("reading an {} failed: {e}", signal.message());
            Err(Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "the {} could not be read (an internal error)",
                    signal.message()
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Health probes made while `health` answers `callers` at once.
    async fn probes(health: Arc<Health>, callers: usize) -> usize {
        let probed = Arc::new(AtomicUsize::new(0));
        let mut all = tokio::task::JoinSet::new();
        for _ in 0..callers {
            let (health, probed) = (health.clone(), probed.clone());
            all.spawn(async move {
                health
                    .check(|| async {
                        probed.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        true
                    })
                    .await
            });
        }
        while let Some(healthy) = all.join_next().await {
            assert!(healthy.unwrap());
        }
        probed.load(Ordering::SeqCst)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_callers_of_healthz_make_one_database_query_per_interval() {
        let cached = Arc::new(Health::new(Duration::from_secs(3600)));
        assert_eq!(probes(cached.clone(), 200).await, 1);
        assert_eq!(probes(cached, 200).await, 0, "still fresh");
        // With no time to live, every caller asks, one after the other.
        assert_eq!(probes(Arc::new(Health::new(Duration::ZERO)), 20).await, 20);
    }

    #[tokio::test]
    async fn an_unhealthy_answer_is_kept_as_well() {
        let health = Health::new(Duration::from_secs(3600));
        assert!(!health.check(|| async { false }).await);
        assert!(!health.check(|| async { true }).await);
    }
}
