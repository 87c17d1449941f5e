//! The HTTP side: the middleware chain in the plan's order, the `/in` `/out` `/counters`
//! handlers, the admin `/health` and `/metrics`, and the connection loop with graceful drain.
//! A request rejected by the chain never reaches the CDB or Redis.
//!
//! Both servers are axum routers (`api_router`, `admin_router`), the stack pepsi-httpd uses,
//! over hyper's HTTP/1.1 connection driven by our own accept loop (`serve`): the Go server's
//! idle and header timeouts and the drain on stop have no axum equivalent. The chain stays one
//! function in the plan's order rather than axum's method routing and extractors, whose
//! rejections (a 405 without the JSON body, HEAD answered by the GET handler) would change
//! the answers the plan fixes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{
    ALLOW, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue, WWW_AUTHENTICATE,
};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use axum::routing::any;
use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use http_body_util::{BodyExt, Limited};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::config::{self, Config};
use crate::counting::{self, Event, KeyResult, Plan, Rules};
use crate::domains::{Domains, Flow, Level};
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::store::{Store, StoreError, TxResult};
use crate::txlog::TxLog;
use crate::validate::{self, CountRequest, CountersQuery, Route};

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;
/// How long a stopping server waits for requests in flight.
pub const DRAIN: Duration = Duration::from_secs(10);

type Resp = Response;

/// The answer to a queued count, `{"accepted":true}`.
const ACCEPTED_BODY: &[u8] = br#"{"accepted":true}"#;

/// A counting job handed from the HTTP handler to the worker pool.
pub struct Job {
    pub req: CountRequest,
    pub received: Instant,
    pub date: chrono::NaiveDate,
}

/// Everything a request or a worker needs.
pub struct App {
    pub cfg: Config,
    pub cidrs: Vec<ipnet::IpNet>,
    pub domains: Arc<ArcSwap<Domains>>,
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub notifier: Arc<Notifier>,
    pub txlog: TxLog,
    pub queue: mpsc::Sender<Job>,
}

/// Which route a request reached; `Other` is every path outside them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Count(Route),
    Counters,
    Other,
}

impl Endpoint {
    fn label(self) -> &'static str {
        match self {
            Endpoint::Count(r) => r.as_str(),
            Endpoint::Counters => "counters",
            Endpoint::Other => "other",
        }
    }
}

/// A refusal by one step of the chain.
struct Reject {
    status: StatusCode,
    reason: String,
    trace_id: String,
    header: Option<(HeaderName, &'static str)>,
}

fn reject(status: StatusCode, reason: impl Into<String>) -> Reject {
    Reject {
        status,
        reason: reason.into(),
        trace_id: String::new(),
        header: None,
    }
}

fn json_response(status: StatusCode, body: &Value) -> Resp {
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("static response parts")
}

/// Compares without an early exit, so response time does not reveal how much of a guess matched.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

/// The bearer token of an `Authorization` header; the scheme is case-insensitive.
pub fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// `application/json`, parameters such as charset ignored.
pub fn is_json_content_type(value: &str) -> bool {
    value
        .split(';')
        .next()
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// Step 1 of the chain: a panic becomes a 500 and the daemon keeps serving; a refusal
/// becomes its JSON error, logged at warn.
async fn recover(
    route: &str,
    peer: SocketAddr,
    work: impl Future<Output = Result<Resp, Reject>>,
) -> Resp {
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(Ok(resp)) => resp,
        Ok(Err(r)) => {
            tracing::warn!(
                route,
                peer = %peer,
                status = r.status.as_u16(),
                reason = %r.reason,
                trace_id = %r.trace_id,
                "request rejected"
            );
            let mut resp = json_response(r.status, &json!({ "error": r.reason }));
            if let Some((name, value)) = r.header {
                resp.headers_mut()
                    .insert(name, HeaderValue::from_static(value));
            }
            resp
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!(route, peer = %peer, status = 500, reason = %what, "handler panicked");
            json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({"error": "internal error"}),
            )
        }
    }
}

