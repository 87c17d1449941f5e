//! Admission into the queue: one `pepsi.workqueue_add` call per message, all recipients in
//! one row, in one transaction. The function never notifies (see `wake`); when this
//! returns Ok the row has committed and the 250 may go out.

use sqlx::PgPool;

/// The message as it is stored.
#[derive(Debug)]
pub struct Admission<'a> {
    /// Empty for the null reverse path.
    pub mail_from: &'a str,
    pub rcpt_to: &'a [String],
    /// The header block, prepended fields included; raw = headers || CRLF || body.
    pub headers: &'a [u8],
    pub body: &'a [u8],
    pub state: &'a serde_json::Value,
    pub auth_user: Option<&'a str>,
    pub client_addr: std::net::IpAddr,
}

/// Stores the message and returns its `workqueue_id`, after commit.
pub async fn admit(pool: &PgPool, msg: &Admission<'_>) -> Result<i64, sqlx::Error> {
    pepsi_common::db::with_retry(|| async {
        // A single statement in autocommit is its own transaction: the body row and the
        // queue row commit together or not at all.
        sqlx::query_scalar("SELECT pepsi.workqueue_add($1, $2, $3, $4, $5, $6, $7::inet)")
            .bind(msg.mail_from)
            .bind(msg.rcpt_to)
            .bind(msg.headers)
            .bind(msg.body)
            .bind(msg.state)
            .bind(msg.auth_user)
            .bind(msg.client_addr.to_string())
            .fetch_one(pool)
            .await
    })
    .await
}
