//! What the ingress counts — sessions served, messages and recipients accepted, connections
//! turned away, and every refused command by its verb and enhanced status code — kept in
//! memory and added to `pepsi.ingress_stats` every STATS_INTERVAL (and at shutdown) with one
//! statement, for pepsi-httpd's `/metrics`. Several ingress processes add up.
//!
//! The labels are bounded by construction: a verb is one of the commands the parser knows,
//! a status code is the server's own (a few dozen exist), a connection refusal one of two.

use pepsi_contract::telemetry::{CounterDelta, CountersRecord, Emitter};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::PgPool;

const FLUSH: &str = "INSERT INTO pepsi.ingress_stats AS s (counter, reason, value) \
     SELECT * FROM unnest($1::text[], $2::text[], $3::int8[]) \
     ON CONFLICT (counter, reason) DO UPDATE SET value = s.value + EXCLUDED.value, updated_at = now()";

/// The counters of one ingress process since its last flush.
#[derive(Debug, Default)]
pub struct Stats {
    sessions: AtomicU64,
    messages: AtomicU64,
    recipients: AtomicU64,
    /// (counter, reason) → count, for the labelled counters.
    labelled: Mutex<HashMap<(&'static str, String), u64>>,
}

impl Stats {
    pub fn session(&self) {
        self.sessions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn message(&self) {
        self.messages.fetch_add(1, Ordering::Relaxed);
    }

    pub fn recipient(&self) {
        self.recipients.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection turned away before its greeting: `too_many_connections`,
    /// `too_many_from_client`.
    pub fn connection_refused(&self, why: &'static str) {
        self.add("connections_refused", why.to_owned());
    }

    /// A command answered with a 4xx or 5xx reply: `verb` and its enhanced status code
    /// (the basic code when the reply has none).
    pub fn refused(&self, verb: &str, code: u16, enhanced: Option<&str>) {
        let status = enhanced.map_or_else(|| code.to_string(), str::to_owned);
        self.add("refused", format!("{verb} {status}"));
    }

    fn add(&self, counter: &'static str, reason: String) {
        if let Ok(mut m) = self.labelled.lock() {
            *m.entry((counter, reason)).or_insert(0) += 1;
        }
    }

    /// Everything counted since the last call, as the rows to add, and zero again.
    pub fn take(&self) -> Vec<(String, String, i64)> {
        let mut rows = Vec::new();
        for (name, counter) in [
            ("sessions", &self.sessions),
            ("messages", &self.messages),
            ("recipients", &self.recipients),
        ] {
            let n = counter.swap(0, Ordering::Relaxed);
            if n > 0 {
                rows.push((name.to_owned(), String::new(), n as i64));
            }
        }
        if let Ok(mut m) = self.labelled.lock() {
            for ((counter, reason), n) in m.drain() {
                rows.push((counter.to_owned(), reason, n as i64));
            }
        }
        rows.sort();
        rows
    }

    /// Gives back rows a flush could not write, so they are tried again with the next.
    fn restore(&self, rows: Vec<(String, String, i64)>) {
        for (counter, reason, n) in rows {
            let n = n as u64;
            match (counter.as_str(), reason.is_empty()) {
                ("sessions", true) => self.sessions.fetch_add(n, Ordering::Relaxed),
                ("messages", true) => self.messages.fetch_add(n, Ordering::Relaxed),
                ("recipients", true) => self.recipients.fetch_add(n, Ordering::Relaxed),
                _ => {
                    let counter: &'static str = match counter.as_str() {
                        "connections_refused" => "connections_refused",
                        _ => "refused",
                    };
                    if let Ok(mut m) = self.labelled.lock() {
                        *m.entry((counter, reason)).or_insert(0) += n;
                    }
                    0
                }
            };
        }
    }

    /// Adds what was counted to `pepsi.ingress_stats`; on failure keeps it for the next
    /// flush.
    pub async fn flush(&self, pool: &PgPool, telemetry: &Emitter) -> Result<(), sqlx::Error> {
        let rows = self.take();
        if rows.is_empty() {
            return Ok(());
        }
        let deltas = telemetry.is_on().then(|| counters(&rows));
        let (counters, rest): (Vec<String>, Vec<(String, i64)>) =
            rows.iter().cloned().map(|(c, r, n)| (c, (r, n))).unzip();
        let (reasons, values): (Vec<String>, Vec<i64>) = rest.into_iter().unzip();
        let result = sqlx::query(FLUSH)
            .bind(&counters)
            .bind(&reasons)
            .bind(&values)
            .execute(pool)
            .await;
        if result.is_err() {
            self.restore(rows);
        } else if let Some(counters) = deltas {
            telemetry.emit_counters(&CountersRecord {
                program: "pepsi-ingress".into(),
                pid: std::process::id(),
                counters,
            });
        }
        result.map(drop)
    }
}

/// The rows a flush adds, as the telemetry client's counters: `pepsi.ingress.<counter>`,
/// split by `reason` where the row has one.
fn counters(rows: &[(String, String, i64)]) -> Vec<CounterDelta> {
    rows.iter()
        .map(|(counter, reason, n)| CounterDelta {
            name: format!("pepsi.ingress.{counter}"),
            label: (!reason.is_empty()).then(|| ("reason".to_owned(), reason.clone())),
            value: *n as f64,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_taken_once_and_refusals_keep_their_labels() {
        let s = Stats::default();
        s.session();
        s.session();
        s.message();
        s.recipient();
        s.refused("RCPT", 550, Some("5.1.1"));
        s.refused("RCPT", 550, Some("5.1.1"));
        s.refused("MAIL", 421, None);
        s.connection_refused("too_many_from_client");
        let rows = s.take();
        let want = [
            ("connections_refused", "too_many_from_client", 1),
            ("messages", "", 1),
            ("recipients", "", 1),
            ("refused", "MAIL 421", 1),
            ("refused", "RCPT 5.1.1", 2),
            ("sessions", "", 2),
        ];
        let got: Vec<(&str, &str, i64)> = rows
            .iter()
            .map(|(c, r, n)| (c.as_str(), r.as_str(), *n))
            .collect();
        assert_eq!(got, want);
        assert!(s.take().is_empty(), "taken once");
        s.restore(rows);
        assert_eq!(
            s.take().len(),
            want.len(),
            "given back after a failed flush"
        );
    }
}