/// The API server: `/in`, `/out` and `/counters` take every method, so that a wrong one is
/// refused by the chain (405 with its JSON body and Allow) in its place after the path; every
/// other path goes through the chain as `Other` (404).
pub fn api_router(app: Arc<App>) -> Router {
    let at = |endpoint: Endpoint| {
        any(
            move |State(app): State<Arc<App>>,
                  ConnectInfo(peer): ConnectInfo<SocketAddr>,
                  req: Request| app.handle(endpoint, req, peer),
        )
    };
    Router::new()
        .route("/in", at(Endpoint::Count(Route::In)))
        .route("/out", at(Endpoint::Count(Route::Out)))
        .route("/counters", at(Endpoint::Counters))
        .fallback(
            |State(app): State<Arc<App>>,
             ConnectInfo(peer): ConnectInfo<SocketAddr>,
             req: Request| app.handle(Endpoint::Other, req, peer),
        )
        .with_state(app)
}

/// The admin server: `/health` and `/metrics` to any method, no authentication.
pub fn admin_router(app: Arc<App>) -> Router {
    Router::new()
        .route(
            "/metrics",
            any(|State(app): State<Arc<App>>| async move { app.metrics_text() }),
        )
        .route(
            "/health",
            any(|State(app): State<Arc<App>>| async move { app.health().await }),
        )
        .fallback(|| async { json_response(StatusCode::NOT_FOUND, &json!({"error": "not found"})) })
        .with_state(app)
}

impl App {
    /// Entry point of the API server: recover (step 1) around the rest of the chain.
    async fn handle(self: Arc<Self>, endpoint: Endpoint, req: Request, peer: SocketAddr) -> Resp {
        let started = Instant::now();
        let route = endpoint.label();
        let resp = recover(route, peer, self.chain(req, peer, endpoint)).await;
        let elapsed = started.elapsed().as_secs_f64();
        match endpoint {
            Endpoint::Count(r) if resp.status() == StatusCode::ACCEPTED => {
                let (requests, duration) = self.metrics.accepted(r);
                requests.inc();
                duration.observe(elapsed);
            }
            _ => {
                self.metrics
                    .requests
                    .with_label_values(&[route, resp.status().as_str()])
                    .inc();
                self.metrics
                    .duration
                    .with_label_values(&[route])
                    .observe(elapsed);
            }
        }
        resp
    }

