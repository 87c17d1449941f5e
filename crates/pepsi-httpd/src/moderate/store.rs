//! The SQL of moderation on the web that pepsi-list does not have: who moderates a list,
//! the emailed links (`pepsi.list_member_link` rows with `list_id` set), the subscriptions
//! waiting for a moderator (`list_pending`, `waiting_for = 'approve'`) and their approval
//! or rejection, and the start of each held post for its excerpt. Held posts, bans and
//! options are changed by `pepsi_list::store`, as the terminal tool changes them.
//!
//! Every change is one transaction with its `list_event_log` rows (the moderator as actor)
//! and its `event_log` row; statements are constants with bound parameters.

use chrono::{DateTime, Utc};
use pepsi_conf::cli::ToolFailure;
use pepsi_contract::audit;
use pepsi_list::store::Who;
use serde::Serialize;
use serde_json::json;
use sqlx::{PgPool, Row as _};

use super::mail::{self, Route};
use crate::error::{ApiError, ApiResult};

/// How long an emailed moderator's link works.
pub const LINK_LIFETIME_SECS: i64 = 3600;
/// The most links one address may be sent for one list within `LINK_LIFETIME_SECS`.
pub const LINKS_PER_ADDRESS: i64 = 3;
/// The most held posts and pending requests a page or an answer shows.
pub const MAX_ROWS: i64 = 200;
/// The bytes of a held post read for its excerpt.
const EXCERPT_BYTES: i32 = 16 * 1024;

/// A refusal of `pepsi_list::store` as the API answers it: input that is not valid is 400;
/// its own refusals are 404 (no such list or held post) or 409 (the rest: exists already,
/// sent on before); a database error is 500.
pub fn refused(e: ToolFailure) -> ApiError {
    match e {
        ToolFailure::Invalid(m) => ApiError::bad_request(m),
        ToolFailure::Other(e) if e.downcast_ref::<sqlx::Error>().is_some() => {
            ApiError::internal(format!("{e:#}"))
        }
        ToolFailure::Other(e) => {
            let text = format!("{e:#}");
            if text.starts_with("there is no list") || text.starts_with("no held post") {
                ApiError::not_found(text)
            } else {
                ApiError::conflict(text)
            }
        }
    }
}

/// A list's id and address, or 404 naming it.
pub async fn list_id(pool: &PgPool, list: &str) -> ApiResult<i64> {
    sqlx::query_scalar("SELECT list_id FROM pepsi.mailing_list WHERE address = $1")
        .bind(list)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("there is no list {list}")))
}

/// The roles of `address` on list `list_id` that run it: (owner, moderator).
pub async fn runs(pool: &PgPool, list_id: i64, address: &str) -> ApiResult<(bool, bool)> {
    let roles: Vec<String> = sqlx::query_scalar(
        "SELECT role FROM pepsi.list_member WHERE list_id = $1 AND address = $2 \
         AND role IN ('owner', 'moderator')",
    )
    .bind(list_id)
    .bind(address)
    .fetch_all(pool)
    .await?;
    Ok((
        roles.iter().any(|r| r == "owner"),
        roles.iter().any(|r| r == "moderator"),
    ))
}

/// Makes a link for `address` to list `list` and queues the mail that carries it, in one
/// transaction; `false` (nothing stored or sent) when the address was sent
/// `LINKS_PER_ADDRESS` links within the last `LINK_LIFETIME_SECS`.
pub async fn send_link(
    pool: &PgPool,
    route: &Route,
    base: &str,
    list: &str,
    list_id: i64,
    address: &str,
) -> ApiResult<bool> {
    let mut tx = pool.begin().await?;
    // One request at a time per list, so that the count below holds.
    sqlx::query("SELECT 1 FROM pepsi.mailing_list WHERE list_id = $1 FOR UPDATE")
        .bind(list_id)
        .execute(&mut *tx)
        .await?;
    let recent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.list_member_link WHERE list_id = $1 AND address = $2 \
         AND created_at > now() - make_interval(secs => $3)",
    )
    .bind(list_id)
    .bind(address)
    .bind(LINK_LIFETIME_SECS as f64)
    .fetch_one(&mut *tx)
    .await?;
    if recent >= LINKS_PER_ADDRESS {
        tx.rollback().await?;
        return Ok(false);
    }
    let token = crate::credentials::new_secret();
    sqlx::query(
        "INSERT INTO pepsi.list_member_link (token_hash, address, list_id, expires_at) \
         VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
    )
    .bind(crate::credentials::digest(&token))
    .bind(address)
    .bind(list_id)
    .bind(LINK_LIFETIME_SECS as f64)
    .execute(&mut *tx)
    .await?;
    let text = format!(
        "Someone, probably you, asked to moderate {list} on the web.\r\n\r\n\
         Open this link within an hour to see the posts and subscriptions waiting for a \
         moderator:\r\n\r\n{base}/moderate/link/{token}\r\n\r\n\
         If you did not ask, ignore this message: nothing changes.\r\n"
    );
    let raw = mail::compose(
        route,
        list,
        address,
        &format!("Moderate {list}"),
        &text,
        None,
    )
    .map_err(ApiError::internal)?;
    mail::queue(&mut tx, route, list, address, &raw).await?;
    sqlx::query(
        "INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         VALUES ($1, $2, 'moderator.link', $3, $2)",
    )
    .bind(list_id)
    .bind(address)
    .bind(json!({"list": list, "via": "web"}))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    wake(pool).await;
    Ok(true)
}

