//! From the span record to what is exported: the privacy rule applied as a span arrives
//! (`admit`, from `pepsi_contract::telemetry::privacy`), and the OpenTelemetry span data
//! made of what is left (`span_data`), under the attribute names of
//! `pepsi_contract::telemetry::attr`. Pure.
//!
//! What leaves the host is what a record carries and nothing more: no body and no header
//! field but the Message-ID ever reach a record (`telemetry::wire`), and the envelope's
//! addresses only with ADDRESSES on. With it off they are dropped as the span arrives,
//! before it is queued (whatever its sender's own setting), and anything address-shaped in
//! an error text (a peer's "550 <bob@example.org>: unknown user") is replaced by
//! `[address]`.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind as OtelKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use pepsi_contract::telemetry::attr;
use pepsi_contract::telemetry::{SpanKind, SpanRecord};

/// The privacy rule, the one the sending processes apply too (`telemetry::privacy`).
pub use pepsi_contract::telemetry::privacy::{ADDRESS_MARK, admit, mask_addresses};

/// The instrumentation scope every exported span names.
pub fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("pepsi-telemetry-client")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

fn int(v: impl TryInto<i64>) -> Value {
    Value::I64(v.try_into().unwrap_or(i64::MAX))
}

/// The span's attributes, in the order of `attr`; an absent field is no attribute.
pub fn attributes(rec: &SpanRecord) -> Vec<KeyValue> {
    let mut kv = vec![
        KeyValue::new(attr::PROGRAM, rec.program.clone()),
        KeyValue::new(attr::PID, int(rec.pid)),
    ];
    let mut text = |key: &'static str, v: &Option<String>| {
        if let Some(v) = v {
            kv.push(KeyValue::new(key, v.clone()));
        }
    };
    text(attr::STAGE, &rec.stage);
    text(attr::MESSAGE_ID, &rec.message_id);
    text(attr::NEXT_STAGE, &rec.next_stage);
    text(attr::FUSED_INTO, &rec.fused_into);
    text(attr::ERROR, &rec.error);
    text(attr::MAIL_FROM, &rec.mail_from);
    kv.push(KeyValue::new(attr::OUTCOME, rec.outcome.as_str()));
    if let Some(id) = rec.queue_id {
        kv.push(KeyValue::new(attr::QUEUE_ID, id));
    }
    if let Some(ms) = rec.dispatch_wait_ms {
        kv.push(KeyValue::new(attr::DISPATCH_WAIT_MS, ms));
    }
    if let Some(n) = rec.rcpt_count {
        kv.push(KeyValue::new(attr::RCPT_COUNT, int(n)));
    }
    if let Some(n) = rec.size {
        kv.push(KeyValue::new(attr::SIZE, int(n)));
    }
    if !rec.rcpt_to.is_empty() {
        let rcpts: Vec<StringValue> = rec.rcpt_to.iter().cloned().map(StringValue::from).collect();
        kv.push(KeyValue::new(
            attr::RCPT_TO,
            Value::Array(Array::String(rcpts)),
        ));
    }
    kv
}

/// The span as OpenTelemetry exports it: its own ids and times, `SpanRecord::name`, kind
/// server for the ingress's transaction and internal otherwise, and an error status (with
/// the error text, else the outcome) for an outcome that is one.
pub fn span_data(rec: &SpanRecord, scope: &InstrumentationScope) -> SpanData {
    let context = SpanContext::new(
        TraceId::from_bytes(rec.trace_id.to_bytes()),
        SpanId::from_bytes(rec.span_id.to_bytes()),
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    );
    let status = if rec.outcome.is_error() {
        Status::error(
            rec.error
                .clone()
                .unwrap_or_else(|| rec.outcome.as_str().to_owned()),
        )
    } else {
        Status::Unset
    };
    SpanData {
        span_context: context,
        parent_span_id: rec
            .parent
            .map_or(SpanId::INVALID, |p| SpanId::from_bytes(p.to_bytes())),
        parent_span_is_remote: false,
        span_kind: match rec.kind {
            SpanKind::Ingress => OtelKind::Server,
            SpanKind::Pass | SpanKind::Interrupted => OtelKind::Internal,
        },
        name: Cow::Owned(rec.name()),
        start_time: rec.start(),
        end_time: rec.end().max(rec.start()),
        attributes: attributes(rec),
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: scope.clone(),
    }
}

