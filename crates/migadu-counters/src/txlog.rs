//! The counting transaction log: the Lua plugin's step-by-step lines, one block per request
//! tagged `<trace_id>`, as text or one JSON object per line. Holds no per-request detail
//! anywhere else.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use crate::counting::{Event, Side};
use crate::domains::Level;
use crate::logging::LogWriter;

/// Where the counting log goes, and how it looks.
#[derive(Clone)]
pub struct TxLog {
    writer: Arc<LogWriter>,
    json: bool,
}

fn level_word(level: Level) -> &'static str {
    match level {
        Level::A => "address",
        Level::D => "domain",
        Level::O => "account",
    }
}

fn limit_text(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_string(), |l| l.to_string())
}

/// The message part of a text line.
pub fn text_message(event: &Event) -> String {
    match event {
        Event::Request {
            auth_user: Some(a),
            recipient,
            mail_from,
            ..
        } => format!("request auth_user={a} recipient={recipient} mail_from={mail_from}"),
        Event::Request {
            auth_user: None,
            recipient,
            mail_from,
            junk,
        } => format!(
            "request recipient={recipient} mail_from={mail_from} junk={}",
            junk.unwrap_or(false)
        ),
        Event::LocalDomain { domain, org_id } => {
            format!("local domain: {domain} account_id={org_id}")
        }
        Event::DomainLimits { domain, limits } => format!("domain: {domain} limits_map={limits}"),
        Event::DeterminedLimit {
            level,
            flow,
            key,
            limit,
        } => format!(
            "determined limit (level=[{}] flow=[{}] key=[{key}]) => {}",
            level.as_str(),
            flow.as_str(),
            limit_text(*limit)
        ),
        Event::NotInDb { side, domain } => format!(
            "{} domain not in domains db: {domain} (not counted)",
            match side {
                Side::Sender => "sender",
                Side::Recipient => "recipient",
            }
        ),
        Event::SkippedExempt { address } => format!("skipped: exempt address {address}"),
        Event::SkippedJunk => "skipped: junk".to_string(),
        Event::Tracked {
            level,
            id,
            count,
            limit,
            reached,
            ..
        } => format!(
            "tracked {} counters for {id} => count={count} limit={} reached={reached}",
            level_word(*level),
            limit_text(*limit)
        ),
        Event::KeyFailed { key, error, .. } => {
            format!("redis error on key {key}: {error} (not counted)")
        }
        Event::LimitReached {
            level,
            flow,
            id,
            by,
            url_name,
            url_set,
        } => format!(
            "limit reached (level=[{}] id=[{id}] flow=[{}] by=[{by}]) => {}",
            level.as_str(),
            flow.as_str(),
            if *url_set {
                format!("notifying {url_name}")
            } else {
                format!("{url_name} empty (not notified)")
            }
        ),
        Event::RedisError { error } => format!("redis error: {error} (nothing counted)"),
        Event::NotificationSent { url } => {
            format!("sent limit exceeded notification to url \"{url}\"")
        }
        Event::NotificationFailed {
            url,
            attempts,
            error,
        } => format!(
            "failed limit exceeded notification to url \"{url}\" after {attempts} attempts: {error}"
        ),
    }
}

