//! Presentation of configuration values and override rows for people and for scripts: the
//! serde shapes of `--json` and the tables. Pure functions, no I/O.

use pepsi_admin::admin::OverrideListing;
use pepsi_admin::queue::json::ts;
use pepsi_conf::config::ValueRow;
use pepsi_conf::text::{clip, table};
use serde::Serialize;

/// `show --json`.
#[derive(Debug, Serialize)]
pub struct Shown {
    pub scope: String,
    pub values: Vec<ValueRow>,
}

/// A problem `check --json` reports: the program whose parser found it (`null` for the
/// stage graph's rules) and what it says.
#[derive(Debug, Serialize)]
pub struct Problem {
    pub program: Option<&'static str>,
    pub error: String,
}

impl Problem {
    pub fn of(p: &pepsi_stage_validate::Problem) -> Problem {
        Problem {
            program: p.source.program(),
            error: p.message.clone(),
        }
    }
}

/// A warning `check --json` reports, shaped as a [`Problem`].
#[derive(Debug, Serialize)]
pub struct Warning {
    pub program: Option<&'static str>,
    pub warning: String,
}

impl Warning {
    pub fn of(p: &pepsi_stage_validate::Problem) -> Warning {
        Warning {
            program: p.source.program(),
            warning: p.message.clone(),
        }
    }
}

pub fn values(rows: &[ValueRow]) -> String {
    if rows.is_empty() {
        return "nothing set\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let value = match (&r.value, r.secret, r.set) {
                (_, true, _) => "(secret)".to_owned(),
                (Some(v), _, _) => clip(v, 60),
                (None, _, false) => "(default)".to_owned(),
                (None, _, true) => String::new(),
            };
            vec![
                format!("[{}]", r.section),
                r.option.clone(),
                value,
                r.origin.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(&["SECTION", "OPTION", "VALUE", "FROM"], &[false; 4], &cells)
}

pub fn overrides(rows: &[OverrideListing]) -> String {
    if rows.is_empty() {
        return "no overrides\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.scope.clone(),
                format!("[{}]", r.section),
                r.option.clone(),
                clip(&r.value, 50),
                ts(r.updated_at),
                r.updated_by.clone(),
            ]
        })
        .collect();
    table(
        &["SCOPE", "SECTION", "OPTION", "VALUE", "UPDATED", "BY"],
        &[false; 6],
        &cells,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use pepsi_conf::config::Config;

    #[test]
    fn values_show_their_origin_and_hide_secrets() {
        let cfg = Config::from_str_named(
            "[stage-relay]\nPARALLELISM = 4\n[pepsi]\nHOSTNAME = mx.example\n",
            "t.conf",
        )
        .unwrap();
        let rows = [
            ValueRow::of(&cfg, "stage-relay", "parallelism"),
            ValueRow::of(&cfg, "stage-relay", "QUEUE_LIMIT"),
        ];
        // What a row holds is pepsi_conf::config::shown's to test; this is its table.
        let text = values(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "[stage-relay]  PARALLELISM  4          t.conf:2");
        assert_eq!(lines[2], "[stage-relay]  QUEUE_LIMIT  (default)  -");
    }
}
