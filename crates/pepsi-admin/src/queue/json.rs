//! The JSON shapes of the queue, shared by `pepsi-queue --json` and pepsi-httpd's API, so
//! a script reads the same document from either: one row, a listing with its summary, one
//! message in full, and one row's outcome of an action. Pure functions, no I/O.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::{AdminError, Message, Outcome, QueueRow, STATUSES};

/// RFC 3339 in UTC, whole seconds.
pub fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Counts per stage and status, every status present (zeros included).
pub fn summary_map(counts: &[(String, String, i64)]) -> BTreeMap<String, BTreeMap<String, i64>> {
    let mut map: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for (stage, status, n) in counts {
        let entry = map
            .entry(stage.clone())
            .or_insert_with(|| STATUSES.iter().map(|s| (s.to_string(), 0)).collect());
        *entry.entry(status.clone()).or_insert(0) += n;
    }
    map
}

/// One row in the shape a listing prints (and `show` extends).
pub fn row_json(r: &QueueRow) -> Value {
    json!({
        "id": r.id,
        "stage": r.stage,
        "status": r.status,
        "held": r.held,
        "display_status": r.display_status(),
        "mail_from": r.mail_from,
        "rcpt_to": r.rcpt_to,
        "received_at": ts(r.received_at),
        "updated_at": ts(r.updated_at),
        "age_seconds": r.age_secs.max(0.0).floor() as i64,
        "timeout": r.timeout.map(ts),
        "next_retry": r.next_retry().map(ts),
        "attempts": r.attempts,
        "last_error": r.last_error,
        "dispatch_error": r.dispatch_error,
    })
}

/// A listing: the summary of every matching row, the rows shown, the limit (`None`: all)
/// and whether rows were left out.
pub fn list_json(counts: &[(String, String, i64)], rows: &[QueueRow], limit: Option<i64>) -> Value {
    let map = summary_map(counts);
    let total: i64 = counts.iter().map(|c| c.2).sum();
    json!({
        "summary": { "total": total, "stages": map },
        "rows": rows.iter().map(row_json).collect::<Vec<_>>(),
        "limit": limit,
        "truncated": (rows.len() as i64) < total,
    })
}

/// One message in full: the row, its state, header block, body facts and origin.
pub fn show_json(m: &Message) -> Value {
    let mut v = row_json(&m.row);
    if let Value::Object(map) = &mut v {
        map.insert("state".into(), m.state.clone());
        map.insert("headers".into(), json!(String::from_utf8_lossy(&m.headers)));
        map.insert("body_id".into(), json!(m.body_id));
        map.insert("body_size".into(), json!(m.body_size));
        map.insert(
            "body".into(),
            json!(m.body.as_deref().map(String::from_utf8_lossy)),
        );
        map.insert("auth_user".into(), json!(m.auth_user));
        map.insert("client_addr".into(), json!(m.client_addr));
        map.insert("sender_key".into(), json!(m.sender_key));
    }
    v
}

/// The `outcome` word of an error: `not_found`, `running`, `refused` or `error`.
pub fn error_kind(e: &AdminError) -> &'static str {
    match e {
        AdminError::NotFound(_) => "not_found",
        AdminError::Running { .. } => "running",
        AdminError::Refused { .. } => "refused",
        AdminError::Database { .. } => "error",
    }
}

/// One row's entry in an action's `results`: `changed` with the `detail` the event log
/// records, `unchanged` with a `note`, or an error kind with `error` (the `message` the
/// caller words for its audience).
pub fn result_json(id: i64, result: &Result<Outcome, AdminError>, message: &str) -> Value {
    match result {
        Ok(Outcome::Changed(report)) => {
            let mut detail = report.clone();
            if let Value::Object(m) = &mut detail {
                m.remove("changed");
            }
            json!({"id": id, "outcome": "changed", "detail": detail})
        }
        Ok(Outcome::Unchanged(note)) => json!({"id": id, "outcome": "unchanged", "note": note}),
        Err(e) => json!({"id": id, "outcome": error_kind(e), "error": message}),
    }
}

/// A row a bulk action skipped because it changed between the selection and its turn.
pub fn skipped_json(id: i64) -> Value {
    json!({"id": id, "outcome": "skipped", "note": format!("row {id} skipped: changed since it was selected")})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_every_status() {
        let counts = vec![
            ("init".to_owned(), "pending".to_owned(), 2),
            ("init".to_owned(), "held".to_owned(), 1),
            ("relay".to_owned(), "failed".to_owned(), 3),
        ];
        let json = list_json(&counts, &[], Some(10));
        assert_eq!(json["summary"]["total"], 6);
        assert_eq!(json["summary"]["stages"]["relay"]["failed"], 3);
        assert_eq!(json["summary"]["stages"]["relay"]["pending"], 0);
        assert_eq!(json["summary"]["stages"]["init"]["held"], 1);
        assert_eq!(json["truncated"], true);
    }

    #[test]
    fn results_name_the_outcome() {
        let cases = [
            (
                Ok(Outcome::Changed(json!({"changed": true, "stage": "init"}))),
                json!({"id": 4, "outcome": "changed", "detail": {"stage": "init"}}),
            ),
            (
                Ok(Outcome::Unchanged("already pending".into())),
                json!({"id": 4, "outcome": "unchanged", "note": "already pending"}),
            ),
            (
                Err(AdminError::NotFound(4)),
                json!({"id": 4, "outcome": "not_found", "error": "msg"}),
            ),
            (
                Err(AdminError::Running {
                    id: 4,
                    message: "x".into(),
                }),
                json!({"id": 4, "outcome": "running", "error": "msg"}),
            ),
        ];
        for (result, want) in cases {
            assert_eq!(result_json(4, &result, "msg"), want);
        }
    }
}
