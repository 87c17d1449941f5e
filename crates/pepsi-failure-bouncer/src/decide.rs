//! What to do with one failed or timed-out row: retry it, return it to its sender, drop it
//! (the null sender) or give it up. Pure: the row, the settings and the bounce stage in, a
//! [`Decision`] out; tested as a table.
//!
//! The count lives in `state.failure_bouncer` ([`FailureRecord`]): retries made at the
//! stage the row failed at, and each failure seen there. A row that failed at another stage
//! before starts a fresh count (it got past that stage), except that a message returned to
//! its sender once is never returned again.

use pepsi_contract::state::{
    FailedStatus, FailureBounced, FailureKind, FailureRecord, FailureSeen,
};

/// The longest `dispatch_error` kept in a record.
const MAX_ERROR: usize = 300;

/// A failed row as the decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed<'a> {
    pub stage: &'a str,
    pub status: FailedStatus,
    pub mail_from: &'a str,
    /// `state.dispatch_error`.
    pub dispatch_error: Option<&'a str>,
    /// `state.failure_bouncer` as stored (None when absent or malformed).
    pub record: Option<FailureRecord>,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Retry {
        record: FailureRecord,
    },
    Bounce {
        bounce_stage: String,
        /// The DSN's diagnostic.
        reason: String,
        record: FailureRecord,
    },
    Drop {
        record: FailureRecord,
    },
    GiveUp {
        record: FailureRecord,
    },
}

impl Decision {
    pub fn record(&self) -> &FailureRecord {
        match self {
            Decision::Retry { record }
            | Decision::Bounce { record, .. }
            | Decision::Drop { record }
            | Decision::GiveUp { record } => record,
        }
    }
}

/// How a failure came about: `timeout` (no answer within MAX_RUNTIME), `crash` (the worker
/// died while handling it, as the dispatcher records it) or `error` (the stage reported
/// one).
pub fn classify(status: FailedStatus, dispatch_error: Option<&str>) -> FailureKind {
    if status == FailedStatus::Timeout {
        return FailureKind::Timeout;
    }
    match dispatch_error {
        Some(e) if e.starts_with("worker ") && e.ends_with(" while handling the message") => {
            FailureKind::Crash
        }
        _ => FailureKind::Error,
    }
}

/// A poison message: every failure seen was the worker crashing or hanging, never an
/// error the stage itself reported.
pub fn is_poison(record: &FailureRecord) -> bool {
    !record.failures.is_empty() && record.failures.iter().all(|f| f.kind != FailureKind::Error)
}

