//! Query parameters and filters as the API accepts them, pure: each value checked where it
//! enters, an unknown parameter refused, and every error naming the parameter and what was
//! expected. Tested as tables.

use std::time::Duration;

use chrono::{DateTime, Utc};
use pepsi_admin::queue::{Filter, STATUSES};
use pepsi_contract::mail_log::{Event, Search};

/// The longest text filter value accepted.
pub const MAX_TEXT: usize = 254;
/// The largest `limit` of a listing.
pub const MAX_LIMIT: i64 = 10_000;
/// The `limit` of a listing that names none.
pub const DEFAULT_LIMIT: i64 = 100;

/// The parameters of the queue filter (`GET /api/queue`, and a bulk action's `filter`).
pub const QUEUE_FILTER_FIELDS: [&str; 6] = [
    "sender",
    "recipient",
    "domain",
    "stage",
    "status",
    "min_age",
];

fn text(field: &str, value: &str) -> Result<String, String> {
    if value.is_empty() {
        return Err(format!(
            "{field}: empty; leave the parameter out to match anything"
        ));
    }
    if value.chars().count() > MAX_TEXT {
        return Err(format!("{field}: longer than {MAX_TEXT} characters"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("{field}: holds a control character"));
    }
    Ok(value.to_owned())
}

/// A stage name: letters, digits, `-`, `_`, `.`, at most 64.
pub fn stage_name(field: &str, value: &str) -> Result<String, String> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{field}: {value:?} is not a stage name (letters, digits, '-', '_', '.', at most 64)"
        ))
    }
}

fn limit(value: &str) -> Result<i64, String> {
    value
        .parse::<i64>()
        .ok()
        .filter(|n| (1..=MAX_LIMIT).contains(n))
        .ok_or_else(|| format!("limit: {value:?} is not a whole number from 1 to {MAX_LIMIT}"))
}

fn row_id(field: &str, value: &str) -> Result<i64, String> {
    value
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{field}: {value:?} is not a row id"))
}

fn duration(field: &str, value: &str) -> Result<Duration, String> {
    pepsi_conf::config::parse_duration(value).map_err(|e| {
        format!("{field}: {value:?} is not a duration (90, 30s, 15m, 2h, 1d, 1h30m): {e}")
    })
}

fn unknown(field: &str, known: &[&str]) -> String {
    format!(
        "unknown parameter {field:?} (expected one of: {})",
        known.join(", ")
    )
}

/// One field of the queue filter into `f`.
fn queue_field(f: &mut Filter, field: &str, value: &str) -> Result<(), String> {
    match field {
        "sender" => f.sender = Some(text(field, value)?),
        "recipient" => f.recipient = Some(text(field, value)?),
        "domain" => {
            f.domain = Some(pepsi_admin::admin::domain(value, "domain").map_err(|e| e.to_string())?)
        }
        "stage" => f.stage = Some(stage_name(field, value)?),
        "status" => {
            if !STATUSES.contains(&value) {
                return Err(format!(
                    "status: {value:?} is not one of {}",
                    STATUSES.join(", ")
                ));
            }
            f.status = Some(value.to_owned());
        }
        "min_age" => f.older_than = Some(duration(field, value)?),
        _ => return Err(unknown(field, &QUEUE_FILTER_FIELDS)),
    }
    Ok(())
}

/// A queue filter from `pairs` (the bulk actions' `filter` object).
pub fn queue_filter(pairs: &[(String, String)]) -> Result<Filter, String> {
    let mut f = Filter::default();
    for (k, v) in pairs {
        queue_field(&mut f, k, v)?;
    }
    Ok(f)
}

/// `GET /api/queue`: the filter and the limit.
pub fn queue_listing(pairs: &[(String, String)]) -> Result<(Filter, i64), String> {
    let mut f = Filter::default();
    let mut lim = DEFAULT_LIMIT;
    for (k, v) in pairs {
        match k.as_str() {
            "limit" => lim = limit(v)?,
            _ => queue_field(&mut f, k, v).map_err(|e| {
                if e.starts_with("unknown parameter") {
                    let mut known = QUEUE_FILTER_FIELDS.to_vec();
                    known.push("limit");
                    unknown(k, &known)
                } else {
                    e
                }
            })?,
        }
    }
    Ok((f, lim))
}

/// `GET /api/mail-log`: the search and the limit.
pub fn mail_log_search(pairs: &[(String, String)]) -> Result<(Search, i64), String> {
    const FIELDS: [&str; 7] = [
        "sender",
        "recipient",
        "event",
        "workqueue_id",
        "since",
        "until",
        "limit",
    ];
    let time = |field: &str, v: &str| -> Result<DateTime<Utc>, String> {
        DateTime::parse_from_rfc3339(v)
            .map(|t| t.to_utc())
            .map_err(|_| format!("{field}: {v:?} is not an RFC 3339 time (2026-10-20T09:00:00Z)"))
    };
    let mut s = Search::default();
    let mut lim = DEFAULT_LIMIT;
    for (k, v) in pairs {
        match k.as_str() {
            "sender" => s.sender = Some(text(k, v)?),
            "recipient" => s.recipient = Some(text(k, v)?),
            "event" => {
                s.event = Some(Event::parse(v).ok_or_else(|| {
                    format!("event: {v:?} is not one of delivered, bounced, expired, dropped")
                })?)
            }
            "workqueue_id" => s.workqueue_id = Some(row_id(k, v)?),
            "since" => s.since = Some(time(k, v)?),
            "until" => s.until = Some(time(k, v)?),
            "limit" => lim = limit(v)?,
            other => return Err(unknown(other, &FIELDS)),
        }
    }
    Ok((s, lim))
}

