//! A message's journey, pure: which trace a lookup names (`Lookup`, from the query string of
//! `GET /journey` and `GET /api/journey`), and the timeline of that trace's spans as
//! `pepsi.telemetry_span` holds them (`build`): each span's start relative to the trace's
//! first, its duration, how long its queue row waited before it, and whether it repeats a
//! stage of its row (a retry) or was cut short (interrupted). No I/O: `api::journey` reads
//! the rows, `journey_page` draws them.

use chrono::{DateTime, Utc};
use pepsi_contract::telemetry::attr;
use serde::Serialize;
use serde_json::Value;

/// The parameters a lookup takes; exactly one of them.
pub const PARAMETERS: [&str; 3] = ["queue", "message_id", "trace"];
/// The longest Message-ID accepted (RFC 5322's line limit).
pub const MAX_MESSAGE_ID: usize = 998;
/// The outcome of a pass cut short by a killed worker, as `SpanOutcome::Interrupted`
/// writes it (`latency`'s query names it too).
pub const INTERRUPTED: &str = "interrupted";

/// What a journey is looked up by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// A `pepsi.workqueue` row: the traces of the spans that carry it.
    Queue(i64),
    /// A Message-ID without its angle brackets: the traces of the spans that carry it,
    /// stored with or without them.
    MessageId(String),
    /// One trace.
    Trace([u8; 16]),
}

impl Lookup {
    /// How the pages and errors name it.
    pub fn describe(&self) -> String {
        match self {
            Lookup::Queue(id) => format!("queue row {id}"),
            Lookup::MessageId(m) => format!("Message-ID <{m}>"),
            Lookup::Trace(t) => format!("trace {}", hex(t)),
        }
    }

    /// The query-string parameter and value that name it again (`queue=42`).
    pub fn parameter(&self) -> (&'static str, String) {
        match self {
            Lookup::Queue(id) => ("queue", id.to_string()),
            Lookup::MessageId(m) => ("message_id", m.clone()),
            Lookup::Trace(t) => ("trace", hex(t)),
        }
    }

    /// The stored forms a Message-ID may have: bare and in angle brackets.
    pub fn message_id_forms(bare: &str) -> [String; 2] {
        [bare.to_owned(), format!("<{bare}>")]
    }
}

/// Lower-case hexadecimal of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A trace id from 32 hexadecimal digits (either case); all zeros is no trace (OpenTelemetry
/// calls it invalid).
pub fn parse_trace(text: &str) -> Result<[u8; 16], String> {
    let t = text.trim();
    let bad = || format!("trace: {text:?} is not a trace id (32 hexadecimal digits)");
    if t.len() != 32 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    if out == [0; 16] {
        return Err(format!("trace: {text:?} is all zeros, which no trace has"));
    }
    Ok(out)
}

/// A Message-ID as typed, with or without its angle brackets, to the bare form.
pub fn parse_message_id(text: &str) -> Result<String, String> {
    let t = text.trim();
    let t = t.strip_prefix('<').unwrap_or(t);
    let t = t.strip_suffix('>').unwrap_or(t).trim();
    if t.is_empty() {
        return Err(format!("message_id: {text:?} holds no Message-ID"));
    }
    if t.chars().count() > MAX_MESSAGE_ID {
        return Err(format!(
            "message_id: longer than {MAX_MESSAGE_ID} characters"
        ));
    }
    if t.chars().any(char::is_control) {
        return Err("message_id: holds a control character".into());
    }
    Ok(t.to_owned())
}

fn parse_queue(text: &str) -> Result<i64, String> {
    text.trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("queue: {text:?} is not a queue row id (a whole number above 0)"))
}

/// The lookup `pairs` name: `Ok(None)` when they name none. More than one, an unknown
/// parameter or a bad value is an error naming it.
pub fn lookup(pairs: &[(String, String)]) -> Result<Option<Lookup>, String> {
    let mut found = None;
    for (k, v) in pairs {
        let l = match k.as_str() {
            "queue" => Lookup::Queue(parse_queue(v)?),
            "message_id" => Lookup::MessageId(parse_message_id(v)?),
            "trace" => Lookup::Trace(parse_trace(v)?),
            other => {
                return Err(format!(
                    "unknown parameter {other:?} (expected one of: {})",
                    PARAMETERS.join(", ")
                ));
            }
        };
        if found.is_some() {
            return Err(format!(
                "give one of {} at a time, not several",
                PARAMETERS.join(", ")
            ));
        }
        found = Some(l);
    }
    Ok(found)
}

