//! pepsi-telemetry as its clients and its operator meet it: the real program over TLS (a
//! test CA), on a database set up by pepsi-setup's own code and reached as the
//! `pepsi-telemetry` role, taking real OTLP/HTTP requests (opentelemetry-proto messages,
//! encoded with prost, sent with reqwest). Tokens, media types, sizes and bodies are
//! checked; spans and points land in their tables with the Pepsi facts in columns; a retry
//! adds nothing; the running receiver deletes what is past its RETENTION; and its role
//! reaches its own tables and nothing else. What one client may cost is bounded: the items
//! and attributes of a request, the length of what is stored, the database queries of
//! `/healthz`, the connections from one address and the time an idle one is kept.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, any_value,
};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, Summary, SummaryDataPoint, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use pepsi_contract::telemetry::attr;
use pepsi_setup::schema::{self, Roles};
use pepsi_testkit::TestDb;
use prost::Message as _;
use serde_json::{Value, json};
use sqlx::Row as _;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::httpd::url_as;
use crate::support::ingress::TestCa;
use crate::support::{Running, free_port};

const RECEIVER: &str = env!("CARGO_BIN_EXE_pepsi-telemetry");
const TOKEN: &str = "mx1-6c1b2f0e9d8a7c6b5a49";
const PROTOBUF: &str = "application/x-protobuf";

/// A running pepsi-telemetry over a fresh database, and a client that trusts its CA.
struct Receiver {
    db: TestDb,
    _dir: tempfile::TempDir,
    log: PathBuf,
    port: u16,
    client: reqwest::Client,
    /// A TLS client of its own, for connections held open by hand.
    tls: tokio_rustls::TlsConnector,
    child: Running,
}

