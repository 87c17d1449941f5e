//! The SQL of the subscriber pages: the lists shown, a web subscription (its limits, its
//! pending row and its confirmation mail), a confirmation carried out, a one-click
//! unsubscribe, the member links and a member's preferences. What the list stage does
//! too is `pepsi_contract::list`'s (the limits' windows, bans, carrying out a request), so
//! both count and change alike.
//!
//! Every change is one transaction with its `list_event_log` row; queued mail is committed
//! with it, and the dispatcher woken after.

use pepsi_contract::list::{self, RateKey, Via};
use serde_json::json;
use sqlx::{PgPool, Row as _};

use super::Web;
use super::mail;
use crate::error::{ApiError, ApiResult};
use crate::moderate::mail::command_address;
use crate::moderate::store::wake;

/// The most lists `/lists` shows.
pub const MAX_LISTS: i64 = 500;
/// How long an emailed member's link works.
pub const MEMBER_LINK_SECS: f64 = 86_400.0;

/// A list as its pages show it.
#[derive(Debug, Clone)]
pub struct ListInfo {
    pub id: i64,
    pub address: String,
    pub display_name: String,
    pub description: String,
    pub policy: String,
}

fn info(r: &sqlx::postgres::PgRow) -> sqlx::Result<ListInfo> {
    Ok(ListInfo {
        id: r.try_get("list_id")?,
        address: r.try_get("address")?,
        display_name: r.try_get("display_name")?,
        description: r.try_get("description")?,
        policy: r.try_get("subscription_policy")?,
    })
}

/// The columns of [`ListInfo`], as a literal for `concat!`.
macro_rules! info_sql {
    () => {
        "SELECT list_id, address, display_name, description, subscription_policy \
         FROM pepsi.mailing_list"
    };
}

/// The advertised lists, by address.
pub async fn advertised(pool: &PgPool) -> ApiResult<Vec<ListInfo>> {
    let rows = sqlx::query(concat!(
        info_sql!(),
        " WHERE advertised ORDER BY address LIMIT $1"
    ))
    .bind(MAX_LISTS)
    .fetch_all(pool)
    .await?;
    Ok(rows.iter().map(info).collect::<sqlx::Result<_>>()?)
}

/// The list of address `list` (as stored), or 404 naming it.
pub async fn list(pool: &PgPool, list: &str) -> ApiResult<ListInfo> {
    let row = sqlx::query(concat!(info_sql!(), " WHERE address = $1"))
        .bind(list)
        .fetch_optional(pool)
        .await?;
    match row {
        Some(r) => Ok(info(&r)?),
        None => Err(ApiError::not_found(format!("there is no list {list}"))),
    }
}

/// What became of a request made on a page; the page answers the same for all but
/// `Closed`, so nobody learns who is a member or banned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// The confirmation (or the link) is queued.
    Sent,
    /// Nothing sent: a limit, a member already, a ban, no member (for a link).
    Quiet,
    /// The list takes no subscriptions.
    Closed,
}

/// Counts a request of `client` for `address` against both of the list's limits; true
/// when both allow it. Both are counted even when the first refuses, so a flood from one
/// client is stopped however it spreads over addresses.
async fn within_limits(
    tx: &mut sqlx::PgConnection,
    list_id: i64,
    address: &str,
    client: &str,
) -> sqlx::Result<bool> {
    let by_address = list::count_confirmation(tx, list_id, RateKey::Address, address).await?;
    let by_client = list::count_confirmation(tx, list_id, RateKey::Client, client).await?;
    Ok(by_address && by_client)
}

fn fresh_token() -> ApiResult<String> {
    list::new_token().map_err(|e| ApiError::internal(format!("no random bytes: {e}")))
}

