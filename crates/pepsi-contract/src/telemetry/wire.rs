//! What a Pepsi process hands to its host's `pepsi-telemetry-client`: one JSON object, a
//! *datagram*, per frame on a Unix stream socket (`[pepsi-telemetry-client] SOCKET`), either
//! a finished span (`SpanRecord`) or a program's counters since its last report
//! (`CountersRecord`: the ingress's and the dispatcher's, each time they write their
//! statistics). A frame is the datagram's length in `FRAME_HEADER` octets (big-endian), then
//! the datagram (`frame`, `frame_len`). The one definition both ends use. Pure, but for
//! `read_frame`, the blocking reader tools and tests use.
//!
//! Everything a span may carry is bounded here, where it is written and again where it is
//! read: a datagram is at most `MAX_DATAGRAM` octets (a frame announcing more ends the
//! stream), text fields are cut to their limits and
//! the recipient list to `MAX_RCPTS`. Addresses ride only as far as the client on the same
//! host, which drops them unless its ADDRESSES is on; nothing of a body or a header field but
//! the Message-ID is ever put in a record.

use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ids::{SpanId, TraceId};

/// The largest datagram either end deals with.
pub const MAX_DATAGRAM: usize = 16 * 1024;
/// Longest stage, program or next-stage name kept.
pub const MAX_NAME: usize = 128;
/// Longest Message-ID kept (RFC 5322's line limit).
pub const MAX_MESSAGE_ID: usize = 998;
/// Longest error text kept.
pub const MAX_ERROR: usize = 1000;
/// Longest address kept, and at most this many recipients.
pub const MAX_ADDRESS: usize = 320;
pub const MAX_RCPTS: usize = 20;

/// What the span stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    /// The ingress's SMTP transaction, MAIL FROM to the row stored: the trace's root.
    Ingress,
    /// One stage's run over a row (a stage fused into another's pass included).
    Pass,
    /// A pass its worker never answered: the worker died or was killed mid-pass. Told by the
    /// dispatcher, which saw the pass start and the worker go.
    Interrupted,
}

/// How the span ended; the names `attr::OUTCOME` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanOutcome {
    Accepted,
    Advanced,
    Paused,
    Finished,
    Failed,
    /// A temporary failure: the row is retried.
    Deferred,
    Interrupted,
    /// The pass's commit found the row no longer its own (another dispatcher took it over):
    /// the message goes on elsewhere.
    Abandoned,
}

impl SpanOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            SpanOutcome::Accepted => "accepted",
            SpanOutcome::Advanced => "advanced",
            SpanOutcome::Paused => "paused",
            SpanOutcome::Finished => "finished",
            SpanOutcome::Failed => "failed",
            SpanOutcome::Deferred => "deferred",
            SpanOutcome::Interrupted => "interrupted",
            SpanOutcome::Abandoned => "abandoned",
        }
    }

    /// The span's status is an error (OTLP status code 2).
    pub fn is_error(self) -> bool {
        matches!(
            self,
            SpanOutcome::Failed | SpanOutcome::Deferred | SpanOutcome::Interrupted
        )
    }
}

/// One finished span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanRecord {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The ingress's span for a pass; none for a trace's root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<SpanId>,
    pub kind: SpanKind,
    /// The program that ran it (`pepsi-ingress`, `pepsi-stage-route`, `pepsi-dispatch`).
    pub program: String,
    pub pid: u32,
    /// The stage section; none for the ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Nanoseconds since the Unix epoch.
    pub start_ns: u64,
    pub end_ns: u64,
    pub outcome: SpanOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_stage: Option<String>,
    /// The stage whose pass this hop ran inside (stage fusion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused_into: Option<String>,
    /// Milliseconds from the dispatcher's claim to the pass's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_wait_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rcpt_count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The envelope, for a client whose ADDRESSES is on; never exported otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mail_from: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rcpt_to: Vec<String>,
    /// Spans this process could not hand over before this one (no client, a full socket),
    /// counted since it started: the client reports the drops it never saw.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sender_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// At most this many counters in one record.
pub const MAX_COUNTERS: usize = 512;

/// A program's counters since its last report: what it adds to its statistics table, told
/// to the client as well.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CountersRecord {
    /// `pepsi-ingress`, `pepsi-dispatch`.
    pub program: String,
    pub pid: u32,
    pub counters: Vec<CounterDelta>,
}

/// One counter's increase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterDelta {
    /// `pepsi.ingress.sessions`, `pepsi.dispatch.stage_passes`, ...
    pub name: String,
    /// The attribute the counter is split by (`reason`, `stage`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<(String, String)>,
    pub value: f64,
}

