//! The host's metrics: what the spans tell (how long each stage's passes take, how long a
//! pass waited for its worker, the ingress's transactions, the passes cut short), the
//! counters the ingress and the dispatcher report (`CountersRecord`, one instrument per
//! name, made as the name first arrives), what `/proc` tells of the Pepsi processes, and how
//! the client itself fares (spans dropped, exported, waiting). One instrument each, on the
//! meter whose periodic reader exports them every METRICS_INTERVAL; cumulative, so a failed
//! export loses no count.
//!
//! `WatchedExporter` wraps the OTLP metric exporter to log when the metric exports stop
//! getting through and when they work again, once each.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter, ObservableGauge};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use pepsi_contract::telemetry::{CountersRecord, SpanKind, SpanRecord, attr};

use crate::convert::seconds;
use crate::health::{Change, Health};
use crate::procfs::{self, Usage};
use crate::transport::Transport;

/// The attribute that says why a span was dropped.
pub const DROP_REASON: &str = "pepsi.reason";

/// Why the client dropped a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The queue was full (MAX_QUEUE): the oldest span went.
    QueueFull,
    /// The record was no span, or its frame announced more than a record may hold.
    Malformed,
    /// The receiver refused the span's batch with an answer that sending it again would
    /// not change (400, 413, ...).
    Rejected,
    /// The sending process could not hand it to the socket (told by its next span).
    Sender,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
            DropReason::Malformed => "malformed",
            DropReason::Rejected => "rejected",
            DropReason::Sender => "sender",
        }
    }
}

/// The prefix every counter a program reports must have: the client exports Pepsi's
/// counters, not whatever a process of the group names.
pub const COUNTER_PREFIX: &str = "pepsi.";

/// At most this many counters of distinct names are made; a name beyond is not exported.
pub const MAX_COUNTER_NAMES: usize = 256;

/// The attribute a reported counter's label becomes: `pepsi.<key>` (`reason` becomes
/// `pepsi.reason`, `stage` the `pepsi.stage` the spans' metrics carry), a dotted key as it is.
pub fn label_attribute(key: &str) -> String {
    if key.contains('.') {
        key.to_owned()
    } else {
        format!("{COUNTER_PREFIX}{key}")
    }
}

/// Whether `name` may become a counter: under [`COUNTER_PREFIX`], and an instrument name
/// OpenTelemetry takes (ASCII letters, digits, `_ . - /`, at most 255).
pub fn counter_name_ok(name: &str) -> bool {
    name.len() > COUNTER_PREFIX.len()
        && name.len() <= 255
        && name.starts_with(COUNTER_PREFIX)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-/".contains(&b))
}

/// Bucket bounds in seconds, from a millisecond to five minutes: a pass, a wait, an SMTP
/// transaction.
const SECONDS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// How long one reading of `/proc` serves both process gauges.
const SCAN_REUSE: Duration = Duration::from_secs(1);

/// Every instrument the client records into.
pub struct Instruments {
    pass_duration: Histogram<f64>,
    dispatch_wait: Histogram<f64>,
    ingress_transactions: Counter<u64>,
    ingress_duration: Histogram<f64>,
    interrupted: Counter<u64>,
    dropped: Counter<u64>,
    exported: Counter<u64>,
    _gauges: Vec<ObservableGauge<u64>>,
    /// What the reported counters are made on.
    meter: Meter,
    /// The reported counters by name.
    reported: Mutex<HashMap<String, Counter<f64>>>,
    /// A reported counter's name was refused already (said once).
    refused_name: std::sync::atomic::AtomicBool,
}

/// The last reading of `/proc`, shared by the two process gauges.
type Scan = Arc<Mutex<Option<(Instant, BTreeMap<String, Usage>)>>>;

fn processes(scan: &Scan, proc: &std::path::Path) -> BTreeMap<String, Usage> {
    let mut last = scan.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((at, usage)) = &*last
        && at.elapsed() < SCAN_REUSE
    {
        return usage.clone();
    }
    let usage = procfs::scan(proc);
    *last = Some((Instant::now(), usage.clone()));
    usage
}

