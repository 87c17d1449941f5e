//! Held mail, challenges and payments as the confirmation page, the owner's page and
//! `pepsi-whitelist` read them, and the two decisions, through the stored functions
//! `pepsi.secretary_confirm` and `pepsi.secretary_decide` (procedures.sql, THE SECRETARY'S
//! DECISIONS), which wake the held rows' queue rows. Nothing here writes a table itself.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row as _};

use crate::token::Token;

/// The most rows one listing returns.
pub const MAX_LISTED: i64 = 1000;

/// A held message, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Held {
    pub held_id: i64,
    pub queue_id: i64,
    pub mailbox: String,
    /// The From address; `mail_from` is the envelope sender.
    pub sender: String,
    pub mail_from: String,
    pub subject: String,
    pub size: i64,
    /// `challenged`, `unauthenticated`, `automated` or `limited`.
    pub reason: String,
    /// `held`, `released`, `discarded` or `expired`.
    pub status: String,
    pub held_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub decided_at: Option<DateTime<Utc>>,
    pub decided_by: Option<String>,
}

impl Held {
    fn from_row(r: &PgRow) -> Result<Held, sqlx::Error> {
        Ok(Held {
            held_id: r.try_get("held_id")?,
            queue_id: r.try_get("queue_id")?,
            mailbox: r.try_get("mailbox")?,
            sender: r.try_get("sender")?,
            mail_from: r.try_get("mail_from")?,
            subject: r.try_get("subject")?,
            size: r.try_get("size")?,
            reason: r.try_get("reason")?,
            status: r.try_get("status")?,
            held_at: r.try_get("held_at")?,
            expires_at: r.try_get("expires_at")?,
            decided_at: r.try_get("decided_at")?,
            decided_by: r.try_get("decided_by")?,
        })
    }
}

/// The held messages of `mailbox` (every mailbox's for `None`), newest first; only those
/// still held unless `all`.
pub async fn held(
    pool: &PgPool,
    mailbox: Option<&str>,
    all: bool,
    limit: i64,
) -> Result<Vec<Held>, sqlx::Error> {
    sqlx::query(
        "SELECT held_id, queue_id, mailbox, sender, mail_from, subject, size, reason, status, \
                held_at, expires_at, decided_at, decided_by \
         FROM pepsi.secretary_held \
         WHERE ($1::text IS NULL OR mailbox = lower($1)) AND ($2 OR status = 'held') \
         ORDER BY held_at DESC, held_id DESC LIMIT $3",
    )
    .bind(mailbox)
    .bind(all)
    .bind(limit.clamp(1, MAX_LISTED))
    .fetch_all(pool)
    .await?
    .iter()
    .map(Held::from_row)
    .collect()
}

/// A payment auto-pay made or refused, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Payment {
    pub payment_id: i64,
    pub login: String,
    pub payee: String,
    pub merchant: String,
    pub order_id: String,
    /// `CURRENCY:VALUE`.
    pub amount: String,
    /// `paid`, `refused` or `failed`.
    pub status: String,
    pub reason: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// The payments of `login` (everyone's for `None`), newest first.
pub async fn payments(
    pool: &PgPool,
    login: Option<&str>,
    limit: i64,
) -> Result<Vec<Payment>, sqlx::Error> {
    sqlx::query(
        "SELECT payment_id, login, payee, merchant, order_id, \
                currency || ':' || trim_scale(value)::text AS amount, status, reason, created_at \
         FROM pepsi.auto_pay_payment WHERE ($1::text IS NULL OR login = lower($1)) \
         ORDER BY created_at DESC, payment_id DESC LIMIT $2",
    )
    .bind(login)
    .bind(limit.clamp(1, MAX_LISTED))
    .fetch_all(pool)
    .await?
    .iter()
    .map(|r| {
        Ok(Payment {
            payment_id: r.try_get("payment_id")?,
            login: r.try_get("login")?,
            payee: r.try_get("payee")?,
            merchant: r.try_get("merchant")?,
            order_id: r.try_get("order_id")?,
            amount: r.try_get("amount")?,
            status: r.try_get("status")?,
            reason: r.try_get("reason")?,
            created_at: r.try_get("created_at")?,
        })
    })
    .collect()
}

/// A challenge as its confirmation page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChallengeView {
    pub mailbox: String,
    pub sender: String,
    pub expires_at: DateTime<Utc>,
    pub confirmed_at: Option<DateTime<Utc>>,
    pub confirmed_by: Option<String>,
    pub amount: Option<String>,
    pub pay_uri: Option<String>,
    /// How many messages a confirmation would release (still held, and held on a
    /// challenge: `pepsi.secretary_confirm` leaves unauthenticated and automated mail).
    pub waiting: i64,
}

