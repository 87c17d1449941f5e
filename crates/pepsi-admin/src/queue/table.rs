//! The queue's summary as a table for people: one line per stage, a column per status.

use pepsi_conf::text::table;

use super::STATUSES;
use super::json::summary_map;

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
