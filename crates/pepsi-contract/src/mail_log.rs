//! The mail log (`pepsi.mail_log`, `[pepsi] MAIL_LOG`): one row per final outcome of a
//! message for its recipients — delivered (with the mailbox or the remote server's reply),
//! bounced (with the DSN's status), expired, or dropped.
//!
//! Stages do not write the table: a stage attaches [`Entry`]s to the `Terminal` it returns
//! (`Terminal::log`), and the stage scaffolding inserts them inside the statement that
//! commits the pass (`stage::commit`), so an outcome and its record commit together, at the
//! cost of one INSERT and no extra round trip. `search` is the read side for pepsi-httpd's
//! API; the retention is the dispatcher's (`pepsi.mail_log_expire`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgPool, Row as _};

/// A final outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Event {
    /// Handed to the mailbox or accepted by the next server.
    Delivered,
    /// Failed for good; a DSN goes (or would go) to the sender.
    Bounced,
    /// Not delivered within MAX_LIFETIME (4.4.7); a DSN goes to the sender.
    Expired,
    /// Given up without a notification (a DSN that cannot be delivered, a discard stage).
    Dropped,
}

impl Event {
    pub const ALL: [Event; 4] = [
        Event::Delivered,
        Event::Bounced,
        Event::Expired,
        Event::Dropped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Event::Delivered => "delivered",
            Event::Bounced => "bounced",
            Event::Expired => "expired",
            Event::Dropped => "dropped",
        }
    }

    pub fn parse(text: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.as_str() == text)
    }
}

/// One row a stage records: the event for `rcpt_to` at `stage`, the envelope sender as it
/// was when the outcome was decided, and `detail` (an object: `mailbox`, `reply`,
/// `remote_mta`, `status`, `diagnostic`, `reason` …, see docs/mail-log.md). Made by
/// `StageContext::log_entry`, which fills the stage and the sender.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    pub stage: String,
    pub mail_from: String,
    pub event: Event,
    pub rcpt_to: Vec<String>,
    pub detail: Value,
}

/// What a search matches; `None` means any. Text filters match a part, any letter case.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Search {
    pub sender: Option<String>,
    pub recipient: Option<String>,
    pub event: Option<Event>,
    pub workqueue_id: Option<i64>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
}

/// One row of the log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogRow {
    pub log_id: i64,
    pub at: DateTime<Utc>,
    pub workqueue_id: Option<i64>,
    pub stage: Option<String>,
    pub event: String,
    pub mail_from: Option<String>,
    pub rcpt_to: Vec<String>,
    pub detail: Value,
}

/// The rows matching `search`, newest first, at most `limit`.
pub async fn search(
    pool: &PgPool,
    search: &Search,
    limit: i64,
) -> Result<Vec<LogRow>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT log_id, at, workqueue_id, stage, event, mail_from, COALESCE(rcpt_to, '{}') AS rcpt_to, detail \
         FROM pepsi.mail_log \
         WHERE ($1::text IS NULL OR strpos(lower(mail_from), lower($1)) > 0) \
           AND ($2::text IS NULL OR EXISTS (SELECT 1 FROM unnest(rcpt_to) AS r(a) \
                                            WHERE strpos(lower(r.a), lower($2)) > 0)) \
           AND ($3::text IS NULL OR event = $3) \
           AND ($4::int8 IS NULL OR workqueue_id = $4) \
           AND ($5::timestamptz IS NULL OR at >= $5) \
           AND ($6::timestamptz IS NULL OR at < $6) \
         ORDER BY at DESC, log_id DESC LIMIT $7",
    )
    .bind(search.sender.as_deref())
    .bind(search.recipient.as_deref())
    .bind(search.event.map(Event::as_str))
    .bind(search.workqueue_id)
    .bind(search.since)
    .bind(search.until)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(LogRow {
                log_id: r.try_get("log_id")?,
                at: r.try_get("at")?,
                workqueue_id: r.try_get("workqueue_id")?,
                stage: r.try_get("stage")?,
                event: r.try_get("event")?,
                mail_from: r.try_get("mail_from")?,
                rcpt_to: r.try_get("rcpt_to")?,
                detail: r.try_get("detail")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_their_names() {
        for e in Event::ALL {
            assert_eq!(Event::parse(e.as_str()), Some(e));
            assert_eq!(serde_json::to_value(e).unwrap(), e.as_str());
        }
        assert_eq!(Event::parse("Delivered"), None);
    }
}