/// One JSON object for an event, with the plan's field names.
pub fn json_object(ts: DateTime<Utc>, trace_id: &str, route: &str, event: &Event) -> Value {
    let mut m = Map::new();
    m.insert(
        "ts".into(),
        json!(ts.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()),
    );
    m.insert("trace_id".into(), json!(trace_id));
    m.insert("route".into(), json!(route));
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_string(), v);
    };
    let name = match event {
        Event::Request {
            auth_user,
            recipient,
            mail_from,
            junk,
        } => {
            if let Some(a) = auth_user {
                put("auth_user", json!(a));
            }
            put("recipient", json!(recipient));
            put("mail_from", json!(mail_from));
            if let Some(j) = junk {
                put("junk", json!(j));
            }
            "request"
        }
        Event::LocalDomain { domain, org_id } => {
            put("domain", json!(domain));
            put("org_id", json!(org_id));
            "local_domain"
        }
        Event::DomainLimits { domain, limits } => {
            put("domain", json!(domain));
            put("limits", json!(limits));
            "limits_map"
        }
        Event::DeterminedLimit {
            level,
            flow,
            key,
            limit,
        } => {
            put("level", json!(level.as_str()));
            put("flow", json!(flow.as_str()));
            put("key", json!(key));
            put("limit", json!(limit));
            "determined_limit"
        }
        Event::NotInDb { side, domain } => {
            put("domain", json!(domain));
            match side {
                Side::Sender => "sender_domain_unknown",
                Side::Recipient => "recipient_domain_unknown",
            }
        }
        Event::SkippedExempt { address } => {
            put("id", json!(address));
            "skipped_exempt"
        }
        Event::SkippedJunk => "skipped_junk",
        Event::Tracked {
            level,
            flow,
            id,
            key,
            count,
            limit,
            reached,
        } => {
            put("level", json!(level.as_str()));
            put("flow", json!(flow.as_str()));
            put("id", json!(id));
            put("key", json!(key));
            put("count", json!(count));
            put("limit", json!(limit));
            put("reached", json!(reached));
            "tracked"
        }
        Event::KeyFailed {
            level,
            flow,
            key,
            error,
        } => {
            put("level", json!(level.as_str()));
            put("flow", json!(flow.as_str()));
            put("key", json!(key));
            put("error", json!(error));
            "key_error"
        }
        Event::LimitReached {
            level,
            flow,
            id,
            by,
            url_name,
            url_set,
        } => {
            put("level", json!(level.as_str()));
            put("flow", json!(flow.as_str()));
            put("id", json!(id));
            put("by", json!(by));
            put("url", json!(if *url_set { *url_name } else { "" }));
            "limit_reached"
        }
        Event::RedisError { error } => {
            put("error", json!(error));
            "redis_error"
        }
        Event::NotificationSent { url } => {
            put("url", json!(url));
            "notification_sent"
        }
        Event::NotificationFailed {
            url,
            attempts,
            error,
        } => {
            put("url", json!(url));
            put("attempts", json!(attempts));
            put("error", json!(error));
            "notification_failed"
        }
    };
    m.insert("event".into(), json!(name));
    Value::Object(m)
}

/// Renders a block of events, each with its own timestamp.
pub fn render(
    json: bool,
    trace_id: &str,
    route: &str,
    events: &[(DateTime<Utc>, Event)],
) -> String {
    let mut out = String::new();
    for (ts, event) in events {
        if json {
            out.push_str(&json_object(*ts, trace_id, route, event).to_string());
        } else {
            out.push_str(&format!(
                "{} <{trace_id}> {route}; {}",
                ts.format("%Y-%m-%d %H:%M:%S%.3f"),
                text_message(event)
            ));
        }
        out.push('\n');
    }
    out
}

impl TxLog {
    pub fn new(writer: Arc<LogWriter>, json: bool) -> TxLog {
        TxLog { writer, json }
    }

    /// Writes a whole block in one write so concurrent requests never interleave inside it.
    /// Whether anything is written (`counting_output` is not `off`).
    pub fn enabled(&self) -> bool {
        !self.writer.is_off()
    }

