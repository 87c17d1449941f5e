//! The secretary's held mail and auto-pay's payments (docs/api.md, "The secretary"): the
//! listings `pepsi-whitelist held` and `payments` give, and an operator's release or
//! discard of one held message, through `pepsi_secretary::store` (the decision is
//! `pepsi.secretary_decide`, which wakes the message's own queue row and no other). A
//! decision that changed something is recorded in `event_log` (`secretary.released`,
//! `secretary.discarded`) with the administrator as actor, as the tool records the owner's;
//! the held row's `decided_by` is `admin:<name>`, told apart from `owner:<login>` and the
//! sender's `link`, `reply` and `postage`.
//!
//! Status codes: 400 for input that is not valid (the message names it), 404 for a held
//! message that is not there, 409 for one decided already.

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use pepsi_contract::audit;
use pepsi_secretary::store::{self, DecideError, Decided, Decision, Held, MAX_LISTED, Payment};
use serde::Serialize;

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Pairs, Principal};

/// The `limit` of a listing that names none.
const DEFAULT_LIMIT: i64 = 100;
/// The longest login `?login=` takes.
const MAX_LOGIN: usize = 320;

/// The routes of the secretary's API.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/secretary/held", get(held))
        .route("/api/secretary/held/{id}/{action}", post(decide))
        .route("/api/auto-pay/payments", get(payments))
}

/// `GET /api/secretary/held`'s answer.
#[derive(Debug, Serialize)]
pub struct HeldListing {
    pub held: Vec<Held>,
    pub limit: i64,
}

/// `GET /api/auto-pay/payments`' answer.
#[derive(Debug, Serialize)]
pub struct PaymentListing {
    pub payments: Vec<Payment>,
    pub limit: i64,
}

fn unknown(name: &str, known: &str) -> String {
    format!("unknown parameter {name:?}: this route takes {known}")
}

fn limit(value: &str) -> Result<i64, String> {
    value
        .parse::<i64>()
        .ok()
        .filter(|n| (1..=MAX_LISTED).contains(n))
        .ok_or_else(|| format!("limit {value:?} is not a whole number from 1 to {MAX_LISTED}"))
}

/// `?mailbox=&all=&limit=`: the mailbox (every one's without), whether decided messages
/// count too, and the limit.
pub fn held_query(pairs: &[(String, String)]) -> Result<(Option<String>, bool, i64), String> {
    let (mut mailbox, mut all, mut lim) = (None, false, DEFAULT_LIMIT);
    for (k, v) in pairs {
        match k.as_str() {
            "mailbox" => {
                mailbox =
                    Some(pepsi_admin::admin::address(v, "mailbox").map_err(|e| e.to_string())?);
            }
            "all" => {
                all = match v.as_str() {
                    "true" | "yes" | "1" => true,
                    "false" | "no" | "0" => false,
                    other => return Err(format!("all {other:?} is not true or false")),
                };
            }
            "limit" => lim = limit(v)?,
            other => return Err(unknown(other, "mailbox, all and limit")),
        }
    }
    Ok((mailbox, all, lim))
}

/// `?login=&limit=`: the login (everyone's without) and the limit.
pub fn payments_query(pairs: &[(String, String)]) -> Result<(Option<String>, i64), String> {
    let (mut login, mut lim) = (None, DEFAULT_LIMIT);
    for (k, v) in pairs {
        match k.as_str() {
            "login" => {
                let t = v.trim();
                if t.is_empty()
                    || t.len() > MAX_LOGIN
                    || t.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return Err(format!(
                        "login {v:?} is not a login: 1 to {MAX_LOGIN} bytes, no spaces or \
                         control characters"
                    ));
                }
                login = Some(t.to_owned());
            }
            "limit" => lim = limit(v)?,
            other => return Err(unknown(other, "login and limit")),
        }
    }
    Ok((login, lim))
}

/// A path's held message id and action.
pub fn decision(id: &str, action: &str) -> Result<(i64, Decision), String> {
    let id = id
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0 && !id.starts_with('+'))
        .ok_or_else(|| format!("{id:?} is not a held message's id"))?;
    let d = match action {
        "release" => Decision::Release,
        "discard" => Decision::Discard,
        other => return Err(format!("action {other:?} is not release or discard")),
    };
    Ok((id, d))
}

