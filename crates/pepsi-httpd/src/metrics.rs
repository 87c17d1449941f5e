//! `GET /metrics`: the Prometheus text format, built fresh on every scrape from
//! `pepsi_admin::status::snapshot` — the dispatcher's cumulative `stage_stats` /
//! `dispatch_stats` (counters), live gauges straight from `pepsi.workqueue` (rows per stage
//! and status, the oldest message), and the final outcomes per stage the mail log recorded
//! in the last hour.
//!
//! Access: open when `METRICS_PUBLIC = yes` or the client is inside `METRICS_ALLOW`;
//! otherwise a session or an API token, as for the API (a scrape is a GET, so it needs no
//! CSRF token). An open scrape is answered from the last open scrape's rendering while it
//! is younger than METRICS_CACHE, and open scrapes build one at a time, so that anyone who
//! may scrape cannot make the database run the aggregates at will (security review #13).

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use pepsi_admin::queue::STATUSES;
use pepsi_admin::status::{Snapshot, snapshot};
use prometheus::{
    CounterVec, Encoder as _, GaugeVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder,
};

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, ClientAddr, authenticate};

/// The snapshot in the Prometheus text exposition format.
pub fn render(s: &Snapshot) -> Result<String, prometheus::Error> {
    let reg = Registry::new();
    let counter =
        |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            reg.register(Box::new(c.clone()))?;
            Ok(c)
        };
    let nonneg = |v: i64| u64::try_from(v).unwrap_or(0);
    let messages = counter(
        "pepsi_stage_messages_total",
        "Messages a stage has handled (stage_stats).",
        &["stage"],
    )?;
    let kills = counter(
        "pepsi_stage_kills_total",
        "Stage workers killed for running over MAX_RUNTIME (stage_stats).",
        &["stage"],
    )?;
    let crashes = counter(
        "pepsi_stage_crashes_total",
        "Stage workers that exited unexpectedly (stage_stats).",
        &["stage"],
    )?;
    let seconds = CounterVec::new(
        Opts::new(
            "pepsi_stage_processing_seconds_total",
            "Time stages spent on messages (stage_stats).",
        ),
        &["stage"],
    )?;
    reg.register(Box::new(seconds.clone()))?;
    for st in &s.stages {
        let stage = [st.stage.as_str()];
        messages
            .with_label_values(&stage)
            .inc_by(nonneg(st.messages));
        seconds
            .with_label_values(&stage)
            .inc_by(nonneg(st.processing_ms) as f64 / 1000.0);
        kills.with_label_values(&stage).inc_by(nonneg(st.kills));
        crashes.with_label_values(&stage).inc_by(nonneg(st.crashes));
    }
    let plain = |name: &str, help: &str, v: i64| -> Result<(), prometheus::Error> {
        let c = IntCounter::new(name, help)?;
        c.inc_by(nonneg(v));
        reg.register(Box::new(c))
    };
    plain(
        "pepsi_dispatch_stages_total",
        "Stage passes the dispatcher has completed (dispatch_stats).",
        s.dispatch.stages_total,
    )?;
    plain(
        "pepsi_dispatch_messages_total",
        "Messages that left the pipeline (dispatch_stats).",
        s.dispatch.messages_total,
    )?;
    plain(
        "pepsi_dispatch_messages_failed_total",
        "Messages that ended failed or timed out (dispatch_stats).",
        s.dispatch.messages_failed,
    )?;
    plain(
        "pepsi_dispatch_serialization_failures_total",
        "Transient serialization/deadlock retries the dispatcher observed (dispatch_stats).",
        s.dispatch.serialization_failures,
    )?;
    let rows = GaugeVec::new(
        Opts::new(
            "pepsi_queue_messages",
            "Rows of the work queue now, per stage and status (held apart from paused).",
        ),
        &["stage", "status"],
    )?;
    reg.register(Box::new(rows.clone()))?;
    let mut stages: Vec<&str> = s.queue.iter().map(|q| q.stage.as_str()).collect();
    stages.dedup();
    for stage in stages {
        for status in STATUSES {
            rows.with_label_values(&[stage, status]).set(0.0);
        }
    }
    for q in &s.queue {
        rows.with_label_values(&[q.stage.as_str(), q.status.as_str()])
            .set(q.rows as f64);
    }
    let oldest = GaugeVec::new(
        Opts::new(
            "pepsi_queue_oldest_message_age_seconds",
            "Age of the oldest row at each stage, since it was received.",
        ),
        &["stage"],
    )?;
    reg.register(Box::new(oldest.clone()))?;
    for o in &s.oldest {
        oldest
            .with_label_values(&[o.stage.as_str()])
            .set(o.age_seconds);
    }
    let outcomes = GaugeVec::new(
        Opts::new(
            "pepsi_mail_outcomes_last_hour",
            "Final outcomes the mail log recorded in the last hour, per stage and event (delivered, bounced, expired, dropped).",
        ),
        &["stage", "event"],
    )?;
    reg.register(Box::new(outcomes.clone()))?;
    for o in &s.outcomes {
        outcomes
            .with_label_values(&[o.stage.as_str(), o.event.as_str()])
            .set(o.rows as f64);
    }
    // The ingress's counters: plain ones, then the refusals by command and status and the
    // connections turned away by why.
    for (name, help) in [
        ("sessions", "SMTP sessions the ingress served."),
        ("messages", "Messages the ingress accepted."),
        ("recipients", "Recipients the ingress accepted."),
    ] {
        let value = s
            .ingress
            .iter()
            .filter(|c| c.counter == name && c.reason.is_empty())
            .map(|c| c.value)
            .sum();
        plain(&format!("pepsi_ingress_{name}_total"), help, value)?;
    }
    let refused = counter(
        "pepsi_ingress_refused_total",
        "Commands the ingress refused (4xx, 5xx), by command and enhanced status code.",
        &["command", "status"],
    )?;
    let turned_away = counter(
        "pepsi_ingress_connections_refused_total",
        "Connections the ingress turned away before greeting them, by why.",
        &["reason"],
    )?;
    for c in &s.ingress {
        match c.counter.as_str() {
            "refused" => {
                let (command, status) = c.reason.split_once(' ').unwrap_or((&c.reason, ""));
                refused
                    .with_label_values(&[command, status])
                    .inc_by(nonneg(c.value));
            }
            "connections_refused" => turned_away
                .with_label_values(&[c.reason.as_str()])
                .inc_by(nonneg(c.value)),
            _ => {}
        }
    }
    let destinations = GaugeVec::new(
        Opts::new(
            "pepsi_destination_outcomes_last_hour",
            "Final outcomes for recipients in the last hour per destination domain (the 20 busiest by name, the rest as other) and event.",
        ),
        &["domain", "event"],
    )?;
    reg.register(Box::new(destinations.clone()))?;
    for d in &s.destinations {
        destinations
            .with_label_values(&[d.domain.as_str(), d.event.as_str()])
            .set(d.recipients as f64);
    }
    let tls = GaugeVec::new(
        Opts::new(
            "pepsi_tls_report_sessions_last_week",
            "Sessions to our domains the TLS reports (RFC 8460) received in the last week count, per result (success or a failure type).",
        ),
        &["result"],
    )?;
    reg.register(Box::new(tls.clone()))?;
    for t in &s.tls_reports {
        tls.with_label_values(&[t.result.as_str()])
            .set(t.sessions as f64);
    }
    let mut out = Vec::new();
    TextEncoder::new().encode(&reg.gather(), &mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

pub async fn metrics(State(state): State<AppState>, req: Request) -> ApiResult<Response> {
    let (parts, _) = req.into_parts();
    let client = parts
        .extensions
        .get::<ClientAddr>()
        .map(ClientAddr::ip)
        .ok_or_else(|| ApiError::internal("a request without its client address"))?;
    let s = &state.options;
    let open = s.metrics_public || crate::options::any_contains(&s.metrics_allow, client);
    if !open && authenticate(&parts, &state).await?.is_none() {
        return Err(ApiError::unauthorized(
            "/metrics needs a session or an API token (or METRICS_PUBLIC / METRICS_ALLOW)",
        ));
    }
    let text = if open && !s.metrics_cache.is_zero() {
        let mut cached = state.metrics_cache.lock().await;
        match &*cached {
            Some((at, text)) if at.elapsed() < s.metrics_cache => text.clone(),
            _ => {
                let text = render(&snapshot(&state.pool).await?).map_err(ApiError::internal)?;
                *cached = Some((std::time::Instant::now(), text.clone()));
                text
            }
        }
    } else {
        render(&snapshot(&state.pool).await?).map_err(ApiError::internal)?
    };
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rendering_names_every_family_with_its_labels() {
        use pepsi_admin::status::{
            DestinationCount, DispatchCounters, IngressCount, Oldest, OutcomeCount, QueueCount,
            StageCounters, TlsReportCount,
        };
        let s = Snapshot {
            stages: vec![StageCounters {
                stage: "relay".into(),
                messages: 10,
                processing_ms: 2500,
                kills: 1,
                crashes: 2,
            }],
            dispatch: DispatchCounters {
                stages_total: 20,
                messages_total: 9,
                messages_failed: 1,
                serialization_failures: 0,
            },
            queue: vec![QueueCount {
                stage: "relay".into(),
                status: "held".into(),
                rows: 3,
            }],
            oldest: vec![Oldest {
                stage: "relay".into(),
                age_seconds: 42.5,
            }],
            outcomes: vec![OutcomeCount {
                stage: "local".into(),
                event: "delivered".into(),
                rows: 7,
            }],
            ingress: vec![
                IngressCount {
                    counter: "sessions".into(),
                    reason: String::new(),
                    value: 12,
                },
                IngressCount {
                    counter: "refused".into(),
                    reason: "RCPT 5.1.1".into(),
                    value: 3,
                },
                IngressCount {
                    counter: "connections_refused".into(),
                    reason: "too_many_from_client".into(),
                    value: 2,
                },
            ],
            destinations: vec![DestinationCount {
                domain: "example.org".into(),
                event: "delivered".into(),
                recipients: 5,
            }],
            tls_reports: vec![TlsReportCount {
                result: "certificate-expired".into(),
                sessions: 4,
            }],
        };
        let text = render(&s).unwrap();
        let want = [
            "pepsi_stage_messages_total{stage=\"relay\"} 10",
            "pepsi_stage_processing_seconds_total{stage=\"relay\"} 2.5",
            "pepsi_stage_crashes_total{stage=\"relay\"} 2",
            "pepsi_dispatch_messages_total 9",
            "pepsi_queue_messages{stage=\"relay\",status=\"held\"} 3",
            "pepsi_queue_messages{stage=\"relay\",status=\"pending\"} 0",
            "pepsi_queue_oldest_message_age_seconds{stage=\"relay\"} 42.5",
            "pepsi_mail_outcomes_last_hour{event=\"delivered\",stage=\"local\"} 7",
            "pepsi_ingress_sessions_total 12",
            "pepsi_ingress_messages_total 0",
            "pepsi_ingress_refused_total{command=\"RCPT\",status=\"5.1.1\"} 3",
            "pepsi_ingress_connections_refused_total{reason=\"too_many_from_client\"} 2",
            "pepsi_destination_outcomes_last_hour{domain=\"example.org\",event=\"delivered\"} 5",
            "pepsi_tls_report_sessions_last_week{result=\"certificate-expired\"} 4",
            "# TYPE pepsi_queue_messages gauge",
            "# TYPE pepsi_dispatch_messages_total counter",
        ];
        for line in want {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }
}