    async fn chain(
        &self,
        req: Request,
        peer: SocketAddr,
        endpoint: Endpoint,
    ) -> Result<Resp, Reject> {
        // 2. method
        let want = match endpoint {
            Endpoint::Count(_) => Method::POST,
            Endpoint::Counters => Method::GET,
            Endpoint::Other => return Err(reject(StatusCode::NOT_FOUND, "not found")),
        };
        if req.method() != want {
            let mut r = reject(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("method {} not allowed", req.method()),
            );
            r.header = Some((ALLOW, if want == Method::POST { "POST" } else { "GET" }));
            return Err(r);
        }
        let has_body = want == Method::POST;
        // 3. body size, when declared; a chunked body is bounded while it is read
        if has_body {
            let declared = req
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > MAX_BODY as u64) {
                return Err(reject(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("body larger than {MAX_BODY} bytes"),
                ));
            }
        }
        // 4. bearer token
        let token = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
        if !token.is_some_and(|t| ct_eq(t.as_bytes(), self.cfg.auth_token.as_bytes())) {
            let mut r = reject(
                StatusCode::UNAUTHORIZED,
                if token.is_none() {
                    "missing bearer token"
                } else {
                    "wrong bearer token"
                },
            );
            r.header = Some((WWW_AUTHENTICATE, "Bearer"));
            return Err(r);
        }
        // 5. source address: the TCP peer only; forwarded headers are never trusted
        if !self.cidrs.is_empty() && !config::any_contains(&self.cidrs, peer.ip()) {
            return Err(reject(
                StatusCode::FORBIDDEN,
                format!("source {} not allowed", peer.ip()),
            ));
        }
        if !has_body {
            // Boxed: the view's future (a Redis read under a timeout) is many times the size
            // of the rest of the chain, and would otherwise be moved whole with every
            // request's future, `/in` and `/out` included.
            return Box::pin(self.counters(req.uri().query().unwrap_or(""))).await;
        }
        let Endpoint::Count(route) = endpoint else {
            return Err(reject(StatusCode::NOT_FOUND, "not found"));
        };
        // 6. content type
        let ctype = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !is_json_content_type(ctype) {
            return Err(reject(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("content type {ctype:?} is not application/json"),
            ));
        }
        // 7. exactly one JSON object
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(reject(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("body larger than {MAX_BODY} bytes"),
                ));
            }
            Err(e) => {
                return Err(reject(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read body: {e}"),
                ));
            }
        };
        // 7 and 8 for the body mailqueuer sends, read from its bytes without building a
        // JSON tree; any other body (and every refusal) takes the tree, which words the error.
        let req = match validate::accept_count_request(route, &body) {
            Some(req) => req,
            None => {
                let value: Value = serde_json::from_slice(&body)
                    .map_err(|e| reject(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")))?;
                if !value.is_object() {
                    return Err(reject(
                        StatusCode::BAD_REQUEST,
                        "invalid JSON: expected one object",
                    ));
                }
                // 8. per-route validation
                validate::validate_count_request(route, &value).map_err(|reason| Reject {
                    trace_id: validate::trace_id_of(&value),
                    ..reject(StatusCode::BAD_REQUEST, reason)
                })?
            }
        };
        // 9. the handler's own work
        let trace_id = req.trace_id.clone();
        let job = Job {
            req,
            received: Instant::now(),
            date: Utc::now().date_naive(),
        };
        // Handing the job over never waits (a full queue answers at once), so no
        // handler_timeout timer is needed around it.
        match self.queue.try_send(job) {
            Ok(()) => Ok(Response::builder()
                .status(StatusCode::ACCEPTED)
                .header(CONTENT_TYPE, "application/json")
                .body(Body::from(ACCEPTED_BODY))
                .expect("static response parts")),
            Err(_) => Err(Reject {
                trace_id,
                ..reject(StatusCode::SERVICE_UNAVAILABLE, "queue full")
            }),
        }
    }

    async fn with_timeout(
        &self,
        work: impl Future<Output = Result<Resp, Reject>>,
        trace_id: &str,
    ) -> Result<Resp, Reject> {
        match tokio::time::timeout(Duration::from_secs(self.cfg.handler_timeout), work).await {
            Ok(r) => r,
            Err(_) => Err(Reject {
                trace_id: trace_id.to_string(),
                ..reject(StatusCode::SERVICE_UNAVAILABLE, "handler timeout")
            }),
        }
    }

    async fn counters(&self, query: &str) -> Result<Resp, Reject> {
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        let (q, date) = validate::validate_counters_query(&pairs, Utc::now().date_naive())
            .map_err(|e| reject(StatusCode::BAD_REQUEST, e))?;
        self.with_timeout(self.counters_view(q, date), "").await
    }

    async fn counters_view(
        &self,
        q: CountersQuery,
        date: chrono::NaiveDate,
    ) -> Result<Resp, Reject> {
        let (query, mode, domain, address) = match &q {
            CountersQuery::Address(a) => {
                let d = crate::address::domain_part(a);
                (a.clone(), "address", d.to_string(), Some(a.clone()))
            }
            CountersQuery::Domain(d) => (d.clone(), "domain", d.clone(), None),
        };
        let rec = self.domains.load().lookup(&domain);
        let exempt = address
            .as_ref()
            .is_some_and(|a| self.cfg.exempt.iter().any(|e| e == a));
        let local = address
            .as_deref()
            .and_then(crate::address::parts)
            .map_or("", |(l, _)| l);
        let mut rows: Vec<(Level, String)> = Vec::new();
        if let Some(a) = &address {
            rows.push((Level::A, a.clone()));
        }
        rows.push((Level::D, domain.clone()));
        if let Some(r) = &rec {
            rows.push((Level::O, r.org_id.to_string()));
        }
        let keys: Vec<String> = rows
            .iter()
            .flat_map(|(l, id)| {
                [Flow::In, Flow::Out].map(|f| counting::counter_key(*l, id, date, f))
            })
            .collect();
        let vals = self.store.mget(&keys).await.map_err(|e| {
            self.metrics.redis_errors.with_label_values(&["mget"]).inc();
            reject(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("redis unavailable: {e}"),
            )
        })?;
        let levels: Vec<Value> = rows
            .iter()
            .enumerate()
            .map(|(i, (level, id))| {
                let lim = |f| rec.as_ref().and_then(|r| r.limit(*level, f, local));
                json!({
                    "level": level.as_str(),
                    "id": id,
                    "in": vals.get(2 * i).copied().flatten().unwrap_or(0),
                    "in_limit": lim(Flow::In),
                    "out": vals.get(2 * i + 1).copied().flatten().unwrap_or(0),
                    "out_limit": lim(Flow::Out),
                })
            })
            .collect();
        let body = json!({
            "query": query,
            "mode": mode,
            "date": date.format("%Y-%m-%d").to_string(),
            "managed": rec.is_some(),
            "exempt": exempt,
            "domain": domain,
            "org_id": rec.as_ref().map(|r| r.org_id),
            "levels": levels,
        });
        Ok(json_response(StatusCode::OK, &body))
    }

    /// Counts one job: CDB lookups, one MULTI/EXEC, crossings, the counting log block.
    pub async fn count(&self, job: Job) {
        self.count_batch(vec![job]).await
    }

    /// Counts the jobs a worker took from the queue together: the CDB lookups of each, their
    /// MULTI/EXEC transactions pipelined on one Redis connection, then for each job on its own
    /// results its crossings, metrics and counting log block, as if it had been counted alone.
    pub async fn count_batch(&self, jobs: Vec<Job>) {
        let domains = self.domains.load_full();
        let log = self.txlog.enabled();
        let rules = Rules {
            exempt: &self.cfg.exempt,
            count_junk: self.cfg.count_junk,
            events: log,
        };
        let plans: Vec<Plan> = jobs
            .iter()
            .map(|j| counting::plan(&j.req, &rules, j.date, &|d| domains.lookup(d)))
            .collect();
        let before = Utc::now();
        let txs: Vec<Vec<&str>> = plans
            .iter()
            .filter(|p| !p.increments.is_empty())
            .map(|p| p.increments.iter().map(|i| i.key.as_str()).collect())
            .collect();
        let mut results = if txs.is_empty() {
            Vec::new()
        } else {
            tracing::debug!(
                requests = jobs.len(),
                transactions = txs.len(),
                "counting batch"
            );
            let budget = Duration::from_secs(self.cfg.handler_timeout);
            self.store.incr_batch(&txs, budget).await
        }
        .into_iter();
        let after = Utc::now();
        for (job, plan) in jobs.iter().zip(plans) {
            let outcome = (!plan.increments.is_empty()).then(|| {
                results
                    .next()
                    .unwrap_or_else(|| Err(StoreError::NotApplied("no result".into())))
            });
            self.finish(job, plan, (before, after), outcome);
        }
    }

    /// One job's share of a batch: metrics, the counting log block, notifications.
    fn finish(
        &self,
        job: &Job,
        plan: Plan,
        (before, after): (DateTime<Utc>, DateTime<Utc>),
        outcome: Option<TxResult>,
    ) {
        let req = &job.req;
        let route = req.route.as_str();
        let mut events: Vec<(DateTime<Utc>, Event)> =
            plan.events.into_iter().map(|e| (before, e)).collect();
        let mut crossings = Vec::new();
        match outcome {
            None => {}
            Some(Ok((results, reread))) => {
                if reread {
                    self.metrics.redis_errors.with_label_values(&["exec"]).inc();
                    tracing::warn!(
                        trace_id = req.trace_id,
                        "lost EXEC reply, counts re-read from the master"
                    );
                }
                let (evs, cs) = counting::outcome(
                    &plan.increments,
                    &results,
                    &|l| !self.notifier.url_for(l).is_empty(),
                    self.txlog.enabled(),
                );
                // Crossings are counted before increments, so a reader that sees every
                // increment also sees every crossing.
                for c in &cs {
                    self.metrics
                        .limit_reached
                        .with_label_values(&[c.level.as_str(), c.flow.as_str()])
                        .inc();
                }
                for (inc, res) in plan.increments.iter().zip(&results) {
                    match res {
                        KeyResult::Counted(_) | KeyResult::Seen(_) => {
                            self.metrics.increment(inc.level, inc.flow).inc()
                        }
                        KeyResult::Failed(e) => {
                            self.metrics.redis_errors.with_label_values(&["incr"]).inc();
                            tracing::error!(
                                trace_id = req.trace_id,
                                key = inc.key,
                                error = e,
                                "counter increment failed"
                            );
                        }
                    }
                }
                events.extend(evs.into_iter().map(|e| (after, e)));
                crossings = cs;
                self.metrics
                    .count_delay
                    .observe(job.received.elapsed().as_secs_f64());
            }
            Some(Err(e)) => {
                let error = e.to_string();
                self.metrics.redis_errors.with_label_values(&["incr"]).inc();
                tracing::error!(
                    trace_id = req.trace_id,
                    route,
                    error,
                    "counting failed, nothing counted"
                );
                events.push((after, Event::RedisError { error }));
            }
        }
        self.txlog.block(&req.trace_id, route, &events);
        for c in crossings {
            self.notifier
                .spawn(c, req.trace_id.clone(), req.route.as_str());
        }
    }

    /// Admin `/metrics`: the Prometheus text format.
    fn metrics_text(&self) -> Resp {
        Response::builder()
            .header(CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(Body::from(self.metrics.render()))
            .expect("static response parts")
    }

    /// Admin `/health`: 200 when the CDB is readable and Redis answers PING within 200 ms.
    async fn health(&self) -> Resp {
        let cdb = std::fs::metadata(self.domains.load().path()).map(|_| ());
        let redis = tokio::time::timeout(Duration::from_millis(200), self.store.ping()).await;
        let reason = match (cdb, redis) {
            (Err(e), _) => Some(format!("cdb: {e}")),
            (_, Err(_)) => Some("redis: no PING reply within 200ms".to_string()),
            (_, Ok(Err(e))) => Some(format!("redis: {e}")),
            _ => None,
        };
        match reason {
            None => json_response(StatusCode::OK, &json!({"status": "ok"})),
            Some(r) => json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({"status": "unavailable", "reason": r}),
            ),
        }
    }
}