impl CountersRecord {
    /// Within the limits: at most `MAX_COUNTERS`, names and labels cut to `MAX_NAME`, no
    /// value that is not a finite non-negative number.
    pub fn bounded(mut self) -> Self {
        cut(&mut self.program, MAX_NAME);
        self.counters.truncate(MAX_COUNTERS);
        self.counters
            .retain(|c| c.value.is_finite() && c.value >= 0.0);
        for c in &mut self.counters {
            cut(&mut c.name, MAX_NAME);
            if let Some((k, v)) = &mut c.label {
                cut(k, MAX_NAME);
                cut(v, MAX_NAME);
            }
        }
        self
    }

    /// The datagram, within its limits.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(&self.clone().bounded()).expect("a counters record serialises")
    }
}

/// One datagram as the client reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Datagram {
    Span(Box<SpanRecord>),
    Counters(CountersRecord),
}

impl Datagram {
    /// Reads a datagram: a counters record (it has `counters`) or a span record
    /// (`SpanRecord::decode`'s checks), bounded as their writers bound them.
    pub fn decode(datagram: &[u8]) -> Result<Datagram, WireError> {
        if datagram.len() > MAX_DATAGRAM {
            return Err(WireError::TooLarge(datagram.len()));
        }
        let value: Value =
            serde_json::from_slice(datagram).map_err(|e| WireError::Malformed(e.to_string()))?;
        if value.get("counters").is_some() {
            let rec: CountersRecord = serde_json::from_value(value)
                .map_err(|e| WireError::Malformed(format!("counters: {e}")))?;
            return Ok(Datagram::Counters(rec.bounded()));
        }
        let rec: SpanRecord =
            serde_json::from_value(value).map_err(|e| WireError::Malformed(e.to_string()))?;
        rec.checked().map(|r| Datagram::Span(Box::new(r)))
    }
}

/// The Message-ID's identifier alone (`<left@right>`), the one part of a header field that
/// leaves a host: comments, phrases and anything else the sender put around it stay. None
/// when the field holds no such token.
pub fn message_id_token(field: &str) -> Option<String> {
    let start = field.find('<')?;
    let len = field[start..].find('>')?;
    let token = &field[start..=start + len];
    let inner = &token[1..token.len() - 1];
    let ok = inner.contains('@')
        && !inner.starts_with('@')
        && !inner.ends_with('@')
        && inner
            .chars()
            .all(|c| (c.is_ascii_graphic() && c != '<' && c != '>') || !c.is_ascii());
    (ok && token.len() <= MAX_MESSAGE_ID).then(|| token.to_owned())
}

/// The octets before each datagram on the stream: its length, big-endian.
pub const FRAME_HEADER: usize = 4;