/// The dispatcher woken for rows just committed (a lost wake-up only waits for its poll).
pub async fn wake(pool: &PgPool) {
    if let Err(e) = pepsi_contract::db::notify_workqueue(pool).await {
        tracing::warn!(error = %e, "could not wake the dispatcher");
    }
}

/// What a link opens: the list, and the address it was sent to.
#[derive(Debug, Clone)]
pub struct Link {
    pub list: String,
    pub list_id: i64,
    pub address: String,
}

/// The unexpired moderator's link of `token`, if any.
pub async fn link(pool: &PgPool, token: &str) -> ApiResult<Option<Link>> {
    if !crate::credentials::is_secret(token) {
        return Ok(None);
    }
    let row = sqlx::query(
        "SELECT l.address AS list, k.list_id, k.address FROM pepsi.list_member_link k \
           JOIN pepsi.mailing_list l USING (list_id) \
          WHERE k.token_hash = $1 AND k.expires_at > now()",
    )
    .bind(crate::credentials::digest(token))
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        Some(r) => Some(Link {
            list: r.try_get("list")?,
            list_id: r.try_get("list_id")?,
            address: r.try_get("address")?,
        }),
        None => None,
    })
}

/// A request in `list_pending`.
#[derive(Debug, Clone, Serialize)]
pub struct Pending {
    pub id: i64,
    pub address: String,
    pub display_name: String,
    /// `subscribe` or `unsubscribe`.
    pub kind: String,
    /// `confirm` (the person has not answered yet) or `approve` (a moderator decides).
    pub waiting_for: String,
    pub requested_via: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// The unexpired requests of list `list_id`, oldest first; only those waiting for a
/// moderator with `approve_only`.
pub async fn pending(pool: &PgPool, list_id: i64, approve_only: bool) -> ApiResult<Vec<Pending>> {
    let rows = sqlx::query(
        "SELECT pending_id, address, display_name, kind, waiting_for, requested_via, \
                created_at, expires_at \
           FROM pepsi.list_pending \
          WHERE list_id = $1 AND expires_at > now() AND (NOT $2 OR waiting_for = 'approve') \
          ORDER BY created_at, pending_id LIMIT $3",
    )
    .bind(list_id)
    .bind(approve_only)
    .bind(MAX_ROWS)
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        out.push(Pending {
            id: r.try_get("pending_id")?,
            address: r.try_get("address")?,
            display_name: r.try_get("display_name")?,
            kind: r.try_get("kind")?,
            waiting_for: r.try_get("waiting_for")?,
            requested_via: r.try_get("requested_via")?,
            created_at: r.try_get("created_at")?,
            expires_at: r.try_get("expires_at")?,
        });
    }
    Ok(out)
}

/// What a moderator decides about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Approve,
    Reject,
}

impl Decision {
    pub fn parse(text: &str) -> Option<Decision> {
        match text {
            "approve" => Some(Decision::Approve),
            "reject" => Some(Decision::Reject),
            _ => None,
        }
    }
    fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Reject => "reject",
        }
    }
}

/// What deciding a request did.
#[derive(Debug, Clone, Serialize)]
pub struct Decided {
    pub list: String,
    pub id: i64,
    pub address: String,
    pub kind: String,
    pub action: Decision,
    pub reason: String,
    /// The welcome queued to the new member (an approved subscription), or the notice to
    /// the person whose subscription was rejected.
    pub queue_id: Option<i64>,
}

/// What a person whose subscription a moderator decided is told: (subject, text). A
/// rejection gives the moderator's reason when there is one.
pub fn subscription_outcome(list: &str, decision: Decision, reason: &str) -> (String, String) {
    match decision {
        Decision::Approve => (
            format!("Welcome to {list}"),
            format!(
                "Welcome to {list}: a moderator approved your subscription.\r\n\r\n\
                 To post, write to {list}.\r\nTo leave, write to {}.\r\n",
                mail::command_address(list, "-leave")
            ),
        ),
        Decision::Reject => {
            let mut text = format!("A moderator of {list} did not approve your subscription.\r\n");
            let reason = pepsi_conf::text::one_line(reason);
            if !reason.is_empty() {
                text.push_str(&format!("\r\nThe reason given: {reason}\r\n"));
            }
            (format!("Your subscription to {list}"), text)
        }
    }
}