/// Socket timeouts of a server, with the Go server's meanings: `idle` bounds the wait for the
/// next request on a kept-alive connection, `read_header` the time from a request's first byte
/// to its complete header, `write` the handling and answer of one request.
#[derive(Clone, Copy)]
pub struct Timeouts {
    pub read_header: Duration,
    pub write: Duration,
    pub idle: Duration,
}

const NONE: u64 = u64::MAX;

/// What the connection watchdog needs to know, in milliseconds since the connection started.
struct ConnState {
    start: Instant,
    inflight: AtomicUsize,
    idle_since: AtomicU64,
    first_byte: AtomicU64,
}

impl ConnState {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Decides whether an idle connection has waited too long; pure apart from the clock.
    fn expired(&self, t: &Timeouts) -> bool {
        if self.inflight.load(Ordering::Acquire) > 0 {
            return false;
        }
        let now = self.now();
        match self.first_byte.load(Ordering::Acquire) {
            NONE => {
                now.saturating_sub(self.idle_since.load(Ordering::Acquire))
                    > t.idle.as_millis() as u64
            }
            first => now.saturating_sub(first) > t.read_header.as_millis() as u64,
        }
    }
}

/// Ends a request: the connection is idle from now on.
struct InflightGuard(Arc<ConnState>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.idle_since.store(self.0.now(), Ordering::Release);
        self.0.first_byte.store(NONE, Ordering::Release);
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The TCP stream, noting when the first byte of the next request arrives.
struct TrackedIo {
    inner: tokio::net::TcpStream,
    state: Arc<ConnState>,
}

impl tokio::io::AsyncRead for TrackedIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let now = self.state.now();
            let _ = self.state.first_byte.compare_exchange(
                NONE,
                now,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        r
    }
}

