//! What an OTLP export request holds, as the rows of `pepsi.telemetry_span` and
//! `pepsi.telemetry_metric` (pepsi-0027.sql), with the items that cannot be stored counted
//! as rejected and the first reason kept for the answer's `partial_success`. Pure: no I/O.
//!
//! Attributes: `attributes` holds the resource's attributes, the instrumentation scope's
//! name and version (`otel.scope.name`, `otel.scope.version`) and the span's or point's
//! own attributes in one flat object, the item's own winning over the resource's when a name
//! is in both. Sums and histograms add `otel.metric.temporality` (`delta`, `cumulative`)
//! and sums `otel.metric.monotonic`. The Pepsi facts (`pepsi_contract::telemetry::attr`)
//! are lifted from that object into columns, and stay in it too.
//!
//! Values: strings, booleans, integers and arrays and key-value lists as JSON; a double
//! that is not finite as its text (`NaN`, `inf`), bytes as lower-case hex. PostgreSQL keeps
//! no NUL in text or jsonb, so a NUL anywhere in a string becomes U+FFFD.

use chrono::{DateTime, Utc};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, HistogramDataPoint, NumberDataPoint, metric::Data, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use pepsi_contract::telemetry::attr;
use serde_json::{Map, Value};

/// One row of `pepsi.telemetry_span`: the contract's type, which pepsi-httpd reads back.
pub use pepsi_contract::telemetry::SpanRow;

/// The kinds of `pepsi.telemetry_metric.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sum,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sum => "sum",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One row of `pepsi.telemetry_metric`: a sum's or gauge's `value`, or a histogram's
/// `count`, `sum`, `bounds` and `bucket_counts`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricRow {
    pub name: String,
    pub service: Option<String>,
    pub host: Option<String>,
    pub kind: Kind,
    pub unit: Option<String>,
    pub attributes: Value,
    pub time: DateTime<Utc>,
    pub value: Option<f64>,
    pub count: Option<i64>,
    pub sum: Option<f64>,
    pub bounds: Option<Vec<f64>>,
    pub bucket_counts: Option<Vec<i64>>,
}

/// The rows of one request and what was left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Converted<R> {
    pub rows: Vec<R>,
    /// Items (spans, data points) that cannot be stored.
    pub rejected: i64,
    /// Why the first of them was rejected.
    pub first_problem: Option<String>,
}

impl<R> Converted<R> {
    fn new() -> Self {
        Converted {
            rows: Vec::new(),
            rejected: 0,
            first_problem: None,
        }
    }

    fn reject(&mut self, n: usize, why: impl FnOnce() -> String) {
        if n == 0 {
            return;
        }
        self.rejected += i64::try_from(n).unwrap_or(i64::MAX);
        if self.first_problem.is_none() {
            self.first_problem = Some(why());
        }
    }

    /// The `partial_success.error_message` of the answer: how many were rejected, and the
    /// first reason; None when nothing was.
    pub fn error_message(&self, items: &str) -> Option<String> {
        let first = self.first_problem.as_deref()?;
        Some(format!(
            "{} {items} rejected; the first: {first}",
            self.rejected
        ))
    }
}

/// `text` without NUL characters, which PostgreSQL's text and jsonb cannot hold.
fn clean(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// An attribute value as JSON.
fn json(value: Option<AnyValue>) -> Value {
    use any_value::Value as V;
    match value.and_then(|v| v.value) {
        None | Some(V::StringValueStrindex(_)) => Value::Null,
        Some(V::StringValue(s)) => Value::String(clean(s)),
        Some(V::BoolValue(b)) => Value::Bool(b),
        Some(V::IntValue(i)) => Value::from(i),
        Some(V::DoubleValue(d)) => serde_json::Number::from_f64(d)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(d.to_string())),
        Some(V::ArrayValue(a)) => {
            Value::Array(a.values.into_iter().map(|v| json(Some(v))).collect())
        }
        Some(V::KvlistValue(kv)) => {
            let mut map = Map::new();
            put(&mut map, kv.values);
            Value::Object(map)
        }
        Some(V::BytesValue(b)) => Value::String(hex(&b)),
    }
}

