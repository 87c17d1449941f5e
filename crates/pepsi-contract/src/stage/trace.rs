//! The spans of a stage pass: one per stage it ran (its own and each fused into it), joined
//! to the message's trace (`state.trace`, else the row's own `TraceId::of_row`) under the
//! ingress's span, handed to the host's telemetry client when the pass is settled (committed
//! or failed). Built only when telemetry is on; nothing here can fail a pass.

use std::time::SystemTime;

use chrono::{DateTime, Utc};

use super::StageError;
use super::context::{Outcome, StageContext};
use crate::state::Trace;
use crate::telemetry::wire::{message_id_token, unix_ns};
use crate::telemetry::{Emitter, SpanId, SpanKind, SpanOutcome, SpanRecord, TraceId};

/// One stage's run inside a pass.
#[derive(Debug, Clone)]
pub(crate) struct Hop {
    pub stage: String,
    pub start: SystemTime,
    pub end: SystemTime,
}

/// The trace context of a row as loaded: `state.trace`, when it holds one.
pub(crate) fn context_of(ctx: &StageContext<'_>) -> Option<Trace> {
    Trace::from_state(ctx.state()).ok().flatten()
}

/// What a pass's spans need, taken from its context before the context goes.
#[derive(Debug, Clone)]
pub(crate) struct PassTrace {
    trace_id: TraceId,
    parent: Option<SpanId>,
    queue_id: i64,
    message_id: Option<String>,
    mail_from: String,
    rcpt_to: Vec<String>,
    /// When the dispatcher claimed the row (its `updated_at` as loaded).
    claimed: Option<DateTime<Utc>>,
    /// When the pass began (the row's load).
    started: SystemTime,
    /// When it was settled: its commit, or (a pass committed with its batch) the end of its
    /// own processing.
    ended: SystemTime,
    hops: Vec<Hop>,
    outcome: SpanOutcome,
    next_stage: Option<String>,
    error: Option<String>,
}

/// The span outcome of a transition.
pub(crate) fn outcome_of(outcome: &Outcome) -> (SpanOutcome, Option<String>) {
    match outcome {
        Outcome::Advance { stage } => (SpanOutcome::Advanced, Some(stage.clone())),
        Outcome::Pause { .. } | Outcome::PauseWith { .. } => (SpanOutcome::Paused, None),
        Outcome::Fail => (SpanOutcome::Failed, None),
        Outcome::Finish | Outcome::FinishWith { .. } => (SpanOutcome::Finished, None),
    }
}

/// The span outcome of a failed pass: a temporary failure is retried (`deferred`); a row
/// found no longer this pass's own went on elsewhere (`abandoned`).
fn failure_of(e: &StageError) -> SpanOutcome {
    if matches!(e, StageError::NotRunning { .. }) {
        SpanOutcome::Abandoned
    } else if e.is_temporary() {
        SpanOutcome::Deferred
    } else {
        SpanOutcome::Failed
    }
}

impl PassTrace {
    /// The trace context of the row as loaded (`context_of`, read before the pass: a stage
    /// may replace the state), for the pass over `ctx` begun at `started`, whose stages ran
    /// as `hops`, ended with `result`, settled now.
    pub fn of(
        ctx: &StageContext<'_>,
        context: Option<Trace>,
        claimed: Option<DateTime<Utc>>,
        started: SystemTime,
        hops: Vec<Hop>,
        result: Result<&Outcome, &StageError>,
    ) -> Self {
        let (trace_id, parent) = match context {
            Some(t) => (t.trace_id, Some(t.span_id)),
            None => (TraceId::of_row(ctx.id()), None),
        };
        let message_id = ctx.headers().ok().and_then(|h| {
            crate::message::field_values(h, "Message-ID")
                .first()
                .and_then(|v| message_id_token(v))
        });
        let (outcome, next_stage, error) = match result {
            Ok(o) => {
                let (outcome, next) = outcome_of(o);
                (outcome, next, None)
            }
            Err(e) => (failure_of(e), None, Some(e.to_string())),
        };
        Self {
            trace_id,
            parent,
            queue_id: ctx.id(),
            message_id,
            mail_from: ctx.mail_from().to_owned(),
            rcpt_to: ctx.rcpt_to().to_vec(),
            claimed,
            started,
            ended: SystemTime::now(),
            hops,
            outcome,
            next_stage,
            error,
        }
    }

    /// The pass was settled at `at` (its own commit).
    pub fn settled(&mut self, at: SystemTime) {
        self.ended = at;
    }

    /// The pass did not commit after all.
    pub fn failed(mut self, e: &StageError) -> Self {
        self.outcome = failure_of(e);
        self.next_stage = None;
        self.error = Some(e.to_string());
        self
    }