impl Instruments {
    /// The instruments on `meter`; `queue_length` tells the spans waiting, `proc` is where
    /// the processes are read (`/proc`).
    pub fn new(
        meter: &Meter,
        queue_length: impl Fn() -> u64 + Send + Sync + 'static,
        proc: PathBuf,
    ) -> Instruments {
        let histogram = |name: &'static str, description: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(description)
                .with_boundaries(SECONDS.to_vec())
                .build()
        };
        let counter = |name: &'static str, unit: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_unit(unit)
                .with_description(description)
                .build()
        };
        let scan: Scan = Arc::default();
        let (scan_count, proc_count) = (scan.clone(), proc.clone());
        let (scan_memory, proc_memory) = (scan, proc);
        let gauges = vec![
            meter
                .u64_observable_gauge("pepsi.process.count")
                .with_unit("{process}")
                .with_description("Processes running of each Pepsi program")
                .with_callback(move |o| {
                    for (program, usage) in processes(&scan_count, &proc_count) {
                        o.observe(usage.count, &[KeyValue::new(attr::PROGRAM, program)]);
                    }
                })
                .build(),
            meter
                .u64_observable_gauge("pepsi.process.memory")
                .with_unit("By")
                .with_description("Resident memory of each Pepsi program's processes together")
                .with_callback(move |o| {
                    for (program, usage) in processes(&scan_memory, &proc_memory) {
                        o.observe(usage.rss, &[KeyValue::new(attr::PROGRAM, program)]);
                    }
                })
                .build(),
            meter
                .u64_observable_gauge("pepsi.telemetry.queue_length")
                .with_unit("{span}")
                .with_description("Spans waiting in the client for export")
                .with_callback(move |o| o.observe(queue_length(), &[]))
                .build(),
        ];
        Instruments {
            pass_duration: histogram(
                "pepsi.stage.pass_duration",
                "How long a stage's pass over a message took",
            ),
            dispatch_wait: histogram(
                "pepsi.stage.dispatch_wait",
                "How long a message waited between the dispatcher's claim and its pass",
            ),
            ingress_transactions: counter(
                "pepsi.ingress.transactions",
                "{transaction}",
                "SMTP transactions of the ingress, by outcome",
            ),
            ingress_duration: histogram(
                "pepsi.ingress.duration",
                "How long an SMTP transaction took, MAIL FROM to the message stored",
            ),
            interrupted: counter(
                "pepsi.stage.interrupted",
                "{pass}",
                "Passes cut short: the worker died or was killed mid-pass",
            ),
            dropped: counter(
                "pepsi.telemetry.dropped_spans",
                "{span}",
                "Spans the client dropped, by reason",
            ),
            exported: counter(
                "pepsi.telemetry.exported_spans",
                "{span}",
                "Spans the receiver took",
            ),
            _gauges: gauges,
            meter: meter.clone(),
            reported: Mutex::new(HashMap::new()),
            refused_name: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Adds what a program reports to its counters: one monotonic sum per name, with the
    /// label (`label_attribute`) and `pepsi.program` as attributes. A name that is not
    /// Pepsi's (`counter_name_ok`), or one more than `MAX_COUNTER_NAMES`, is left out and
    /// the first such said in the log.
    pub fn add_counters(&self, rec: &CountersRecord) {
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        for c in &rec.counters {
            if !c.value.is_finite() || c.value < 0.0 {
                continue;
            }
            if !reported.contains_key(&c.name) {
                if !counter_name_ok(&c.name) || reported.len() >= MAX_COUNTER_NAMES {
                    if !self
                        .refused_name
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                    {
                        tracing::warn!(
                            program = rec.program,
                            pid = rec.pid,
                            "counter {:?} not exported: expected a name under {COUNTER_PREFIX:?} of letters, digits and `_.-/`, and at most {MAX_COUNTER_NAMES} names (further ones are left out quietly)",
                            c.name
                        );
                    }
                    continue;
                }
                let mut builder = self
                    .meter
                    .f64_counter(c.name.clone())
                    .with_description("A count the program reports, as it adds to it");
                if c.name.ends_with("_ms") {
                    builder = builder.with_unit("ms");
                }
                reported.insert(c.name.clone(), builder.build());
            }
            let mut attributes = vec![KeyValue::new(attr::PROGRAM, rec.program.clone())];
            if let Some((key, value)) = &c.label {
                attributes.push(KeyValue::new(label_attribute(key), value.clone()));
            }
            reported[&c.name].add(c.value, &attributes);
        }
    }

    /// Records what one span tells.
    pub fn record(&self, rec: &SpanRecord) {
        let stage = || KeyValue::new(attr::STAGE, rec.stage.clone().unwrap_or_else(|| "-".into()));
        let took = seconds(rec.start(), rec.end());
        match rec.kind {
            SpanKind::Pass => {
                self.pass_duration.record(
                    took,
                    &[stage(), KeyValue::new(attr::OUTCOME, rec.outcome.as_str())],
                );
                if let Some(ms) = rec
                    .dispatch_wait_ms
                    .filter(|ms| ms.is_finite() && *ms >= 0.0)
                {
                    self.dispatch_wait.record(ms / 1000.0, &[stage()]);
                }
            }
            SpanKind::Ingress => {
                self.ingress_transactions
                    .add(1, &[KeyValue::new(attr::OUTCOME, rec.outcome.as_str())]);
                self.ingress_duration.record(took, &[]);
            }
            SpanKind::Interrupted => self.interrupted.add(1, &[stage()]),
        }
    }

    pub fn dropped(&self, reason: DropReason, n: u64) {
        if n > 0 {
            self.dropped
                .add(n, &[KeyValue::new(DROP_REASON, reason.as_str())]);
        }
    }

    pub fn exported(&self, n: u64) {
        self.exported.add(n, &[]);
    }
}

