//! What an OTLP export request holds, as the rows of `pepsi.telemetry_span` and
//! `pepsi.telemetry_metric` (pepsi-0027.sql), with the items that cannot be stored counted
//! as rejected and the first reason kept for the answer's `partial_success`. Pure: no I/O.
//!
//! Attributes: `attributes` holds the resource's attributes, the instrumentation scope's
//! name and version (`otel.scope.name`, `otel.scope.version`) and the span's or point's
//! own attributes in one flat object, the item's own winning over the resource's when a name
//! is in both. Sums and histograms add `otel.metric.temporality` (`delta`, `cumulative`)
//! and sums `otel.metric.monotonic`. The Pepsi facts (`pepsi_contract::telemetry::attr`)
//! are lifted from that object into columns, and stay in it too. The resource's and the
//! scope's part is made once per scope, and each item's row starts from it.
//!
//! Values: strings, booleans, integers and arrays and key-value lists as JSON; a double
//! that is not finite as its text (`NaN`, `inf`), bytes as lower-case hex. PostgreSQL keeps
//! no NUL in text or jsonb, so a NUL anywhere in a string becomes U+FFFD.
//!
//! Bounds, so that what one request costs is bounded by its size rather than by what it
//! repeats: at most [`Limits::attributes`] attributes of a resource, a span or a point (the
//! rest are left out and counted in `otel.dropped_attributes_count`, with those the sender
//! says it dropped); strings cut at [`MAX_STRING`] bytes and names at [`MAX_KEY`], on a
//! character boundary; arrays and key-value lists cut at [`MAX_LIST`] entries and nested
//! at most [`MAX_DEPTH`] deep (a list deeper is null); and the rows of one request holding
//! at most [`Limits::attribute_bytes`] of attributes, the items beyond rejected. A span's
//! name is cut at [`MAX_COLUMN`] bytes, a metric's unit too; a span whose service, host,
//! stage or outcome is longer than [`MAX_COLUMN`] bytes, or whose message id is longer than
//! [`MAX_MESSAGE_ID`], is rejected, and so is a point whose metric name, service or host is
//! longer than [`MAX_COLUMN`]: those are what the rows are found by, and a cut one would
//! name something else (an indexed text beyond about 2.7 KB would fail the whole
//! transaction). The number of items a request may carry is bounded before decoding
//! (`trim`).

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

/// The longest string value kept, in bytes; a longer one is cut.
pub const MAX_STRING: usize = 4096;
/// The longest attribute name kept, in bytes; a longer one is cut.
pub const MAX_KEY: usize = 256;
/// The most entries of an array or a key-value list kept.
pub const MAX_LIST: usize = 128;
/// How deep arrays and key-value lists may nest: an attribute's value is at depth 1.
pub const MAX_DEPTH: usize = 4;
/// The longest span name, metric name or unit, service, host, stage and outcome, in bytes.
pub const MAX_COLUMN: usize = 256;
/// The longest message id, in bytes: RFC 5322's longest line.
pub const MAX_MESSAGE_ID: usize = 998;
/// The attribute counting what a row lacks of the sender's attributes.
pub const DROPPED: &str = "otel.dropped_attributes_count";

