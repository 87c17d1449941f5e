//! An export's protobuf trimmed before it is decoded. Decoding makes a structure of a few
//! hundred bytes of each message however small its encoding (an empty span is two bytes),
//! so what a body of MAX_BODY decodes to is bounded by what the receiver takes, not by the
//! body: at most MAX_ITEMS spans or data points are kept, the rest only counted; and what
//! the receiver never stores is left out: a span's events and links, a point's exemplars, a
//! metric's metadata, the content of the points it rejects whole (exponential histograms
//! and summaries, kept as empty messages to be counted), and every resource, scope and
//! metric left without an item. The rest is copied field by field, as it came.
//!
//! Pure: bytes in, bytes out. It reads the protobuf wire format only as far as the path to
//! the items; whatever it does not understand is left for prost to decode (and refuse).

/// How a message on the path to the items is copied.
struct Shape {
    /// Fields holding a nested message on the path, and its shape.
    nested: &'static [(u32, &'static Shape)],
    /// The fields left out.
    dropped: &'static [u32],
    /// A span or a data point: counted against the limit.
    item: bool,
    /// An item of which only the count matters: none of its fields is kept.
    hollow: bool,
}

const fn path(nested: &'static [(u32, &'static Shape)], dropped: &'static [u32]) -> Shape {
    Shape {
        nested,
        dropped,
        item: false,
        hollow: false,
    }
}

const fn item(dropped: &'static [u32]) -> Shape {
    Shape {
        nested: &[],
        dropped,
        item: true,
        hollow: false,
    }
}

// opentelemetry/proto/trace/v1/trace.proto: ExportTraceServiceRequest.resource_spans = 1,
// ResourceSpans.scope_spans = 2, ScopeSpans.spans = 2; Span.events = 11, Span.links = 13.
const SPAN: Shape = item(&[11, 13]);
const SCOPE_SPANS: Shape = path(&[(2, &SPAN)], &[]);
const RESOURCE_SPANS: Shape = path(&[(2, &SCOPE_SPANS)], &[]);
const TRACES: Shape = path(&[(1, &RESOURCE_SPANS)], &[]);

// opentelemetry/proto/metrics/v1/metrics.proto: ExportMetricsServiceRequest.resource_metrics
// = 1, ResourceMetrics.scope_metrics = 2, ScopeMetrics.metrics = 2; Metric.gauge = 5, sum =
// 7, histogram = 9, exponential_histogram = 10, summary = 11, metadata = 12; each kind's
// data_points = 1; NumberDataPoint.exemplars = 5, HistogramDataPoint.exemplars = 8.
const NUMBER_POINT: Shape = item(&[5]);
const HISTOGRAM_POINT: Shape = item(&[8]);
const HOLLOW_POINT: Shape = Shape {
    nested: &[],
    dropped: &[],
    item: true,
    hollow: true,
};
const NUMBERS: Shape = path(&[(1, &NUMBER_POINT)], &[]);
const HISTOGRAM: Shape = path(&[(1, &HISTOGRAM_POINT)], &[]);
const REJECTED_KIND: Shape = path(&[(1, &HOLLOW_POINT)], &[]);
const METRIC: Shape = path(
    &[
        (5, &NUMBERS),
        (7, &NUMBERS),
        (9, &HISTOGRAM),
        (10, &REJECTED_KIND),
        (11, &REJECTED_KIND),
    ],
    &[12],
);
const SCOPE_METRICS: Shape = path(&[(2, &METRIC)], &[]);
const RESOURCE_METRICS: Shape = path(&[(2, &SCOPE_METRICS)], &[]);
const METRICS: Shape = path(&[(1, &RESOURCE_METRICS)], &[]);

/// What is left of a request, and how many items were beyond the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trimmed {
    pub bytes: Vec<u8>,
    pub beyond: u64,
}

/// An `ExportTraceServiceRequest` with at most `max_items` spans.
pub fn traces(body: &[u8], max_items: usize) -> Result<Trimmed, String> {
    trim(body, &TRACES, max_items)
}

/// An `ExportMetricsServiceRequest` with at most `max_items` data points.
pub fn metrics(body: &[u8], max_items: usize) -> Result<Trimmed, String> {
    trim(body, &METRICS, max_items)
}

fn trim(body: &[u8], shape: &Shape, max_items: usize) -> Result<Trimmed, String> {
    let mut count = Count {
        left: max_items,
        beyond: 0,
    };
    let mut bytes = Vec::with_capacity(body.len());
    copy(body, shape, &mut count, &mut bytes)?;
    Ok(Trimmed {
        bytes,
        beyond: count.beyond,
    })
}