impl tokio::io::AsyncWrite for TrackedIo {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves `router` on `listener` until `stop`, then lets every connection finish its request in
/// flight and waits up to `DRAIN` for them. The router sees the TCP peer as `ConnectInfo`.
pub async fn serve(
    listener: TcpListener,
    timeouts: Timeouts,
    stop: CancellationToken,
    router: Router,
) {
    let conns = tokio_util::task::TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::new(ConnState {
            start: Instant::now(),
            inflight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            first_byte: AtomicU64::new(NONE),
        });
        let router = router.clone();
        let svc_state = state.clone();
        let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            svc_state.inflight.fetch_add(1, Ordering::AcqRel);
            let guard = InflightGuard(svc_state.clone());
            let mut req = req.map(Body::new);
            req.extensions_mut().insert(ConnectInfo(peer));
            let fut = router.clone().oneshot(req);
            async move {
                let resp = match tokio::time::timeout(timeouts.write, fut).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(never)) => match never {},
                    Err(_) => json_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &json!({"error": "write timeout"}),
                    ),
                };
                drop(guard);
                Ok::<_, Infallible>(resp)
            }
        });
        let io = TrackedIo {
            inner: stream,
            state: state.clone(),
        };
        let stop = stop.clone();
        conns.spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(io), svc);
            let mut conn = std::pin::pin!(conn);
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            let mut stopping = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = tick.tick() => if state.expired(&timeouts) { break },
                    _ = stop.cancelled(), if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }
    drop(listener);
    conns.close();
    if tokio::time::timeout(DRAIN, conns.wait()).await.is_err() {
        tracing::warn!(
            "requests still in flight after {}s, closing",
            DRAIN.as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_answers_500_and_the_next_request_is_served() {
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let boom = async {
            if peer.port() == 1 {
                panic!("handler bug");
            }
            Ok(json_response(StatusCode::OK, &json!({})))
        };
        assert_eq!(
            recover("in", peer, boom).await.status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let fine = async { Ok(json_response(StatusCode::ACCEPTED, &json!({}))) };
        assert_eq!(
            recover("in", peer, fine).await.status(),
            StatusCode::ACCEPTED
        );
        let refused = async { Err(reject(StatusCode::FORBIDDEN, "no")) };
        assert_eq!(
            recover("in", peer, refused).await.status(),
            StatusCode::FORBIDDEN
        );
    }

    #[test]
    fn idle_and_header_deadlines() {
        let t = Timeouts {
            read_header: Duration::from_secs(5),
            write: Duration::from_secs(30),
            idle: Duration::from_secs(60),
        };
        let st = |inflight: usize, idle_since: u64, first_byte: u64, ago: u64| {
            let s = ConnState {
                start: Instant::now() - Duration::from_millis(ago),
                inflight: AtomicUsize::new(inflight),
                idle_since: AtomicU64::new(idle_since),
                first_byte: AtomicU64::new(first_byte),
            };
            s.expired(&t)
        };
        // (requests in flight, idle since ms, first byte ms, connection age ms) → expired
        assert!(!st(0, 0, NONE, 59_000));
        assert!(st(0, 0, NONE, 61_000));
        assert!(!st(1, 0, NONE, 600_000));
        assert!(!st(0, 0, 57_000, 61_000));
        assert!(st(0, 0, 50_000, 61_000));
        assert!(!st(0, 10_000, NONE, 61_000));
    }

    #[test]
    fn token_and_content_type_rules() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"secret", b"secret2"));
        assert!(!ct_eq(b"", b"x"));
        let cases: &[(&str, Option<&str>)] = &[
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("Basic abc", None),
            ("Bearer", None),
            ("abc", None),
        ];
        for (h, want) in cases {
            assert_eq!(bearer_token(h), *want, "{h}");
        }
        for (ct, want) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("text/plain", false),
            ("", false),
            ("application/jsonx", false),
        ] {
            assert_eq!(is_json_content_type(ct), want, "{ct}");
        }
    }
}
