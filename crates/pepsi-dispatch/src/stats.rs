//! Pipeline statistics accumulated in memory and flushed in one transaction: per stage
//! (messages, processing time, kills, crashes) and global (stage passes, messages finished,
//! messages failed, serialization retries). The dispatcher is the only writer of
//! `stage_stats` and `dispatch_stats`.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::PgPool;

use pepsi_contract::db::SERIALIZATION_RETRIES;
use pepsi_contract::telemetry::CounterDelta;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageDelta {
    pub messages: i64,
    pub processing_ms: f64,
    pub kills: i64,
    pub crashes: i64,
}

/// Deltas not yet written.
#[derive(Debug, Default)]
pub struct Stats {
    stages: BTreeMap<String, StageDelta>,
    messages_total: i64,
    messages_failed: i64,
    /// SERIALIZATION_RETRIES as of the last flush.
    retries_flushed: u64,
}

impl Stats {
    /// A pass of `stage` completed (`finished`: it ended the message).
    pub fn pass(&mut self, stage: &str, took: Duration, finished: bool) {
        let d = self.stages.entry(stage.to_owned()).or_default();
        d.messages += 1;
        d.processing_ms += took.as_secs_f64() * 1000.0;
        if finished {
            self.messages_total += 1;
        }
    }

    /// A pass of a stage fused into another stage's worker.
    pub fn fused(&mut self, stage: &str, ms: f64) {
        let d = self.stages.entry(stage.to_owned()).or_default();
        d.messages += 1;
        d.processing_ms += ms;
    }

    pub fn kill(&mut self, stage: &str) {
        self.stages.entry(stage.to_owned()).or_default().kills += 1;
    }

    pub fn crash(&mut self, stage: &str) {
        self.stages.entry(stage.to_owned()).or_default().crashes += 1;
    }

    /// A message ended in a terminal failed or timeout state.
    pub fn failed(&mut self) {
        self.messages_failed += 1;
    }

    /// A kill or a crash is waiting to be written.
    pub fn has_failures(&self) -> bool {
        self.stages.values().any(|d| d.kills > 0 || d.crashes > 0)
    }

    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
            && self.messages_total == 0
            && self.messages_failed == 0
            && SERIALIZATION_RETRIES.load(Ordering::Relaxed) == self.retries_flushed
    }

    /// Writes the deltas in one transaction and forgets them; on error they are kept for the
    /// next flush.
    /// What the next flush adds, as counters for the host's telemetry client: per stage
    /// (`pepsi.dispatch.passes`, `.processing_ms`, `.kills`, `.crashes`, by `stage`) and for
    /// the whole pipeline (`.messages_finished`, `.messages_failed`).
    pub fn counters(&self) -> Vec<CounterDelta> {
        let mut out = Vec::new();
        let mut add = |name: &str, label: Option<(&str, &str)>, value: f64| {
            if value > 0.0 {
                out.push(CounterDelta {
                    name: format!("pepsi.dispatch.{name}"),
                    label: label.map(|(k, v)| (k.to_owned(), v.to_owned())),
                    value,
                });
            }
        };
        for (stage, d) in &self.stages {
            let by = Some(("stage", stage.as_str()));
            add("passes", by, d.messages as f64);
            add("processing_ms", by, d.processing_ms);
            add("kills", by, d.kills as f64);
            add("crashes", by, d.crashes as f64);
        }
        add("messages_finished", None, self.messages_total as f64);
        add("messages_failed", None, self.messages_failed as f64);
        out
    }

    pub async fn flush(&mut self, pool: &PgPool) -> Result<(), sqlx::Error> {
        if self.is_empty() {
            return Ok(());
        }
        let retries = SERIALIZATION_RETRIES.load(Ordering::Relaxed);
        let names: Vec<&str> = self.stages.keys().map(String::as_str).collect();
        let messages: Vec<i64> = self.stages.values().map(|d| d.messages).collect();
        let ms: Vec<i64> = self
            .stages
            .values()
            .map(|d| d.processing_ms.round() as i64)
            .collect();
        let kills: Vec<i64> = self.stages.values().map(|d| d.kills).collect();
        let crashes: Vec<i64> = self.stages.values().map(|d| d.crashes).collect();
        let passes: i64 = messages.iter().sum();
        let mut tx = pool.begin().await?;
        // Counters need no durability (a kill -9 loses unwritten deltas anyway), and the
        // dispatcher's loop waits for this commit: do not make it wait for a WAL flush too.
        sqlx::query("SET LOCAL synchronous_commit = off")
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO pepsi.stage_stats AS s (stage, messages, processing_ms, kills, crashes) \
             SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::int8[]) \
             ON CONFLICT (stage) DO UPDATE SET messages = s.messages + EXCLUDED.messages, \
               processing_ms = s.processing_ms + EXCLUDED.processing_ms, kills = s.kills + EXCLUDED.kills, \
               crashes = s.crashes + EXCLUDED.crashes, updated_at = now()",
        )
        .bind(&names)
        .bind(&messages)
        .bind(&ms)
        .bind(&kills)
        .bind(&crashes)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO pepsi.dispatch_stats AS d (id, stages_total, messages_total, messages_failed, serialization_failures) \
             VALUES (1, $1, $2, $3, $4) \
             ON CONFLICT (id) DO UPDATE SET stages_total = d.stages_total + EXCLUDED.stages_total, \
               messages_total = d.messages_total + EXCLUDED.messages_total, \
               messages_failed = d.messages_failed + EXCLUDED.messages_failed, \
               serialization_failures = d.serialization_failures + EXCLUDED.serialization_failures, \
               updated_at = now()",
        )
        .bind(passes)
        .bind(self.messages_total)
        .bind(self.messages_failed)
        .bind((retries - self.retries_flushed) as i64)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.stages.clear();
        self.messages_total = 0;
        self.messages_failed = 0;
        self.retries_flushed = retries;
        Ok(())
    }
}