/// One row of `pepsi.telemetry_span`, as the receiver stored it.
pub use pepsi_contract::telemetry::SpanRow;

/// One span of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Span {
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub name: String,
    pub host: Option<String>,
    pub service: Option<String>,
    /// The attribute `pepsi.program`.
    pub program: Option<String>,
    /// None for the ingress's span.
    pub stage: Option<String>,
    pub outcome: Option<String>,
    pub queue_id: Option<i64>,
    pub message_id: Option<String>,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// Milliseconds from the trace's first span's start to this one's.
    pub offset_ms: f64,
    /// `end - start` in milliseconds (0 when a clock made it negative).
    pub duration_ms: f64,
    /// How long the queue row waited before this span: its start minus the latest end of
    /// the row's spans that started before it, never negative; None for the row's first.
    pub wait_ms: Option<f64>,
    /// The attribute `pepsi.dispatch_wait_ms`: from the dispatcher's claim to the start.
    pub dispatch_wait_ms: Option<f64>,
    /// The stage this span's hop was fused into (attribute `pepsi.fused_into`).
    pub fused_into: Option<String>,
    /// The how-manieth pass of this stage for this queue row, from 1; more is a retry.
    pub attempt: u32,
    /// The worker died mid-pass (outcome `interrupted`).
    pub interrupted: bool,
    /// OTLP status: 0 unset, 1 ok, 2 error.
    pub status_code: i16,
    pub status_message: Option<String>,
    pub attributes: Value,
}

impl Span {
    /// A pass of a stage this queue row had passed before.
    pub fn is_retry(&self) -> bool {
        self.attempt > 1
    }
}

/// A message's journey: one trace, the other traces the lookup found, the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Journey {
    pub trace_id: String,
    /// The other traces the lookup matched, the one that began last first.
    pub traces: Vec<String>,
    /// The first span's start.
    pub start: DateTime<Utc>,
    /// From the first span's start to the last end, in milliseconds.
    pub duration_ms: f64,
    /// The trace holds more spans than are shown (`api::journey::MAX_SPANS`).
    pub truncated: bool,
    pub spans: Vec<Span>,
}

fn millis(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let d = to - from;
    match d.num_microseconds() {
        Some(us) => us as f64 / 1000.0,
        None => d.num_milliseconds() as f64,
    }
}

fn number(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_owned)
}

