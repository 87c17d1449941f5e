//! The report: everything one look shows, as serde types (the `--json` document, described
//! in docs/status.md) and the pure steps that shape the database's answers into it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use pepsi_admin::status::{
    DispatchCounters, Failure, Oldest, QueueCount, RecentOutcome, StageCounters,
};
use pepsi_contract::mail_log::{Event, LogRow};
use serde::Serialize;

use crate::probe::Service;

/// One look at the system.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub generated_at: DateTime<Utc>,
    /// True when every probed service answered (the exit status is 0 exactly then).
    pub ok: bool,
    pub services: Vec<Service>,
    /// The database's part: none when it did not answer.
    pub queue: Option<Queue>,
    pub rates: Option<Rates>,
    pub counters: Option<Counters>,
    pub failures: Option<Failures>,
    pub bounces: Option<Vec<LogRow>>,
    /// Parts that could not be shown, and why (a role that may not read the mail log).
    pub notes: Vec<String>,
}

/// The queue by stage and status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Queue {
    pub total: i64,
    pub stages: Vec<StageQueue>,
    /// The oldest message of the whole queue.
    pub oldest: Option<Oldest>,
}

/// The rows at one stage per status (held apart from paused), and its oldest message.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StageQueue {
    pub stage: String,
    pub pending: i64,
    pub running: i64,
    pub paused: i64,
    pub held: i64,
    pub failed: i64,
    pub timeout: i64,
    pub total: i64,
    /// Seconds since the oldest row at the stage was received.
    pub oldest_age_seconds: Option<f64>,
}

/// What left the pipeline recently, from the mail log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rates {
    /// Always `mail_log`: the outcomes recorded in `pepsi.mail_log` (nothing when
    /// `[pepsi] MAIL_LOG` is off).
    pub source: &'static str,
    pub windows: Vec<Window>,
}

/// Outcomes within the last `seconds`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Window {
    pub seconds: u32,
    pub delivered: i64,
    pub bounced: i64,
    pub expired: i64,
    pub dropped: i64,
    pub total: i64,
    /// `total` per minute over the window.
    pub per_minute: f64,
}

/// The dispatcher's cumulative counters (flushed by it every `STATS_INTERVAL`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Counters {
    pub dispatch: DispatchCounters,
    pub stages: Vec<StageCounters>,
}

/// The failed and timed-out rows: how many there are, and the most recent ones.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failures {
    pub total: i64,
    pub rows: Vec<Failure>,
}

/// Per-stage rows from the counts and the oldest ages, stages in name order.
pub fn queue(counts: &[QueueCount], oldest: &[Oldest]) -> Queue {
    let mut stages: BTreeMap<&str, StageQueue> = BTreeMap::new();
    for c in counts {
        let s = stages
            .entry(c.stage.as_str())
            .or_insert_with(|| StageQueue {
                stage: c.stage.clone(),
                ..StageQueue::default()
            });
        let cell = match c.status.as_str() {
            "pending" => &mut s.pending,
            "running" => &mut s.running,
            "paused" => &mut s.paused,
            "held" => &mut s.held,
            "failed" => &mut s.failed,
            _ => &mut s.timeout,
        };
        *cell += c.rows;
        s.total += c.rows;
    }
    for o in oldest {
        stages
            .entry(o.stage.as_str())
            .or_insert_with(|| StageQueue {
                stage: o.stage.clone(),
                ..StageQueue::default()
            })
            .oldest_age_seconds = Some(o.age_seconds);
    }
    let done: Vec<StageQueue> = stages.into_values().collect();
    let oldest = oldest
        .iter()
        .max_by(|a, b| a.age_seconds.total_cmp(&b.age_seconds))
        .cloned();
    Queue {
        total: done.iter().map(|s| s.total).sum(),
        stages: done,
        oldest,
    }
}

/// The last five minutes and the last hour, every event present.
pub fn rates(recent: &[RecentOutcome]) -> Rates {
    let window = |seconds: u32, pick: fn(&RecentOutcome) -> i64| {
        let mut w = Window {
            seconds,
            ..Window::default()
        };
        for r in recent {
            let n = pick(r);
            match Event::parse(&r.event) {
                Some(Event::Delivered) => w.delivered += n,
                Some(Event::Bounced) => w.bounced += n,
                Some(Event::Expired) => w.expired += n,
                Some(Event::Dropped) => w.dropped += n,
                // An event this version does not know still left the pipeline.
                None => {}
            }
            w.total += n;
        }
        w.per_minute = w.total as f64 * 60.0 / f64::from(seconds);
        w
    };
    Rates {
        source: "mail_log",
        windows: vec![
            window(300, |r| r.last_5_minutes),
            window(3600, |r| r.last_hour),
        ],
    }
}