/// `datagram` as it goes on the stream: its length, then itself.
pub fn frame(datagram: &[u8]) -> Vec<u8> {
    let len = u32::try_from(datagram.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(FRAME_HEADER + datagram.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(datagram);
    out
}

/// The length of the datagram a frame's header announces; one over `MAX_DATAGRAM` is
/// refused, and the stream cannot be read further (its next frame's start is unknown).
pub fn frame_len(header: [u8; FRAME_HEADER]) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_DATAGRAM {
        return Err(WireError::TooLarge(len));
    }
    Ok(len)
}

/// Reads one frame's datagram from a blocking stream: None at the end of the stream
/// between two frames; an error for one cut short or announcing too much.
pub fn read_frame(stream: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut header = [0u8; FRAME_HEADER];
    let mut got = 0;
    while got < FRAME_HEADER {
        match stream.read(&mut header[got..])? {
            0 if got == 0 => return Ok(None),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    let len = frame_len(header).map_err(std::io::Error::other)?;
    let mut datagram = vec![0u8; len];
    stream.read_exact(&mut datagram)?;
    Ok(Some(datagram))
}

/// Why a datagram was not a span.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("datagram of {0} octets is over the limit of {MAX_DATAGRAM}")]
    TooLarge(usize),
    #[error("datagram is not a span record: {0}")]
    Malformed(String),
    #[error("span {0} ends before it starts")]
    Backwards(SpanId),
}

/// Nanoseconds since the Unix epoch of `t` (0 before it, saturated far after it).
pub fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The time `ns` nanoseconds after the Unix epoch.
pub fn from_unix_ns(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

fn cut(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

fn cut_opt(text: &mut Option<String>, max: usize) {
    if let Some(t) = text {
        cut(t, max);
    }
}

impl SpanRecord {
    /// The span's name as exported: `ingress`, the stage's name, or `interrupted <stage>`.
    pub fn name(&self) -> String {
        let stage = self.stage.as_deref().unwrap_or("-");
        match self.kind {
            SpanKind::Ingress => "ingress".to_owned(),
            SpanKind::Pass => stage.to_owned(),
            SpanKind::Interrupted => format!("interrupted {stage}"),
        }
    }

    pub fn start(&self) -> SystemTime {
        from_unix_ns(self.start_ns)
    }

    pub fn end(&self) -> SystemTime {
        from_unix_ns(self.end_ns)
    }

    /// Every field within its limit (the ends of long text cut off, recipients beyond
    /// `MAX_RCPTS` dropped).
    pub fn bounded(mut self) -> Self {
        cut(&mut self.program, MAX_NAME);
        cut_opt(&mut self.stage, MAX_NAME);
        cut_opt(&mut self.next_stage, MAX_NAME);
        cut_opt(&mut self.fused_into, MAX_NAME);
        cut_opt(&mut self.message_id, MAX_MESSAGE_ID);
        cut_opt(&mut self.error, MAX_ERROR);
        cut_opt(&mut self.mail_from, MAX_ADDRESS);
        self.rcpt_to.truncate(MAX_RCPTS);
        for r in &mut self.rcpt_to {
            cut(r, MAX_ADDRESS);
        }
        self
    }

    /// The datagram: the record within its limits, as JSON. Should escaping still take it
    /// over `MAX_DATAGRAM` (text of control characters), the envelope goes first and then
    /// the longest texts are cut short, so a datagram always fits.
    pub fn encode(&self) -> Vec<u8> {
        let mut bounded = self.clone().bounded();
        let json = |r: &SpanRecord| serde_json::to_vec(r).expect("a span record serialises");
        let mut out = json(&bounded);
        if out.len() > MAX_DATAGRAM {
            bounded.mail_from = None;
            bounded.rcpt_to.clear();
            out = json(&bounded);
        }
        if out.len() > MAX_DATAGRAM {
            cut_opt(&mut bounded.message_id, MAX_NAME);
            cut_opt(&mut bounded.error, MAX_NAME);
            out = json(&bounded);
        }
        out
    }

    /// Reads a datagram, refusing one over the limit, one that is not a record and one whose
    /// end comes before its start; what it holds is bounded as `encode` bounds it.
    pub fn decode(datagram: &[u8]) -> Result<SpanRecord, WireError> {
        if datagram.len() > MAX_DATAGRAM {
            return Err(WireError::TooLarge(datagram.len()));
        }
        let rec: SpanRecord =
            serde_json::from_slice(datagram).map_err(|e| WireError::Malformed(e.to_string()))?;
        rec.checked()
    }

    fn checked(self) -> Result<SpanRecord, WireError> {
        if self.end_ns < self.start_ns {
            return Err(WireError::Backwards(self.span_id));
        }
        Ok(self.bounded())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> SpanRecord {
        SpanRecord {
            trace_id: TraceId::parse("0af7651916cd43dd8448eb211c80319c").unwrap(),
            span_id: SpanId::parse("b7ad6b7169203331").unwrap(),
            parent: SpanId::parse("00f067aa0ba902b7"),
            kind: SpanKind::Pass,
            program: "pepsi-stage-route".into(),
            pid: 4242,
            stage: Some("route".into()),
            queue_id: Some(17),
            message_id: Some("<a@example.org>".into()),
            start_ns: 1_700_000_000_000_000_000,
            end_ns: 1_700_000_000_002_000_000,
            outcome: SpanOutcome::Advanced,
            next_stage: Some("local".into()),
            fused_into: None,
            dispatch_wait_ms: Some(0.4),
            error: None,
            rcpt_count: Some(1),
            size: None,
            mail_from: Some("a@example.org".into()),
            rcpt_to: vec!["b@example.net".into()],
            sender_dropped: 0,
        }
    }

    #[test]
    fn a_datagram_is_a_span_or_a_programs_counters() {
        let span = sample();
        assert_eq!(
            Datagram::decode(&span.encode()).unwrap(),
            Datagram::Span(Box::new(span.clone()))
        );
        let counters = CountersRecord {
            program: "pepsi-ingress".into(),
            pid: 7,
            counters: vec![
                CounterDelta {
                    name: "pepsi.ingress.refused".into(),
                    label: Some(("reason".into(), "5.7.1".into())),
                    value: 3.0,
                },
                CounterDelta {
                    name: "pepsi.ingress.sessions".into(),
                    label: None,
                    value: f64::NAN,
                },
            ],
        };
        let Datagram::Counters(back) = Datagram::decode(&counters.encode()).unwrap() else {
            panic!("not read as counters");
        };
        assert_eq!(back.counters.len(), 1, "the NaN is dropped: {back:?}");
        assert_eq!(
            back.counters[0].label,
            Some(("reason".into(), "5.7.1".into()))
        );
        let err = Datagram::decode(br#"{"counters": 3}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("counters"), "{err}");
        let mut backwards = sample();
        backwards.end_ns = backwards.start_ns - 1;
        let err = Datagram::decode(&serde_json::to_vec(&backwards).unwrap()).unwrap_err();
        assert!(err.to_string().contains("ends before it starts"), "{err}");
    }

    #[test]
    fn frames_carry_datagrams_back_to_back_and_refuse_an_oversized_one() {
        let span = sample().encode();
        let counters = CountersRecord {
            program: "pepsi-dispatch".into(),
            pid: 1,
            counters: Vec::new(),
        }
        .encode();
        let mut stream = frame(&span);
        stream.extend(frame(&counters));
        assert_eq!(stream.len(), 2 * FRAME_HEADER + span.len() + counters.len());
        let mut r = &stream[..];
        assert_eq!(read_frame(&mut r).unwrap(), Some(span.clone()));
        assert_eq!(read_frame(&mut r).unwrap(), Some(counters));
        assert_eq!(read_frame(&mut r).unwrap(), None);

        let cut = &stream[..FRAME_HEADER + 3];
        let e = read_frame(&mut &cut[..]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        let e = read_frame(&mut &stream[..2]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);

        let over = u32::try_from(MAX_DATAGRAM + 1).unwrap().to_be_bytes();
        assert_eq!(frame_len(over), Err(WireError::TooLarge(MAX_DATAGRAM + 1)));
        let e = read_frame(&mut &over[..]).unwrap_err();
        assert!(e.to_string().contains("over the limit"), "{e}");
        let at = u32::try_from(MAX_DATAGRAM).unwrap().to_be_bytes();
        assert_eq!(frame_len(at), Ok(MAX_DATAGRAM));
    }

    #[test]
    fn only_the_message_ids_identifier_leaves() {
        for (field, want) in [
            ("<a.b@example.org>", Some("<a.b@example.org>")),
            (
                "  <a.b@example.org> (Bob Smith's mail)",
                Some("<a.b@example.org>"),
            ),
            ("Bob <bob@example.org> said", Some("<bob@example.org>")),
            ("<no-at-sign>", None),
            ("<@example.org>", None),
            ("<a b@example.org>", None),
            ("no brackets@example.org", None),
            ("<unterminated@example.org", None),
            ("", None),
        ] {
            assert_eq!(message_id_token(field).as_deref(), want, "{field:?}");
        }
    }

    #[test]
    fn a_record_survives_the_wire() {
        let rec = sample();
        let back = SpanRecord::decode(&rec.encode()).unwrap();
        assert_eq!(back, rec);
        assert_eq!(back.name(), "route");
        let text = String::from_utf8(rec.encode()).unwrap();
        assert!(text.contains(r#""outcome":"advanced""#), "{text}");
        assert!(
            text.contains(r#""trace_id":"0af7651916cd43dd8448eb211c80319c""#),
            "{text}"
        );
    }

    #[test]
    fn the_wire_refuses_what_is_no_span() {
        let mut backwards = sample();
        backwards.end_ns = backwards.start_ns - 1;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"{}".to_vec(), "not a span record"),
            (b"not json".to_vec(), "not a span record"),
            (vec![b' '; MAX_DATAGRAM + 1], "over the limit"),
            (
                serde_json::to_vec(&backwards).unwrap(),
                "ends before it starts",
            ),
            (
                br#"{"trace_id":"00000000000000000000000000000000"}"#.to_vec(),
                "not all zero",
            ),
        ];
        for (datagram, want) in cases {
            let err = SpanRecord::decode(&datagram).unwrap_err().to_string();
            assert!(err.contains(want), "{err} lacks {want}");
        }
    }

    #[test]
    fn every_field_is_bounded_so_a_datagram_stays_under_its_limit() {
        let mut rec = sample();
        rec.message_id = Some("é".repeat(5000));
        rec.error = Some("x".repeat(100_000));
        rec.stage = Some("s".repeat(1000));
        rec.rcpt_to = vec!["r".repeat(5000); 500];
        rec.mail_from = Some("m".repeat(5000));
        let datagram = rec.encode();
        assert!(datagram.len() <= MAX_DATAGRAM, "{}", datagram.len());
        let mut escaped = rec.clone();
        escaped.rcpt_to = vec!["\u{1}".repeat(MAX_ADDRESS); MAX_RCPTS];
        escaped.error = Some("\u{1}".repeat(MAX_ERROR));
        escaped.message_id = Some("\u{1}".repeat(MAX_MESSAGE_ID));
        assert!(escaped.encode().len() <= MAX_DATAGRAM);
        assert!(datagram.len() <= MAX_DATAGRAM, "{}", datagram.len());
        let back = SpanRecord::decode(&datagram).unwrap();
        assert_eq!(back.rcpt_to.len(), MAX_RCPTS);
        assert!(back.message_id.unwrap().len() <= MAX_MESSAGE_ID);
        assert_eq!(back.error.unwrap().len(), MAX_ERROR);
        assert_eq!(back.stage.unwrap().len(), MAX_NAME);
    }
}
