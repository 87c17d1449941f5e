//! The report and the mail log for people: aligned tables, ages in the two largest units.
//! Pure functions, no I/O.

use chrono::{DateTime, Utc};
use pepsi_conf::text::{clip, human_duration, table};
use pepsi_contract::mail_log::LogRow;
use serde_json::Value;

use crate::probe::Kind;
use crate::report::Report;

/// `2026-12-01 18:55:02Z`.
pub fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

/// The first recipient, and how many more: `bob@example.test (+2)`.
fn recipients(rcpt: &[String]) -> String {
    match rcpt {
        [] => "-".into(),
        [one] => clip(one, 40),
        [first, rest @ ..] => format!("{} (+{})", clip(first, 40), rest.len()),
    }
}

fn sender(s: Option<&str>) -> String {
    match s {
        None => "-".into(),
        Some("") => "<>".into(),
        Some(s) => clip(s, 40),
    }
}

/// The whole screen.
pub fn screen(r: &Report) -> String {
    let mut out = format!("pepsi-status at {}\n\n", when(r.generated_at));
    let rows: Vec<Vec<String>> = r
        .services
        .iter()
        .map(|s| {
            let state = match (s.ok, s.kind) {
                (true, Kind::Dispatcher) => "running",
                (true, _) => "up",
                (false, Kind::Dispatcher) => "NOT RUNNING",
                (false, _) => "DOWN",
            };
            let took = match s.elapsed_ms {
                Some(ms) if s.kind != Kind::Dispatcher => format!(" ({ms} ms)"),
                _ => String::new(),
            };
            vec![
                s.name.clone(),
                state.into(),
                s.address.clone().unwrap_or_else(|| "-".into()),
                format!("{}{took}", s.detail),
            ]
        })
        .collect();
    out.push_str(&table(
        &["SERVICE", "STATE", "ADDRESS", "DETAIL"],
        &[],
        &rows,
    ));

    let Some(q) = &r.queue else {
        out.push_str("\nthe database did not answer: no queue, rates or failures to show\n");
        return out;
    };
    out.push('\n');
    match &q.oldest {
        None => out.push_str("QUEUE: empty\n"),
        Some(o) => {
            out.push_str(&format!(
                "QUEUE: {} row{}, the oldest received {} ago (stage {})\n",
                q.total,
                if q.total == 1 { "" } else { "s" },
                human_duration(o.age_seconds),
                o.stage
            ));
            let mut rows: Vec<Vec<String>> = q
                .stages
                .iter()
                .map(|s| {
                    let mut row = vec![s.stage.clone()];
                    row.extend(
                        [
                            s.pending, s.running, s.paused, s.held, s.failed, s.timeout, s.total,
                        ]
                        .map(|n| n.to_string()),
                    );
                    row.push(s.oldest_age_seconds.map_or("-".into(), human_duration));
                    row
                })
                .collect();
            let sum = |f: fn(&crate::report::StageQueue) -> i64| -> String {
                q.stages.iter().map(f).sum::<i64>().to_string()
            };
            rows.push(vec![
                "total".into(),
                sum(|s| s.pending),
                sum(|s| s.running),
                sum(|s| s.paused),
                sum(|s| s.held),
                sum(|s| s.failed),
                sum(|s| s.timeout),
                q.total.to_string(),
                human_duration(o.age_seconds),
            ]);
            out.push_str(&table(
                &[
                    "STAGE", "PENDING", "RUNNING", "PAUSED", "HELD", "FAILED", "TIMEOUT", "TOTAL",
                    "OLDEST",
                ],
                &[false, true, true, true, true, true, true, true, true],
                &rows,
            ));
        }
    }

    if let Some(rates) = &r.rates {
        out.push_str("\nLEFT THE PIPELINE (mail log)\n");
        let w = &rates.windows;
        let cell = |f: fn(&crate::report::Window) -> i64| -> Vec<String> {
            w.iter().map(|x| f(x).to_string()).collect()
        };
        let mut rows = Vec::new();
        for (name, cells) in [
            ("delivered", cell(|x| x.delivered)),
            ("bounced", cell(|x| x.bounced)),
            ("expired", cell(|x| x.expired)),
            ("dropped", cell(|x| x.dropped)),
            ("total", cell(|x| x.total)),
        ] {
            let mut row = vec![name.to_owned()];
            row.extend(cells);
            rows.push(row);
        }
        rows.push(
            std::iter::once("per minute".to_owned())
                .chain(w.iter().map(|x| format!("{:.2}", x.per_minute)))
                .collect(),
        );
        let headers: Vec<String> = w.iter().map(|x| window_name(x.seconds)).collect();
        let mut h: Vec<&str> = vec!["EVENT"];
        h.extend(headers.iter().map(String::as_str));
        out.push_str(&table(&h, &[false, true, true], &rows));
    }

    if let Some(c) = &r.counters {
        out.push_str(&format!(
            "\nCOUNTERS (cumulative, pepsi.dispatch_stats): {} stage passes, {} messages done, {} failed or timed out, {} serialization retries\n",
            c.dispatch.stages_total,
            c.dispatch.messages_total,
            c.dispatch.messages_failed,
            c.dispatch.serialization_failures
        ));
    }

    if let Some(f) = &r.failures {
        if f.total == 0 {
            out.push_str("\nRECENT FAILURES: none (no failed or timed-out rows)\n");
        } else {
            out.push_str(&format!(
                "\nRECENT FAILURES: {} failed or timed-out row{}, {} shown, most recent first\n",
                f.total,
                if f.total == 1 { "" } else { "s" },
                f.rows.len()
            ));
            let rows: Vec<Vec<String>> = f
                .rows
                .iter()
                .map(|x| {
                    let error = x
                        .dispatch_error
                        .as_deref()
                        .or(x.last_error.as_deref())
                        .unwrap_or("-");
                    vec![
                        x.id.to_string(),
                        x.stage.clone(),
                        x.status.clone(),
                        human_duration((r.generated_at - x.updated_at).as_seconds_f64()),
                        sender(Some(&x.mail_from)),
                        recipients(&x.rcpt_to),
                        clip(error, 80),
                    ]
                })
                .collect();
            out.push_str(&table(
                &[
                    "ID",
                    "STAGE",
                    "STATUS",
                    "SINCE",
                    "SENDER",
                    "RECIPIENTS",
                    "ERROR",
                ],
                &[true],
                &rows,
            ));
        }
    }

    if let Some(b) = &r.bounces {
        if b.is_empty() {
            out.push_str("\nRECENT BOUNCES: none in the mail log\n");
        } else {
            out.push_str("\nRECENT BOUNCES (mail log, newest first)\n");
            let rows: Vec<Vec<String>> = b
                .iter()
                .map(|x| {
                    vec![
                        when(x.at),
                        x.event.clone(),
                        text_of(&x.detail, "status").unwrap_or_else(|| "-".into()),
                        sender(x.mail_from.as_deref()),
                        recipients(&x.rcpt_to),
                        clip(
                            &text_of(&x.detail, "diagnostic")
                                .or_else(|| text_of(&x.detail, "reply"))
                                .unwrap_or_else(|| "-".into()),
                            80,
                        ),
                    ]
                })
                .collect();
            out.push_str(&table(
                &["AT", "EVENT", "STATUS", "SENDER", "RECIPIENT", "DIAGNOSTIC"],
                &[],
                &rows,
            ));
        }
    }
    for note in &r.notes {
        out.push_str(&format!("\nNOTE: {note}\n"));
    }
    out
}