/// Decides for `row`, retrying up to `attempts` times; `bounce_stage` is where the row's
/// stage returns mail (or why it cannot); `now` is RFC 3339.
pub fn decide(
    row: &Failed<'_>,
    attempts: u32,
    bounce_stage: Result<String, String>,
    now: &str,
) -> Decision {
    let stored = row.record.clone().unwrap_or_default();
    let same_stage = stored.stage == row.stage;
    let mut record = FailureRecord {
        stage: row.stage.to_owned(),
        retries: if same_stage { stored.retries } else { 0 },
        failures: if same_stage {
            stored.failures
        } else {
            Vec::new()
        },
        bounced: stored.bounced,
        given_up: None,
    };
    record.failures.push(FailureSeen {
        status: row.status,
        kind: classify(row.status, row.dispatch_error),
        error: row
            .dispatch_error
            .map(|e| e.chars().take(MAX_ERROR).collect()),
        at: now.to_owned(),
    });
    let keep = attempts as usize + 1;
    if record.failures.len() > keep {
        let extra = record.failures.len() - keep;
        record.failures.drain(..extra);
    }
    if record.retries < attempts {
        record.retries += 1;
        return Decision::Retry { record };
    }
    let tries = record.retries + 1;
    if row.mail_from.is_empty() {
        return Decision::Drop { record };
    }
    let give_up = |mut record: FailureRecord, why: String| {
        record.given_up = Some(why);
        Decision::GiveUp { record }
    };
    if let Some(b) = &record.bounced {
        let why = format!(
            "failed {tries} times at stage {} after it was returned to its sender (from stage {}): it is not returned twice",
            row.stage, b.stage
        );
        return give_up(record, why);
    }
    match bounce_stage {
        Err(why) => give_up(
            record,
            format!("failed {tries} times; cannot return it: {why}"),
        ),
        Ok(target) if target == row.stage => give_up(
            record,
            format!("failed {tries} times at its own bounce stage {target}"),
        ),
        Ok(target) => {
            let reason = if is_poison(&record) {
                format!(
                    "the mail system could not process this message: it failed at an internal step ({}) on each of {tries} attempts",
                    row.stage
                )
            } else {
                format!(
                    "the message could not be processed at an internal step ({}) after {tries} attempts",
                    row.stage
                )
            };
            record.bounced = Some(FailureBounced {
                stage: row.stage.to_owned(),
                at: now.to_owned(),
            });
            Decision::Bounce {
                bounce_stage: target,
                reason,
                record,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2029-01-01T00:00:00Z";
    const CRASH: &str = "worker pepsi-stage-x (pid 7) of stage relay was killed by signal 6 while handling the message";

    fn seen(status: FailedStatus, kind: FailureKind) -> FailureSeen {
        FailureSeen {
            status,
            kind,
            error: None,
            at: NOW.into(),
        }
    }

    /// The kind stored as `name`.
    fn kind(name: &str) -> FailureKind {
        serde_json::from_value(serde_json::Value::String(name.into())).unwrap()
    }

    fn record(stage: &str, retries: u32, kinds: &[&str]) -> FailureRecord {
        FailureRecord {
            stage: stage.into(),
            retries,
            failures: kinds
                .iter()
                .map(|k| seen(FailedStatus::Failed, kind(k)))
                .collect(),
            bounced: None,
            given_up: None,
        }
    }

    /// (what decide returns, summarised): kind of decision, retries, failures, the
    /// bounce stage or the reason's beginning.
    fn summary(d: &Decision) -> (String, u32, usize, String) {
        let r = d.record();
        let (kind, extra) = match d {
            Decision::Retry { .. } => ("retry", String::new()),
            Decision::Bounce {
                bounce_stage,
                reason,
                ..
            } => ("bounce", format!("{bounce_stage}: {reason}")),
            Decision::Drop { .. } => ("drop", String::new()),
            Decision::GiveUp { record } => ("give up", record.given_up.clone().unwrap()),
        };
        (kind.into(), r.retries, r.failures.len(), extra)
    }

    #[test]
    fn decisions() {
        let bounce = || Ok::<_, String>("bounce".to_owned());
        type Case = (
            Failed<'static>,
            Result<String, String>,
            (&'static str, u32, usize, &'static str),
        );
        let row = |status: &str, from, error, record| Failed {
            stage: "relay",
            status: FailedStatus::of_row(status),
            mail_from: from,
            dispatch_error: error,
            record,
        };
        let cases: Vec<Case> = vec![
            // A first failure is retried.
            (
                row("failed", "a@x.test", Some("boom"), None),
                bounce(),
                ("retry", 1, 1, ""),
            ),
            (
                row("timeout", "a@x.test", None, None),
                bounce(),
                ("retry", 1, 1, ""),
            ),
            // Retries until ATTEMPTS (3) …
            (
                row(
                    "failed",
                    "a@x.test",
                    Some("boom"),
                    Some(record("relay", 2, &["error", "error"])),
                ),
                bounce(),
                ("retry", 3, 3, ""),
            ),
            // … then returned.
            (
                row(
                    "failed",
                    "a@x.test",
                    Some("boom"),
                    Some(record("relay", 3, &["error"; 3])),
                ),
                bounce(),
                ("bounce", 3, 4, "bounce: the message could not be processed"),
            ),
            // A poison message: every failure a crash or a hang.
            (
                row(
                    "failed",
                    "a@x.test",
                    Some(CRASH),
                    Some(record("relay", 3, &["crash", "timeout", "crash"])),
                ),
                bounce(),
                (
                    "bounce",
                    3,
                    4,
                    "bounce: the mail system could not process this message",
                ),
            ),
            // The null sender is dropped, never bounced.
            (
                row(
                    "failed",
                    "",
                    Some("boom"),
                    Some(record("relay", 3, &["error"; 3])),
                ),
                bounce(),
                ("drop", 3, 4, ""),
            ),
            // A count at another stage does not carry over.
            (
                row(
                    "failed",
                    "a@x.test",
                    Some("boom"),
                    Some(record("route", 3, &["error"; 3])),
                ),
                bounce(),
                ("retry", 1, 1, ""),
            ),
            // No bounce stage: given up, saying why.
            (
                row(
                    "failed",
                    "a@x.test",
                    None,
                    Some(record("relay", 3, &["error"; 3])),
                ),
                Err("[stage-relay] has no BOUNCE_STAGE".into()),
                (
                    "give up",
                    3,
                    4,
                    "failed 4 times; cannot return it: [stage-relay] has no BOUNCE_STAGE",
                ),
            ),
        ];
        for (row, target, (kind, retries, failures, extra)) in cases {
            let got = summary(&decide(&row, 3, target, NOW));
            assert_eq!(
                (got.0.as_str(), got.1, got.2),
                (kind, retries, failures),
                "{row:?}"
            );
            assert!(got.3.starts_with(extra), "{row:?}: {}", got.3);
        }
    }

    #[test]
    fn a_message_is_returned_once_and_the_bounce_stage_never_bounces_itself() {
        let mut r = record("bounce", 3, &["error"; 3]);
        r.bounced = Some(FailureBounced {
            stage: "relay".into(),
            at: NOW.into(),
        });
        let row = Failed {
            stage: "bounce",
            status: FailedStatus::Failed,
            mail_from: "a@x.test",
            dispatch_error: None,
            record: Some(r),
        };
        let d = decide(&row, 3, Ok("bounce".into()), NOW);
        assert!(
            matches!(&d, Decision::GiveUp { record } if record.given_up.as_deref().unwrap().contains("not returned twice")),
            "{d:?}"
        );
        // Its bounce stage is its own stage.
        let row = Failed {
            record: Some(record("bounce", 3, &["error"; 3])),
            ..row
        };
        let d = decide(&row, 3, Ok("bounce".into()), NOW);
        assert!(matches!(d, Decision::GiveUp { .. }), "{d:?}");
        // A bounce records where from; a retry after it keeps that.
        let row = Failed {
            stage: "relay",
            status: FailedStatus::Failed,
            mail_from: "a@x.test",
            dispatch_error: None,
            record: Some(record("relay", 0, &[])),
        };
        let d = decide(&row, 0, Ok("bounce".into()), NOW);
        assert_eq!(d.record().bounced.as_ref().unwrap().stage, "relay");
    }

    #[test]
    fn classification() {
        let cases = [
            ("timeout", None, "timeout"),
            ("failed", Some(CRASH), "crash"),
            ("failed", Some("stage relay (pid 3): refused"), "error"),
            ("failed", None, "error"),
        ];
        for (status, error, want) in cases {
            assert_eq!(
                classify(FailedStatus::of_row(status), error),
                kind(want),
                "{status} {error:?}"
            );
            assert_eq!(kind(want).as_str(), want);
        }
        assert!(is_poison(&record("x", 0, &["crash", "timeout"])));
        assert!(!is_poison(&record("x", 0, &["crash", "error"])));
        assert!(!is_poison(&record("x", 0, &[])));
    }
}