/// A subscription asked on the web: counted against the limits; when the list takes it
/// and the address is neither a member, banned, nor one of the list's own addresses, a `list_pending` row (`requested_via`
/// web, `client`) and its confirmation mail, in one transaction.
pub async fn subscribe(
    pool: &PgPool,
    web: &Web,
    l: &ListInfo,
    address: &str,
    display_name: &str,
    client: &str,
) -> ApiResult<Asked> {
    if l.policy == "closed" {
        return Ok(Asked::Closed);
    }
    let route = web.route()?;
    let mut tx = pool.begin().await?;
    if !within_limits(&mut tx, l.id, address, client).await? {
        tx.commit().await?;
        tracing::warn!(list = %l.address, %address, %client, "confirmation limit reached: none sent");
        return Ok(Asked::Quiet);
    }
    let member = list::is_member(&mut *tx, l.id, address).await?;
    // An address of the list itself (`team-request@`, ...) would answer the list's own
    // mail: the stage ignores commands from it, and so do the pages.
    let own = list::ListAddress::candidates(address)
        .iter()
        .any(|c| c.list == l.address);
    if member || own || list::banned(&mut tx, l.id, address).await? {
        tx.commit().await?;
        return Ok(Asked::Quiet);
    }
    let token = fresh_token()?;
    sqlx::query(
        "INSERT INTO pepsi.list_pending (list_id, address, display_name, kind, token_hash, \
         requested_via, client, expires_at) \
         SELECT $1, $2, $3, 'subscribe', $4, 'web', $5, now() + pending_lifetime \
         FROM pepsi.mailing_list WHERE list_id = $1",
    )
    .bind(l.id)
    .bind(address)
    .bind(display_name)
    .bind(list::token_hash(&token))
    .bind(client)
    .execute(&mut *tx)
    .await?;
    let reply_to = command_address(&l.address, &format!("-confirm+{token}"));
    let text = mail::confirmation_text(
        &l.address,
        address,
        &reply_to,
        &command_address(&l.address, "-request"),
        &token,
        web.base.as_deref(),
    );
    let raw = mail::compose(
        route,
        &l.address,
        address,
        &format!("confirm {token}"),
        &text,
        Some(&reply_to),
    )
    .map_err(ApiError::internal)?;
    crate::moderate::mail::queue(&mut tx, route, &l.address, address, &raw).await?;
    tx.commit().await?;
    wake(pool).await;
    Ok(Asked::Sent)
}

/// A request waiting for the confirmation `token`: (list, address, kind).
pub async fn pending(pool: &PgPool, token: &str) -> ApiResult<Option<(String, String, String)>> {
    Ok(sqlx::query_as(
        "SELECT l.address, p.address, p.kind FROM pepsi.list_pending p \
           JOIN pepsi.mailing_list l USING (list_id) \
          WHERE p.token_hash = $1 AND p.waiting_for = 'confirm' AND p.expires_at > now()",
    )
    .bind(list::token_hash(token))
    .fetch_optional(pool)
    .await?)
}

/// Carries out the request waiting for `token` (`pepsi_contract::list::carry_out`, via
/// web) and mails the person what became of it, in one transaction: (list, what
/// happened), or `None` when no request waits for it.
pub async fn confirm(
    pool: &PgPool,
    web: &Web,
    token: &str,
) -> ApiResult<Option<(String, list::Carried)>> {
    let hash = list::token_hash(token);
    let mut tx = pool.begin().await?;
    let found: Option<(i64, String)> = sqlx::query_as(
        "SELECT l.list_id, l.address FROM pepsi.list_pending p \
           JOIN pepsi.mailing_list l USING (list_id) \
          WHERE p.token_hash = $1 FOR UPDATE OF p",
    )
    .bind(&hash)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((list_id, list_address)) = found else {
        return Ok(None);
    };
    let spare = list::token_hash(&fresh_token()?);
    let Some(carried) = list::carry_out(&mut tx, list_id, &hash, Via::Web, &spare).await? else {
        return Ok(None);
    };
    // The person hears of it as when confirming by mail; without a list stage in the
    // configuration the change still stands, only unannounced.
    if let Ok(route) = web.route() {
        let (subject, text) = mail::outcome_text(&list_address, carried.event);
        let raw = mail::compose(
            route,
            &list_address,
            &carried.address,
            &subject,
            &text,
            None,
        )
        .map_err(ApiError::internal)?;
        crate::moderate::mail::queue(&mut tx, route, &list_address, &carried.address, &raw).await?;
    }
    tx.commit().await?;
    wake(pool).await;
    tracing::info!(list = %list_address, who = %carried.address, event = carried.event, "list request confirmed on the web");
    Ok(Some((list_address, carried)))
}