/// The OTLP metric exporter, its failures and recoveries logged once each.
pub struct WatchedExporter {
    pub inner: opentelemetry_otlp::MetricExporter,
    pub transport: Transport,
    pub endpoint: String,
    pub health: Health,
}

impl PushMetricExporter for WatchedExporter {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.inner.export(metrics).await;
        match &result {
            Ok(()) => {
                if let Change::Recovered { failures } = self.health.succeeded() {
                    tracing::info!(
                        "metrics reach {} again, after {failures} failed export(s)",
                        self.endpoint
                    );
                }
            }
            Err(e) => {
                let why = self
                    .transport
                    .take_failure()
                    .map_or_else(|| e.to_string(), |f| f.text);
                if self.health.failed() == Change::Failing {
                    tracing::warn!(
                        "metrics export to {} failed: {why}; trying again every interval, quietly until it works",
                        self.endpoint
                    );
                } else {
                    tracing::debug!("metrics export to {} failed again: {why}", self.endpoint);
                }
            }
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reported_counter_is_pepsis_and_its_label_an_attribute_of_ours() {
        let names = [
            ("pepsi.ingress.sessions", true),
            ("pepsi.dispatch.processing_ms", true),
            ("pepsi.a-b/c_d", true),
            ("pepsi.", false),
            ("other.counter", false),
            ("pepsi.with space", false),
            ("pepsi.é", false),
            ("", false),
        ];
        for (name, ok) in names {
            assert_eq!(counter_name_ok(name), ok, "{name:?}");
        }
        assert!(!counter_name_ok(&format!("pepsi.{}", "x".repeat(250))));
        for (key, want) in [
            ("reason", "pepsi.reason"),
            ("stage", "pepsi.stage"),
            ("http.status", "http.status"),
        ] {
            assert_eq!(label_attribute(key), want);
        }
    }
}