/// Two searches (bounced, expired), newest first, at most `limit` in all.
pub fn bounces(mut bounced: Vec<LogRow>, expired: Vec<LogRow>, limit: usize) -> Vec<LogRow> {
    bounced.extend(expired);
    bounced.sort_by(|a, b| b.at.cmp(&a.at).then(b.log_id.cmp(&a.log_id)));
    bounced.truncate(limit);
    bounced
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(stage: &str, status: &str, rows: i64) -> QueueCount {
        QueueCount {
            stage: stage.into(),
            status: status.into(),
            rows,
        }
    }

    fn oldest(stage: &str, age_seconds: f64) -> Oldest {
        Oldest {
            stage: stage.into(),
            age_seconds,
        }
    }

    #[test]
    fn counts_fall_into_their_stage_and_status() {
        let q = queue(
            &[
                count("relay", "paused", 2),
                count("init", "pending", 3),
                count("relay", "held", 1),
                count("relay", "timeout", 4),
                count("local", "failed", 1),
                count("init", "running", 5),
            ],
            &[
                oldest("relay", 90.0),
                oldest("init", 7200.5),
                oldest("local", 3.0),
            ],
        );
        assert_eq!(q.total, 16);
        let rows: Vec<(&str, [i64; 7], Option<f64>)> = q
            .stages
            .iter()
            .map(|s| {
                (
                    s.stage.as_str(),
                    [
                        s.pending, s.running, s.paused, s.held, s.failed, s.timeout, s.total,
                    ],
                    s.oldest_age_seconds,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("init", [3, 5, 0, 0, 0, 0, 8], Some(7200.5)),
                ("local", [0, 0, 0, 0, 1, 0, 1], Some(3.0)),
                ("relay", [0, 0, 2, 1, 0, 4, 7], Some(90.0)),
            ]
        );
        assert_eq!(q.oldest, Some(oldest("init", 7200.5)));
        let empty = queue(&[], &[]);
        assert_eq!(
            (empty.total, empty.stages.len(), empty.oldest),
            (0, 0, None)
        );
    }

    #[test]
    fn rates_have_both_windows_and_every_event() {
        let r = |event: &str, last_5_minutes, last_hour| RecentOutcome {
            event: event.into(),
            last_5_minutes,
            last_hour,
        };
        let got = rates(&[
            r("delivered", 30, 600),
            r("bounced", 0, 6),
            r("dropped", 1, 1),
        ]);
        assert_eq!(got.source, "mail_log");
        let w = &got.windows;
        assert_eq!(
            (
                w[0].seconds,
                w[0].delivered,
                w[0].bounced,
                w[0].dropped,
                w[0].total
            ),
            (300, 30, 0, 1, 31)
        );
        assert_eq!(
            (
                w[1].seconds,
                w[1].delivered,
                w[1].bounced,
                w[1].expired,
                w[1].total
            ),
            (3600, 600, 6, 0, 607)
        );
        assert!((w[0].per_minute - 6.2).abs() < 1e-9);
        assert!((w[1].per_minute - 607.0 / 60.0).abs() < 1e-9);
        let none = rates(&[]);
        assert_eq!(
            (none.windows[0].total, none.windows[1].per_minute),
            (0, 0.0)
        );
    }

    #[test]
    fn bounces_merge_newest_first_within_the_limit() {
        let row = |log_id: i64, secs: i64, event: &str| LogRow {
            log_id,
            at: DateTime::from_timestamp(secs, 0).unwrap(),
            workqueue_id: None,
            stage: None,
            event: event.into(),
            mail_from: None,
            rcpt_to: vec![],
            detail: serde_json::json!({}),
        };
        let got = bounces(
            vec![row(1, 100, "bounced"), row(4, 400, "bounced")],
            vec![row(3, 300, "expired"), row(2, 400, "expired")],
            3,
        );
        let ids: Vec<i64> = got.iter().map(|r| r.log_id).collect();
        assert_eq!(ids, [4, 2, 3]);
    }
}