async fn held(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<HeldListing>> {
    let (mailbox, all, limit) = held_query(&pairs).map_err(ApiError::bad_request)?;
    let held = store::held(&state.pool, mailbox.as_deref(), all, limit).await?;
    Ok(Json(HeldListing { held, limit }))
}

async fn decide(
    State(state): State<AppState>,
    who: Principal,
    Path((id, action)): Path<(String, String)>,
) -> ApiResult<Json<Decided>> {
    let (id, decision) = decision(&id, &action).map_err(ApiError::bad_request)?;
    let by = format!("admin:{}", who.name);
    let d = match store::decide(&state.pool, id, None, decision, &by).await {
        Ok(d) => d,
        Err(DecideError::NotFound(_)) => {
            return Err(ApiError::not_found(format!("no held message {id}")));
        }
        Err(DecideError::Database(e)) => return Err(e.into()),
    };
    if !d.changed {
        return Err(ApiError::conflict(format!(
            "held message {id} is {} already",
            d.status
        )));
    }
    // After the stored function's own commit, as pepsi-whitelist records the owner's: the
    // function takes the pool, and a decision stands whether or not its record is written.
    let mut conn = state.pool.acquire().await?;
    audit::record(
        &mut conn,
        &who.actor(),
        &format!("secretary.{}", decision.as_str()),
        None,
        serde_json::json!({"held_id": id, "mailbox": d.mailbox, "sender": d.sender}),
    )
    .await?;
    Ok(Json(d))
}

async fn payments(
    State(state): State<AppState>,
    _who: Principal,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<PaymentListing>> {
    let (login, limit) = payments_query(&pairs).map_err(ApiError::bad_request)?;
    let payments = store::payments(&state.pool, login.as_deref(), limit).await?;
    Ok(Json(PaymentListing { payments, limit }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &[(&str, &str)]) -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn held_queries_are_checked() {
        assert_eq!(held_query(&[]), Ok((None, false, DEFAULT_LIMIT)));
        assert_eq!(
            held_query(&pairs(&[
                ("mailbox", "Boss@Example.TEST"),
                ("all", "yes"),
                ("limit", "5")
            ])),
            Ok((Some("boss@example.test".into()), true, 5))
        );
        for (q, says) in [
            (vec![("mailbox", "nobody")], "is not an address"),
            (vec![("all", "maybe")], "all \"maybe\" is not true or false"),
            (vec![("limit", "0")], "limit \"0\""),
            (vec![("limit", "1001")], "from 1 to 1000"),
            (vec![("page", "2")], "unknown parameter \"page\""),
        ] {
            let e = held_query(&pairs(&q)).unwrap_err();
            assert!(e.contains(says), "{q:?}: {e}");
        }
    }

    #[test]
    fn payment_queries_are_checked() {
        assert_eq!(
            payments_query(&pairs(&[("login", " boss@example.test ")])),
            Ok((Some("boss@example.test".into()), DEFAULT_LIMIT))
        );
        for (q, says) in [
            (vec![("login", "")], "is not a login"),
            (vec![("login", "a b")], "is not a login"),
            (vec![("mailbox", "x@y.z")], "unknown parameter \"mailbox\""),
        ] {
            let e = payments_query(&pairs(&q)).unwrap_err();
            assert!(e.contains(says), "{q:?}: {e}");
        }
    }

    #[test]
    fn decisions_name_an_id_and_an_action() {
        assert_eq!(decision("7", "release"), Ok((7, Decision::Release)));
        assert_eq!(decision("7", "discard"), Ok((7, Decision::Discard)));
        for (id, action, says) in [
            ("0", "release", "is not a held message's id"),
            ("+7", "release", "is not a held message's id"),
            ("x", "release", "is not a held message's id"),
            ("7", "retry", "action \"retry\" is not release or discard"),
        ] {
            let e = decision(id, action).unwrap_err();
            assert!(e.contains(says), "{id} {action}: {e}");
        }
    }
}