impl Receiver {
    /// Starts the receiver with `extra` options in its section, and waits for /healthz.
    async fn start(extra: &str) -> Receiver {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new(dir.path());
        let tokens = dir.path().join("tokens");
        std::fs::write(
            &tokens,
            format!("# the Pepsi hosts\n{TOKEN}\n\nmx2-0000000000000000aa\n"),
        )
        .unwrap();
        let port = free_port();
        let config = dir.path().join("pepsi-telemetry.conf");
        std::fs::write(
            &config,
            format!(
                "[pepsi-telemetry]\nLISTEN = 127.0.0.1:{port}\nTLS_CERT = {}\nTLS_KEY = {}\n\
                 TOKEN_FILE = {}\nDATABASE_URL = {}\nALLOW_ROOT = yes\n{extra}\n",
                ca.cert.display(),
                ca.key.display(),
                tokens.display(),
                url_as(&db.url, "pepsi-telemetry"),
            ),
        )
        .unwrap();
        let log = dir.path().join("pepsi-telemetry.log");
        let child = Command::new(RECEIVER)
            .arg("-c")
            .arg(&config)
            .args(["-L", "debug"])
            .env_remove("PEPSI_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let client = reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(&std::fs::read(&ca.ca).unwrap()).unwrap(),
            )
            .timeout(Duration::from_secs(20))
            .build()
            .unwrap();
        let mut receiver = Receiver {
            db,
            _dir: dir,
            log,
            port,
            client,
            tls: ca.connector(),
            child: Running(child),
        };
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = receiver.client.get(receiver.url("/healthz")).send().await
                && r.status() == 200
            {
                break;
            }
            if let Ok(Some(status)) = receiver.child.try_wait() {
                panic!("pepsi-telemetry exited {status}: {}", receiver.logs());
            }
            assert!(
                Instant::now() < until,
                "pepsi-telemetry did not answer /healthz: {}",
                receiver.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        receiver
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// POSTs `body` to `path` with `content_type` and, when given, the bearer `token`.
    async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: Vec<u8>,
    ) -> reqwest::Response {
        let mut r = self
            .client
            .post(self.url(path))
            .header("content-type", content_type)
            .body(body);
        if let Some(token) = token {
            r = r.bearer_auth(token);
        }
        r.send().await.unwrap()
    }

    /// Exports `request` and decodes the 200 answer.
    async fn traces(&self, request: &ExportTraceServiceRequest) -> ExportTraceServiceResponse {
        let r = self
            .post("/v1/traces", Some(TOKEN), PROTOBUF, request.encode_to_vec())
            .await;
        let (status, kind) = (r.status(), content_type(&r));
        let body = r.bytes().await.unwrap();
        assert_eq!(
            (status.as_u16(), kind.as_str()),
            (200, PROTOBUF),
            "{}\n{}",
            String::from_utf8_lossy(&body),
            self.logs()
        );
        ExportTraceServiceResponse::decode(body).unwrap()
    }

    async fn metrics(&self, request: &ExportMetricsServiceRequest) -> ExportMetricsServiceResponse {
        let r = self
            .post(
                "/v1/metrics",
                Some(TOKEN),
                PROTOBUF,
                request.encode_to_vec(),
            )
            .await;
        let (status, kind) = (r.status(), content_type(&r));
        let body = r.bytes().await.unwrap();
        assert_eq!(
            (status.as_u16(), kind.as_str()),
            (200, PROTOBUF),
            "{}\n{}",
            String::from_utf8_lossy(&body),
            self.logs()
        );
        ExportMetricsServiceResponse::decode(body).unwrap()
    }

    /// The number of spans and of metric points stored.
    async fn counts(&self) -> (i64, i64) {
        let spans: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.telemetry_span")
            .fetch_one(&self.db.pool)
            .await
            .unwrap();
        let points: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.telemetry_metric")
            .fetch_one(&self.db.pool)
            .await
            .unwrap();
        (spans, points)
    }
}

fn content_type(r: &reqwest::Response) -> String {
    r.headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// The status and the JSON error of a refused request.
async fn refused(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    assert_eq!(content_type(&r), "application/json", "status {status}");
    let body: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    let text = body["error"].as_str().expect("an error text").to_owned();
    (status, text)
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn text(value: &str) -> any_value::Value {
    any_value::Value::StringValue(value.into())
}

fn int(value: i64) -> any_value::Value {
    any_value::Value::IntValue(value)
}

/// The resource every export of a Pepsi host carries.
fn resource(host: &str) -> Option<Resource> {
    Some(Resource {
        attributes: vec![
            kv(attr::RESOURCE_SERVICE, text(attr::SERVICE_NAME)),
            kv(attr::RESOURCE_HOST, text(host)),
            kv(attr::PID, int(4242)),
        ],
        ..Default::default()
    })
}

fn nanos(t: chrono::DateTime<chrono::Utc>) -> u64 {
    t.timestamp_nanos_opt().unwrap() as u64
}

fn span(trace: u8, id: u8, parent: Option<u8>, name: &str, start: u64, ms: u64) -> Span {
    Span {
        trace_id: vec![trace; 16],
        span_id: vec![id; 8],
        parent_span_id: parent.map(|p| vec![p; 8]).unwrap_or_default(),
        name: name.into(),
        start_time_unix_nano: start,
        end_time_unix_nano: start + ms * 1_000_000,
        ..Default::default()
    }
}

fn traces_request(host: &str, spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: resource(host),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "pepsi".into(),
                    version: "0.1.0".into(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// A message's journey on mx1: the ingress accepts it, the route stage advances it, the
/// local delivery fails temporarily.
fn journey(start: u64) -> ExportTraceServiceRequest {
    let mut ingress = span(7, 1, None, "pepsi-ingress", start, 40);
    ingress.attributes = vec![
        kv(attr::PROGRAM, text("pepsi-ingress")),
        kv(attr::QUEUE_ID, int(41)),
        kv(attr::MESSAGE_ID, text("<journey@example.test>")),
        kv(attr::OUTCOME, text("accepted")),
        kv(attr::SIZE, int(1234)),
    ];
    let mut route = span(7, 2, Some(1), "route", start + 50_000_000, 3);
    route.attributes = vec![
        kv(attr::PROGRAM, text("pepsi-stage-route")),
        kv(attr::STAGE, text("route")),
        kv(attr::QUEUE_ID, int(41)),
        kv(attr::MESSAGE_ID, text("<journey@example.test>")),
        kv(attr::OUTCOME, text("advanced")),
        kv(attr::NEXT_STAGE, text("local")),
        kv(
            attr::RCPT_TO,
            any_value::Value::ArrayValue(ArrayValue {
                values: vec![AnyValue {
                    value: Some(text("alice@example.test")),
                }],
            }),
        ),
    ];
    let mut local = span(7, 3, Some(1), "local", start + 60_000_000, 12);
    local.attributes = vec![
        kv(attr::STAGE, text("local")),
        kv(attr::QUEUE_ID, int(41)),
        kv(attr::OUTCOME, text("deferred")),
        kv(attr::ERROR, text("mailbox locked")),
    ];
    local.status = Some(Status {
        code: 2,
        message: "mailbox locked".into(),
    });
    traces_request("mx1.example.test", vec![ingress, route, local])
}

#[tokio::test]
async fn exports_without_an_accepted_token_get_401_and_store_nothing() {
    let r = Receiver::start("").await;
    let body = journey(nanos(chrono::Utc::now())).encode_to_vec();
    for (path, token, challenge) in [
        ("/v1/traces", None, r#"Bearer realm="pepsi-telemetry""#),
        (
            "/v1/traces",
            Some("mx1-6c1b2f0e9d8a7c6b5a48"),
            r#"Bearer realm="pepsi-telemetry", error="invalid_token""#,
        ),
        ("/v1/metrics", None, r#"Bearer realm="pepsi-telemetry""#),
        (
            "/v1/metrics",
            Some(&TOKEN[..TOKEN.len() - 1]),
            r#"Bearer realm="pepsi-telemetry", error="invalid_token""#,
        ),
    ] {
        let resp = r.post(path, token, PROTOBUF, body.clone()).await;
        assert_eq!(
            resp.headers()["www-authenticate"].to_str().unwrap(),
            challenge,
            "{path} {token:?}"
        );
        let (status, error) = refused(resp).await;
        assert_eq!(status, 401, "{path} {token:?}: {error}");
        assert!(error.contains("bearer token"), "{error}");
    }
    // The scheme is any case; the second token of the file is as good as the first.
    let resp = r
        .client
        .post(r.url("/v1/traces"))
        .header("authorization", "bearer mx2-0000000000000000aa")
        .header("content-type", PROTOBUF)
        .body(ExportTraceServiceRequest::default().encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(r.counts().await, (0, 0));
}

#[tokio::test]
async fn three_spans_land_with_the_pepsi_facts_in_columns_and_a_retry_adds_nothing() {
    let r = Receiver::start("").await;
    let start = chrono::Utc::now() - chrono::Duration::seconds(5);
    let request = journey(nanos(start));
    let answer = r.traces(&request).await;
    assert_eq!(answer.partial_success, None, "all three taken");
    let rows = sqlx::query(
        "SELECT encode(trace_id, 'hex') AS trace, encode(span_id, 'hex') AS span, \
         encode(parent_span_id, 'hex') AS parent, name, service, host, stage, queue_id, \
         message_id, outcome, status_code, status_message, attributes, \
         (extract(epoch FROM end_time - start_time) * 1000)::int AS ms \
         FROM pepsi.telemetry_span ORDER BY start_time",
    )
    .fetch_all(&r.db.pool)
    .await
    .unwrap();
    type Columns = (
        String,
        Option<String>,
        String,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<i64>,
        Option<String>,
        Option<String>,
        i16,
        Option<String>,
        i32,
    );
    let columns: Vec<Columns> = rows
        .iter()
        .map(|row| {
            (
                row.get("span"),
                row.get("parent"),
                row.get("name"),
                row.get("service"),
                row.get("host"),
                row.get("stage"),
                row.get("queue_id"),
                row.get("message_id"),
                row.get("outcome"),
                row.get("status_code"),
                row.get("status_message"),
                row.get("ms"),
            )
        })
        .collect();
    let s = |v: &str| Some(v.to_owned());
    let pepsi = s("pepsi");
    let mx1 = s("mx1.example.test");
    assert_eq!(
        columns,
        [
            (
                "0101010101010101".to_owned(),
                None,
                "pepsi-ingress".to_owned(),
                pepsi.clone(),
                mx1.clone(),
                None,
                Some(41),
                s("<journey@example.test>"),
                s("accepted"),
                0,
                None,
                40,
            ),
            (
                "0202020202020202".to_owned(),
                s("0101010101010101"),
                "route".to_owned(),
                pepsi.clone(),
                mx1.clone(),
                s("route"),
                Some(41),
                s("<journey@example.test>"),
                s("advanced"),
                0,
                None,
                3,
            ),
            (
                "0303030303030303".to_owned(),
                s("0101010101010101"),
                "local".to_owned(),
                pepsi,
                mx1,
                s("local"),
                Some(41),
                None,
                s("deferred"),
                2,
                s("mailbox locked"),
                12,
            ),
        ]
    );
    for row in &rows {
        assert_eq!(row.get::<String, _>("trace"), "07".repeat(16));
    }
    // Every attribute is kept, the resource's and the scope's beside the span's own.
    let route: Value = rows[1].get("attributes");
    assert_eq!(
        route,
        json!({
            "service.name": "pepsi",
            "host.name": "mx1.example.test",
            "process.pid": 4242,
            "otel.scope.name": "pepsi",
            "otel.scope.version": "0.1.0",
            "pepsi.program": "pepsi-stage-route",
            "pepsi.stage": "route",
            "pepsi.queue_id": 41,
            "pepsi.message_id": "<journey@example.test>",
            "pepsi.outcome": "advanced",
            "pepsi.next_stage": "local",
            "pepsi.rcpt_to": ["alice@example.test"],
        })
    );

    // The client's retry of the same export: answered as before, nothing added.
    let again = r.traces(&request).await;
    assert_eq!(again.partial_success, None);
    assert_eq!(r.counts().await, (3, 0));

    // A span with a malformed id is rejected alone, and counted in the answer.
    let mut bad = span(8, 1, None, "short trace id", nanos(start), 1);
    bad.trace_id = vec![8; 5];
    let good = span(8, 2, None, "fine", nanos(start), 1);
    let answer = r
        .traces(&traces_request("mx2.example.test", vec![bad, good]))
        .await;
    let partial = answer.partial_success.expect("a partial success");
    assert_eq!(partial.rejected_spans, 1);
    assert!(
        partial.error_message.starts_with(
            "1 span rejected; the first: span \"short trace id\": trace_id of 5 bytes"
        ),
        "{}",
        partial.error_message
    );
    assert_eq!(r.counts().await, (4, 0));
    let host: Option<String> =
        sqlx::query_scalar("SELECT host FROM pepsi.telemetry_span WHERE name = 'fine'")
            .fetch_one(&r.db.pool)
            .await
            .unwrap();
    assert_eq!(host.as_deref(), Some("mx2.example.test"));
}

fn number(value: f64, time: u64, attributes: Vec<KeyValue>) -> NumberDataPoint {
    NumberDataPoint {
        attributes,
        time_unix_nano: time,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    }
}

fn metrics_request(time: u64) -> ExportMetricsServiceRequest {
    let passes = Metric {
        name: "pepsi.stage.passes".into(),
        unit: "{pass}".into(),
        data: Some(metric::Data::Sum(Sum {
            data_points: vec![NumberDataPoint {
                value: Some(number_data_point::Value::AsInt(17)),
                ..number(0.0, time, vec![kv(attr::STAGE, text("route"))])
            }],
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        })),
        ..Default::default()
    };
    let queue = Metric {
        name: "pepsi.queue.pending".into(),
        data: Some(metric::Data::Gauge(Gauge {
            data_points: vec![number(3.0, time, vec![kv(attr::STAGE, text("local"))])],
        })),
        ..Default::default()
    };
    let latency = Metric {
        name: "pepsi.stage.duration".into(),
        unit: "s".into(),
        data: Some(metric::Data::Histogram(Histogram {
            data_points: vec![HistogramDataPoint {
                attributes: vec![kv(attr::STAGE, text("route"))],
                time_unix_nano: time,
                count: 6,
                sum: Some(0.75),
                bucket_counts: vec![2, 3, 1],
                explicit_bounds: vec![0.05, 0.25],
                ..Default::default()
            }],
            aggregation_temporality: AggregationTemporality::Delta as i32,
        })),
        ..Default::default()
    };
    let summary = Metric {
        name: "x.summary".into(),
        data: Some(metric::Data::Summary(Summary {
            data_points: vec![SummaryDataPoint {
                time_unix_nano: time,
                count: 1,
                sum: 1.0,
                ..Default::default()
            }],
        })),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: resource("mx1.example.test"),
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![passes, queue, latency, summary],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[tokio::test]
async fn sum_gauge_and_histogram_points_land_and_a_summary_is_counted_as_rejected() {
    let r = Receiver::start("").await;
    let answer = r.metrics(&metrics_request(nanos(chrono::Utc::now()))).await;
    let partial = answer.partial_success.expect("the summary is rejected");
    assert_eq!(partial.rejected_data_points, 1);
    assert!(
        partial
            .error_message
            .starts_with("1 data point rejected; the first: metric \"x.summary\": a summary"),
        "{}",
        partial.error_message
    );
    let rows = sqlx::query(
        "SELECT name, service, host, kind, unit, value, count, sum, bounds, bucket_counts, \
         attributes FROM pepsi.telemetry_metric ORDER BY metric_id",
    )
    .fetch_all(&r.db.pool)
    .await
    .unwrap();
    type Point = (
        String,
        Option<String>,
        Option<String>,
        String,
        Option<String>,
        Option<f64>,
        Option<i64>,
        Option<f64>,
        Option<Vec<f64>>,
        Option<Vec<i64>>,
    );
    let points: Vec<Point> = rows
        .iter()
        .map(|row| {
            (
                row.get("name"),
                row.get("service"),
                row.get("host"),
                row.get("kind"),
                row.get("unit"),
                row.get("value"),
                row.get("count"),
                row.get("sum"),
                row.get("bounds"),
                row.get("bucket_counts"),
            )
        })
        .collect();
    let s = |v: &str| Some(v.to_owned());
    assert_eq!(
        points,
        [
            (
                "pepsi.stage.passes".to_owned(),
                s("pepsi"),
                s("mx1.example.test"),
                "sum".to_owned(),
                s("{pass}"),
                Some(17.0),
                None,
                None,
                None,
                None,
            ),
            (
                "pepsi.queue.pending".to_owned(),
                s("pepsi"),
                s("mx1.example.test"),
                "gauge".to_owned(),
                None,
                Some(3.0),
                None,
                None,
                None,
                None,
            ),
            (
                "pepsi.stage.duration".to_owned(),
                s("pepsi"),
                s("mx1.example.test"),
                "histogram".to_owned(),
                s("s"),
                None,
                Some(6),
                Some(0.75),
                Some(vec![0.05, 0.25]),
                Some(vec![2, 3, 1]),
            ),
        ]
    );
    let sum: Value = rows[0].get("attributes");
    assert_eq!(sum["pepsi.stage"], "route");
    assert_eq!(sum["otel.metric.temporality"], "cumulative");
    assert_eq!(sum["otel.metric.monotonic"], true);
    assert_eq!(sum["process.pid"], 4242);
}

#[tokio::test]
async fn wrong_media_types_garbage_and_oversized_bodies_are_refused_and_gzip_is_taken() {
    let r = Receiver::start("MAX_BODY = 16k\n").await;
    let body = journey(nanos(chrono::Utc::now())).encode_to_vec();
    let cases: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        (
            "/v1/traces",
            "application/json",
            b"{}".to_vec(),
            415,
            "OTLP's JSON encoding is not taken here",
        ),
        (
            "/v1/metrics",
            "text/plain",
            body.clone(),
            415,
            "Content-Type \"text/plain\": expected application/x-protobuf",
        ),
        (
            "/v1/traces",
            PROTOBUF,
            b"\xff\xff\xff\xffnot protobuf".to_vec(),
            400,
            "the body is not a protobuf ExportTraceServiceRequest",
        ),
        (
            "/v1/metrics",
            PROTOBUF,
            b"\x0a\x05ab".to_vec(),
            400,
            "the body is not a protobuf ExportMetricsServiceRequest",
        ),
        (
            "/v1/traces",
            PROTOBUF,
            vec![0; 32 * 1024],
            413,
            "the body is larger than MAX_BODY (16384 bytes)",
        ),
    ];
    for (path, kind, bytes, status, want) in cases {
        let (got, error) = refused(r.post(path, Some(TOKEN), kind, bytes).await).await;
        assert_eq!(got, status, "{path} {kind}: {error}");
        assert!(error.contains(want), "{path} {kind}: {error}");
    }
    // A content type with parameters is the same type.
    let resp = r
        .post(
            "/v1/traces",
            Some(TOKEN),
            "Application/X-Protobuf; charset=binary",
            ExportTraceServiceRequest::default().encode_to_vec(),
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(r.counts().await, (0, 0), "nothing refused was stored");

    // gzip, as an OpenTelemetry Collector sends by default; and a gzip body that unpacks
    // beyond MAX_BODY is refused like a large one.
    let gzip = |bytes: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    };
    let send = |bytes: Vec<u8>| {
        r.client
            .post(r.url("/v1/traces"))
            .bearer_auth(TOKEN)
            .header("content-type", PROTOBUF)
            .header("content-encoding", "gzip")
            .body(bytes)
            .send()
    };
    let resp = send(gzip(&body)).await.unwrap();
    assert_eq!(resp.status(), 200, "{}", r.logs());
    assert_eq!(r.counts().await, (3, 0));
    let (status, error) = refused(send(gzip(&vec![0; 64 * 1024])).await.unwrap()).await;
    assert_eq!((status, error.contains("MAX_BODY")), (413, true), "{error}");
    let (status, error) = refused(send(body).await.unwrap()).await;
    assert_eq!(status, 400, "{error}");
    assert!(error.contains("not gzip"), "{error}");

    // Elsewhere: 404 and 405 with what is served.
    let (status, error) = refused(r.client.get(r.url("/v1/logs")).send().await.unwrap()).await;
    assert_eq!(status, 404, "{error}");
    assert!(error.contains("POST /v1/traces"), "{error}");
    let (status, _) = refused(r.client.get(r.url("/v1/traces")).send().await.unwrap()).await;
    assert_eq!(status, 405);
}

#[tokio::test]
async fn the_running_receiver_deletes_what_is_past_its_retention_and_keeps_the_rest() {
    let r = Receiver::start("RETENTION = 1d\nRETENTION_SWEEP = 200ms\nRETENTION_BATCH = 2\n").await;
    let now = chrono::Utc::now();
    let old = now - chrono::Duration::days(3);
    // Five old spans (more than one batch) and one of now; an old and a new point.
    let mut spans: Vec<Span> = (1..=5)
        .map(|i| span(9, i, None, "old", nanos(old), 5))
        .collect();
    spans.push(span(9, 6, None, "new", nanos(now), 5));
    r.traces(&traces_request("mx1.example.test", spans)).await;
    let mut points = metrics_request(nanos(old));
    points.resource_metrics[0].scope_metrics[0]
        .metrics
        .truncate(2);
    let mut gauge = metrics_request(nanos(now));
    gauge.resource_metrics[0].scope_metrics[0].metrics =
        vec![gauge.resource_metrics[0].scope_metrics[0].metrics[1].clone()];
    r.metrics(&points).await;
    r.metrics(&gauge).await;
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let old_spans: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pepsi.telemetry_span WHERE name = 'old'")
                .fetch_one(&r.db.pool)
                .await
                .unwrap();
        let old_points: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pepsi.telemetry_metric WHERE time < now() - interval '1 day'",
        )
        .fetch_one(&r.db.pool)
        .await
        .unwrap();
        if old_spans == 0 && old_points == 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "still {old_spans} old spans and {old_points} old points:\n{}",
            r.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(r.counts().await, (1, 1), "what is within RETENTION stays");
    let name: String = sqlx::query_scalar("SELECT name FROM pepsi.telemetry_span")
        .fetch_one(&r.db.pool)
        .await
        .unwrap();
    assert_eq!(name, "new");
    assert!(
        r.logs().contains("deleted what ended before"),
        "{}",
        r.logs()
    );
}

/// Runs `sql` connected as the `pepsi-telemetry` role, as the daemon connects; the SQLSTATE
/// on failure.
async fn as_telemetry(db: &TestDb, sql: &str) -> Result<(), String> {
    use sqlx::Connection as _;
    let mut c = sqlx::PgConnection::connect(&url_as(&db.url, "pepsi-telemetry"))
        .await
        .unwrap();
    let r = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut c)
        .await;
    r.map(drop).map_err(|e| match e {
        sqlx::Error::Database(d) => d.code().unwrap_or_default().into_owned(),
        other => other.to_string(),
    })
}

#[tokio::test]
async fn the_telemetry_role_reaches_its_own_tables_and_nothing_else() {
    let db = TestDb::new().await;
    let check = schema::check(&db.url, &Roles::default()).await.unwrap();
    assert!(check.is_current(), "pepsi-setup's verification: {check:?}");
    let mut denied = vec![
        "SELECT * FROM pepsi.workqueue".to_owned(),
        "SELECT * FROM pepsi.workqueue_body".to_owned(),
        "SELECT * FROM pepsi.crypto_identity".to_owned(),
        "SELECT identity_id, address FROM pepsi.crypto_identity".to_owned(),
        "SELECT private_wrapped FROM pepsi.crypto_identity".to_owned(),
        "SELECT * FROM pepsi.config_override".to_owned(),
        "SELECT * FROM pepsi.mail_log".to_owned(),
        "INSERT INTO pepsi.workqueue_body (body) VALUES ('x'::bytea)".to_owned(),
        "UPDATE pepsi.telemetry_span SET name = 'x'".to_owned(),
        "UPDATE pepsi.telemetry_metric SET name = 'x'".to_owned(),
        "DELETE FROM pepsi.schema_patch".to_owned(),
    ];
    for table in schema::CREDENTIAL_TABLES {
        denied.push(format!("SELECT * FROM pepsi.{table}"));
    }
    for sql in &denied {
        assert_eq!(
            as_telemetry(&db, sql).await,
            Err("42501".to_owned()),
            "{sql}"
        );
    }
    for sql in [
        "SELECT * FROM pepsi.schema_patch",
        "INSERT INTO pepsi.telemetry_span (trace_id, span_id, name, start_time, end_time) \
         VALUES (decode(repeat('ab', 16), 'hex'), decode(repeat('cd', 8), 'hex'), 'x', now(), now())",
        "SELECT * FROM pepsi.telemetry_span",
        "DELETE FROM pepsi.telemetry_span",
        "INSERT INTO pepsi.telemetry_metric (name, kind, time, value) VALUES ('x', 'gauge', now(), 1)",
        "SELECT * FROM pepsi.telemetry_metric",
        "DELETE FROM pepsi.telemetry_metric",
    ] {
        assert_eq!(as_telemetry(&db, sql).await, Ok(()), "{sql}");
    }
}

#[tokio::test]
async fn it_refuses_to_start_without_a_usable_token_file_naming_it() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("tokens");
    std::fs::write(&empty, "# nobody yet\n\n").unwrap();
    let url = url_as(&db.url, "pepsi-telemetry");
    for (tokens, want) in [
        (
            Some(&empty),
            format!("TOKEN_FILE {}: holds no token", empty.display()),
        ),
        (None, "[pepsi-telemetry] TOKEN_FILE is not set".to_owned()),
    ] {
        let config = dir.path().join("t.conf");
        let token_line = tokens
            .map(|t| format!("TOKEN_FILE = {}\n", t.display()))
            .unwrap_or_default();
        std::fs::write(
            &config,
            format!(
                "[pepsi-telemetry]\nLISTEN = 127.0.0.1:{}\n{token_line}DATABASE_URL = {url}\nALLOW_ROOT = yes\n",
                free_port()
            ),
        )
        .unwrap();
        for command in [&["serve"][..], &["check"][..]] {
            let out = Command::new(RECEIVER)
                .arg("-c")
                .arg(&config)
                .args(command)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{command:?}: {err}");
            assert!(err.contains(&want), "{command:?}: {err}");
        }
    }
    // With a token, `check` reaches the database as the role and says so.
    std::fs::write(&empty, format!("{TOKEN}\n")).unwrap();
    let config = dir.path().join("t.conf");
    std::fs::write(
        &config,
        format!(
            "[pepsi-telemetry]\nTOKEN_FILE = {}\nDATABASE_URL = {url}\n",
            empty.display()
        ),
    )
    .unwrap();
    let out = Command::new(RECEIVER)
        .arg("-c")
        .arg(&config)
        .arg("check")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("tokens: 1 accepted"), "{said}");
    assert!(said.contains("answers, with pepsi-0027"), "{said}");
}

/// `count` spans of trace `trace`, ids 1 to `count`, named `name`.
fn many_spans(trace: u8, count: u64, name: &str) -> Vec<Span> {
    let start = nanos(chrono::Utc::now());
    (1..=count)
        .map(|i| Span {
            trace_id: vec![trace; 16],
            span_id: i.to_be_bytes().to_vec(),
            name: name.into(),
            start_time_unix_nano: start,
            end_time_unix_nano: start + 1_000,
            ..Default::default()
        })
        .collect()
}

async fn spans_named(r: &Receiver, name: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pepsi.telemetry_span WHERE name = $1")
        .bind(name)
        .fetch_one(&r.db.pool)
        .await
        .unwrap()
}

/// Guards the per-request bounds: every span of a request was converted and stored, the
/// resource's attributes copied into each, however many.
#[tokio::test]
async fn fifty_thousand_spans_under_a_large_resource_are_answered_storing_max_items() {
    let r = Receiver::start("").await;
    // 300 resource attributes: the first 128 are kept in every row, the rest counted.
    let mut request = traces_request("mx1.example.test", many_spans(5, 50_000, "tiny"));
    let resource = request.resource_spans[0].resource.as_mut().unwrap();
    resource
        .attributes
        .extend((0..297).map(|i| kv(&format!("r.{i:03}"), text("a resource attribute"))));
    let answer = r.traces(&request).await;
    let partial = answer.partial_success.expect("a partial success");
    assert_eq!(partial.rejected_spans, 40_000);
    assert!(
        partial.error_message.starts_with(
            "40000 spans rejected; the first: 40000 spans beyond MAX_ITEMS (10000 a request)"
        ),
        "{}",
        partial.error_message
    );
    assert_eq!(spans_named(&r, "tiny").await, 10_000);
    let (keys, dropped, last_kept, first_dropped): (i64, i64, bool, bool) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM jsonb_object_keys(attributes)), \
         (attributes->>'otel.dropped_attributes_count')::int8, attributes ? 'r.124', \
         attributes ? 'r.125' FROM pepsi.telemetry_span LIMIT 1",
    )
    .fetch_one(&r.db.pool)
    .await
    .unwrap();
    // 128 of the resource, the scope's name and version, and the count of the 172 left out.
    assert_eq!(
        (keys, dropped, last_kept, first_dropped),
        (131, 172, true, false)
    );

    // A resource of 128 strings of 10 KB (each cut to 4 KiB) under 1000 spans: the rows
    // would hold half a gigabyte of copies; those beyond 16 x MAX_BODY are rejected.
    let mut request = traces_request("mx1.example.test", many_spans(6, 1000, "heavy"));
    request.resource_spans[0]
        .resource
        .as_mut()
        .unwrap()
        .attributes = (0..128)
        .map(|i| kv(&format!("big.{i:03}"), text(&"x".repeat(10_000))))
        .collect();
    let answer = r.traces(&request).await;
    let partial = answer.partial_success.expect("a partial success");
    let stored = spans_named(&r, "heavy").await;
    assert!(0 < stored && stored < 1000, "{stored} stored");
    assert_eq!(partial.rejected_spans, 1000 - stored);
    assert!(
        partial
            .error_message
            .contains("bytes of attributes one request may store; export smaller batches"),
        "{}",
        partial.error_message
    );
    let longest: i32 = sqlx::query_scalar(
        "SELECT max(octet_length(value)) FROM pepsi.telemetry_span, \
         jsonb_each_text(attributes) WHERE name = 'heavy'",
    )
    .fetch_one(&r.db.pool)
    .await
    .unwrap();
    assert_eq!(longest, 4096);
}

/// Guards the 503 loop: a text too long for its column's index failed the whole
/// transaction, and the client sent the same request again for ever.
#[tokio::test]
async fn a_span_with_a_10_kb_message_id_and_stage_is_rejected_alone_and_long_texts_are_cut() {
    let r = Receiver::start("").await;
    let start = nanos(chrono::Utc::now());
    let mut before = span(4, 1, None, "before", start, 1);
    before.attributes = vec![kv(attr::MESSAGE_ID, text("<fine@example.test>"))];
    let mut huge = span(4, 2, None, "huge", start, 1);
    huge.attributes = vec![
        kv(
            attr::MESSAGE_ID,
            text(&format!("<{}@example.test>", "m".repeat(10_000))),
        ),
        kv(attr::STAGE, text(&"s".repeat(10_000))),
    ];
    // A long name, status message and attribute are cut, on a character boundary.
    let long_name = format!("a{}", "é".repeat(5_000));
    let mut after = span(4, 3, None, &long_name, start, 1);
    after.attributes = vec![kv(attr::ERROR, text(&"e".repeat(10_000)))];
    after.status = Some(Status {
        code: 2,
        message: "z".repeat(10_000),
    });
    let request = traces_request("mx1.example.test", vec![before, huge, after]);
    for _ in 0..2 {
        // The same answer when the client tries again: never a 503.
        let answer = r.traces(&request).await;
        let partial = answer.partial_success.expect("a partial success");
        assert_eq!(partial.rejected_spans, 1);
        assert!(
            partial
                .error_message
                .starts_with("1 span rejected; the first: span \"huge\": pepsi.stage \"ssss"),
            "{}",
            partial.error_message
        );
        assert!(
            partial.error_message.len() < 300,
            "{}",
            partial.error_message
        );
        assert_eq!(r.counts().await, (2, 0));
    }
    let (name, message_id, error, status): (String, Option<String>, i32, i32) = sqlx::query_as(
        "SELECT name, (SELECT message_id FROM pepsi.telemetry_span WHERE name = 'before'), \
         octet_length(attributes->>'pepsi.error'), octet_length(status_message) \
         FROM pepsi.telemetry_span WHERE name <> 'before'",
    )
    .fetch_one(&r.db.pool)
    .await
    .unwrap();
    assert_eq!(name.len(), 255);
    assert!(long_name.starts_with(&name));
    assert_eq!(message_id.as_deref(), Some("<fine@example.test>"));
    assert_eq!((error, status), (4096, 4096));
}

/// Guards the pool against unauthenticated callers: every /healthz ran a query on it.
#[tokio::test]
async fn many_concurrent_healthz_calls_leave_exports_working() {
    let r = Receiver::start("DATABASE_MAX_CONNECTIONS = 1\n").await;
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (client, url) = (r.client.clone(), r.url("/healthz"));
        callers.spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..25 {
                let resp = client.get(&url).send().await.unwrap();
                let closes = resp
                    .headers()
                    .get("connection")
                    .map(|v| v.to_str().unwrap().to_owned());
                statuses.push((resp.status().as_u16(), closes));
            }
            statuses
        });
    }
    let start = chrono::Utc::now() - chrono::Duration::seconds(5);
    let answer = r.traces(&journey(nanos(start))).await;
    assert_eq!(answer.partial_success, None);
    while let Some(statuses) = callers.join_next().await {
        for status in statuses.unwrap() {
            assert_eq!(status, (200, Some("close".to_owned())));
        }
    }
    assert_eq!(r.counts().await, (3, 0));
    // What needs no token closes its connection, as a refusal does.
    for resp in [
        r.client.get(r.url("/nowhere")).send().await.unwrap(),
        r.post("/v1/traces", None, PROTOBUF, Vec::new()).await,
    ] {
        assert_eq!(
            (
                resp.status().as_u16() / 100,
                resp.headers()["connection"].to_str().unwrap()
            ),
            (4, "close")
        );
    }
}