struct Count {
    left: usize,
    beyond: u64,
}

/// Copies the fields of the message `msg` of `shape` to `out`; whether it holds an item.
fn copy(msg: &[u8], shape: &Shape, count: &mut Count, out: &mut Vec<u8>) -> Result<bool, String> {
    let mut rest = msg;
    let mut holds_item = false;
    while !rest.is_empty() {
        let start = rest;
        let key = varint(&mut rest)?;
        let (field, wire) = (key >> 3, key & 7);
        let field = u32::try_from(field).map_err(|_| format!("field number {field}"))?;
        let value = match wire {
            0 => {
                varint(&mut rest)?;
                None
            }
            1 => {
                take(&mut rest, 8)?;
                None
            }
            2 => {
                let len = varint(&mut rest)?;
                let len = usize::try_from(len).map_err(|_| format!("a length of {len}"))?;
                Some(take(&mut rest, len)?)
            }
            5 => {
                take(&mut rest, 4)?;
                None
            }
            other => return Err(format!("wire type {other} of field {field}")),
        };
        let whole = &start[..start.len() - rest.len()];
        if shape.dropped.contains(&field) {
            continue;
        }
        let nested = shape
            .nested
            .iter()
            .find(|(number, _)| *number == field)
            .map(|(_, s)| *s);
        let (Some(inner), Some(value)) = (nested, value) else {
            out.extend_from_slice(whole);
            continue;
        };
        if inner.item {
            if count.left == 0 {
                count.beyond += 1;
                continue;
            }
            count.left -= 1;
            holds_item = true;
        }
        let mut copied = Vec::new();
        let kept = if inner.hollow {
            true
        } else {
            copy(value, inner, count, &mut copied)? || inner.item
        };
        if kept {
            put_varint(out, key);
            put_varint(out, copied.len() as u64);
            out.extend_from_slice(&copied);
            holds_item = true;
        }
    }
    Ok(holds_item)
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if rest.len() < n {
        return Err(format!(
            "a field of {n} bytes where {} are left",
            rest.len()
        ));
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

fn varint(rest: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, tail) = rest
            .split_first()
            .ok_or_else(|| "a varint cut short".to_owned())?;
        *rest = tail;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a varint of more than 10 bytes".to_owned())
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::metrics::v1::{
        Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram,
        HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary,
        SummaryDataPoint, metric::Data,
    };
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span};
    use prost::Message as _;

    fn span(id: u8) -> Span {
        Span {
            trace_id: vec![1; 16],
            span_id: vec![id; 8],
            name: format!("s{id}"),
            start_time_unix_nano: 1,
            end_time_unix_nano: 2,
            attributes: vec![KeyValue {
                key: "k".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(i64::from(id) << 40)),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn resource() -> Option<Resource> {
        Some(Resource {
            attributes: vec![KeyValue {
                key: "host.name".into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue("mx1".into())),
                }),
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    fn traces_of(scopes: Vec<Vec<Span>>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: resource(),
                scope_spans: scopes
                    .into_iter()
                    .map(|spans| ScopeSpans {
                        spans,
                        schema_url: "s".into(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
        }
    }

    fn trimmed_traces(
        request: &ExportTraceServiceRequest,
        max: usize,
    ) -> (ExportTraceServiceRequest, u64) {
        let t = traces(&request.encode_to_vec(), max).unwrap();
        (
            ExportTraceServiceRequest::decode(t.bytes.as_slice()).unwrap(),
            t.beyond,
        )
    }

    #[test]
    fn a_request_within_the_limit_is_decoded_as_it_was_sent() {
        let request = traces_of(vec![vec![span(1), span(2)], vec![span(3)]]);
        assert_eq!(trimmed_traces(&request, 3), (request.clone(), 0));
        assert_eq!(trimmed_traces(&request, 10_000), (request, 0));
    }

    #[test]
    fn spans_beyond_the_limit_are_counted_and_scopes_left_without_one_go() {
        let request = traces_of(vec![
            vec![span(1), span(2)],
            vec![span(3), span(4)],
            vec![span(5)],
        ]);
        let (kept, beyond) = trimmed_traces(&request, 3);
        assert_eq!(beyond, 2);
        assert_eq!(kept, traces_of(vec![vec![span(1), span(2)], vec![span(3)]]));
        // A limit reached inside the first resource leaves out the next resources whole.
        let mut two = request.clone();
        two.resource_spans.push(two.resource_spans[0].clone());
        let (kept, beyond) = trimmed_traces(&two, 5);
        assert_eq!((kept.resource_spans.len(), beyond), (1, 5));
        // Many empty spans: only the limit's worth is ever decoded.
        let empties = traces_of(vec![vec![Span::default(); 50_000]]);
        let (kept, beyond) = trimmed_traces(&empties, 10_000);
        assert_eq!(
            (kept.resource_spans[0].scope_spans[0].spans.len(), beyond),
            (10_000, 40_000)
        );
    }

    #[test]
    fn events_links_exemplars_and_metadata_are_left_out() {
        let mut with = span(1);
        with.events = vec![
            span::Event {
                name: "e".into(),
                ..Default::default()
            };
            3
        ];
        with.links = vec![span::Link {
            trace_id: vec![2; 16],
            ..Default::default()
        }];
        let (kept, beyond) = trimmed_traces(&traces_of(vec![vec![with]]), 10);
        assert_eq!((kept, beyond), (traces_of(vec![vec![span(1)]]), 0));

        let point = NumberDataPoint {
            time_unix_nano: 5,
            exemplars: vec![Exemplar::default(); 2],
            ..Default::default()
        };
        let histogram_point = HistogramDataPoint {
            count: 3,
            exemplars: vec![Exemplar::default()],
            ..Default::default()
        };
        let metric = |data| Metric {
            name: "m".into(),
            metadata: vec![KeyValue::default()],
            data: Some(data),
            ..Default::default()
        };
        let request = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: resource(),
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![
                        metric(Data::Gauge(Gauge {
                            data_points: vec![point.clone(); 2],
                        })),
                        metric(Data::Sum(Sum {
                            data_points: vec![point.clone()],
                            aggregation_temporality: 1,
                            is_monotonic: true,
                        })),
                        metric(Data::Histogram(Histogram {
                            data_points: vec![histogram_point.clone()],
                            aggregation_temporality: 2,
                        })),
                        metric(Data::Summary(Summary {
                            data_points: vec![SummaryDataPoint {
                                count: 9,
                                ..Default::default()
                            }],
                        })),
                        metric(Data::ExponentialHistogram(ExponentialHistogram {
                            data_points: vec![ExponentialHistogramDataPoint {
                                count: 9,
                                ..Default::default()
                            }],
                            aggregation_temporality: 1,
                        })),
                        // Beyond the limit: the whole metric goes.
                        metric(Data::Gauge(Gauge {
                            data_points: vec![point.clone()],
                        })),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let t = metrics(&request.encode_to_vec(), 6).unwrap();
        let kept = ExportMetricsServiceRequest::decode(t.bytes.as_slice()).unwrap();
        assert_eq!(t.beyond, 1);
        let bare = NumberDataPoint {
            exemplars: vec![],
            ..point
        };
        let bare_histogram = HistogramDataPoint {
            exemplars: vec![],
            ..histogram_point
        };
        let metric = |data| Metric {
            name: "m".into(),
            data: Some(data),
            ..Default::default()
        };
        let mut want = request.clone();
        want.resource_metrics[0].scope_metrics[0].metrics = vec![
            metric(Data::Gauge(Gauge {
                data_points: vec![bare.clone(); 2],
            })),
            metric(Data::Sum(Sum {
                data_points: vec![bare],
                aggregation_temporality: 1,
                is_monotonic: true,
            })),
            metric(Data::Histogram(Histogram {
                data_points: vec![bare_histogram],
                aggregation_temporality: 2,
            })),
            metric(Data::Summary(Summary {
                data_points: vec![SummaryDataPoint::default()],
            })),
            metric(Data::ExponentialHistogram(ExponentialHistogram {
                data_points: vec![ExponentialHistogramDataPoint::default()],
                aggregation_temporality: 1,
            })),
        ];
        assert_eq!(kept, want);
    }

    #[test]
    fn what_is_no_protobuf_is_named() {
        for (body, want) in [
            (&b"\x0a\x05ab"[..], "a field of 5 bytes where 2 are left"),
            (b"\x0a", "a varint cut short"),
            (b"\x0b", "wire type 3 of field 1"),
            (&[0xff; 11], "a varint of more than 10 bytes"),
        ] {
            assert_eq!(traces(body, 10).unwrap_err(), want, "{body:?}");
        }
        assert_eq!(
            metrics(b"", 10).unwrap(),
            Trimmed {
                bytes: vec![],
                beyond: 0
            }
        );
    }
}
