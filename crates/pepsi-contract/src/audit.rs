//! The audit log: the one way any Pepsi program writes a `pepsi.event_log` row.
//!
//! Operator tools and the administrative API record every administrative action here, in
//! the same transaction as the action, so the log is complete whichever surface acted. The
//! row's `actor` is the database role (`current_user`) unless the caller names a principal
//! (an API account, say); `detail` always carries the program and the operating-system
//! user that ran it. This module never reads the log and never changes a row it wrote: the
//! table is append-only for every role.

use serde_json::{Map, Value, json};
use sqlx::PgConnection;

/// Who performs an action, as far as this process can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The program acting (`pepsi-queue`).
    pub program: String,
    /// The principal to record as `actor`; `None` records the database role.
    pub principal: Option<String>,
    /// The operating-system user running the program (`$USER`, else `$LOGNAME`).
    pub os_user: Option<String>,
    /// The effective uid of the process.
    pub os_uid: Option<u32>,
}

impl Actor {
    /// The actor for a command-line program run by a local user.
    pub fn local(program: &str) -> Actor {
        use std::os::unix::fs::MetadataExt as _;
        let os_user = ["USER", "LOGNAME"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()));
        // /proc/self belongs to the process's effective uid.
        let os_uid = std::fs::metadata("/proc/self").ok().map(|m| m.uid());
        Actor {
            program: program.to_owned(),
            principal: None,
            os_user,
            os_uid,
        }
    }

    /// `detail` with the program and operating-system user added (under `tool`, `os_user`
    /// and `os_uid`); keys the caller set are kept.
    pub fn annotate(&self, detail: Value) -> Value {
        let mut map = match detail {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => {
                let mut m = Map::new();
                m.insert("value".into(), other);
                m
            }
        };
        map.entry("tool").or_insert_with(|| json!(self.program));
        if let Some(user) = &self.os_user {
            map.entry("os_user").or_insert_with(|| json!(user));
        }
        if let Some(uid) = self.os_uid {
            map.entry("os_uid").or_insert_with(|| json!(uid));
        }
        Value::Object(map)
    }
}

/// Writes one `pepsi.event_log` row through `pepsi.event_log_add`. Call it on the
/// transaction that performs the action, so that the action and its record commit together.
pub async fn record(
    conn: &mut PgConnection,
    actor: &Actor,
    action: &str,
    workqueue_id: Option<i64>,
    detail: Value,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pepsi.event_log_add($1, $2, $3, $4)")
        .bind(action)
        .bind(workqueue_id)
        .bind(actor.annotate(detail))
        .bind(actor.principal.as_deref())
        .execute(conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotate_adds_who_and_keeps_the_callers_keys() {
        let actor = Actor {
            program: "pepsi-queue".into(),
            principal: None,
            os_user: Some("alice".into()),
            os_uid: Some(1000),
        };
        let cases = [
            (
                json!({"from_status": "failed"}),
                json!({"from_status": "failed", "tool": "pepsi-queue", "os_user": "alice", "os_uid": 1000}),
            ),
            (
                json!({"tool": "api"}),
                json!({"tool": "api", "os_user": "alice", "os_uid": 1000}),
            ),
            (
                Value::Null,
                json!({"tool": "pepsi-queue", "os_user": "alice", "os_uid": 1000}),
            ),
            (
                json!(7),
                json!({"value": 7, "tool": "pepsi-queue", "os_user": "alice", "os_uid": 1000}),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(actor.annotate(input.clone()), want, "{input}");
        }
    }
}
