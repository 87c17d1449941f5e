//! The pipeline's per-stage pass times: for each stage of the graph, how many passes ended
//! within `[pepsi-httpd] LATENCY_WINDOW` and the 50th, 90th and 99th percentile of their
//! durations, from the spans `pepsi-telemetry` keeps in `pepsi.telemetry_span`.
//!
//! One query per reading, bounded by the window on an index: `telemetry_span_stage_idx`
//! (stage, end_time), where the named stages (`stage = ANY(...)`) make one range each, or
//! `telemetry_span_end_idx` when the planner finds the window alone the narrower; never the
//! whole table (test `httpd_journey::the_pass_time_query_reads_only_the_window_through_an_index`).
//! Interrupted passes (a worker killed mid-pass) are counted apart and left out of the
//! percentiles: their span ends when the worker died, which measures MAX_RUNTIME or the
//! crash, not the stage; the retried pass has a span of its own that counts. Deferred and
//! failed passes count: the stage spent that time. A fused hop's span counts for its own
//! stage. A reading is kept for `REFRESH`, so pages polling every few seconds cost the
//! database one aggregate per `REFRESH` whatever their number.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Row as _};

/// How long a reading is answered again before the next one is made.
pub const REFRESH: Duration = Duration::from_secs(10);

/// One stage's pass times.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageLatency {
    pub stage: String,
    /// Passes that ended within the window, interrupted ones not counted.
    pub passes: i64,
    /// Passes cut short by a killed worker within the window (not in the percentiles).
    pub interrupted: i64,
    /// Percentiles of the passes' durations, in milliseconds (continuous, interpolated);
    /// None without a pass.
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// The `latency` member of the pipeline document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Latency {
    /// LATENCY_WINDOW in seconds.
    pub window_seconds: u64,
    /// When the figures were read.
    pub as_of: DateTime<Utc>,
    /// The stages with a pass in the window, in the graph's order.
    pub stages: Vec<StageLatency>,
    /// Why there are no figures, when the spans could not be read.
    pub error: Option<String>,
}

/// The last reading: when, for which stages, what.
pub type Cache = Option<(Instant, Vec<String>, Latency)>;

/// The one query: `$1` the stages, `$2` the window in seconds. `stage IS NOT NULL` lets
/// the planner take the partial `telemetry_span_stage_idx`, where `stage = ANY($1)` with
/// the `end_time` bound is a range per stage.
pub const PASS_TIMES_SQL: &str = "SELECT stage, \
        count(*) FILTER (WHERE outcome IS DISTINCT FROM 'interrupted') AS passes, \
        count(*) FILTER (WHERE outcome = 'interrupted') AS interrupted, \
        percentile_cont(ARRAY[0.5, 0.9, 0.99]::float8[]) WITHIN GROUP ( \
            ORDER BY greatest(0, extract(epoch FROM end_time - start_time) * 1000)::float8) \
            FILTER (WHERE outcome IS DISTINCT FROM 'interrupted') AS pct \
    FROM pepsi.telemetry_span \
    WHERE stage IS NOT NULL AND stage = ANY($1::text[]) \
      AND end_time > now() - make_interval(secs => $2::float8) \
    GROUP BY stage";

/// Reads the pass times of `stages` over the last `window`, in the order of `stages`.
pub async fn read(
    pool: &PgPool,
    stages: &[String],
    window: Duration,
) -> Result<Vec<StageLatency>, sqlx::Error> {
    let rows = sqlx::query(PASS_TIMES_SQL)
        .bind(stages)
        .bind(window.as_secs_f64())
        .fetch_all(pool)
        .await?;
    let mut out = rows
        .iter()
        .map(|r| {
            let pct: Option<Vec<Option<f64>>> = r.try_get("pct")?;
            let p = |i: usize| pct.as_ref().and_then(|v| v.get(i).copied().flatten());
            Ok(StageLatency {
                stage: r.try_get("stage")?,
                passes: r.try_get("passes")?,
                interrupted: r.try_get("interrupted")?,
                p50_ms: p(0),
                p90_ms: p(1),
                p99_ms: p(2),
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    out.sort_by_key(|l| stages.iter().position(|s| *s == l.stage));
    Ok(out)
}

/// The pass times of `stages`, from the cache while it is younger than `REFRESH` and was
/// read for the same stages. A failure to read is logged and answered as `error`, so the
/// rest of the pipeline page still works without the telemetry tables.
pub async fn current(
    pool: &PgPool,
    window: Duration,
    cache: &tokio::sync::Mutex<Cache>,
    stages: Vec<String>,
) -> Latency {
    let mut cache = cache.lock().await;
    if let Some((at, for_stages, latency)) = cache.as_ref()
        && at.elapsed() < REFRESH
        && *for_stages == stages
    {
        return latency.clone();
    }
    let (found, error) = match read(pool, &stages, window).await {
        Ok(v) => (v, None),
        Err(e) => {
            tracing::error!("reading the stages' pass times from pepsi.telemetry_span: {e}");
            (
                Vec::new(),
                Some("cannot read pepsi.telemetry_span (the server log has the cause)".into()),
            )
        }
    };
    let latency = Latency {
        window_seconds: window.as_secs(),
        as_of: Utc::now(),
        stages: found,
        error,
    };
    *cache = Some((Instant::now(), stages, latency.clone()));
    latency
}

/// Milliseconds as the pages show them: `0.42 ms`, `12.3 ms`, `840 ms`, `1.25 s`, `3.2 min`.
pub fn show_ms(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 100.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if ms < 60_000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms < 3_600_000.0 {
        format!("{:.1} min", ms / 60_000.0)
    } else {
        format!("{:.1} h", ms / 3_600_000.0)
    }
}

/// A window as the pages name it: `1h`, `15m`, `90s`, `2d`.
pub fn show_window(seconds: u64) -> String {
    match seconds {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_a_person_would_write_them() {
        let cases = [
            (0.0, "0.00 ms"),
            (0.4249, "0.42 ms"),
            (12.34, "12.3 ms"),
            (840.2, "840 ms"),
            (1250.0, "1.25 s"),
            (192_000.0, "3.2 min"),
            (7_200_000.0, "2.0 h"),
        ];
        for (ms, want) in cases {
            assert_eq!(show_ms(ms), want, "{ms}");
        }
        let windows = [(3600, "1h"), (900, "15m"), (90, "90s"), (172_800, "2d")];
        for (s, want) in windows {
            assert_eq!(show_window(s), want, "{s}");
        }
    }
}