/// The challenge of `token`, when there is one.
pub async fn challenge(pool: &PgPool, token: &Token) -> Result<Option<ChallengeView>, sqlx::Error> {
    sqlx::query(
        "SELECT c.mailbox, c.sender, c.expires_at, c.confirmed_at, c.confirmed_by, c.amount, \
                c.pay_uri, \
                (SELECT count(*) FROM pepsi.secretary_held h \
                  WHERE h.mailbox = c.mailbox AND h.sender = c.sender AND h.status = 'held' \
                    AND h.reason IN ('challenged', 'limited')) \
                  AS waiting \
         FROM pepsi.secretary_challenge c WHERE c.token_hash = $1",
    )
    .bind(token.digest())
    .fetch_optional(pool)
    .await?
    .map(|r| {
        Ok(ChallengeView {
            mailbox: r.try_get("mailbox")?,
            sender: r.try_get("sender")?,
            expires_at: r.try_get("expires_at")?,
            confirmed_at: r.try_get("confirmed_at")?,
            confirmed_by: r.try_get("confirmed_by")?,
            amount: r.try_get("amount")?,
            pay_uri: r.try_get("pay_uri")?,
            waiting: r.try_get("waiting")?,
        })
    })
    .transpose()
}

/// How a sender confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    Link,
    Reply,
    Postage,
}

impl How {
    pub fn as_str(self) -> &'static str {
        match self {
            How::Link => "link",
            How::Reply => "reply",
            How::Postage => "postage",
        }
    }
}

/// What `secretary_confirm` answered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Confirmation {
    /// There is a challenge of that token.
    pub found: bool,
    /// This call confirmed it (false: confirmed before, or expired).
    pub changed: bool,
    #[serde(default)]
    pub expired: bool,
    #[serde(default)]
    pub mailbox: Option<String>,
    #[serde(default)]
    pub sender: Option<String>,
    /// How it was confirmed (this call's or the earlier one's).
    #[serde(default)]
    pub confirmed_by: Option<String>,
    /// How many held messages this call released.
    #[serde(default)]
    pub released: i64,
}

/// Confirms the challenge of the token whose digest is `token_digest`.
pub async fn confirm(
    pool: &PgPool,
    token_digest: &[u8],
    how: How,
) -> Result<Confirmation, sqlx::Error> {
    let v: serde_json::Value = sqlx::query_scalar("SELECT pepsi.secretary_confirm($1, $2)")
        .bind(token_digest)
        .bind(how.as_str())
        .fetch_one(pool)
        .await?;
    serde_json::from_value(v).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// The owner's decision on a held message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Release,
    Discard,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Release => "released",
            Decision::Discard => "discarded",
        }
    }
}

/// What `secretary_decide` answered.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Decided {
    /// This call decided it (false: it was decided before, `status` says how).
    pub changed: bool,
    pub held_id: i64,
    pub status: String,
    pub mailbox: String,
    pub sender: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// No such held message (for that mailbox, where one was named).
    #[error("no held message {0} for this mailbox")]
    NotFound(i64),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Decides held message `held_id`; `mailbox`, when given, must be its mailbox. `by` says
/// who decided (`owner:<login>`, or an operator's role).
pub async fn decide(
    pool: &PgPool,
    held_id: i64,
    mailbox: Option<&str>,
    decision: Decision,
    by: &str,
) -> Result<Decided, DecideError> {
    let v: serde_json::Value =
        match sqlx::query_scalar("SELECT pepsi.secretary_decide($1, $2, $3, $4)")
            .bind(held_id)
            .bind(mailbox)
            .bind(decision.as_str())
            .bind(by)
            .fetch_one(pool)
            .await
        {
            Ok(v) => v,
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("P0002") => {
                return Err(DecideError::NotFound(held_id));
            }
            Err(e) => return Err(e.into()),
        };
    serde_json::from_value(v).map_err(|e| DecideError::Database(sqlx::Error::Decode(Box::new(e))))
}

/// The mailbox whose owner's page `token` opens, while its link is good.
pub async fn owner_of(pool: &PgPool, token: &Token) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT mailbox FROM pepsi.secretary_owner_link \
         WHERE token_hash = $1 AND expires_at > now()",
    )
    .bind(token.digest())
    .fetch_optional(pool)
    .await
}

/// The owner's page's path for `token` (`{PREFIX}/held/{token}`).
pub fn owner_path(token: &Token) -> String {
    format!("{}/held/{}", crate::token::PREFIX, token.as_str())
}