/// What a one-click token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OneClick {
    /// A member: (member row, list, address).
    Member(i64, String, String),
    /// A member who has left by this token before: the list.
    Gone(String),
    Unknown,
}

/// The member (or the former member) of one-click token `token`.
pub async fn one_click(pool: &PgPool, token: &str) -> ApiResult<OneClick> {
    let hash = list::token_hash(token);
    let row: Option<(i64, String, String)> = sqlx::query_as(
        "SELECT m.member_id, l.address, m.address FROM pepsi.list_unsubscribe_token t \
           JOIN pepsi.list_member m USING (member_id) \
           JOIN pepsi.mailing_list l ON l.list_id = m.list_id \
          WHERE t.token_hash = $1 AND m.role = 'member'",
    )
    .bind(&hash)
    .fetch_optional(pool)
    .await?;
    if let Some((id, l, a)) = row {
        return Ok(OneClick::Member(id, l, a));
    }
    let gone: Option<String> = sqlx::query_scalar(
        "SELECT detail->>'list' FROM pepsi.list_event_log \
          WHERE event = 'member.unsubscribe' AND detail ? 'token_hash' \
            AND detail->>'token_hash' = $1 LIMIT 1",
    )
    .bind(crate::credentials::hex(&hash))
    .fetch_optional(pool)
    .await?;
    Ok(gone.map_or(OneClick::Unknown, OneClick::Gone))
}

/// Queues the goodbye (`mail::goodbye_text`) to `address`, who has just left `list` on the
/// web, in the transaction of the removal, so it goes once per removal. Without a list
/// stage in the configuration the removal still stands, only unannounced (as in
/// [`confirm`]).
async fn goodbye(
    tx: &mut sqlx::PgConnection,
    web: &Web,
    list: &str,
    address: &str,
) -> ApiResult<()> {
    let Ok(route) = web.route() else {
        return Ok(());
    };
    let (subject, text) = mail::goodbye_text(list, web.base.as_deref());
    let raw =
        mail::compose(route, list, address, &subject, &text, None).map_err(ApiError::internal)?;
    crate::moderate::mail::queue(tx, route, list, address, &raw).await?;
    Ok(())
}

/// Unsubscribes by one-click token: the member row deleted (its token and preferences
/// with it), `member.unsubscribe` logged with `via` one-click and the token's hash, so
/// that the same link posted again is known, and the goodbye queued. Returns the list, or
/// `None` for an unknown token. Idempotent: a token used before answers its list again
/// and sends nothing.
pub async fn unsubscribe_one_click(
    pool: &PgPool,
    web: &Web,
    token: &str,
) -> ApiResult<Option<String>> {
    let mut tx = pool.begin().await?;
    let hash = list::token_hash(token);
    let row: Option<(i64, String, String)> = sqlx::query_as(
        "DELETE FROM pepsi.list_member m USING pepsi.list_unsubscribe_token t, \
                pepsi.mailing_list l \
          WHERE t.token_hash = $1 AND m.member_id = t.member_id AND m.role = 'member' \
            AND l.list_id = m.list_id \
         RETURNING m.list_id, l.address, m.address",
    )
    .bind(&hash)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((list_id, list_address, address)) = row else {
        tx.rollback().await?;
        return Ok(match one_click(pool, token).await? {
            OneClick::Gone(l) => Some(l),
            _ => None,
        });
    };
    sqlx::query(
        "INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         VALUES ($1, $2, 'member.unsubscribe', $3, $2)",
    )
    .bind(list_id)
    .bind(&address)
    .bind(json!({
        "via": "one-click",
        "list": list_address,
        "token_hash": crate::credentials::hex(&hash),
    }))
    .execute(&mut *tx)
    .await?;
    goodbye(&mut tx, web, &list_address, &address).await?;
    tx.commit().await?;
    wake(pool).await;
    tracing::info!(list = %list_address, %address, "unsubscribed by one-click link");
    Ok(Some(list_address))
}