/// The answer to `request` on `stream`: its head and body.
async fn exchange(
    stream: &mut (impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin),
    request: &str,
) -> (String, Vec<u8>) {
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed after {got:?}");
        got.extend_from_slice(&chunk[..n]);
        let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        if got.len() >= end + 4 + length {
            return (head, got[end + 4..end + 4 + length].to_vec());
        }
    }
}

/// Whether the server closes `stream` (an end of stream or a reset) before `failsafe`.
async fn closed_by_server(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    failsafe: Duration,
) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(failsafe, stream.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn a_third_connection_from_one_address_is_closed_while_two_are_held() {
    let r = Receiver::start("MAX_CONNECTIONS_PER_ADDRESS = 2\nHEADER_TIMEOUT = 60s\n").await;
    let handshake = || async {
        let tcp = TcpStream::connect(("127.0.0.1", r.port)).await.unwrap();
        r.tls.connect("localhost".try_into().unwrap(), tcp).await
    };
    // Two connections through their TLS handshake: the server holds both. (The connection
    // of the start's /healthz may take a moment to be counted out.)
    let until = Instant::now() + Duration::from_secs(20);
    let (mut first, mut second) = loop {
        if let (Ok(a), Ok(b)) = (handshake().await, handshake().await) {
            break (a, b);
        }
        assert!(
            Instant::now() < until,
            "two connections are not held: {}",
            r.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut third = TcpStream::connect(("127.0.0.1", r.port)).await.unwrap();
    assert!(
        closed_by_server(&mut third, Duration::from_secs(20)).await,
        "a third connection from 127.0.0.1 was kept: {}",
        r.logs()
    );
    assert!(handshake().await.is_err(), "nor with TLS");
    assert!(
        r.logs()
            .contains("MAX_CONNECTIONS_PER_ADDRESS (2) from that address already"),
        "{}",
        r.logs()
    );
    // The two held are served.
    for held in [&mut first, &mut second] {
        let (head, body) = exchange(held, "GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n").await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert_eq!(body, br#"{"status":"ok"}"#);
    }
    // Once they are gone, a fresh connection is served.
    drop((first, second));
    loop {
        if let Ok(resp) = r.client.get(r.url("/healthz")).send().await
            && resp.status() == 200
        {
            break;
        }
        assert!(
            Instant::now() < until,
            "no fresh connection served: {}",
            r.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Guards against keep-alive connections held for ever: HEADER_TIMEOUT is a minute here,
/// so only IDLE_TIMEOUT can close the answered connection.
#[tokio::test]
async fn an_answered_connection_that_stays_silent_is_closed_after_idle_timeout() {
    let r = Receiver::start("HEADER_TIMEOUT = 60s\nIDLE_TIMEOUT = 1s\n").await;
    let tcp = TcpStream::connect(("127.0.0.1", r.port)).await.unwrap();
    let mut tls = r
        .tls
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let export = format!(
        "POST /v1/traces HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {TOKEN}\r\n\
         content-type: {PROTOBUF}\r\ncontent-length: 0\r\n\r\n"
    );
    // Kept alive across answers...
    for _ in 0..2 {
        let (head, body) = exchange(&mut tls, &export).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
        assert_eq!(
            ExportTraceServiceResponse::decode(body.as_slice())
                .unwrap()
                .partial_success,
            None
        );
    }
    // ...and closed once silent.
    assert!(
        closed_by_server(&mut tls, Duration::from_secs(30)).await,
        "the idle connection was kept: {}",
        r.logs()
    );
}
