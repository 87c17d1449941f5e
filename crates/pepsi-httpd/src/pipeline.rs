//! The live pipeline document of `GET /api/pipeline`, pure: the stage graph (`graph`) with
//! each stage's queue depth by status, its throughput and its failures, from one
//! `pepsi_admin::status::Snapshot`.
//!
//! Throughput is the change of the dispatcher's cumulative `stage_stats` counters over the
//! last minute: this process keeps the counters it read on earlier requests (`Samples`, at
//! most one a second, none older than needed) and answers the difference to the newest
//! sample at least `WINDOW` old, or to the oldest it has, with the span in seconds. The
//! dispatcher writes those counters every STATS_INTERVAL (5s) under load, so the figure is
//! what a stage finished in the last minute, not a rate; the mail log is not used, because
//! it is off by default and records only final outcomes. The cumulative counters themselves
//! (`counters`: what the page calls "done", kills, crashes) go out as they are.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use pepsi_admin::queue::STATUSES;
use pepsi_admin::status::Snapshot;
use serde_json::{Value, json};

use crate::graph::Graph;

/// The span throughput is measured over.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Samples closer together than this are not kept (a page polls every few seconds).
const MIN_GAP: Duration = Duration::from_secs(1);

/// A stage's cumulative counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub messages: i64,
    pub kills: i64,
    pub crashes: i64,
}

/// What changed over the span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delta {
    pub messages: i64,
    pub kills: i64,
    pub crashes: i64,
}

/// Earlier readings of the counters, oldest first.
#[derive(Debug, Default)]
pub struct Samples {
    list: VecDeque<(Instant, BTreeMap<String, Counts>)>,
}