/// A member's link asked on list `l`'s page: counted against the list's limits; when
/// `address` is a member of it, a `list_member_link` row for that list (a day of life)
/// and the mail carrying `{base}/lists/member/<token>`, in one transaction.
pub async fn send_member_link(
    pool: &PgPool,
    web: &Web,
    base: &str,
    l: &ListInfo,
    address: &str,
    client: &str,
) -> ApiResult<Asked> {
    let route = web.route()?;
    let mut tx = pool.begin().await?;
    if !within_limits(&mut tx, l.id, address, client).await? {
        tx.commit().await?;
        tracing::warn!(list = %l.address, %address, %client, "member link limit reached: none sent");
        return Ok(Asked::Quiet);
    }
    let member = list::is_member(&mut *tx, l.id, address).await?;
    if !member {
        tx.commit().await?;
        return Ok(Asked::Quiet);
    }
    let token = fresh_token()?;
    sqlx::query(
        "INSERT INTO pepsi.list_member_link (token_hash, address, list_id, expires_at) \
         VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
    )
    .bind(list::token_hash(&token))
    .bind(address)
    .bind(l.id)
    .bind(MEMBER_LINK_SECS)
    .execute(&mut *tx)
    .await?;
    let text = format!(
        "Someone, probably you, asked for the page of your subscription to {list}.\r\n\r\n\
         Open this link within a day to change how you receive the list, or to leave it:\r\n\r\n\
         {base}/lists/member/{token}\r\n\r\n\
         If you did not ask, ignore this message: nothing changes.\r\n",
        list = l.address
    );
    let raw = mail::compose(
        route,
        &l.address,
        address,
        &format!("Your subscription to {}", l.address),
        &text,
        None,
    )
    .map_err(ApiError::internal)?;
    crate::moderate::mail::queue(&mut tx, route, &l.address, address, &raw).await?;
    tx.commit().await?;
    wake(pool).await;
    Ok(Asked::Sent)
}

/// The unexpired member link of `token`: (address, list or `None` for every list).
pub async fn member_link(pool: &PgPool, token: &str) -> ApiResult<Option<(String, Option<i64>)>> {
    Ok(sqlx::query_as(
        "SELECT address, list_id FROM pepsi.list_member_link \
          WHERE token_hash = $1 AND expires_at > now()",
    )
    .bind(list::token_hash(token))
    .fetch_optional(pool)
    .await?)
}

/// One subscription as the member page shows it.
#[derive(Debug, Clone)]
pub struct Subscription {
    pub member_id: i64,
    pub list: String,
    pub display_name: String,
    pub digests_enabled: bool,
    pub delivery_mode: String,
    pub receive_own_postings: bool,
    pub hide_address: bool,
}

/// The subscriptions of `address` (on `list_id`, or on every list), by list.
pub async fn subscriptions(
    pool: &PgPool,
    address: &str,
    list_id: Option<i64>,
) -> ApiResult<Vec<Subscription>> {
    let rows = sqlx::query(
        "SELECT m.member_id, l.address, l.display_name, l.digests_enabled, \
                coalesce(p.delivery_mode, 'regular') AS delivery_mode, \
                coalesce(p.receive_own_postings, true) AS receive_own_postings, \
                coalesce(p.hide_address, true) AS hide_address \
           FROM pepsi.list_member m JOIN pepsi.mailing_list l ON l.list_id = m.list_id \
           LEFT JOIN pepsi.list_member_preference p ON p.member_id = m.member_id \
          WHERE m.address = $1 AND m.role = 'member' \
            AND ($2::bigint IS NULL OR m.list_id = $2) \
          ORDER BY l.address LIMIT $3",
    )
    .bind(address)
    .bind(list_id)
    .bind(MAX_LISTS)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Subscription {
                member_id: r.try_get("member_id")?,
                list: r.try_get("address")?,
                display_name: r.try_get("display_name")?,
                digests_enabled: r.try_get("digests_enabled")?,
                delivery_mode: r.try_get("delivery_mode")?,
                receive_own_postings: r.try_get("receive_own_postings")?,
                hide_address: r.try_get("hide_address")?,
            })
        })
        .collect::<sqlx::Result<_>>()
        .map_err(Into::into)
}