/// Seconds from `start` to `end` (0 when backwards).
pub fn seconds(start: SystemTime, end: SystemTime) -> f64 {
    end.duration_since(start).map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pepsi_contract::telemetry::{SpanId as PSpanId, SpanOutcome, TraceId as PTraceId};

    fn record() -> SpanRecord {
        SpanRecord {
            trace_id: PTraceId::parse("0af7651916cd43dd8448eb211c80319c").unwrap(),
            span_id: PSpanId::parse("b7ad6b7169203331").unwrap(),
            parent: PSpanId::parse("00f067aa0ba902b7"),
            kind: SpanKind::Pass,
            program: "pepsi-stage-route".into(),
            pid: 4242,
            stage: Some("route".into()),
            queue_id: Some(17),
            message_id: Some("<m1@example.org>".into()),
            start_ns: 1_700_000_000_000_000_000,
            end_ns: 1_700_000_000_250_000_000,
            outcome: SpanOutcome::Advanced,
            next_stage: Some("local".into()),
            fused_into: None,
            dispatch_wait_ms: Some(0.5),
            error: None,
            rcpt_count: Some(2),
            size: None,
            mail_from: Some("alice@example.org".into()),
            rcpt_to: vec!["bob@example.net".into(), "carol@example.net".into()],
            sender_dropped: 0,
        }
    }

    /// The attributes as `key=value` text, in order.
    fn shown(kv: &[KeyValue]) -> Vec<String> {
        kv.iter()
            .map(|kv| format!("{}={}", kv.key, kv.value))
            .collect()
    }

    #[test]
    fn a_span_without_addresses_unless_they_may_leave() {
        let mut rec = record();
        rec.error = Some("relay refused alice@example.org".into());
        let kept = admit(rec.clone(), true);
        assert_eq!(kept, rec);
        let stripped = admit(rec, false);
        assert_eq!(stripped.mail_from, None);
        assert!(stripped.rcpt_to.is_empty());
        assert_eq!(stripped.error.as_deref(), Some("relay refused [address]"));
        assert_eq!(stripped.message_id.as_deref(), Some("<m1@example.org>"));
        let text = shown(&attributes(&stripped)).join(" ");
        assert!(
            !text.contains("alice") && !text.contains("bob") && !text.contains("carol"),
            "{text}"
        );
    }

    #[test]
    fn every_field_becomes_its_attribute() {
        assert_eq!(
            shown(&attributes(&record())),
            [
                "pepsi.program=pepsi-stage-route",
                "process.pid=4242",
                "pepsi.stage=route",
                "pepsi.message_id=<m1@example.org>",
                "pepsi.next_stage=local",
                "pepsi.mail_from=alice@example.org",
                "pepsi.outcome=advanced",
                "pepsi.queue_id=17",
                "pepsi.dispatch_wait_ms=0.5",
                "pepsi.rcpt_count=2",
                r#"pepsi.rcpt_to=["bob@example.net","carol@example.net"]"#,
            ]
        );
        let mut ingress = record();
        ingress.kind = SpanKind::Ingress;
        ingress.stage = None;
        ingress.parent = None;
        ingress.next_stage = None;
        ingress.dispatch_wait_ms = None;
        ingress.outcome = SpanOutcome::Accepted;
        ingress.size = Some(2048);
        ingress.fused_into = Some("route".into());
        let attrs = shown(&attributes(&ingress));
        assert!(attrs.contains(&"pepsi.size=2048".to_owned()), "{attrs:?}");
        assert!(
            attrs.contains(&"pepsi.fused_into=route".to_owned()),
            "{attrs:?}"
        );
        assert!(
            !attrs.iter().any(|a| a.starts_with("pepsi.stage=")),
            "{attrs:?}"
        );
    }

    #[test]
    fn ids_times_kind_and_status() {
        let scope = scope();
        let data = span_data(&record(), &scope);
        assert_eq!(
            data.span_context.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(data.span_context.span_id().to_string(), "b7ad6b7169203331");
        assert_eq!(data.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert_eq!(data.name, "route");
        assert_eq!(data.span_kind, OtelKind::Internal);
        assert_eq!(data.status, Status::Unset);
        assert_eq!(seconds(data.start_time, data.end_time), 0.25);
        assert_eq!(data.instrumentation_scope.name(), "pepsi-telemetry-client");

        let mut ingress = record();
        ingress.kind = SpanKind::Ingress;
        ingress.parent = None;
        ingress.outcome = SpanOutcome::Accepted;
        let data = span_data(&ingress, &scope);
        assert_eq!(
            (data.span_kind, data.name.as_ref()),
            (OtelKind::Server, "ingress")
        );
        assert_eq!(data.parent_span_id, SpanId::INVALID);

        let mut failed = record();
        failed.outcome = SpanOutcome::Failed;
        failed.error = Some("no route to example.net".into());
        assert_eq!(
            span_data(&failed, &scope).status,
            Status::error("no route to example.net")
        );
        let mut interrupted = record();
        interrupted.kind = SpanKind::Interrupted;
        interrupted.outcome = SpanOutcome::Interrupted;
        let data = span_data(&interrupted, &scope);
        assert_eq!(data.name, "interrupted route");
        assert_eq!(data.status, Status::error("interrupted"));
        for outcome in [SpanOutcome::Paused, SpanOutcome::Finished] {
            let mut r = record();
            r.outcome = outcome;
            assert_eq!(span_data(&r, &scope).status, Status::Unset);
        }
        let mut deferred = record();
        deferred.outcome = SpanOutcome::Deferred;
        assert_eq!(
            span_data(&deferred, &scope).status,
            Status::error("deferred")
        );
    }
}