/// `GET /api/events`: the action (exact), the queue row and the limit.
pub fn events_query(
    pairs: &[(String, String)],
) -> Result<(Option<String>, Option<i64>, i64), String> {
    let mut action = None;
    let mut row = None;
    let mut lim = DEFAULT_LIMIT;
    for (k, v) in pairs {
        match k.as_str() {
            "action" => action = Some(text(k, v)?),
            "workqueue_id" => row = Some(row_id(k, v)?),
            "limit" => lim = limit(v)?,
            other => return Err(unknown(other, &["action", "workqueue_id", "limit"])),
        }
    }
    Ok((action, row, lim))
}

/// `GET /api/accounts`: a part of the address and the limit.
pub fn accounts_query(pairs: &[(String, String)]) -> Result<(Option<String>, i64), String> {
    let mut search = None;
    let mut lim = DEFAULT_LIMIT;
    for (k, v) in pairs {
        match k.as_str() {
            "search" => search = Some(text(k, v)?),
            "limit" => lim = limit(v)?,
            other => return Err(unknown(other, &["search", "limit"])),
        }
    }
    Ok((search, lim))
}

/// A listing that takes only `limit`.
pub fn limit_only(pairs: &[(String, String)]) -> Result<i64, String> {
    let mut lim = DEFAULT_LIMIT;
    for (k, v) in pairs {
        match k.as_str() {
            "limit" => lim = limit(v)?,
            other => return Err(unknown(other, &["limit"])),
        }
    }
    Ok(lim)
}

/// A comma-separated list parameter: its items trimmed, none empty.
fn list(field: &str, value: &str) -> Result<Vec<String>, String> {
    let items: Vec<String> = text(field, value)?
        .split(',')
        .map(|t| t.trim().to_owned())
        .collect();
    if items.iter().any(String::is_empty) {
        return Err(format!("{field}: an empty item in {value:?}"));
    }
    Ok(items)
}

/// `GET /api/config/overrides`: the scope, as written (checked by `admin::override_scope`).
pub fn overrides_query(pairs: &[(String, String)]) -> Result<Option<String>, String> {
    let mut scope = None;
    for (k, v) in pairs {
        match k.as_str() {
            "scope" => scope = Some(text(k, v)?),
            other => return Err(unknown(other, &["scope"])),
        }
    }
    Ok(scope)
}

/// `GET /api/config/effective`: which configuration and which of its options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectiveQuery {
    /// As written (checked by `admin::override_scope`); `None` is global.
    pub scope: Option<String>,
    /// Programs whose options to show; empty: every option set.
    pub programs: Vec<String>,
    /// Only these sections; empty: all.
    pub sections: Vec<String>,
}

pub fn effective_query(pairs: &[(String, String)]) -> Result<EffectiveQuery, String> {
    let mut q = EffectiveQuery::default();
    for (k, v) in pairs {
        match k.as_str() {
            "scope" => q.scope = Some(text(k, v)?),
            "program" => q.programs = list(k, v)?,
            "section" => q.sections = list(k, v)?,
            other => return Err(unknown(other, &["program", "section", "scope"])),
        }
    }
    Ok(q)
}