/// What one request may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// MAX_ATTRIBUTES: attributes kept of a resource, a span or a point.
    pub attributes: usize,
    /// Bytes of attributes (as JSON, about) the rows of one request may hold all told; an
    /// item that would pass it is rejected.
    pub attribute_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            attributes: 128,
            attribute_bytes: 64 << 20,
        }
    }
}

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

    /// Counts `n` more items rejected; `why` is kept when it is the first reason.
    pub fn reject(&mut self, n: u64, why: impl FnOnce() -> String) {
        if n == 0 {
            return;
        }
        self.rejected = self
            .rejected
            .saturating_add(i64::try_from(n).unwrap_or(i64::MAX));
        if self.first_problem.is_none() {
            self.first_problem = Some(why());
        }
    }

    /// The `partial_success.error_message` of the answer: how many were rejected, and the
    /// first reason; None when nothing was. `one` and `many` name the items (`span`,
    /// `spans`).
    pub fn error_message(&self, one: &str, many: &str) -> Option<String> {
        let first = self.first_problem.as_deref()?;
        let items = if self.rejected == 1 { one } else { many };
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

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// `text` cut to `max` bytes and without NUL (a NUL's replacement is longer, hence the
/// second cut).
fn bounded(text: String, max: usize) -> String {
    cut(clean(cut(text, max)), max)
}

/// `text` as an error message shows it: its first 64 bytes.
fn abbreviated(text: &str) -> String {
    if text.len() <= 64 {
        return text.to_owned();
    }
    format!("{}…", cut(text.to_owned(), 64))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// An attribute value at `depth` (1 for an attribute's own) as JSON.
fn json(value: Option<AnyValue>, depth: usize) -> Value {
    use any_value::Value as V;
    match value.and_then(|v| v.value) {
        None | Some(V::StringValueStrindex(_)) => Value::Null,
        Some(V::StringValue(s)) => Value::String(bounded(s, MAX_STRING)),
        Some(V::BoolValue(b)) => Value::Bool(b),
        Some(V::IntValue(i)) => Value::from(i),
        Some(V::DoubleValue(d)) => serde_json::Number::from_f64(d)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(d.to_string())),
        Some(V::ArrayValue(a)) if depth <= MAX_DEPTH => Value::Array(
            a.values
                .into_iter()
                .take(MAX_LIST)
                .map(|v| json(Some(v), depth + 1))
                .collect(),
        ),
        Some(V::KvlistValue(kv)) if depth <= MAX_DEPTH => {
            let mut map = Map::new();
            for kv in kv.values.into_iter().take(MAX_LIST) {
                map.insert(bounded(kv.key, MAX_KEY), json(kv.value, depth + 1));
            }
            Value::Object(map)
        }
        Some(V::ArrayValue(_) | V::KvlistValue(_)) => Value::Null,
        Some(V::BytesValue(b)) => Value::String(hex(&b[..b.len().min(MAX_STRING / 2)])),
    }
}

/// About the bytes `value` takes as JSON (escapes aside).
fn size(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 20,
        Value::String(s) => s.len() + 2,
        Value::Array(a) => a.iter().map(|v| size(v) + 1).sum::<usize>() + 2,
        Value::Object(m) => map_size(m),
    }
}

fn map_size(map: &Map<String, Value>) -> usize {
    map.iter()
        .map(|(k, v)| k.len() + 4 + size(v))
        .sum::<usize>()
        + 2
}

/// Attributes as JSON, with about the bytes they take and how many the sender's list has
/// that they lack.
#[derive(Debug, Clone, Default)]
struct Attributes {
    map: Map<String, Value>,
    bytes: usize,
    dropped: u64,
}

impl Attributes {
    /// The first `limit` of `list`; the rest, and `dropped` the sender left out, are
    /// counted.
    fn of(list: Vec<KeyValue>, limit: usize, dropped: u32) -> Attributes {
        let left_out = list.len().saturating_sub(limit) as u64;
        let mut map = Map::new();
        for kv in list.into_iter().take(limit) {
            map.insert(bounded(kv.key, MAX_KEY), json(kv.value, 1));
        }
        Attributes {
            bytes: map_size(&map),
            map,
            dropped: left_out + u64::from(dropped),
        }
    }

    fn insert(&mut self, key: &str, value: Value) {
        self.bytes += key.len() + 4 + size(&value);
        self.map.insert(key.to_owned(), value);
    }
}

/// The attributes every item of a resource and scope starts from.
fn base(resource: &Attributes, scope: Option<&InstrumentationScope>) -> Attributes {
    let mut base = resource.clone();
    if let Some(scope) = scope {
        for (key, text) in [
            ("otel.scope.name", &scope.name),
            ("otel.scope.version", &scope.version),
        ] {
            if !text.is_empty() {
                base.insert(key, Value::String(bounded(text.clone(), MAX_STRING)));
            }
        }
    }
    base
}