    /// The spans, in order: each hop but the last advanced to the next; the first starts when
    /// the pass began and the last ends now (the commit included).
    pub fn spans(&self, program: &str, ended: SystemTime) -> Vec<SpanRecord> {
        let n = self.hops.len();
        let first_stage = self.hops.first().map(|h| h.stage.clone());
        let dispatch_wait_ms = self.claimed.and_then(|c| {
            let started: DateTime<Utc> = self.started.into();
            let ms = (started - c).num_microseconds()? as f64 / 1000.0;
            (ms >= 0.0).then_some(ms)
        });
        self.hops
            .iter()
            .enumerate()
            .map(|(i, hop)| {
                let last = i + 1 == n;
                let start = if i == 0 { self.started } else { hop.start };
                let end = if last { ended.max(hop.end) } else { hop.end };
                SpanRecord {
                    trace_id: self.trace_id,
                    span_id: SpanId::random(),
                    parent: self.parent,
                    kind: SpanKind::Pass,
                    program: program.to_owned(),
                    pid: std::process::id(),
                    stage: Some(hop.stage.clone()),
                    queue_id: Some(self.queue_id),
                    message_id: self.message_id.clone(),
                    start_ns: unix_ns(start),
                    end_ns: unix_ns(end).max(unix_ns(start)),
                    outcome: if last {
                        self.outcome
                    } else {
                        SpanOutcome::Advanced
                    },
                    next_stage: if last {
                        self.next_stage.clone()
                    } else {
                        Some(self.hops[i + 1].stage.clone())
                    },
                    fused_into: if i == 0 { None } else { first_stage.clone() },
                    dispatch_wait_ms: if i == 0 { dispatch_wait_ms } else { None },
                    error: if last { self.error.clone() } else { None },
                    rcpt_count: u32::try_from(self.rcpt_to.len()).ok(),
                    size: None,
                    mail_from: Some(self.mail_from.clone()),
                    rcpt_to: self.rcpt_to.clone(),
                    sender_dropped: 0,
                }
            })
            .collect()
    }

    /// Hands every span to `emitter`.
    pub fn emit(&self, emitter: &Emitter, program: &str) {
        for span in self.spans(program, self.ended) {
            emitter.emit(&span);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000) + Duration::from_millis(ms)
    }

    fn trace(hops: &[(&str, u64, u64)], outcome: SpanOutcome, next: Option<&str>) -> PassTrace {
        PassTrace {
            trace_id: TraceId::of_row(5),
            parent: SpanId::parse("00f067aa0ba902b7"),
            queue_id: 5,
            message_id: Some("<m@example.org>".into()),
            mail_from: "a@example.org".into(),
            rcpt_to: vec!["b@example.net".into()],
            claimed: Some(at(0).into()),
            started: at(3),
            ended: at(20),
            hops: hops
                .iter()
                .map(|(s, a, b)| Hop {
                    stage: (*s).into(),
                    start: at(*a),
                    end: at(*b),
                })
                .collect(),
            outcome,
            next_stage: next.map(Into::into),
            error: None,
        }
    }

    /// (hops, outcome, next): each span's (stage, start ms, end ms, outcome, next stage,
    /// fused into), with the pass begun at 3 ms and committed at 20 ms.
    #[test]
    fn a_pass_is_one_span_per_stage_it_ran() {
        type Want = (
            &'static str,
            u64,
            u64,
            SpanOutcome,
            Option<&'static str>,
            Option<&'static str>,
        );
        type Case = (
            Vec<(&'static str, u64, u64)>,
            SpanOutcome,
            Option<&'static str>,
            Vec<Want>,
        );
        let cases: Vec<Case> = vec![
            (
                vec![("route", 5, 9)],
                SpanOutcome::Advanced,
                Some("local"),
                vec![("route", 3, 20, SpanOutcome::Advanced, Some("local"), None)],
            ),
            (
                vec![("init", 5, 6), ("route", 6, 8), ("local", 8, 15)],
                SpanOutcome::Finished,
                None,
                vec![
                    ("init", 3, 6, SpanOutcome::Advanced, Some("route"), None),
                    (
                        "route",
                        6,
                        8,
                        SpanOutcome::Advanced,
                        Some("local"),
                        Some("init"),
                    ),
                    ("local", 8, 20, SpanOutcome::Finished, None, Some("init")),
                ],
            ),
            (
                vec![("remote", 4, 30)],
                SpanOutcome::Paused,
                None,
                vec![("remote", 3, 30, SpanOutcome::Paused, None, None)],
            ),
        ];
        for (hops, outcome, next, want) in cases {
            let t = trace(&hops, outcome, next);
            let spans = t.spans("pepsi-stage-route", at(20));
            let got: Vec<Want> = spans
                .iter()
                .map(|s| {
                    let ms = |ns: u64| (ns - unix_ns(at(0))) / 1_000_000;
                    (
                        leak(s.stage.clone().unwrap()),
                        ms(s.start_ns),
                        ms(s.end_ns),
                        s.outcome,
                        s.next_stage.clone().map(leak),
                        s.fused_into.clone().map(leak),
                    )
                })
                .collect();
            assert_eq!(got, want, "{hops:?}");
            for s in &spans {
                assert_eq!(s.trace_id, TraceId::of_row(5));
                assert_eq!(s.parent, SpanId::parse("00f067aa0ba902b7"));
                assert_eq!(s.queue_id, Some(5));
            }
            assert_eq!(spans[0].dispatch_wait_ms, Some(3.0));
            assert!(spans[1..].iter().all(|s| s.dispatch_wait_ms.is_none()));
        }
    }

    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }

    #[test]
    fn a_pass_that_fails_to_commit_says_so_on_its_last_span() {
        let t = trace(
            &[("init", 4, 5), ("local", 5, 9)],
            SpanOutcome::Finished,
            None,
        )
        .failed(&StageError::Temporary("database gone".into()));
        let spans = t.spans("pepsi-stage-init", at(10));
        assert_eq!(spans[0].outcome, SpanOutcome::Advanced);
        assert_eq!(spans[1].outcome, SpanOutcome::Deferred);
        assert!(spans[1].error.as_deref().unwrap().contains("database gone"));
    }
}