/// `LAST 5 MIN`, `LAST HOUR`.
fn window_name(seconds: u32) -> String {
    match seconds {
        3600 => "LAST HOUR".into(),
        s if s % 60 == 0 => format!("LAST {} MIN", s / 60),
        s => format!("LAST {s}s"),
    }
}

/// A string (or number) field of a detail object.
fn text_of(detail: &Value, key: &str) -> Option<String> {
    match detail.get(key)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The DETAIL cell of a log row: what the event's detail says first (docs/mail-log.md).
pub fn detail_summary(event: &str, detail: &Value) -> String {
    let mut parts = Vec::new();
    match event {
        "delivered" => {
            if let Some(m) = text_of(detail, "mailbox") {
                parts.push(format!("mailbox {m}"));
            }
            if let Some(r) = text_of(detail, "reply") {
                parts.push(format!("reply {r}"));
            }
            if let Some(m) = text_of(detail, "remote_mta") {
                parts.push(format!("from {m}"));
            }
        }
        _ => {
            for key in ["status", "diagnostic", "reason"] {
                if let Some(v) = text_of(detail, key) {
                    parts.push(v);
                }
            }
        }
    }
    if parts.is_empty() {
        match detail {
            Value::Object(m) if m.is_empty() => "-".into(),
            Value::Null => "-".into(),
            other => clip(&other.to_string(), 100),
        }
    } else {
        clip(&parts.join("; "), 100)
    }
}

/// The mail log rows as a table.
pub fn log_table(rows: &[LogRow]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                when(r.at),
                r.event.clone(),
                r.workqueue_id.map_or("-".into(), |i| i.to_string()),
                r.stage.clone().unwrap_or_else(|| "-".into()),
                sender(r.mail_from.as_deref()),
                recipients(&r.rcpt_to),
                detail_summary(&r.event, &r.detail),
            ]
        })
        .collect();
    table(
        &[
            "AT",
            "EVENT",
            "ROW",
            "STAGE",
            "SENDER",
            "RECIPIENTS",
            "DETAIL",
        ],
        &[false, false, true],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn details_say_what_matters_for_each_event() {
        for (event, detail, want) in [
            (
                "delivered",
                json!({"mailbox": "/var/mail/alice/Maildir"}),
                "mailbox /var/mail/alice/Maildir",
            ),
            (
                "delivered",
                json!({"reply": "250 2.0.0 ok", "remote_mta": "mx.example.org"}),
                "reply 250 2.0.0 ok; from mx.example.org",
            ),
            (
                "bounced",
                json!({"status": "5.1.1", "diagnostic": "no such user"}),
                "5.1.1; no such user",
            ),
            (
                "dropped",
                json!({"reason": "a DSN to the null sender"}),
                "a DSN to the null sender",
            ),
            ("dropped", json!({}), "-"),
            ("expired", json!({"other": 1}), "{\"other\":1}"),
        ] {
            assert_eq!(detail_summary(event, &detail), want, "{event} {detail}");
        }
    }

    #[test]
    fn a_screen_without_the_database_names_what_does_not_answer() {
        use crate::probe::Service;
        let mut down = Service::new("listener-mx", Kind::Smtp, false, "cannot connect: refused");
        down.address = Some("127.0.0.1:25".into());
        down.elapsed_ms = Some(1);
        let r = Report {
            generated_at: DateTime::from_timestamp(1_764_615_302, 0).unwrap(),
            ok: false,
            services: vec![
                Service::new(
                    "database",
                    Kind::Database,
                    false,
                    "cannot connect to the database",
                ),
                Service::new("dispatcher", Kind::Dispatcher, false, "unknown"),
                down,
            ],
            queue: None,
            rates: None,
            counters: None,
            failures: None,
            bounces: None,
            notes: vec![],
        };
        let text = screen(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "pepsi-status at 2025-12-01 18:55:02Z");
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["SERVICE", "STATE", "ADDRESS", "DETAIL"]
        );
        assert!(
            lines[3].starts_with("database ") && lines[3].contains(" DOWN "),
            "{text}"
        );
        assert!(lines[4].contains("NOT RUNNING"), "{text}");
        assert!(
            lines[5].contains("DOWN")
                && lines[5].contains("127.0.0.1:25")
                && lines[5].ends_with("cannot connect: refused (1 ms)"),
            "{text}"
        );
        assert!(text.contains("the database did not answer"), "{text}");
    }

    #[test]
    fn recipients_show_the_first_and_how_many_more() {
        assert_eq!(recipients(&[]), "-");
        assert_eq!(recipients(&["a@x".into()]), "a@x");
        assert_eq!(
            recipients(&["a@x".into(), "b@x".into(), "c@x".into()]),
            "a@x (+2)"
        );
        assert_eq!(sender(Some("")), "<>");
    }
}
