//! Text for people, shared by the operator tools: aligned tables, durations in the two
//! largest units, cells clipped to a width, and the queue's summary by stage and status.
//! Pure functions, no I/O.

use crate::queue::STATUSES;
use crate::queue::json::summary_map;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::json::list_json;

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
}