/// The member row `member_id` when it is a subscription of `address` within the link's
/// reach (`list_id`, or every list): its list.
async fn owned(
    tx: &mut sqlx::PgConnection,
    member_id: i64,
    address: &str,
    list_id: Option<i64>,
) -> ApiResult<(i64, String, bool)> {
    let row: Option<(i64, String, bool)> = sqlx::query_as(
        "SELECT l.list_id, l.address, l.digests_enabled FROM pepsi.list_member m \
           JOIN pepsi.mailing_list l ON l.list_id = m.list_id \
          WHERE m.member_id = $1 AND m.address = $2 AND m.role = 'member' \
            AND ($3::bigint IS NULL OR m.list_id = $3) FOR UPDATE OF m",
    )
    .bind(member_id)
    .bind(address)
    .bind(list_id)
    .fetch_optional(&mut *tx)
    .await?;
    row.ok_or_else(|| {
        ApiError::not_found(format!(
            "subscription {member_id} is not one of {address}'s (left already?)"
        ))
    })
}

/// Stores a member's choices (`member.preferences` in the event log, with what they are
/// now). Digests are refused on a list that sends none.
pub async fn save_preferences(
    pool: &PgPool,
    address: &str,
    list_id: Option<i64>,
    member_id: i64,
    p: &super::form::Preferences,
) -> ApiResult<String> {
    let mut tx = pool.begin().await?;
    let (list_id, list_address, digests) = owned(&mut tx, member_id, address, list_id).await?;
    if p.delivery_mode != "regular" && !digests {
        return Err(ApiError::bad_request(format!(
            "{list_address} sends no digests: choose regular delivery"
        )));
    }
    // The member's share of an open digest, before the mode changes.
    pepsi_list::mode::switch(&mut tx, member_id, p.delivery_mode).await?;
    sqlx::query(
        "INSERT INTO pepsi.list_member_preference (member_id, delivery_mode, \
         receive_own_postings, hide_address) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (member_id) DO UPDATE SET delivery_mode = EXCLUDED.delivery_mode, \
         receive_own_postings = EXCLUDED.receive_own_postings, \
         hide_address = EXCLUDED.hide_address, updated_at = now()",
    )
    .bind(member_id)
    .bind(p.delivery_mode)
    .bind(p.receive_own_postings)
    .bind(p.hide_address)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         VALUES ($1, $2, 'member.preferences', $3, $2)",
    )
    .bind(list_id)
    .bind(address)
    .bind(json!({
        "via": "member-page",
        "list": list_address,
        "delivery_mode": p.delivery_mode,
        "receive_own_postings": p.receive_own_postings,
        "hide_address": p.hide_address,
    }))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(list_address)
}

/// Removes a member row from the member page (`member.unsubscribe`, via member-page) and
/// queues the goodbye.
pub async fn leave(
    pool: &PgPool,
    web: &Web,
    address: &str,
    list_id: Option<i64>,
    member_id: i64,
) -> ApiResult<String> {
    let mut tx = pool.begin().await?;
    let (list_id, list_address, _) = owned(&mut tx, member_id, address, list_id).await?;
    sqlx::query("DELETE FROM pepsi.list_member WHERE member_id = $1")
        .bind(member_id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         VALUES ($1, $2, 'member.unsubscribe', $3, $2)",
    )
    .bind(list_id)
    .bind(address)
    .bind(json!({"via": "member-page", "list": list_address}))
    .execute(&mut *tx)
    .await?;
    goodbye(&mut tx, web, &list_address, address).await?;
    tx.commit().await?;
    wake(pool).await;
    Ok(list_address)
}
