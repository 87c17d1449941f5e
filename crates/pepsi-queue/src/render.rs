//! Presentation of the queue for people and for scripts: tables, ages, the JSON shapes of
//! `list`, `show` and the actions. Pure functions, no I/O.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
pub use pepsi_admin::queue::json::{list_json, show_json, ts};
pub use pepsi_admin::queue::table::summary_table;
use pepsi_admin::queue::{Message, QueueRow};
pub use pepsi_conf::text::{clip, human_duration, table};
use serde_json::{Value, json};

/// The NEXT RETRY cell: `held`, `due` (its time has passed), `in 4m10s`, or `-`.
pub fn next_retry_cell(row: &QueueRow, now: DateTime<Utc>) -> String {
    if row.held {
        return "held".into();
    }
    match row.next_retry() {
        Some(t) if t <= now => "due".into(),
        Some(t) => format!("in {}", human_duration((t - now).as_seconds_f64())),
        None => "-".into(),
    }
}

/// `<>` for the null sender, else the address.
fn sender(mail_from: &str) -> String {
    if mail_from.is_empty() {
        "<>".into()
    } else {
        mail_from.into()
    }
}

/// The row table of `list`.
pub fn rows_table(rows: &[QueueRow], now: DateTime<Utc>) -> String {
    let headers = [
        "ID",
        "STAGE",
        "STATUS",
        "AGE",
        "ATTEMPTS",
        "NEXT RETRY",
        "SENDER",
        "RECIPIENTS",
        "LAST ERROR",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let rcpt = match r.rcpt_to.len() {
                0 => "-".to_owned(),
                1 => r.rcpt_to[0].clone(),
                n => format!("{} (+{})", r.rcpt_to[0], n - 1),
            };
            let error = r
                .dispatch_error
                .as_deref()
                .or(r.last_error.as_deref())
                .map(|e| clip(e, 70))
                .unwrap_or_else(|| "-".into());
            vec![
                r.id.to_string(),
                r.stage.clone(),
                r.display_status().to_owned(),
                human_duration(r.age_secs),
                r.attempts.map_or("-".into(), |a| a.to_string()),
                next_retry_cell(r, now),
                clip(&sender(&r.mail_from), 40),
                clip(&rcpt, 50),
                error,
            ]
        })
        .collect();
    table(
        &headers,
        &[true, false, false, true, true, false, false, false, false],
        &cells,
    )
}

/// `show` for people, up to and including the header block (the body is written raw by
/// the caller).
pub fn show_text(m: &Message, now: DateTime<Utc>) -> String {
    let r = &m.row;
    let mut out = String::new();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let _ = writeln!(out, "row {}", r.id);
    let mut fields: Vec<(&str, String)> = vec![
        ("stage", r.stage.clone()),
        ("status", r.display_status().to_owned()),
        ("mail from", format!("<{}>", r.mail_from)),
        ("rcpt to", r.rcpt_to.join(", ")),
        (
            "received",
            format!("{} ({} ago)", ts(r.received_at), human_duration(r.age_secs)),
        ),
        ("updated", ts(r.updated_at)),
    ];
    if r.held {
        fields.push(("timeout", "none: held until released".into()));
    } else if let Some(t) = r.timeout {
        fields.push((
            "timeout",
            format!("{} ({})", ts(t), next_retry_cell(r, now)),
        ));
    }
    fields.extend([
        ("attempts", r.attempts.map_or("-".into(), |a| a.to_string())),
        ("last error", opt(&r.last_error)),
        ("dispatch error", opt(&r.dispatch_error)),
        ("auth user", opt(&m.auth_user)),
        ("client addr", opt(&m.client_addr)),
        (
            "sender key",
            if m.sender_key.is_empty() {
                "-".into()
            } else {
                m.sender_key.clone()
            },
        ),
        (
            "body",
            format!("{} bytes (body row {})", m.body_size, m.body_id),
        ),
    ]);
    for (k, v) in fields {
        let _ = writeln!(out, "  {:<15} {v}", format!("{k}:"));
    }
    let _ = writeln!(out, "state:");
    let pretty = serde_json::to_string_pretty(&m.state).unwrap_or_default();
    for l in pretty.lines() {
        let _ = writeln!(out, "  {l}");
    }
    let _ = writeln!(out, "headers:");
    out.push_str(&String::from_utf8_lossy(&m.headers));
    if !m.headers.ends_with(b"\n") {
        out.push('\n');
    }
    out
}

/// One line for people about what an action did to a row.
pub fn changed_line(action: &str, id: i64, report: &Value) -> String {
    let s = |k: &str| report[k].as_str().unwrap_or("?").to_owned();
    match action {
        "queue.retry" => format!(
            "{id}: retried ({} at stage {}, now pending)",
            s("from_status"),
            s("stage")
        ),
        "queue.hold" => format!(
            "{id}: held (was {} at stage {})",
            s("from_status"),
            s("stage")
        ),
        "queue.release" => format!("{id}: released (pending at stage {})", s("stage")),
        "queue.delete" => format!(
            "{id}: deleted (was {} at stage {}, from <{}>)",
            if report["held"] == json!(true) {
                "held".into()
            } else {
                s("status")
            },
            s("stage"),
            s("mail_from")
        ),
        "queue.bounce" => format!(
            "{id}: bounced (from stage {} to {}, pending)",
            s("from_stage"),
            s("to_stage")
        ),
        other => format!("{id}: {other} done"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: &str, held: bool, timeout: Option<DateTime<Utc>>) -> QueueRow {
        let t = DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
            .unwrap()
            .to_utc();
        QueueRow {
            id: 1,
            stage: "init".into(),
            status: status.into(),
            held,
            mail_from: String::new(),
            rcpt_to: vec!["a@example.test".into()],
            received_at: t,
            updated_at: t,
            timeout,
            age_secs: 0.0,
            attempts: None,
            last_error: None,
            dispatch_error: None,
        }
    }

    #[test]
    fn next_retry_shows_held_due_and_waiting_rows() {
        let now = DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
            .unwrap()
            .to_utc();
        let later = now + chrono::Duration::seconds(250);
        let earlier = now - chrono::Duration::seconds(5);
        let cases = [
            (row("paused", false, Some(later)), "in 4m10s"),
            (row("paused", false, Some(earlier)), "due"),
            (row("paused", true, Some(later)), "held"),
            (row("failed", false, None), "-"),
            (row("pending", false, Some(later)), "-"),
        ];
        for (r, want) in cases {
            assert_eq!(next_retry_cell(&r, now), want, "{r:?}");
        }
    }

    #[test]
    fn action_lines_name_the_row_and_what_changed() {
        let cases = [
            (
                "queue.retry",
                json!({"stage": "relay", "from_status": "failed"}),
                "5: retried (failed at stage relay, now pending)",
            ),
            (
                "queue.hold",
                json!({"stage": "init", "from_status": "pending"}),
                "5: held (was pending at stage init)",
            ),
            (
                "queue.release",
                json!({"stage": "init"}),
                "5: released (pending at stage init)",
            ),
            (
                "queue.delete",
                json!({"stage": "init", "status": "paused", "held": true, "mail_from": "a@b"}),
                "5: deleted (was held at stage init, from <a@b>)",
            ),
            (
                "queue.bounce",
                json!({"from_stage": "relay", "to_stage": "bounce"}),
                "5: bounced (from stage relay to bounce, pending)",
            ),
        ];
        for (action, report, want) in cases {
            assert_eq!(changed_line(action, 5, &report), want);
        }
    }
}
