//! `GET /api/pipeline`: the live pipeline — the stage graph of the configuration the
//! workers see (the file with the global database overlay) and, per stage, the queue by
//! status, throughput and failures (`crate::pipeline` builds the document), and the
//! stages' pass-time percentiles from the telemetry spans (`crate::latency`). The pipeline
//! page polls it.

use axum::Json;
use axum::extract::State;
use pepsi_conf::config::Scope;
use pepsi_contract::overlay::DbOverlay;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Pairs, Principal};
use crate::graph::{self, Graph};
use crate::pipeline;

/// Reads the configuration and the counters once: the graph and the document.
pub async fn current(state: &AppState) -> ApiResult<(Graph, Value)> {
    let cfg = state
        .cfg
        .with_db_overlay(&state.pool, &Scope::Global)
        .await
        .map_err(|e| ApiError::internal(format!("reading the configuration overlay: {e}")))?;
    let snap = pepsi_admin::status::snapshot(&state.pool).await?;
    let mut queued: Vec<String> = snap.queue.iter().map(|q| q.stage.clone()).collect();
    queued.dedup();
    let graph = graph::build(&cfg, &queued, state.stage_edges);
    let (deltas, seconds) = state
        .samples
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .record(std::time::Instant::now(), pipeline::counts(&snap));
    let mut doc = pipeline::document(&graph, &snap, &deltas, seconds, chrono::Utc::now());
    let stages = graph.nodes.iter().map(|n| n.name.clone()).collect();
    let latency = crate::latency::current(
        &state.pool,
        state.options.latency_window,
        &state.latency,
        stages,
    )
    .await;
    doc["latency"] = serde_json::to_value(&latency).map_err(ApiError::internal)?;
    Ok((graph, doc))
}

pub async fn pipeline(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    if let Some((k, _)) = pairs.first() {
        return Err(ApiError::bad_request(format!(
            "unknown parameter {k:?} (GET /api/pipeline takes none)"
        )));
    }
    Ok(Json(current(&state).await?.1))
}
