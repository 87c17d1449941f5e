//! Presentation of the queue for people and for scripts: tables, ages, the JSON shapes of
//! `list`, `show` and the actions. Pure functions, no I/O.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
pub use pepsi_common::queue::json::{list_json, show_json, summary_map, ts};
use pepsi_common::queue::{Message, QueueRow, STATUSES};
use serde_json::{Value, json};

/// `secs` as the two largest units: `45s`, `3m12s`, `2h05m`, `3d04h`.
pub fn human_duration(secs: f64) -> String {
    let s = if secs.is_finite() && secs > 0.0 {
        secs as u64
    } else {
        0
    };
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

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

/// `text` cut to `max` characters, with `…` when it was longer; newlines become spaces.
pub fn clip(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let mut s: String = flat.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// Left-aligned columns separated by two spaces; numeric columns (`right[i]`) right-aligned.
pub fn table(headers: &[&str], right: &[bool], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            if right.get(i).copied().unwrap_or(false) {
                text.push_str(&" ".repeat(pad));
                text.push_str(cell);
            } else {
                text.push_str(cell);
                text.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut out, &mut headers.iter().copied());
    for row in rows {
        line(&mut out, &mut row.iter().map(String::as_str));
    }
    out
}

/// The summary table: one line per stage, a column per status, and a total line.
pub fn summary_table(counts: &[(String, String, i64)]) -> String {
    let map = summary_map(counts);
    let mut headers = vec!["STAGE"];
    headers.extend(STATUSES.iter().map(|s| match *s {
        "pending" => "PENDING",
        "running" => "RUNNING",
        "paused" => "PAUSED",
        "held" => "HELD",
        "failed" => "FAILED",
        _ => "TIMEOUT",
    }));
    headers.push("TOTAL");
    let mut totals = vec![0i64; STATUSES.len()];
    let mut rows = Vec::new();
    for (stage, by_status) in &map {
        let mut row = vec![stage.clone()];
        for (i, st) in STATUSES.iter().enumerate() {
            let n = by_status.get(*st).copied().unwrap_or(0);
            totals[i] += n;
            row.push(n.to_string());
        }
        row.push(by_status.values().sum::<i64>().to_string());
        rows.push(row);
    }
    let mut total_row = vec!["total".to_owned()];
    total_row.extend(totals.iter().map(i64::to_string));
    total_row.push(totals.iter().sum::<i64>().to_string());
    rows.push(total_row);
    let mut right = vec![false];
    right.extend(std::iter::repeat_n(true, STATUSES.len() + 1));
    table(&headers, &right, &rows)
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

    #[test]
    fn durations_read_as_the_two_largest_units() {
        let cases = [
            (-3.0, "0s"),
            (0.4, "0s"),
            (45.9, "45s"),
            (60.0, "1m00s"),
            (192.0, "3m12s"),
            (3599.0, "59m59s"),
            (3600.0, "1h00m"),
            (7500.0, "2h05m"),
            (86400.0, "1d00h"),
            (273600.0, "3d04h"),
            (f64::NAN, "0s"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn clip_cuts_long_text_and_flattens_newlines() {
        let cases = [
            ("short", 10, "short"),
            ("exactly10!", 10, "exactly10!"),
            ("eleven char", 10, "eleven ch…"),
            ("a\nb\tc", 10, "a b c"),
            ("ünïcödé", 4, "ünï…"),
        ];
        for (text, max, want) in cases {
            assert_eq!(clip(text, max), want, "{text:?}");
        }
    }

    #[test]
    fn table_pads_columns_and_right_aligns_numbers() {
        let out = table(
            &["ID", "NAME"],
            &[true, false],
            &[
                vec!["7".into(), "seven".into()],
                vec!["1000".into(), "x".into()],
            ],
        );
        assert_eq!(out, "  ID  NAME\n   7  seven\n1000  x\n");
    }

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
    fn summary_counts_every_status_and_totals() {
        let counts = vec![
            ("init".to_owned(), "pending".to_owned(), 2),
            ("init".to_owned(), "held".to_owned(), 1),
            ("relay".to_owned(), "failed".to_owned(), 3),
        ];
        let out = summary_table(&counts);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "STAGE  PENDING  RUNNING  PAUSED  HELD  FAILED  TIMEOUT  TOTAL"
        );
        assert_eq!(
            lines[1],
            "init         2        0       0     1       0        0      3"
        );
        assert_eq!(
            lines[3],
            "total        2        0       0     1       3        0      6"
        );
        let json = list_json(&counts, &[], Some(10));
        assert_eq!(json["summary"]["total"], 6);
        assert_eq!(json["summary"]["stages"]["relay"]["failed"], 3);
        assert_eq!(json["summary"]["stages"]["relay"]["pending"], 0);
        assert_eq!(json["truncated"], true);
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
