//! The span of a pass its worker never answered: the worker died (a crash, a kill -9) or
//! was killed past MAX_RUNTIME while the dispatcher watched the pass run. Only the dispatcher
//! saw both ends, so it tells the host's telemetry client, in the message's own trace
//! (`state.trace`, read from the row), that the pass was cut short; the pass that runs the
//! row again is a second span of the same stage in that trace.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use pepsi_contract::state::Trace;
use pepsi_contract::telemetry::wire::unix_ns;
use pepsi_contract::telemetry::{Emitter, SpanId, SpanKind, SpanOutcome, SpanRecord, TraceId};
use sqlx::PgPool;

/// The pass that was cut short.
#[derive(Debug, Clone)]
pub struct Interrupted {
    pub id: i64,
    pub stage: String,
    /// The worker's program.
    pub program: String,
    pub pid: u32,
    /// When the dispatcher saw the pass start (the id reached the head of the worker's
    /// queue).
    pub started: Instant,
    /// What happened to the worker.
    pub reason: String,
}

impl Interrupted {
    /// The span, in trace `trace` (None: the row carries none) and ending `now`.
    pub fn span(&self, trace: Option<Trace>, now: SystemTime, now_mono: Instant) -> SpanRecord {
        let start = now
            .checked_sub(now_mono.saturating_duration_since(self.started))
            .unwrap_or(now);
        let (trace_id, parent) = match trace {
            Some(t) => (t.trace_id, Some(t.span_id)),
            None => (TraceId::of_row(self.id), None),
        };
        SpanRecord {
            trace_id,
            span_id: SpanId::random(),
            parent,
            kind: SpanKind::Interrupted,
            program: self.program.clone(),
            pid: self.pid,
            stage: Some(self.stage.clone()),
            queue_id: Some(self.id),
            message_id: None,
            start_ns: unix_ns(start),
            end_ns: unix_ns(now),
            outcome: SpanOutcome::Interrupted,
            next_stage: None,
            fused_into: None,
            dispatch_wait_ms: None,
            error: Some(self.reason.clone()),
            rcpt_count: None,
            size: None,
            mail_from: None,
            rcpt_to: Vec::new(),
            sender_dropped: 0,
        }
    }
}

/// Reads the row's trace and hands the span over, in a task of its own: the dispatcher's
/// loop never waits on it, and a row already gone is traced under its own id.
pub fn report(db: &PgPool, emitter: &Arc<Emitter>, cut: Interrupted) {
    if !emitter.is_on() {
        return;
    }
    let (now, now_mono) = (SystemTime::now(), Instant::now());
    let (db, emitter) = (db.clone(), emitter.clone());
    tokio::spawn(async move {
        let stored: Option<serde_json::Value> = sqlx::query_scalar(
            "SELECT state -> 'trace' FROM pepsi.workqueue WHERE workqueue_id = $1",
        )
        .bind(cut.id)
        .fetch_optional(&db)
        .await
        .ok()
        .flatten();
        let trace = stored.and_then(|v| Trace::from_value(&v).ok());
        emitter.emit(&cut.span(trace, now, now_mono));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_span_runs_from_the_pass_start_to_now_in_the_rows_trace() {
        let mono = Instant::now();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let cut = Interrupted {
            id: 9,
            stage: "local".into(),
            program: "pepsi-stage-relay-to-maildir".into(),
            pid: 77,
            started: mono,
            reason: "was killed by signal 9".into(),
        };
        let later = mono + Duration::from_millis(1500);
        let trace = Trace {
            trace_id: TraceId::parse("0af7651916cd43dd8448eb211c80319c").unwrap(),
            span_id: SpanId::parse("b7ad6b7169203331").unwrap(),
        };
        let span = cut.span(Some(trace), now, later);
        assert_eq!(span.end_ns - span.start_ns, 1_500_000_000);
        assert_eq!(span.trace_id, trace.trace_id);
        assert_eq!(span.parent, Some(trace.span_id));
        assert_eq!(span.outcome, SpanOutcome::Interrupted);
        assert_eq!(span.name(), "interrupted local");
        let own = cut.span(None, now, later);
        assert_eq!(own.trace_id, TraceId::of_row(9));
        assert_eq!(own.parent, None);
    }
}