    pub fn block(&self, trace_id: &str, route: &str, events: &[(DateTime<Utc>, Event)]) {
        if self.writer.is_off() || events.is_empty() {
            return;
        }
        self.writer
            .write_all(render(self.json, trace_id, route, events).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counting::{self, KeyResult, Rules};
    use crate::domains::parse_record;
    use crate::validate::{CountRequest, Route};
    use chrono::TimeZone;

    fn ts(ms: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 10, 6, 1, 12, 6).unwrap()
            + chrono::Duration::milliseconds(ms.into())
    }

    /// The plan's /out example: local sender, external recipient, the O level reached.
    fn out_example() -> Vec<(DateTime<Utc>, Event)> {
        let rec = std::sync::Arc::new(
            parse_record("116681|A/i=500,A/o=100,D/i=10000,D/o=2200,O/i=10000,O/o=2200").unwrap(),
        );
        let req = CountRequest {
            route: Route::Out,
            trace_id: "ad8525".into(),
            auth_user: Some("noah@wearemiraclesnow.com".into()),
            mail_from: "noah@wearemiraclesnow.com".into(),
            recipient: "y@example.org".into(),
            junk: false,
        };
        let lookup = |d: &str| (d == "wearemiraclesnow.com").then(|| rec.clone());
        let date = chrono::NaiveDate::from_ymd_opt(2026, 10, 6).unwrap();
        let p = counting::plan(
            &req,
            &Rules {
                exempt: &[],
                count_junk: false,
                events: true,
            },
            date,
            &lookup,
        );
        let mut events: Vec<_> = p.events.into_iter().map(|e| (ts(412), e)).collect();
        let results = [
            KeyResult::Counted(12),
            KeyResult::Counted(1830),
            KeyResult::Counted(2200),
        ];
        let (after, _) = counting::outcome(&p.increments, &results, &|_| true, true);
        events.extend(after.into_iter().map(|e| (ts(414), e)));
        events.push((ts(903), Event::NotificationSent {
            url: "https://admin.migadu.com/api/limits?level=O&id=116681&flow=o&period=d&by=noah%40wearemiraclesnow.com&count=2200".into(),
        }));
        events
    }

    #[test]
    fn text_block_matches_the_plan() {
        let got = render(false, "ad8525", "out", &out_example());
        let want = "\
2026-10-06 01:12:06.412 <ad8525> out; request auth_user=noah@wearemiraclesnow.com recipient=y@example.org mail_from=noah@wearemiraclesnow.com
2026-10-06 01:12:06.412 <ad8525> out; local domain: wearemiraclesnow.com account_id=116681
2026-10-06 01:12:06.412 <ad8525> out; domain: wearemiraclesnow.com limits_map={A/i=500, A/o=100, D/i=10000, D/o=2200, O/i=10000, O/o=2200}
2026-10-06 01:12:06.412 <ad8525> out; determined limit (level=[A] flow=[o] key=[cnt/A/noah@wearemiraclesnow.com/d/2026-10-06/o]) => 100
2026-10-06 01:12:06.412 <ad8525> out; determined limit (level=[D] flow=[o] key=[cnt/D/wearemiraclesnow.com/d/2026-10-06/o]) => 2200
2026-10-06 01:12:06.412 <ad8525> out; determined limit (level=[O] flow=[o] key=[cnt/O/116681/d/2026-10-06/o]) => 2200
2026-10-06 01:12:06.412 <ad8525> out; recipient domain not in domains db: example.org (not counted)
2026-10-06 01:12:06.414 <ad8525> out; tracked address counters for noah@wearemiraclesnow.com => count=12 limit=100 reached=false
2026-10-06 01:12:06.414 <ad8525> out; tracked domain counters for wearemiraclesnow.com => count=1830 limit=2200 reached=false
2026-10-06 01:12:06.414 <ad8525> out; tracked account counters for 116681 => count=2200 limit=2200 reached=true
2026-10-06 01:12:06.414 <ad8525> out; limit reached (level=[O] id=[116681] flow=[o] by=[noah@wearemiraclesnow.com]) => notifying org_url
2026-10-06 01:12:06.903 <ad8525> out; sent limit exceeded notification to url \"https://admin.migadu.com/api/limits?level=O&id=116681&flow=o&period=d&by=noah%40wearemiraclesnow.com&count=2200\"
";
        assert_eq!(got, want);
    }

    #[test]
    fn single_lines() {
        let cases: Vec<(Event, &str)> = vec![
            (Event::SkippedJunk, "skipped: junk"),
            (
                Event::SkippedExempt {
                    address: "support@migadu.com".into(),
                },
                "skipped: exempt address support@migadu.com",
            ),
            (
                Event::NotInDb {
                    side: Side::Sender,
                    domain: "gmail.com".into(),
                },
                "sender domain not in domains db: gmail.com (not counted)",
            ),
            (
                Event::RedisError {
                    error: "connection refused".into(),
                },
                "redis error: connection refused (nothing counted)",
            ),
            (
                Event::Request {
                    auth_user: None,
                    recipient: "y@e.org".into(),
                    mail_from: "".into(),
                    junk: Some(true),
                },
                "request recipient=y@e.org mail_from= junk=true",
            ),
            (
                Event::NotificationFailed {
                    url: "http://x/".into(),
                    attempts: 5,
                    error: "status 500".into(),
                },
                "failed limit exceeded notification to url \"http://x/\" after 5 attempts: status 500",
            ),
            (
                Event::DeterminedLimit {
                    level: Level::D,
                    flow: crate::domains::Flow::In,
                    key: "k".into(),
                    limit: None,
                },
                "determined limit (level=[D] flow=[i] key=[k]) => unlimited",
            ),
        ];
        for (event, want) in cases {
            assert_eq!(text_message(&event), want);
        }
    }

    #[test]
    fn json_lines() {
        let out = render(true, "ad8525", "out", &out_example());
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 12);
        assert_eq!(lines[0]["event"], "request");
        assert_eq!(lines[0]["ts"], "2026-10-06T01:12:06.412Z");
        assert_eq!(lines[1]["org_id"], 116681);
        assert_eq!(lines[9]["event"], "tracked");
        assert_eq!(lines[9]["reached"], true);
        assert_eq!(lines[9]["limit"], 2200);
        assert_eq!(lines[9]["trace_id"], "ad8525");
        assert_eq!(lines[9]["route"], "out");
    }
}
