//! Prometheus metrics with the plan's names and labels, in a registry of their own.

use std::sync::OnceLock;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

use crate::domains::{Flow, Level};
use crate::validate::Route;

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub duration: HistogramVec,
    pub increments: IntCounterVec,
    pub limit_reached: IntCounterVec,
    pub notifications: IntCounterVec,
    pub redis_errors: IntCounterVec,
    pub cdb_domains: IntGauge,
    pub cdb_reloads: IntCounterVec,
    /// Not in the plan's list: time from acceptance (202) to the EXEC reply, the queue's lag.
    pub count_delay: prometheus::Histogram,
    /// `requests{route, status="202"}` and `duration{route}` of `/in` and `/out`, looked up
    /// once on first use instead of by label on every accepted request.
    accepted: [OnceLock<(IntCounter, Histogram)>; 2],
    /// `increments{level, flow}`, likewise: three of them on every counted `/out`.
    increment: [[OnceLock<IntCounter>; 2]; 3],
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("metric definition");
    r.register(Box::new(c.clone()))
        .expect("metric registration");
    c
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let requests = counter(
            &r,
            "migadu_counters_requests_total",
            "HTTP requests by route and status",
            &["route", "status"],
        );
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "migadu_counters_request_duration_seconds",
                "HTTP request duration by route",
            ),
            &["route"],
        )
        .expect("metric definition");
        r.register(Box::new(duration.clone()))
            .expect("metric registration");
        let increments = counter(
            &r,
            "migadu_counters_increments_total",
            "Counter increments by level and flow",
            &["level", "flow"],
        );
        let limit_reached = counter(
            &r,
            "migadu_counters_limit_reached_total",
            "Limit crossings by level and flow",
            &["level", "flow"],
        );
        let notifications = counter(
            &r,
            "migadu_counters_notifications_total",
            "Web app notifications by level and result",
            &["level", "result"],
        );
        let redis_errors = counter(
            &r,
            "migadu_counters_redis_errors_total",
            "Redis errors by operation",
            &["op"],
        );
        let cdb_domains = IntGauge::new("migadu_counters_cdb_domains", "Domains in the loaded CDB")
            .expect("metric definition");
        r.register(Box::new(cdb_domains.clone()))
            .expect("metric registration");
        let cdb_reloads = counter(
            &r,
            "migadu_counters_cdb_reloads_total",
            "CDB reloads by result",
            &["result"],
        );
        let count_delay = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "migadu_counters_count_delay_seconds",
                "Time from a 202 answer to the counted values",
            )
            .buckets(vec![
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
        )
        .expect("metric definition");
        r.register(Box::new(count_delay.clone()))
            .expect("metric registration");
        Metrics {
            count_delay,
            registry: r,
            requests,
            duration,
            increments,
            limit_reached,
            notifications,
            redis_errors,
            cdb_domains,
            cdb_reloads,
            accepted: Default::default(),
            increment: Default::default(),
        }
    }

    /// The request counter and duration histogram of a route's 202 answers.
    pub fn accepted(&self, route: Route) -> &(IntCounter, Histogram) {
        let i = match route {
            Route::In => 0,
            Route::Out => 1,
        };
        self.accepted[i].get_or_init(|| {
            (
                self.requests.with_label_values(&[route.as_str(), "202"]),
                self.duration.with_label_values(&[route.as_str()]),
            )
        })
    }

    /// The increments counter of a level and flow.
    pub fn increment(&self, level: Level, flow: Flow) -> &IntCounter {
        let (l, f) = (
            match level {
                Level::A => 0,
                Level::D => 1,
                Level::O => 2,
            },
            match flow {
                Flow::In => 0,
                Flow::Out => 1,
            },
        );
        self.increment[l][f].get_or_init(|| {
            self.increments
                .with_label_values(&[level.as_str(), flow.as_str()])
        })
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}