impl Samples {
    /// Records the counters read at `now` and returns each stage's change since the
    /// baseline (the newest sample at least `WINDOW` old, else the oldest kept; none: no
    /// change) and the baseline's age in seconds.
    pub fn record(
        &mut self,
        now: Instant,
        counters: BTreeMap<String, Counts>,
    ) -> (BTreeMap<String, Delta>, f64) {
        let old_enough = |t: &Instant| now.saturating_duration_since(*t) >= WINDOW;
        let base = self
            .list
            .iter()
            .rev()
            .find(|(t, _)| old_enough(t))
            .or(self.list.front());
        let (deltas, seconds) = match base {
            None => (BTreeMap::new(), 0.0),
            Some((t, before)) => {
                let change = |now: i64, then: i64| {
                    // A smaller value means the counters were reset: all of it is new.
                    if now >= then { now - then } else { now }
                };
                let deltas = counters
                    .iter()
                    .map(|(stage, c)| {
                        let b = before.get(stage).copied().unwrap_or_default();
                        (
                            stage.clone(),
                            Delta {
                                messages: change(c.messages, b.messages),
                                kills: change(c.kills, b.kills),
                                crashes: change(c.crashes, b.crashes),
                            },
                        )
                    })
                    .collect();
                (deltas, now.saturating_duration_since(*t).as_secs_f64())
            }
        };
        let gap_ok = self
            .list
            .back()
            .is_none_or(|(t, _)| now.saturating_duration_since(*t) >= MIN_GAP);
        if gap_ok {
            self.list.push_back((now, counters));
        }
        // Only the newest sample at least WINDOW old can be a baseline again.
        while self.list.len() > 1 && old_enough(&self.list[1].0) {
            self.list.pop_front();
        }
        (deltas, seconds)
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// The cumulative counters of a snapshot, by stage.
pub fn counts(snap: &Snapshot) -> BTreeMap<String, Counts> {
    snap.stages
        .iter()
        .map(|s| {
            (
                s.stage.clone(),
                Counts {
                    messages: s.messages,
                    kills: s.kills,
                    crashes: s.crashes,
                },
            )
        })
        .collect()
}

/// The document: the graph's nodes as `stages`, each with `queue` (rows by status and
/// `total`), `oldest_age_seconds`, `counters` (cumulative), `throughput` (over
/// `throughput_seconds`), `failures` and `outcomes_last_hour`; the `edges`, the `problems`,
/// the dispatcher's counters and the queue's totals.
pub fn document(
    graph: &Graph,
    snap: &Snapshot,
    deltas: &BTreeMap<String, Delta>,
    seconds: f64,
    generated_at: chrono::DateTime<chrono::Utc>,
) -> Value {
    let mut total_rows = 0;
    let mut failed_rows = 0;
    let stages: Vec<Value> = graph
        .nodes
        .iter()
        .map(|n| {
            let mut queue = serde_json::Map::new();
            let mut total = 0;
            for status in STATUSES {
                let rows: i64 = snap
                    .queue
                    .iter()
                    .filter(|q| q.stage == n.name && q.status == status)
                    .map(|q| q.rows)
                    .sum();
                total += rows;
                queue.insert(status.to_owned(), json!(rows));
            }
            queue.insert("total".into(), json!(total));
            total_rows += total;
            let bad =
                queue["failed"].as_i64().unwrap_or(0) + queue["timeout"].as_i64().unwrap_or(0);
            failed_rows += bad;
            let c = snap
                .stages
                .iter()
                .find(|s| s.stage == n.name)
                .cloned()
                .unwrap_or_default();
            let d = deltas.get(&n.name).copied().unwrap_or_default();
            let oldest = snap
                .oldest
                .iter()
                .find(|o| o.stage == n.name)
                .map(|o| o.age_seconds);
            let outcomes: serde_json::Map<String, Value> = snap
                .outcomes
                .iter()
                .filter(|o| o.stage == n.name)
                .map(|o| (o.event.clone(), json!(o.rows)))
                .collect();
            json!({
                "name": n.name,
                "program": n.program,
                "configured": n.configured,
                "reachable": n.reachable,
                "column": n.column,
                "row": n.row,
                "condition": n.condition,
                "queue": queue,
                "oldest_age_seconds": oldest,
                "counters": {
                    "messages": c.messages,
                    "processing_ms": c.processing_ms,
                    "kills": c.kills,
                    "crashes": c.crashes,
                },
                "throughput": {"messages": d.messages, "kills": d.kills, "crashes": d.crashes},
                "failures": {"rows": bad, "kills": c.kills, "crashes": c.crashes},
                "outcomes_last_hour": outcomes,
            })
        })
        .collect();
    json!({
        "generated_at": generated_at,
        "first_stage": graph.first_stage,
        "graph_id": graph.id(),
        "throughput_seconds": seconds,
        "window_seconds": WINDOW.as_secs(),
        "stages": stages,
        "edges": graph.edges,
        "problems": graph.problems,
        "dispatch": snap.dispatch,
        "totals": {"rows": total_rows, "failed_rows": failed_rows},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pepsi_admin::status::{QueueCount, StageCounters};
    use pepsi_conf::config::Config;

    fn at(c: &[(&str, i64)]) -> BTreeMap<String, Counts> {
        c.iter()
            .map(|(s, m)| {
                (
                    s.to_string(),
                    Counts {
                        messages: *m,
                        kills: 0,
                        crashes: 0,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn throughput_is_the_change_since_the_newest_sample_a_window_old() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut samples = Samples::default();
        // (seconds after t0, relay's counter, the change answered, the span answered)
        let cases = [
            (0, 10, 0, 0.0),    // nothing to compare with yet
            (0, 12, 2, 0.0),    // too close: compared, not kept
            (5, 15, 5, 5.0),    // against the oldest
            (61, 30, 20, 61.0), // t0 is the only sample a minute old
            (70, 31, 16, 65.0), // t0+5 is a minute old now, and newer
            (200, 5, 5, 130.0), // reset (smaller): all of it counts; baseline t0+70
        ];
        for (i, (secs, relay, want, span)) in cases.into_iter().enumerate() {
            let (d, seconds) = samples.record(s(secs), at(&[("relay", relay)]));
            let got = d.get("relay").map_or(0, |d| d.messages);
            assert_eq!(got, want, "case {i}");
            assert!((seconds - span).abs() < 0.001, "case {i}: span {seconds}");
        }
        assert!(
            samples.len() <= 2,
            "old samples are dropped: {}",
            samples.len()
        );
        let (d, _) = samples.record(s(201), at(&[("relay", 6), ("new", 4)]));
        assert_eq!(d["new"].messages, 4, "a stage first seen counts from zero");
    }

    #[test]
    fn the_document_puts_rows_and_counters_on_their_stages() {
        let cfg = Config::from_str_named(
            "[stage-init]\nPROGRAM = x\nNEXT_STAGE = relay\n[stage-relay]\nPROGRAM = y\n",
            "t.conf",
        )
        .unwrap();
        let graph = crate::graph::build(&cfg, &["gone".to_owned()], &[]);
        let snap = Snapshot {
            stages: vec![StageCounters {
                stage: "relay".into(),
                messages: 40,
                processing_ms: 900,
                kills: 1,
                crashes: 2,
            }],
            queue: vec![
                QueueCount {
                    stage: "init".into(),
                    status: "pending".into(),
                    rows: 3,
                },
                QueueCount {
                    stage: "relay".into(),
                    status: "failed".into(),
                    rows: 2,
                },
                QueueCount {
                    stage: "relay".into(),
                    status: "held".into(),
                    rows: 1,
                },
                QueueCount {
                    stage: "gone".into(),
                    status: "paused".into(),
                    rows: 4,
                },
            ],
            ..Snapshot::default()
        };
        let deltas = BTreeMap::from([(
            "relay".to_owned(),
            Delta {
                messages: 7,
                kills: 1,
                crashes: 0,
            },
        )]);
        let doc = document(&graph, &snap, &deltas, 60.0, chrono::Utc::now());
        let stage = |name: &str| {
            doc["stages"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("no stage {name} in {doc}"))
        };
        assert_eq!(stage("init")["queue"]["pending"], 3);
        assert_eq!(stage("init")["queue"]["total"], 3);
        let relay = stage("relay");
        assert_eq!(relay["queue"]["failed"], 2);
        assert_eq!(relay["queue"]["held"], 1);
        assert_eq!(relay["queue"]["total"], 3);
        assert_eq!(
            relay["failures"],
            json!({"rows": 2, "kills": 1, "crashes": 2})
        );
        assert_eq!(relay["throughput"]["messages"], 7);
        assert_eq!(relay["counters"]["messages"], 40);
        assert_eq!(stage("gone")["configured"], false);
        assert_eq!(stage("gone")["queue"]["paused"], 4);
        assert_eq!(doc["totals"], json!({"rows": 10, "failed_rows": 2}));
        assert_eq!(
            doc["edges"][0],
            json!({"from": "init", "to": "relay", "kind": "next", "label": null})
        );
        assert_eq!(doc["graph_id"].as_str().unwrap().len(), 16);
    }
}