fn resource_attributes(resource: Option<Resource>, limits: &Limits) -> Attributes {
    resource.map_or_else(Attributes::default, |r| {
        Attributes::of(r.attributes, limits.attributes, r.dropped_attributes_count)
    })
}

/// The item's own value of `key`, else the base's.
fn lifted<'a>(own: &'a Attributes, base: &'a Attributes, key: &str) -> Option<&'a Value> {
    own.map.get(key).or_else(|| base.map.get(key))
}

/// The text of `key` for its column, at most `max` bytes; why not when it is longer.
fn column(
    own: &Attributes,
    base: &Attributes,
    key: &str,
    max: usize,
) -> Result<Option<String>, String> {
    match lifted(own, base, key).and_then(Value::as_str) {
        None | Some("") => Ok(None),
        Some(text) if text.len() > max => Err(format!(
            "{key} {:?} is longer than {max} bytes",
            abbreviated(text)
        )),
        Some(text) => Ok(Some(text.to_owned())),
    }
}

/// `pepsi.queue_id`: an integer, or a string of one.
fn queue_id(own: &Attributes, base: &Attributes) -> Option<i64> {
    match lifted(own, base, attr::QUEUE_ID)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// What is left of the request's [`Limits::attribute_bytes`].
struct Budget {
    limit: usize,
    left: usize,
}

impl Budget {
    fn new(limits: &Limits) -> Budget {
        Budget {
            limit: limits.attribute_bytes,
            left: limits.attribute_bytes,
        }
    }

    /// Takes what a row of `base` and `own` attributes costs, or says why it cannot.
    fn take(&mut self, base: &Attributes, own: &Attributes) -> Result<(), String> {
        let cost = base.bytes.saturating_add(own.bytes);
        if cost > self.left {
            return Err(format!(
                "its attributes (about {cost} bytes) pass the {} bytes of attributes one request may store; export smaller batches",
                self.limit
            ));
        }
        self.left -= cost;
        Ok(())
    }
}

/// The row's attributes: `base`, then `extra`, then `own`, which win; and what the row
/// lacks, when it lacks something.
fn merged(base: &Attributes, extra: &[(&'static str, Value)], own: Attributes) -> Value {
    let mut map = base.map.clone();
    for (key, value) in extra {
        map.insert((*key).to_owned(), value.clone());
    }
    map.extend(own.map);
    let dropped = base.dropped + own.dropped;
    if dropped > 0 {
        map.insert(DROPPED.to_owned(), Value::from(dropped));
    }
    Value::Object(map)
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
fn span_row(
    span: Span,
    base: &Attributes,
    limits: &Limits,
    budget: &mut Budget,
) -> Result<SpanRow, String> {
    let name = bounded(span.name, MAX_COLUMN);
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
        Some(s) => (
            s.code,
            Some(bounded(s.message, MAX_STRING)).filter(|m| !m.is_empty()),
        ),
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
    let own = Attributes::of(
        span.attributes,
        limits.attributes,
        span.dropped_attributes_count,
    );
    let text = |key, max| column(&own, base, key, max).map_err(what);
    let service = text(attr::RESOURCE_SERVICE, MAX_COLUMN)?;
    let host = text(attr::RESOURCE_HOST, MAX_COLUMN)?;
    let stage = text(attr::STAGE, MAX_COLUMN)?;
    let message_id = text(attr::MESSAGE_ID, MAX_MESSAGE_ID)?;
    let outcome = text(attr::OUTCOME, MAX_COLUMN)?;
    let queue_id = queue_id(&own, base);
    budget.take(base, &own).map_err(what)?;
    Ok(SpanRow {
        trace_id: span.trace_id,
        span_id: span.span_id,
        parent_span_id,
        name,
        service,
        host,
        stage,
        queue_id,
        message_id,
        outcome,
        start_time,
        end_time,
        attributes: merged(base, &[], own),
        status_code,
        status_message,
    })
}

/// The spans of a traces request.
pub fn spans(request: ExportTraceServiceRequest, limits: &Limits) -> Converted<SpanRow> {
    let mut out = Converted::new();
    let mut budget = Budget::new(limits);
    for resource_spans in request.resource_spans {
        let resource = resource_attributes(resource_spans.resource, limits);
        for scope_spans in resource_spans.scope_spans {
            if scope_spans.spans.is_empty() {
                continue;
            }
            let base = base(&resource, scope_spans.scope.as_ref());
            for span in scope_spans.spans {
                match span_row(span, &base, limits, &mut budget) {
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

/// What one metric's points share and what each costs.
struct Points<'a> {
    info: MetricInfo,
    base: &'a Attributes,
    limits: &'a Limits,
}

impl Points<'_> {
    /// The row of a point with `attributes` at `time_unix_nano`, its values not set yet.
    fn row(
        &self,
        budget: &mut Budget,
        attributes: Vec<KeyValue>,
        time_unix_nano: u64,
    ) -> Result<MetricRow, String> {
        let info = &self.info;
        let what = |problem: String| format!("metric {:?}: {problem}", info.name);
        let Some(time) = time(time_unix_nano) else {
            return Err(what(format!(
                "a point at {time_unix_nano} (expected nanoseconds since 1970, before 2262)"
            )));
        };
        let own = Attributes::of(attributes, self.limits.attributes, 0);
        let service = column(&own, self.base, attr::RESOURCE_SERVICE, MAX_COLUMN).map_err(what)?;
        let host = column(&own, self.base, attr::RESOURCE_HOST, MAX_COLUMN).map_err(what)?;
        budget.take(self.base, &own).map_err(what)?;
        Ok(MetricRow {
            name: info.name.clone(),
            service,
            host,
            kind: info.kind,
            unit: info.unit.clone(),
            attributes: merged(self.base, &info.extra, own),
            time,
            value: None,
            count: None,
            sum: None,
            bounds: None,
            bucket_counts: None,
        })
    }

    fn number(&self, budget: &mut Budget, p: NumberDataPoint) -> Result<MetricRow, String> {
        let value = match p.value {
            Some(number_data_point::Value::AsDouble(d)) => d,
            Some(number_data_point::Value::AsInt(i)) => i as f64,
            None => {
                return Err(format!(
                    "metric {:?}: a point without a value",
                    self.info.name
                ));
            }
        };
        let mut row = self.row(budget, p.attributes, p.time_unix_nano)?;
        row.value = Some(value);
        Ok(row)
    }

    fn histogram(&self, budget: &mut Budget, p: HistogramDataPoint) -> Result<MetricRow, String> {
        let name = &self.info.name;
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
        let mut row = self.row(budget, p.attributes, p.time_unix_nano)?;
        row.count = Some(count);
        row.sum = p.sum;
        row.bounds = Some(p.explicit_bounds);
        row.bucket_counts = Some(buckets);
        Ok(row)
    }
}

/// How many points `data` holds.
fn point_count(data: &Option<Data>) -> usize {
    match data {
        None => 0,
        Some(Data::Gauge(g)) => g.data_points.len(),
        Some(Data::Sum(s)) => s.data_points.len(),
        Some(Data::Histogram(h)) => h.data_points.len(),
        Some(Data::ExponentialHistogram(e)) => e.data_points.len(),
        Some(Data::Summary(s)) => s.data_points.len(),
    }
}

/// The data points of a metrics request: sums, gauges and histograms; the points of
/// exponential histograms and summaries are rejected (no column holds them).
pub fn metrics(request: ExportMetricsServiceRequest, limits: &Limits) -> Converted<MetricRow> {
    let mut out = Converted::new();
    let mut budget = Budget::new(limits);
    for resource_metrics in request.resource_metrics {
        let resource = resource_attributes(resource_metrics.resource, limits);
        for scope_metrics in resource_metrics.scope_metrics {
            if scope_metrics.metrics.is_empty() {
                continue;
            }
            let base = base(&resource, scope_metrics.scope.as_ref());
            for metric in scope_metrics.metrics {
                let name = clean(metric.name);
                if name.len() > MAX_COLUMN {
                    out.reject(point_count(&metric.data) as u64, || {
                        format!(
                            "metric {:?}: a name of {} bytes (at most {MAX_COLUMN})",
                            abbreviated(&name),
                            name.len()
                        )
                    });
                    continue;
                }
                let unit = Some(bounded(metric.unit, MAX_COLUMN)).filter(|u| !u.is_empty());
                let points = |kind, extra| Points {
                    info: MetricInfo {
                        name: name.clone(),
                        unit: unit.clone(),
                        kind,
                        extra,
                    },
                    base: &base,
                    limits,
                };
                let results: Vec<Result<MetricRow, String>> = match metric.data {
                    None => Vec::new(),
                    Some(Data::Gauge(g)) => {
                        let points = points(Kind::Gauge, Vec::new());
                        g.data_points
                            .into_iter()
                            .map(|p| points.number(&mut budget, p))
                            .collect()
                    }
                    Some(Data::Sum(s)) => {
                        let points = points(
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
                            .map(|p| points.number(&mut budget, p))
                            .collect()
                    }
                    Some(Data::Histogram(h)) => {
                        let points = points(
                            Kind::Histogram,
                            vec![(
                                "otel.metric.temporality",
                                temporality(h.aggregation_temporality),
                            )],
                        );
                        h.data_points
                            .into_iter()
                            .map(|p| points.histogram(&mut budget, p))
                            .collect()
                    }
                    Some(Data::ExponentialHistogram(e)) => {
                        out.reject(e.data_points.len() as u64, || {
                            format!(
                                "metric {name:?}: an exponential histogram (only sums, gauges and histograms are kept)"
                            )
                        });
                        Vec::new()
                    }
                    Some(Data::Summary(s)) => {
                        out.reject(s.data_points.len() as u64, || {
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
        let out = spans(traces(vec![sp]), &Limits::default());
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
            let out = spans(traces(vec![bad, good]), &Limits::default());
            assert_eq!(out.rows.len(), 1, "{name}");
            assert_eq!(out.rows[0].name, "good");
            assert_eq!(out.rejected, 1, "{name}");
            let first = out.first_problem.clone().unwrap();
            assert!(first.starts_with(want), "{name}: {first}");
            assert_eq!(
                out.error_message("span", "spans").unwrap(),
                format!("1 span rejected; the first: {first}")
            );
        }
        // An all-zero parent is no parent; a string queue id is read too.
        let mut root = span("root");
        root.parent_span_id = vec![0; 8];
        root.attributes = vec![kv(attr::QUEUE_ID, s(" 17 "))];
        let out = spans(traces(vec![root]), &Limits::default());
        assert_eq!(
            (out.rows[0].parent_span_id.clone(), out.rows[0].queue_id),
            (None, Some(17))
        );
        assert_eq!(out.error_message("span", "spans"), None);
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
        let out = metrics(
            metrics_request(vec![
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
            ]),
            &Limits::default(),
        );
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

    fn array(values: Vec<any_value::Value>) -> any_value::Value {
        any_value::Value::ArrayValue(ArrayValue {
            values: values
                .into_iter()
                .map(|v| AnyValue { value: Some(v) })
                .collect(),
        })
    }

    /// The JSON of one attribute `value`, as a span stores it.
    fn stored(value: any_value::Value) -> Value {
        let mut sp = span("v");
        sp.attributes = vec![kv("v", value)];
        let out = spans(traces(vec![sp]), &Limits::default());
        out.rows[0].attributes["v"].clone()
    }

    #[test]
    fn values_are_bounded_strings_on_a_character_boundary() {
        let long = format!("a{}", "é".repeat(5000));
        let Value::String(cut) = stored(s(&long)) else {
            panic!("a string")
        };
        assert_eq!((cut.len(), long.starts_with(&cut)), (4095, true));
        // A NUL's replacement is three bytes: cut again after it.
        let Value::String(nuls) = stored(s(&"\0".repeat(5000))) else {
            panic!("a string")
        };
        assert_eq!(nuls, "\u{FFFD}".repeat(1365));
        let bytes = stored(any_value::Value::BytesValue(vec![0xab; 5000]));
        assert_eq!(bytes, Value::String("ab".repeat(2048)));
        let many: Vec<_> = (0..200).map(any_value::Value::IntValue).collect();
        assert_eq!(stored(array(many)), json!((0..128).collect::<Vec<_>>()));
        let list = any_value::Value::KvlistValue(KeyValueList {
            values: (0..200)
                .map(|i| kv(&format!("k{i:03}"), any_value::Value::BoolValue(true)))
                .collect(),
        });
        let Value::Object(list) = stored(list) else {
            panic!("an object")
        };
        assert_eq!(
            (
                list.len(),
                list.contains_key("k127"),
                list.contains_key("k128")
            ),
            (128, true, false)
        );
        // Four levels of lists are kept; a fifth is null.
        let mut deep = any_value::Value::IntValue(7);
        for _ in 0..5 {
            deep = array(vec![deep]);
        }
        assert_eq!(stored(deep), json!([[[[null]]]]));
        // A long name is cut too.
        let mut sp = span("k");
        sp.attributes = vec![kv(&"n".repeat(1000), s("x"))];
        let out = spans(traces(vec![sp]), &Limits::default());
        assert_eq!(out.rows[0].attributes["n".repeat(256)], "x");
    }

    #[test]
    fn attributes_beyond_the_limit_are_left_out_and_counted() {
        let limits = Limits {
            attributes: 3,
            ..Limits::default()
        };
        let mut request = traces(vec![]);
        let resource = request.resource_spans[0].resource.as_mut().unwrap();
        resource
            .attributes
            .extend([kv("r.4", s("x")), kv("r.5", s("x"))]);
        resource.dropped_attributes_count = 1;
        let mut counted = span("counted");
        counted.attributes = (0..5).map(|i| kv(&format!("s.{i}"), s("x"))).collect();
        counted.dropped_attributes_count = 2;
        let mut plain = span("plain");
        plain.span_id = vec![3; 8];
        request.resource_spans[0].scope_spans[0].spans = vec![counted, plain];
        let out = spans(request, &limits);
        let keys = |row: &SpanRow| {
            let mut keys: Vec<String> = row
                .attributes
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            keys.sort();
            keys
        };
        // The resource's first three, the span's first three; 2 + 1 of the resource and
        // 2 + 2 of the span lacking.
        assert_eq!(
            keys(&out.rows[0]),
            [
                "host.name",
                DROPPED,
                "otel.scope.name",
                "pepsi.program",
                "s.0",
                "s.1",
                "s.2",
                "service.name"
            ]
        );
        assert_eq!(out.rows[0].attributes[DROPPED], 7);
        assert_eq!(out.rows[1].attributes[DROPPED], 3);
        // Nothing lacking: no count.
        let out = spans(traces(vec![span("whole")]), &Limits::default());
        assert_eq!(out.rows[0].attributes.get(DROPPED), None);
    }

    #[test]
    fn a_column_that_would_not_fit_rejects_its_span_and_a_long_name_is_cut() {
        type Case = (&'static str, fn(&mut Span), Option<&'static str>);
        let cases: Vec<Case> = vec![
            (
                "fits",
                |s| s.attributes = vec![kv(attr::MESSAGE_ID, self::s(&"m".repeat(998)))],
                None,
            ),
            (
                "long message id",
                |s| s.attributes = vec![kv(attr::MESSAGE_ID, self::s(&"m".repeat(10_000)))],
                Some("span \"long message id\": pepsi.message_id \"mmmm"),
            ),
            (
                "long stage",
                |s| s.attributes = vec![kv(attr::STAGE, self::s(&"s".repeat(257)))],
                Some("span \"long stage\": pepsi.stage \"ssss"),
            ),
            (
                "long outcome",
                |s| s.attributes = vec![kv(attr::OUTCOME, self::s(&"o".repeat(300)))],
                Some("is longer than 256 bytes"),
            ),
            (
                "long host",
                |s| s.attributes = vec![kv(attr::RESOURCE_HOST, self::s(&"h".repeat(300)))],
                Some("span \"long host\": host.name \"hhhh"),
            ),
        ];
        for (name, spoil, want) in cases {
            let mut bad = span(name);
            spoil(&mut bad);
            let mut good = span("good");
            good.span_id = vec![9; 8];
            let out = spans(traces(vec![bad, good]), &Limits::default());
            match want {
                None => assert_eq!((out.rows.len(), out.rejected), (2, 0), "{name}"),
                Some(want) => {
                    assert_eq!(out.rows.len(), 1, "{name}");
                    assert_eq!(out.rows[0].name, "good");
                    let first = out.first_problem.unwrap();
                    assert!(first.contains(want), "{name}: {first}");
                    assert!(first.len() < 200, "{name}: the value abbreviated: {first}");
                }
            }
        }
        let long = format!("a{}", "é".repeat(5000));
        let mut sp = span(&long);
        sp.status = Some(Status {
            code: 2,
            message: "x".repeat(10_000),
        });
        let out = spans(traces(vec![sp]), &Limits::default());
        let row = &out.rows[0];
        assert_eq!((row.name.len(), long.starts_with(&row.name)), (255, true));
        assert_eq!(
            row.status_message.as_ref().map(String::len),
            Some(MAX_STRING)
        );
    }

    #[test]
    fn the_rows_of_one_request_hold_a_bounded_amount_of_attributes() {
        let limits = Limits {
            attribute_bytes: 4000,
            ..Limits::default()
        };
        let mut request = traces(vec![]);
        let resource = request.resource_spans[0].resource.as_mut().unwrap();
        resource.attributes.push(kv("big", s(&"b".repeat(1000))));
        request.resource_spans[0].scope_spans[0].spans = (1..=10)
            .map(|i| {
                let mut sp = span("s");
                sp.span_id = vec![i; 8];
                sp
            })
            .collect();
        let out = spans(request, &limits);
        assert_eq!((out.rows.len(), out.rejected), (3, 7));
        let first = out.first_problem.clone().unwrap();
        assert!(
            first.contains("pass the 4000 bytes of attributes one request may store"),
            "{first}"
        );
        assert_eq!(
            out.error_message("span", "spans").unwrap(),
            format!("7 spans rejected; the first: {first}")
        );
    }

    #[test]
    fn a_metric_name_too_long_rejects_its_points_and_a_long_unit_is_cut() {
        let gauge = |n| {
            Data::Gauge(Gauge {
                data_points: vec![point(1.0, vec![]); n],
            })
        };
        let mut long_unit = metric("pepsi.ok", gauge(1));
        long_unit.unit = "u".repeat(1000);
        let mut far_host = metric("pepsi.far", gauge(1));
        if let Some(Data::Gauge(g)) = &mut far_host.data {
            g.data_points[0].attributes = vec![kv(attr::RESOURCE_HOST, s(&"h".repeat(300)))];
        }
        let out = metrics(
            metrics_request(vec![
                metric(&"n".repeat(300), gauge(3)),
                long_unit,
                far_host,
            ]),
            &Limits::default(),
        );
        assert_eq!((out.rows.len(), out.rejected), (1, 4));
        assert_eq!(out.rows[0].unit.as_ref().map(String::len), Some(MAX_COLUMN));
        let first = out.first_problem.clone().unwrap();
        assert!(
            first.starts_with(&format!(
                "metric \"{}…\": a name of 300 bytes (at most 256)",
                "n".repeat(64)
            )),
            "{first}"
        );
        assert_eq!(
            out.error_message("data point", "data points").unwrap(),
            format!("4 data points rejected; the first: {first}")
        );
        let one = metrics(
            metrics_request(vec![metric(
                "x",
                Data::Summary(Summary {
                    data_points: vec![SummaryDataPoint::default()],
                }),
            )]),
            &Limits::default(),
        );
        assert!(
            one.error_message("data point", "data points")
                .unwrap()
                .starts_with("1 data point rejected; the first: metric \"x\": a summary"),
        );
    }
}