/// `GET /api/settings`: the setting names (comma-separated; checked against
/// `KNOWN_SETTINGS` by the caller) and the limit.
pub fn settings_query(pairs: &[(String, String)]) -> Result<(Vec<String>, i64), String> {
    let mut names = Vec::new();
    let mut lim = DEFAULT_LIMIT;
    for (k, v) in pairs {
        match k.as_str() {
            "name" => names = list(k, v)?,
            "limit" => lim = limit(v)?,
            other => return Err(unknown(other, &["name", "limit"])),
        }
    }
    Ok((names, lim))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &[(&str, &str)]) -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn queue_listing_reads_every_filter() {
        let (f, lim) = queue_listing(&pairs(&[
            ("sender", "a@x"),
            ("recipient", "@example.org"),
            ("domain", "Example.ORG"),
            ("stage", "relay"),
            ("status", "held"),
            ("min_age", "1h30m"),
            ("limit", "5"),
        ]))
        .unwrap();
        assert_eq!(f.sender.as_deref(), Some("a@x"));
        assert_eq!(f.recipient.as_deref(), Some("@example.org"));
        assert_eq!(f.domain.as_deref(), Some("example.org"));
        assert_eq!(f.stage.as_deref(), Some("relay"));
        assert_eq!(f.status.as_deref(), Some("held"));
        assert_eq!(f.older_than, Some(Duration::from_secs(5400)));
        assert_eq!(lim, 5);
        assert_eq!(queue_listing(&[]).unwrap().1, DEFAULT_LIMIT);
    }

    #[test]
    fn bad_parameters_are_named() {
        let long = "x".repeat(300);
        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            (vec![("status", "lost")], "status: \"lost\" is not one of"),
            (
                vec![("min_age", "soon")],
                "min_age: \"soon\" is not a duration",
            ),
            (vec![("limit", "0")], "limit: \"0\" is not a whole number"),
            (vec![("limit", "100001")], "limit: \"100001\""),
            (vec![("stage", "a b")], "stage: \"a b\" is not a stage name"),
            (
                vec![("domain", "nodot")],
                "domain \"nodot\" is not a domain name",
            ),
            (vec![("sender", "")], "sender: empty"),
            (vec![("sender", long.as_str())], "sender: longer than 254"),
            (vec![("colour", "red")], "unknown parameter \"colour\""),
        ];
        for (q, want) in cases {
            let e = queue_listing(&pairs(&q)).unwrap_err();
            assert!(e.contains(want), "{q:?}: {e}");
        }
        assert!(
            queue_listing(&pairs(&[("x", "1")]))
                .unwrap_err()
                .contains("limit")
        );
        assert!(
            !queue_filter(&pairs(&[("limit", "1")]))
                .unwrap_err()
                .contains("min_age, limit")
        );
    }

    #[test]
    fn mail_log_search_reads_and_refuses() {
        let (s, lim) = mail_log_search(&pairs(&[
            ("recipient", "alice"),
            ("event", "bounced"),
            ("workqueue_id", "42"),
            ("since", "2026-10-20T09:00:00Z"),
            ("limit", "7"),
        ]))
        .unwrap();
        assert_eq!(s.recipient.as_deref(), Some("alice"));
        assert_eq!(s.event, Some(Event::Bounced));
        assert_eq!(s.workqueue_id, Some(42));
        assert!(s.since.is_some() && s.until.is_none());
        assert_eq!(lim, 7);
        let cases = [
            (("event", "lost"), "event: \"lost\""),
            (("workqueue_id", "-1"), "workqueue_id: \"-1\""),
            (
                ("until", "yesterday"),
                "until: \"yesterday\" is not an RFC 3339 time",
            ),
            (("who", "x"), "unknown parameter \"who\""),
        ];
        for ((k, v), want) in cases {
            let e = mail_log_search(&pairs(&[(k, v)])).unwrap_err();
            assert!(e.contains(want), "{k}={v}: {e}");
        }
    }

    #[test]
    fn events_query_takes_an_action_and_a_row() {
        assert_eq!(
            events_query(&pairs(&[("workqueue_id", "9"), ("action", "queue.retry")])).unwrap(),
            (Some("queue.retry".to_owned()), Some(9), DEFAULT_LIMIT)
        );
        let cases = [
            (("workqueue_id", "0"), "workqueue_id: \"0\" is not a row id"),
            (("workqueue_id", "x"), "workqueue_id: \"x\" is not a row id"),
            (
                ("id", "1"),
                "unknown parameter \"id\" (expected one of: action, workqueue_id, limit)",
            ),
        ];
        for ((k, v), want) in cases {
            let e = events_query(&pairs(&[(k, v)])).unwrap_err();
            assert!(e.contains(want), "{k}={v}: {e}");
        }
    }

    #[test]
    fn configuration_and_settings_queries_read_and_refuse() {
        let q = effective_query(&pairs(&[
            ("program", "pepsi-ingress, pepsi-httpd"),
            ("section", "pepsi-ingress"),
            ("scope", "domain:x.example"),
        ]))
        .unwrap();
        assert_eq!(q.programs, ["pepsi-ingress", "pepsi-httpd"]);
        assert_eq!(q.sections, ["pepsi-ingress"]);
        assert_eq!(q.scope.as_deref(), Some("domain:x.example"));
        assert_eq!(effective_query(&[]).unwrap(), EffectiveQuery::default());
        assert_eq!(
            overrides_query(&pairs(&[("scope", "global")])).unwrap(),
            Some("global".into())
        );
        assert_eq!(
            settings_query(&pairs(&[("name", "alias,send_as"), ("limit", "5")])).unwrap(),
            (vec!["alias".to_owned(), "send_as".to_owned()], 5)
        );
        let errors = [
            (
                effective_query(&pairs(&[("programs", "x")])).map(drop),
                "\"programs\"",
            ),
            (
                effective_query(&pairs(&[("program", "a,,b")])).map(drop),
                "program: an empty item",
            ),
            (
                overrides_query(&pairs(&[("scope", "")])).map(drop),
                "scope: empty",
            ),
            (
                overrides_query(&pairs(&[("section", "x")])).map(drop),
                "\"section\"",
            ),
            (
                settings_query(&pairs(&[("limit", "0")])).map(drop),
                "limit: \"0\"",
            ),
        ];
        for (got, want) in errors {
            let e = got.unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
