//! What the operator tool, the admin API and the sender's page show of a link: one summary
//! type ([`Link`]), read with bound values only.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Row as _};

use crate::store::{Error, Refusal};

/// Where a link stands, the most final first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    Purged,
    Revoked,
    Expired,
    Active,
}

impl LinkState {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Purged => "purged",
            LinkState::Revoked => "revoked",
            LinkState::Expired => "expired",
            LinkState::Active => "active",
        }
    }
}

/// One link, without anything secret (no sealed bytes, no digest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Link {
    pub link_id: String,
    pub sender: String,
    pub recipient: String,
    pub created: DateTime<Utc>,
    pub expires: DateTime<Utc>,
    pub generation: i32,
    pub state: LinkState,
    pub revoked_by: Option<String>,
    /// The message's size in bytes.
    pub size: i64,
    /// The latest line of its access log.
    pub last_access: Option<DateTime<Utc>>,
}

/// The columns [`Link::from_row`] reads, from `pepsi.secure_link_message m`.
pub(crate) const COLUMNS: &str = "m.link_id, m.sender, m.recipient, m.created_at, m.expires_at, \
     m.generation, m.revoked_by, m.size, \
     CASE WHEN m.purged_at IS NOT NULL THEN 'purged' WHEN m.revoked_at IS NOT NULL THEN 'revoked' \
          WHEN m.expires_at <= now() THEN 'expired' ELSE 'active' END AS state, \
     (SELECT max(a.at) FROM pepsi.secure_link_access a WHERE a.message_id = m.message_id) \
         AS last_access";

impl Link {
    pub(crate) fn from_row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Link> {
        let state: String = r.try_get("state")?;
        Ok(Link {
            link_id: r.try_get("link_id")?,
            sender: r.try_get("sender")?,
            recipient: r.try_get("recipient")?,
            created: r.try_get("created_at")?,
            expires: r.try_get("expires_at")?,
            generation: r.try_get("generation")?,
            state: match state.as_str() {
                "purged" => LinkState::Purged,
                "revoked" => LinkState::Revoked,
                "expired" => LinkState::Expired,
                _ => LinkState::Active,
            },
            revoked_by: r.try_get("revoked_by")?,
            size: r.try_get("size")?,
            last_access: r.try_get("last_access")?,
        })
    }
}

/// The link `link_id`, or [`Refusal::Unknown`].
pub async fn get(pool: &PgPool, link_id: &str) -> Result<Link, Error> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM pepsi.secure_link_message m WHERE m.link_id = $1"
    ))
    .bind(link_id)
    .fetch_optional(pool)
    .await?
    .ok_or(Refusal::Unknown)?;
    Ok(Link::from_row(&row)?)
}