/// The timeline of one trace's `rows` (any order; `trace_id` its id, `traces` the others
/// the lookup found). None when there are no rows.
pub fn build(
    trace_id: &[u8],
    traces: Vec<String>,
    mut rows: Vec<SpanRow>,
    truncated: bool,
) -> Option<Journey> {
    rows.sort_by(|a, b| {
        (a.start_time, a.end_time, &a.span_id).cmp(&(b.start_time, b.end_time, &b.span_id))
    });
    let first = rows.first()?.start_time;
    let last = rows.iter().map(|r| r.end_time).max().unwrap_or(first);
    // Per queue row: the latest end of its spans so far, and the passes of each stage.
    let mut row_end: std::collections::HashMap<i64, DateTime<Utc>> = Default::default();
    let mut passes: std::collections::HashMap<(i64, String), u32> = Default::default();
    let spans = rows
        .into_iter()
        .map(|r| {
            let wait_ms = r.queue_id.and_then(|q| {
                let before = row_end.get(&q).copied();
                let end = row_end.entry(q).or_insert(r.end_time);
                *end = (*end).max(r.end_time);
                before.map(|b| millis(b, r.start_time).max(0.0))
            });
            let attempt = match (r.queue_id, &r.stage) {
                (Some(q), Some(stage)) => {
                    let n = passes.entry((q, stage.clone())).or_insert(0);
                    *n += 1;
                    *n
                }
                _ => 1,
            };
            Span {
                span_id: hex(&r.span_id),
                parent_span_id: r.parent_span_id.as_deref().map(hex),
                program: text(r.attributes.get(attr::PROGRAM)),
                dispatch_wait_ms: number(r.attributes.get(attr::DISPATCH_WAIT_MS)),
                fused_into: text(r.attributes.get(attr::FUSED_INTO)),
                offset_ms: millis(first, r.start_time).max(0.0),
                duration_ms: millis(r.start_time, r.end_time).max(0.0),
                wait_ms,
                attempt,
                interrupted: r.outcome.as_deref() == Some(INTERRUPTED),
                name: r.name,
                host: r.host,
                service: r.service,
                stage: r.stage,
                outcome: r.outcome,
                queue_id: r.queue_id,
                message_id: r.message_id,
                start: r.start_time,
                end: r.end_time,
                status_code: r.status_code,
                status_message: r.status_message,
                attributes: r.attributes,
            }
        })
        .collect();
    Some(Journey {
        trace_id: hex(trace_id),
        traces,
        start: first,
        duration_ms: millis(first, last).max(0.0),
        truncated,
        spans,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pairs(q: &[(&str, &str)]) -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn lookups_read_and_refuse() {
        let trace = "0AF7651916CD43DD8448EB211C80319C";
        // (the query, the lookup or a part of the error)
        type Case<'a> = (&'a [(&'a str, &'a str)], Result<Option<Lookup>, &'a str>);
        let cases: [Case; 14] = [
            (&[], Ok(None)),
            (&[("queue", "42")], Ok(Some(Lookup::Queue(42)))),
            (
                &[("message_id", "<a.b@example.org>")],
                Ok(Some(Lookup::MessageId("a.b@example.org".into()))),
            ),
            (
                &[("message_id", " a.b@example.org ")],
                Ok(Some(Lookup::MessageId("a.b@example.org".into()))),
            ),
            (
                &[("trace", trace)],
                Ok(Some(Lookup::Trace(parse_trace(trace).unwrap()))),
            ),
            (&[("queue", "0")], Err("queue: \"0\" is not a queue row id")),
            (&[("queue", "x")], Err("queue: \"x\" is not a queue row id")),
            (
                &[("message_id", "<>")],
                Err("message_id: \"<>\" holds no Message-ID"),
            ),
            (
                &[("message_id", "a\nb")],
                Err("message_id: holds a control character"),
            ),
            (&[("trace", "abc")], Err("trace: \"abc\" is not a trace id")),
            (&[("trace", &"g".repeat(32))], Err("is not a trace id")),
            (&[("trace", &"0".repeat(32))], Err("is all zeros")),
            (
                &[("queue", "1"), ("trace", trace)],
                Err("give one of queue, message_id, trace at a time"),
            ),
            (
                &[("id", "1")],
                Err("unknown parameter \"id\" (expected one of: queue, message_id, trace)"),
            ),
        ];
        for (q, want) in cases {
            let got = lookup(&pairs(q));
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{q:?}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{q:?}: {e}"),
                (g, w) => panic!("{q:?}: got {g:?}, want {w:?}"),
            }
        }
        assert_eq!(hex(&parse_trace(trace).unwrap()), trace.to_lowercase());
        let long = "x".repeat(MAX_MESSAGE_ID + 1);
        assert!(
            parse_message_id(&long)
                .unwrap_err()
                .contains("longer than 998")
        );
        assert_eq!(
            Lookup::message_id_forms("a@b"),
            ["a@b".to_owned(), "<a@b>".to_owned()]
        );
    }

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_790_000_000_000 + ms).unwrap()
    }

    /// (span id, queue row, stage, outcome, start ms, end ms, attributes)
    type Row<'a> = (u8, i64, Option<&'a str>, &'a str, i64, i64, Value);

    fn row((id, q, stage, outcome, start, end, attributes): Row) -> SpanRow {
        SpanRow {
            trace_id: vec![1; 16],
            span_id: vec![0, 0, 0, 0, 0, 0, 0, id],
            parent_span_id: (id != 1).then(|| vec![0, 0, 0, 0, 0, 0, 0, 1]),
            name: stage.map_or("ingress".into(), |s| format!("stage {s}")),
            service: Some("pepsi".into()),
            host: Some("mx1".into()),
            stage: stage.map(str::to_owned),
            queue_id: Some(q),
            message_id: Some("<m@x>".into()),
            outcome: Some(outcome.into()),
            start_time: at(start),
            end_time: at(end),
            attributes,
            status_code: 0,
            status_message: None,
        }
    }

    #[test]
    fn the_timeline_orders_spans_and_computes_waits_retries_and_interruptions() {
        let rows: Vec<Row> = vec![
            // Given out of order: build sorts by start.
            (4, 7, Some("relay"), "interrupted", 300, 900, json!({})),
            (
                1,
                7,
                None,
                "accepted",
                0,
                100,
                json!({"pepsi.program": "pepsi-ingress"}),
            ),
            (
                2,
                7,
                Some("route"),
                "advanced",
                130,
                150,
                json!({"pepsi.dispatch_wait_ms": 4, "pepsi.program": "pepsi-stage-route"}),
            ),
            // Fused into route, inside its pass: the row waited for nothing.
            (
                3,
                7,
                Some("dkim"),
                "advanced",
                140,
                145,
                json!({"pepsi.fused_into": "route"}),
            ),
            (
                5,
                7,
                Some("relay"),
                "deferred",
                1000,
                1200,
                json!({"pepsi.dispatch_wait_ms": "2.5"}),
            ),
            (6, 7, Some("relay"), "finished", 2000, 2100, json!({})),
            // A child row of the same trace: its first span has no wait.
            (7, 8, Some("local"), "finished", 2050, 2060, json!({})),
            // A clock behind: a negative duration and wait are 0.
            (8, 8, Some("local"), "finished", 2070, 2065, json!({})),
        ];
        let j = build(
            &[0xab; 16],
            vec!["cd".repeat(16)],
            rows.into_iter().map(row).collect(),
            false,
        )
        .unwrap();
        assert_eq!(j.trace_id, "ab".repeat(16));
        assert_eq!(j.traces, ["cd".repeat(16)]);
        assert_eq!(j.start, at(0));
        assert_eq!(j.duration_ms, 2100.0);
        // (span, stage, offset, duration, wait, dispatch wait, attempt, interrupted)
        let got: Vec<_> = j
            .spans
            .iter()
            .map(|s| {
                (
                    s.span_id.clone(),
                    s.stage.clone().unwrap_or("ingress".into()),
                    s.offset_ms,
                    s.duration_ms,
                    s.wait_ms,
                    s.dispatch_wait_ms,
                    s.attempt,
                    s.interrupted,
                )
            })
            .collect();
        let want = [
            ("01", "ingress", 0.0, 100.0, None, None, 1, false),
            ("02", "route", 130.0, 20.0, Some(30.0), Some(4.0), 1, false),
            ("03", "dkim", 140.0, 5.0, Some(0.0), None, 1, false),
            ("04", "relay", 300.0, 600.0, Some(150.0), None, 1, true),
            (
                "05",
                "relay",
                1000.0,
                200.0,
                Some(100.0),
                Some(2.5),
                2,
                false,
            ),
            ("06", "relay", 2000.0, 100.0, Some(800.0), None, 3, false),
            ("07", "local", 2050.0, 10.0, None, None, 1, false),
            ("08", "local", 2070.0, 0.0, Some(10.0), None, 2, false),
        ];
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.0, format!("00000000000000{}", w.0));
            assert_eq!(
                (g.1.as_str(), g.2, g.3, g.4, g.5, g.6, g.7),
                (w.1, w.2, w.3, w.4, w.5, w.6, w.7),
                "span {}",
                w.0
            );
        }
        assert_eq!(j.spans[0].program.as_deref(), Some("pepsi-ingress"));
        assert_eq!(j.spans[0].parent_span_id, None);
        assert_eq!(
            j.spans[1].parent_span_id.as_deref(),
            Some("0000000000000001")
        );
        assert_eq!(j.spans[2].fused_into.as_deref(), Some("route"));
        assert!(j.spans[4].is_retry() && !j.spans[3].is_retry());
        assert_eq!(build(&[1; 16], vec![], vec![], false), None);
        assert_eq!(
            INTERRUPTED,
            pepsi_contract::telemetry::SpanOutcome::Interrupted.as_str()
        );
    }
}