/// Approves or rejects request `id` of `list`, which must wait for a moderator: approved, a
/// subscription makes the member (`subscribed_via` as requested) and queues a welcome
/// (when `route` is known); rejected, the request is dropped and a subscriber told so
/// (when `route` is known). Either way one
/// `list_moderation_decision` row (`subject_kind = subscription`), one
/// `subscription.approve` or `subscription.reject` event and one `list.subscription_approve`
/// or `list.subscription_reject` audit row, in one transaction.
pub async fn decide_pending(
    pool: &PgPool,
    who: &Who,
    route: Option<&Route>,
    list: &str,
    id: i64,
    decision: Decision,
    reason: &str,
) -> ApiResult<Decided> {
    let mut tx = pool.begin().await?;
    let list_id: i64 =
        sqlx::query_scalar("SELECT list_id FROM pepsi.mailing_list WHERE address = $1 FOR UPDATE")
            .bind(list)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("there is no list {list}")))?;
    let row = sqlx::query(
        "DELETE FROM pepsi.list_pending WHERE pending_id = $1 AND list_id = $2 \
         AND waiting_for = 'approve' AND expires_at > now() \
         RETURNING address, display_name, kind, requested_via",
    )
    .bind(id)
    .bind(list_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| {
        ApiError::not_found(format!(
            "no request {id} of {list} waits for a moderator (decided already, expired, \
             still waiting for its confirmation, or never made)"
        ))
    })?;
    let address: String = row.try_get("address")?;
    let display_name: String = row.try_get("display_name")?;
    let kind: String = row.try_get("kind")?;
    let via: String = row.try_get("requested_via")?;
    let mut queue_id = None;
    if kind == "subscribe"
        && let Some(route) = route
    {
        // The person confirmed the address, so telling them is no backscatter.
        let (subject, text) = subscription_outcome(list, decision, reason);
        let raw = mail::compose(route, list, &address, &subject, &text, None)
            .map_err(ApiError::internal)?;
        queue_id = Some(mail::queue(&mut tx, route, list, &address, &raw).await?);
    }
    if decision == Decision::Approve {
        if kind == "subscribe" {
            pepsi_contract::list::add_member(&mut tx, list_id, &address, &display_name, &via)
                .await?;
        } else {
            sqlx::query(
                "DELETE FROM pepsi.list_member WHERE list_id = $1 AND address = $2 \
                 AND role = 'member'",
            )
            .bind(list_id)
            .bind(&address)
            .execute(&mut *tx)
            .await?;
        }
    }
    let action = decision.as_str();
    sqlx::query(
        "INSERT INTO pepsi.list_moderation_decision \
         (list_id, subject_kind, sender, action, moderator, reason) \
         VALUES ($1, 'subscription', $2, $3, $4, $5)",
    )
    .bind(list_id)
    .bind(&address)
    .bind(action)
    .bind(&who.name)
    .bind(reason)
    .execute(&mut *tx)
    .await?;
    let detail = json!({
        "list": list,
        "pending_id": id,
        "kind": kind,
        "via": via,
        "reason": reason,
        "queue_id": queue_id,
    });
    sqlx::query(
        "INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(list_id)
    .bind(&address)
    .bind(format!("subscription.{action}"))
    .bind(&detail)
    .bind(&who.name)
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        &who.actor,
        &format!("list.subscription_{action}"),
        None,
        detail,
    )
    .await?;
    tx.commit().await?;
    if queue_id.is_some() {
        wake(pool).await;
    }
    Ok(Decided {
        list: list.to_owned(),
        id,
        address,
        kind,
        action: decision,
        reason: reason.to_owned(),
        queue_id,
    })
}

/// The first `EXCERPT_BYTES` of each held post of list `list_id`: (held id, header block
/// and the start of the body).
pub async fn held_starts(pool: &PgPool, list_id: i64) -> ApiResult<Vec<(i64, Vec<u8>)>> {
    let rows: Vec<(i64, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT held_id, headers, substring(body FROM 1 FOR $2) FROM pepsi.list_held_message \
          WHERE list_id = $1 ORDER BY held_at, held_id LIMIT $3",
    )
    .bind(list_id)
    .bind(EXCERPT_BYTES)
    .bind(MAX_ROWS)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, headers, body)| (id, pepsi_smtp::message::join(&headers, &body)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn a_store_refusal_gets_its_status() {
        let cases: [(ToolFailure, StatusCode); 5] = [
            (ToolFailure::Invalid("bad".into()), StatusCode::BAD_REQUEST),
            (
                ToolFailure::Other(anyhow::anyhow!("there is no list a@b (`pepsi-list lists`)")),
                StatusCode::NOT_FOUND,
            ),
            (
                ToolFailure::Other(anyhow::anyhow!("no held post 4 on a@b: nothing done")),
                StatusCode::NOT_FOUND,
            ),
            (
                ToolFailure::Other(anyhow::anyhow!("list a@b exists already")),
                StatusCode::CONFLICT,
            ),
            (
                ToolFailure::Other(sqlx::Error::PoolTimedOut.into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (e, want) in cases {
            let text = format!("{e:?}");
            assert_eq!(refused(e).status, want, "{text}");
        }
    }
}
