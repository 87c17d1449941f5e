//! Parsing a worker's status line. Pure.

use serde_json::Value;

/// What one status line says about the message at the head of a worker's queue.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// `0 [json]`: handled and committed by the worker.
    Done {
        finished: bool,
        /// Stages fused into this pass: (stage, milliseconds).
        fused: Vec<(String, f64)>,
        /// The row advanced and is running at this stage, waiting to be handed to its pool
        /// (`"handed"`, from workers started with `PEPSI_HAND_FORWARD`).
        handed: Option<String>,
        /// The pass left no pending row anywhere (`"settled":true`): no claim is needed on
        /// its account.
        settled: bool,
    },
    /// Non-zero: not handled; the row is as the worker found it. `misplaced`: it was not as
    /// the worker was handed it (gone, not running for this epoch, or at a stage of another
    /// program; `"misplaced":true`), so the database's row stands.
    Failed {
        error: String,
        temporary: bool,
        misplaced: bool,
    },
}

/// Parses `line` (without its newline).
pub fn parse(line: &str) -> Status {
    let (code, rest) = match line.split_once(char::is_whitespace) {
        Some((c, r)) => (c, r.trim()),
        None => (line.trim(), ""),
    };
    let json: Option<Value> = if rest.is_empty() {
        None
    } else {
        serde_json::from_str(rest).ok()
    };
    if code == "0" {
        let finished = json
            .as_ref()
            .and_then(|j| j.get("finished"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let fused = json
            .as_ref()
            .and_then(|j| j.get("fused"))
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|f| {
                        Some((
                            f.get("stage")?.as_str()?.to_owned(),
                            f.get("ms").and_then(Value::as_f64).unwrap_or(0.0),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let handed = json
            .as_ref()
            .and_then(|j| j.get("handed"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let settled = json
            .as_ref()
            .and_then(|j| j.get("settled"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        return Status::Done {
            finished,
            fused,
            handed,
            settled,
        };
    }
    let error = match json
        .as_ref()
        .and_then(|j| j.get("error"))
        .and_then(Value::as_str)
    {
        Some(e) => e.to_owned(),
        None if rest.is_empty() => format!("worker answered status {code:?}"),
        None => format!("worker answered status {code:?}: {rest}"),
    };
    let temporary = json
        .as_ref()
        .and_then(|j| j.get("temporary"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let misplaced = json
        .as_ref()
        .and_then(|j| j.get("misplaced"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Status::Failed {
        error,
        temporary,
        misplaced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str, expected: Status) {
        assert_eq!(parse(line), expected, "{line:?}");
    }

    fn done(finished: bool) -> Status {
        Status::Done {
            finished,
            fused: vec![],
            handed: None,
            settled: false,
        }
    }

    #[test]
    fn status_lines() {
        check("0", done(false));
        check("0 {\"finished\":true}", done(true));
        check("0 not json", done(false));
        check(
            "0 {\"fused\":[{\"stage\":\"srs\",\"ms\":1.5},{\"stage\":\"dkim\"}]}",
            Status::Done {
                finished: false,
                fused: vec![("srs".into(), 1.5), ("dkim".into(), 0.0)],
                handed: None,
                settled: false,
            },
        );
        check(
            "0 {\"fused\":[{\"stage\":\"route\",\"ms\":0.2}],\"handed\":\"local\",\"settled\":true}",
            Status::Done {
                finished: false,
                fused: vec![("route".into(), 0.2)],
                handed: Some("local".into()),
                settled: true,
            },
        );
        check(
            "0 {\"finished\":true,\"settled\":true}",
            Status::Done {
                finished: true,
                fused: vec![],
                handed: None,
                settled: true,
            },
        );
        check("0 {\"handed\":\"\"}", done(false));
        check(
            "1 {\"error\":\"boom\",\"temporary\":true}",
            Status::Failed {
                error: "boom".into(),
                temporary: true,
                misplaced: false,
            },
        );
        check(
            "1 {\"error\":\"workqueue row 7 is pending, not running\",\"temporary\":false,\"misplaced\":true}",
            Status::Failed {
                error: "workqueue row 7 is pending, not running".into(),
                temporary: false,
                misplaced: true,
            },
        );
        check(
            "2",
            Status::Failed {
                error: "worker answered status \"2\"".into(),
                temporary: false,
                misplaced: false,
            },
        );
        check(
            "x y",
            Status::Failed {
                error: "worker answered status \"x\": y".into(),
                temporary: false,
                misplaced: false,
            },
        );
    }
}