/// Adds `attributes` to `map`, replacing what it holds under the same names.
fn put(map: &mut Map<String, Value>, attributes: Vec<KeyValue>) {
    for kv in attributes {
        map.insert(clean(kv.key), json(kv.value));
    }
}

/// The attributes every item of a resource and scope starts from.
fn base(resource: Option<Resource>, scope: Option<&InstrumentationScope>) -> Map<String, Value> {
    let mut map = Map::new();
    if let Some(resource) = resource {
        put(&mut map, resource.attributes);
    }
    if let Some(scope) = scope {
        for (key, text) in [
            ("otel.scope.name", &scope.name),
            ("otel.scope.version", &scope.version),
        ] {
            if !text.is_empty() {
                map.insert(key.to_owned(), Value::String(clean(text.clone())));
            }
        }
    }
    map
}

fn text(map: &Map<String, Value>, key: &str) -> Option<String> {
    map.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// `pepsi.queue_id`: an integer, or a string of one.
fn queue_id(map: &Map<String, Value>) -> Option<i64> {
    match map.get(attr::QUEUE_ID)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A time in nanoseconds since the epoch; 0 (unset) and what PostgreSQL cannot hold are
/// None.
fn time(nanos: u64) -> Option<DateTime<Utc>> {
    if nanos == 0 {
        return None;
    }
    i64::try_from(nanos)
        .ok()
        .map(DateTime::from_timestamp_nanos)
}

fn nonzero(id: &[u8]) -> bool {
    id.iter().any(|&b| b != 0)
}

/// Why `span` cannot be stored, or its row.
fn span_row(span: Span, base: &Map<String, Value>) -> Result<SpanRow, String> {
    let name = clean(span.name);
    let what = |problem: String| format!("span {name:?}: {problem}");
    if span.trace_id.len() != 16 || !nonzero(&span.trace_id) {
        return Err(what(format!(
            "trace_id of {} bytes{} (expected 16, not all zero)",
            span.trace_id.len(),
            if nonzero(&span.trace_id) {
                ""
            } else {
                ", all zero"
            }
        )));
    }
    if span.span_id.len() != 8 || !nonzero(&span.span_id) {
        return Err(what(format!(
            "span_id of {} bytes{} (expected 8, not all zero)",
            span.span_id.len(),
            if nonzero(&span.span_id) {
                ""
            } else {
                ", all zero"
            }
        )));
    }
    let parent_span_id = match span.parent_span_id.len() {
        0 => None,
        8 if nonzero(&span.parent_span_id) => Some(span.parent_span_id),
        8 => None,
        n => {
            return Err(what(format!(
                "parent_span_id of {n} bytes (expected 8, or none for a root span)"
            )));
        }
    };
    let (Some(start_time), Some(end_time)) = (
        time(span.start_time_unix_nano),
        time(span.end_time_unix_nano),
    ) else {
        return Err(what(format!(
            "start {} and end {}: both must be set (nanoseconds since 1970, before 2262)",
            span.start_time_unix_nano, span.end_time_unix_nano
        )));
    };
    if end_time < start_time {
        return Err(what(format!(
            "ends ({}) before it starts ({})",
            span.end_time_unix_nano, span.start_time_unix_nano
        )));
    }
    let (status_code, status_message) = match span.status {
        Some(s) => (s.code, Some(clean(s.message)).filter(|m| !m.is_empty())),
        None => (0, None),
    };
    let status_code = match i16::try_from(status_code) {
        Ok(c @ 0..=2) => c,
        _ => {
            return Err(what(format!(
                "status code {status_code} (expected 0 unset, 1 ok or 2 error)"
            )));
        }
    };
    let mut map = base.clone();
    put(&mut map, span.attributes);
    Ok(SpanRow {
        trace_id: span.trace_id,
        span_id: span.span_id,
        parent_span_id,
        name,
        service: text(&map, attr::RESOURCE_SERVICE),
        host: text(&map, attr::RESOURCE_HOST),
        stage: text(&map, attr::STAGE),
        queue_id: queue_id(&map),
        message_id: text(&map, attr::MESSAGE_ID),
        outcome: text(&map, attr::OUTCOME),
        start_time,
        end_time,
        attributes: Value::Object(map),
        status_code,
        status_message,
    })
}

/// The spans of a traces request.
pub fn spans(request: ExportTraceServiceRequest) -> Converted<SpanRow> {
    let mut out = Converted::new();
    for resource_spans in request.resource_spans {
        for scope_spans in resource_spans.scope_spans {
            let base = base(resource_spans.resource.clone(), scope_spans.scope.as_ref());
            for span in scope_spans.spans {
                match span_row(span, &base) {
                    Ok(row) => out.rows.push(row),
                    Err(why) => out.reject(1, || why),
                }
            }
        }
    }
    out
}

/// What every point of one metric shares.
struct MetricInfo {
    name: String,
    unit: Option<String>,
    kind: Kind,
    /// `otel.metric.*` attributes of the metric (temporality, monotonic).
    extra: Vec<(&'static str, Value)>,
}

fn temporality(t: i32) -> Value {
    Value::String(
        match AggregationTemporality::try_from(t) {
            Ok(AggregationTemporality::Delta) => "delta",
            Ok(AggregationTemporality::Cumulative) => "cumulative",
            _ => "unspecified",
        }
        .to_owned(),
    )
}

/// The row of a point with `attributes` at `time_unix_nano`, its values not set yet.
fn point_row(
    info: &MetricInfo,
    base: &Map<String, Value>,
    attributes: Vec<KeyValue>,
    time_unix_nano: u64,
) -> Result<MetricRow, String> {
    let Some(time) = time(time_unix_nano) else {
        return Err(format!(
            "metric {:?}: a point at {time_unix_nano} (expected nanoseconds since 1970, before 2262)",
            info.name
        ));
    };
    let mut map = base.clone();
    for (key, value) in &info.extra {
        map.insert((*key).to_owned(), value.clone());
    }
    put(&mut map, attributes);
    Ok(MetricRow {
        name: info.name.clone(),
        service: text(&map, attr::RESOURCE_SERVICE),
        host: text(&map, attr::RESOURCE_HOST),
        kind: info.kind,
        unit: info.unit.clone(),
        attributes: Value::Object(map),
        time,
        value: None,
        count: None,
        sum: None,
        bounds: None,
        bucket_counts: None,
    })
}

fn number_row(
    info: &MetricInfo,
    base: &Map<String, Value>,
    p: NumberDataPoint,
) -> Result<MetricRow, String> {
    let value = match p.value {
        Some(number_data_point::Value::AsDouble(d)) => d,
        Some(number_data_point::Value::AsInt(i)) => i as f64,
        None => return Err(format!("metric {:?}: a point without a value", info.name)),
    };
    let mut row = point_row(info, base, p.attributes, p.time_unix_nano)?;
    row.value = Some(value);
    Ok(row)
}

fn histogram_row(
    info: &MetricInfo,
    base: &Map<String, Value>,
    p: HistogramDataPoint,
) -> Result<MetricRow, String> {
    let name = &info.name;
    if p.bucket_counts.len() != p.explicit_bounds.len() + 1 && !p.bucket_counts.is_empty() {
        return Err(format!(
            "metric {name:?}: {} bucket counts for {} bounds (expected one more count than bounds)",
            p.bucket_counts.len(),
            p.explicit_bounds.len()
        ));
    }
    if p.bucket_counts.is_empty() && !p.explicit_bounds.is_empty() {
        return Err(format!(
            "metric {name:?}: {} bounds without bucket counts",
            p.explicit_bounds.len()
        ));
    }
    let too_big = || format!("metric {name:?}: a count beyond 2^63-1");
    let count = i64::try_from(p.count).map_err(|_| too_big())?;
    let buckets = p
        .bucket_counts
        .iter()
        .map(|&c| i64::try_from(c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| too_big())?;
    let mut row = point_row(info, base, p.attributes, p.time_unix_nano)?;
    row.count = Some(count);
    row.sum = p.sum;
    row.bounds = Some(p.explicit_bounds);
    row.bucket_counts = Some(buckets);
    Ok(row)
}

/// The data points of a metrics request: sums, gauges and histograms; the points of
/// exponential histograms and summaries are rejected (no column holds them).
pub fn metrics(request: ExportMetricsServiceRequest) -> Converted<MetricRow> {
    let mut out = Converted::new();
    for resource_metrics in request.resource_metrics {
        for scope_metrics in resource_metrics.scope_metrics {
            let base = base(
                resource_metrics.resource.clone(),
                scope_metrics.scope.as_ref(),
            );
            for metric in scope_metrics.metrics {
                let name = clean(metric.name);
                let unit = Some(clean(metric.unit)).filter(|u| !u.is_empty());
                let info = |kind, extra| MetricInfo {
                    name: name.clone(),
                    unit: unit.clone(),
                    kind,
                    extra,
                };
                let results: Vec<Result<MetricRow, String>> = match metric.data {
                    None => Vec::new(),
                    Some(Data::Gauge(g)) => {
                        let info = info(Kind::Gauge, Vec::new());
                        g.data_points
                            .into_iter()
                            .map(|p| number_row(&info, &base, p))
                            .collect()
                    }
                    Some(Data::Sum(s)) => {
                        let info = info(
                            Kind::Sum,
                            vec![
                                (
                                    "otel.metric.temporality",
                                    temporality(s.aggregation_temporality),
                                ),
                                ("otel.metric.monotonic", Value::Bool(s.is_monotonic)),
                            ],
                        );
                        s.data_points
                            .into_iter()
                            .map(|p| number_row(&info, &base, p))
                            .collect()
                    }
                    Some(Data::Histogram(h)) => {
                        let info = info(
                            Kind::Histogram,
                            vec![(
                                "otel.metric.temporality",
                                temporality(h.aggregation_temporality),
                            )],
                        );
                        h.data_points
                            .into_iter()
                            .map(|p| histogram_row(&info, &base, p))
                            .collect()
                    }
                    Some(Data::ExponentialHistogram(e)) => {
                        out.reject(e.data_points.len(), || {
                            format!(
                                "metric {name:?}: an exponential histogram (only sums, gauges and histograms are kept)"
                            )
                        });
                        Vec::new()
                    }
                    Some(Data::Summary(s)) => {
                        out.reject(s.data_points.len(), || {
                            format!(
                                "metric {name:?}: a summary (only sums, gauges and histograms are kept)"
                            )
                        });
                        Vec::new()
                    }
                };
                for result in results {
                    match result {
                        Ok(row) => out.rows.push(row),
                        Err(why) => out.reject(1, || why),
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};
    use opentelemetry_proto::tonic::metrics::v1::{
        ExponentialHistogram, Gauge, Histogram, Metric, ResourceMetrics, ScopeMetrics, Sum,
        Summary, SummaryDataPoint,
    };
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status};
    use serde_json::json;

    fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    fn s(text: &str) -> any_value::Value {
        any_value::Value::StringValue(text.into())
    }

    fn resource() -> Option<Resource> {
        Some(Resource {
            attributes: vec![
                kv(attr::RESOURCE_SERVICE, s("pepsi")),
                kv(attr::RESOURCE_HOST, s("mx1.example.org")),
                kv(attr::PROGRAM, s("pepsi-resource")),
            ],
            ..Default::default()
        })
    }

    const T0: u64 = 1_790_000_000_000_000_000;

    fn span(name: &str) -> Span {
        Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: name.into(),
            start_time_unix_nano: T0,
            end_time_unix_nano: T0 + 1_500_000,
            ..Default::default()
        }
    }

    fn traces(spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: resource(),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "pepsi".into(),
                        ..Default::default()
                    }),
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn a_stage_span_lifts_the_pepsi_facts_and_keeps_every_attribute() {
        let mut sp = span("route");
        sp.parent_span_id = vec![3; 8];
        sp.attributes = vec![
            kv(attr::STAGE, s("route")),
            kv(attr::QUEUE_ID, any_value::Value::IntValue(42)),
            kv(attr::MESSAGE_ID, s("<a@example.org>")),
            kv(attr::OUTCOME, s("advanced")),
            kv(attr::PROGRAM, s("pepsi-stage-route")),
            kv(
                attr::RCPT_TO,
                any_value::Value::ArrayValue(ArrayValue {
                    values: vec![AnyValue {
                        value: Some(s("b@example.net")),
                    }],
                }),
            ),
            kv(
                "x.kv",
                any_value::Value::KvlistValue(KeyValueList {
                    values: vec![kv("n\0ul", any_value::Value::BoolValue(true))],
                }),
            ),
            kv("x.bytes", any_value::Value::BytesValue(vec![0, 0xab])),
            kv("x.nan", any_value::Value::DoubleValue(f64::NAN)),
            kv("x.half", any_value::Value::DoubleValue(0.5)),
        ];
        sp.status = Some(Status {
            code: 2,
            message: "boom".into(),
        });
        let out = spans(traces(vec![sp]));
        assert_eq!((out.rejected, out.first_problem.as_deref()), (0, None));
        let row = &out.rows[0];
        assert_eq!(row.parent_span_id, Some(vec![3; 8]));
        assert_eq!(
            (
                row.service.as_deref(),
                row.host.as_deref(),
                row.stage.as_deref(),
                row.queue_id,
                row.message_id.as_deref(),
                row.outcome.as_deref()
            ),
            (
                Some("pepsi"),
                Some("mx1.example.org"),
                Some("route"),
                Some(42),
                Some("<a@example.org>"),
                Some("advanced")
            )
        );
        assert_eq!(
            (row.status_code, row.status_message.as_deref()),
            (2, Some("boom"))
        );
        assert_eq!(
            row.end_time - row.start_time,
            chrono::Duration::microseconds(1500)
        );
        assert_eq!(
            row.attributes,
            json!({
                "service.name": "pepsi",
                "host.name": "mx1.example.org",
                "otel.scope.name": "pepsi",
                "pepsi.program": "pepsi-stage-route",
                "pepsi.stage": "route",
                "pepsi.queue_id": 42,
                "pepsi.message_id": "<a@example.org>",
                "pepsi.outcome": "advanced",
                "pepsi.rcpt_to": ["b@example.net"],
                "x.kv": {"n\u{FFFD}ul": true},
                "x.bytes": "00ab",
                "x.nan": "NaN",
                "x.half": 0.5,
            })
        );
    }

    #[test]
    fn malformed_spans_are_rejected_one_by_one_with_the_first_reason() {
        type Case = (&'static str, fn(&mut Span), &'static str);
        let cases: Vec<Case> = vec![
            (
                "short trace",
                |s| s.trace_id = vec![1; 5],
                "span \"short trace\": trace_id of 5 bytes (expected 16, not all zero)",
            ),
            (
                "zero trace",
                |s| s.trace_id = vec![0; 16],
                "span \"zero trace\": trace_id of 16 bytes, all zero (expected 16, not all zero)",
            ),
            (
                "long span",
                |s| s.span_id = vec![1; 9],
                "span \"long span\": span_id of 9 bytes (expected 8, not all zero)",
            ),
            (
                "bad parent",
                |s| s.parent_span_id = vec![1; 4],
                "span \"bad parent\": parent_span_id of 4 bytes (expected 8, or none for a root span)",
            ),
            (
                "no end",
                |s| s.end_time_unix_nano = 0,
                "span \"no end\": start 1790000000000000000 and end 0: both must be set",
            ),
            (
                "backwards",
                |s| s.end_time_unix_nano = T0 - 1,
                "span \"backwards\": ends (1789999999999999999) before it starts (1790000000000000000)",
            ),
            (
                "status",
                |s| {
                    s.status = Some(Status {
                        code: 7,
                        message: String::new(),
                    })
                },
                "span \"status\": status code 7 (expected 0 unset, 1 ok or 2 error)",
            ),
        ];
        for (name, spoil, want) in cases {
            let mut bad = span(name);
            spoil(&mut bad);
            let mut good = span("good");
            good.span_id = vec![9; 8];
            let out = spans(traces(vec![bad, good]));
            assert_eq!(out.rows.len(), 1, "{name}");
            assert_eq!(out.rows[0].name, "good");
            assert_eq!(out.rejected, 1, "{name}");
            let first = out.first_problem.clone().unwrap();
            assert!(first.starts_with(want), "{name}: {first}");
            assert_eq!(
                out.error_message("spans").unwrap(),
                format!("1 spans rejected; the first: {first}")
            );
        }
        // An all-zero parent is no parent; a string queue id is read too.
        let mut root = span("root");
        root.parent_span_id = vec![0; 8];
        root.attributes = vec![kv(attr::QUEUE_ID, s(" 17 "))];
        let out = spans(traces(vec![root]));
        assert_eq!(
            (out.rows[0].parent_span_id.clone(), out.rows[0].queue_id),
            (None, Some(17))
        );
        assert_eq!(out.error_message("spans"), None);
    }

    fn point(value: f64, attrs: Vec<KeyValue>) -> NumberDataPoint {
        NumberDataPoint {
            attributes: attrs,
            time_unix_nano: T0,
            value: Some(number_data_point::Value::AsDouble(value)),
            ..Default::default()
        }
    }

    fn metric(name: &str, data: Data) -> Metric {
        Metric {
            name: name.into(),
            unit: "s".into(),
            data: Some(data),
            ..Default::default()
        }
    }

    fn metrics_request(metrics_list: Vec<Metric>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: resource(),
                scope_metrics: vec![ScopeMetrics {
                    metrics: metrics_list,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn sums_gauges_and_histograms_become_rows_the_other_kinds_are_rejected() {
        let hist = HistogramDataPoint {
            time_unix_nano: T0,
            count: 6,
            sum: Some(4.5),
            bucket_counts: vec![1, 2, 3],
            explicit_bounds: vec![0.1, 1.0],
            ..Default::default()
        };
        let mut uneven = hist.clone();
        uneven.bucket_counts = vec![1, 2];
        let out = metrics(metrics_request(vec![
            metric(
                "pepsi.passes",
                Data::Sum(Sum {
                    data_points: vec![NumberDataPoint {
                        value: Some(number_data_point::Value::AsInt(12)),
                        ..point(0.0, vec![kv(attr::STAGE, s("route"))])
                    }],
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    is_monotonic: true,
                }),
            ),
            metric(
                "pepsi.queue",
                Data::Gauge(Gauge {
                    data_points: vec![
                        point(3.0, vec![]),
                        NumberDataPoint {
                            value: None,
                            ..point(0.0, vec![])
                        },
                    ],
                }),
            ),
            metric(
                "pepsi.latency",
                Data::Histogram(Histogram {
                    data_points: vec![hist, uneven],
                    aggregation_temporality: AggregationTemporality::Delta as i32,
                }),
            ),
            metric(
                "x.summary",
                Data::Summary(Summary {
                    data_points: vec![SummaryDataPoint::default(), SummaryDataPoint::default()],
                }),
            ),
            metric(
                "x.exp",
                Data::ExponentialHistogram(ExponentialHistogram {
                    data_points: vec![Default::default()],
                    aggregation_temporality: 1,
                }),
            ),
        ]));
        let kinds: Vec<(&str, Kind, Option<f64>)> = out
            .rows
            .iter()
            .map(|r| (r.name.as_str(), r.kind, r.value))
            .collect();
        assert_eq!(
            kinds,
            [
                ("pepsi.passes", Kind::Sum, Some(12.0)),
                ("pepsi.queue", Kind::Gauge, Some(3.0)),
                ("pepsi.latency", Kind::Histogram, None),
            ]
        );
        let sum = &out.rows[0];
        assert_eq!(
            (
                sum.service.as_deref(),
                sum.host.as_deref(),
                sum.unit.as_deref()
            ),
            (Some("pepsi"), Some("mx1.example.org"), Some("s"))
        );
        assert_eq!(sum.attributes["pepsi.stage"], "route");
        assert_eq!(sum.attributes["otel.metric.temporality"], "cumulative");
        assert_eq!(sum.attributes["otel.metric.monotonic"], true);
        let h = &out.rows[2];
        assert_eq!(
            (h.count, h.sum, h.bounds.clone(), h.bucket_counts.clone()),
            (
                Some(6),
                Some(4.5),
                Some(vec![0.1, 1.0]),
                Some(vec![1, 2, 3])
            )
        );
        assert_eq!(h.attributes["otel.metric.temporality"], "delta");
        // The gauge's point without a value, the uneven histogram, two summary points and
        // one exponential histogram point.
        assert_eq!(out.rejected, 5);
        assert_eq!(
            out.first_problem.as_deref(),
            Some("metric \"pepsi.queue\": a point without a value")
        );
    }
}
