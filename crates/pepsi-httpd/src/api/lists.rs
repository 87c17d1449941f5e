//! Mailing lists (docs/api.md, "Mailing lists"): the lists, their options, members, held
//! posts, bans and waiting subscriptions, and forgetting a person on every list. Each change
//! is the one `pepsi-list` makes, through its checks (`pepsi_list::names`, `options`,
//! `moderation`) and its SQL (`pepsi_list::store`: one transaction with its
//! `list_event_log` rows and its `event_log` row), with the administrator as actor; members
//! added here are `subscribed_via = api`. Subscriptions waiting for a moderator are
//! `moderate::store`'s, as the moderation pages decide them.
//!
//! Status codes (`moderate::store::refused` maps pepsi-list's refusals): 400 for input
//! that is not valid (the message names it), 404 for a list, member, held post, ban or
//! request that is not there, 409 for a list that exists already or a configuration without
//! the stage a decision needs.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use pepsi_contract::local::LocalRecipients;
use pepsi_list::names::{self, Action, Role};
use pepsi_list::store::{self, Verdict, Who};
use pepsi_list::{moderation, options};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Body, Pairs, Principal};
use crate::moderate;
use crate::moderate::store::refused;

/// The most addresses one request adds.
pub const MAX_ADDRESSES: usize = 1000;

/// The routes of the list API.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/lists", get(lists).post(create))
        .route(
            "/api/lists/bans",
            get(all_bans).post(ban_all).delete(unban_all),
        )
        .route("/api/lists/people/{address}", delete(forget))
        .route(
            "/api/lists/{list}",
            get(show).patch(configure).delete(delete_list),
        )
        .route("/api/lists/{list}/members", get(members).post(add))
        .route("/api/lists/{list}/members/{address}", delete(remove))
        .route("/api/lists/{list}/held", get(held))
        .route("/api/lists/{list}/held/{id}/{action}", post(decide))
        .route("/api/lists/{list}/bans", get(bans).post(ban).delete(unban))
        .route("/api/lists/{list}/pending", get(pending))
        .route(
            "/api/lists/{list}/pending/{id}/{action}",
            post(decide_pending),
        )
}

fn who(p: &Principal) -> Who {
    Who {
        actor: p.actor(),
        name: p.name.clone(),
    }
}

fn list_name(text: &str) -> ApiResult<String> {
    names::named_list(text).map_err(ApiError::bad_request)
}

fn address(text: &str) -> ApiResult<String> {
    names::member_address(text).map_err(ApiError::bad_request)
}

/// `?role=` (default `member`), or every role when `any` and none is given.
fn role(pairs: &[(String, String)], any: bool) -> ApiResult<Option<Role>> {
    for (k, _) in pairs {
        if k != "role" {
            return Err(ApiError::bad_request(format!(
                "unknown parameter {k:?}: this route takes role"
            )));
        }
    }
    match pairs.iter().find(|(k, _)| k == "role") {
        Some((_, v)) => parse_role(v).map(Some),
        None if any => Ok(None),
        None => Ok(Some(Role::Member)),
    }
}

fn parse_role(text: &str) -> ApiResult<Role> {
    <Role as clap::ValueEnum>::from_str(text, false).map_err(|_| {
        ApiError::bad_request(format!(
            "role {text:?}: member, owner, moderator or nonmember"
        ))
    })
}

async fn lists(State(state): State<AppState>, _who: Principal) -> ApiResult<Json<Value>> {
    let rows = store::lists(&state.pool).await.map_err(refused)?;
    Ok(Json(json!({ "lists": rows })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Create {
    address: String,
    #[serde(default)]
    display_name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    subject_prefix: String,
    #[serde(default)]
    owners: Vec<String>,
}

fn text_option(name: &str, value: &str) -> ApiResult<String> {
    let option = options::find(name).expect("a text option of the table");
    match option.kind.parse(value) {
        Ok(options::Value::Text(t)) => Ok(t),
        Ok(_) => Err(ApiError::internal(format!("{name} is not a text option"))),
        Err(expected) => Err(ApiError::bad_request(format!(
            "{name} {value:?} is not valid: {expected}"
        ))),
    }
}

/// The addresses given, checked and each once; 1 to `MAX_ADDRESSES` of them unless `empty_ok`.
fn addresses(texts: &[String], field: &str, empty_ok: bool) -> ApiResult<Vec<String>> {
    if texts.len() > MAX_ADDRESSES || (texts.is_empty() && !empty_ok) {
        return Err(ApiError::bad_request(format!(
            "{field}: give 1 to {MAX_ADDRESSES} addresses"
        )));
    }
    let mut out: Vec<String> = Vec::new();
    for t in texts {
        let a =
            names::member_address(t).map_err(|e| ApiError::bad_request(format!("{field}: {e}")))?;
        if !out.contains(&a) {
            out.push(a);
        }
    }
    Ok(out)
}

async fn create(
    State(state): State<AppState>,
    p: Principal,
    Body(req): Body<Create>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let new = store::NewList {
        address: names::list_address(&req.address)
            .map_err(|e| ApiError::bad_request(format!("address: {e}")))?,
        display_name: text_option("display_name", &req.display_name)?,
        description: text_option("description", &req.description)?,
        subject_prefix: text_option("subject_prefix", &req.subject_prefix)?,
        owners: addresses(&req.owners, "owners", true)?,
    };
    let local = LocalRecipients::from_config(&state.cfg).map_err(ApiError::internal)?;
    let id = store::create(&state.pool, &who(&p), &local, &new)
        .await
        .map_err(refused)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"list": new.address, "list_id": id, "owners": new.owners})),
    ))
}

async fn show(
    State(state): State<AppState>,
    _p: Principal,
    Path(list): Path<String>,
) -> ApiResult<Json<store::ListShown>> {
    let list = list_name(&list)?;
    Ok(Json(
        store::show(&state.pool, &list).await.map_err(refused)?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Configure {
    /// Option name → value, as `pepsi-list configure NAME=VALUE` takes them: text, or a
    /// number or true/false, or null for `none`.
    options: serde_json::Map<String, Value>,
}

/// The `NAME=VALUE` assignments of a `Configure` body.
pub fn assignments(given: &serde_json::Map<String, Value>) -> Result<Vec<String>, String> {
    given
        .iter()
        .map(|(name, v)| {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Bool(true) => "yes".into(),
                Value::Bool(false) => "no".into(),
                Value::Number(n) => n.to_string(),
                Value::Null => "none".into(),
                _ => {
                    return Err(format!(
                        "option {name}: give text, a number, true/false or null"
                    ));
                }
            };
            Ok(format!("{name}={text}"))
        })
        .collect()
}

async fn configure(
    State(state): State<AppState>,
    p: Principal,
    Path(list): Path<String>,
    Body(req): Body<Configure>,
) -> ApiResult<Json<Value>> {
    let list = list_name(&list)?;
    let args = assignments(&req.options).map_err(ApiError::bad_request)?;
    let changes = options::parse_assignments(&args).map_err(ApiError::bad_request)?;
    let changed = store::configure(&state.pool, &who(&p), &list, changes)
        .await
        .map_err(refused)?;
    Ok(Json(json!({"list": list, "changed": changed})))
}

async fn delete_list(
    State(state): State<AppState>,
    p: Principal,
    Path(list): Path<String>,
) -> ApiResult<Json<Value>> {
    let list = list_name(&list)?;
    let counts = store::delete(&state.pool, &who(&p), &list)
        .await
        .map_err(refused)?;
    Ok(Json(json!({"list": list, "deleted": counts})))
}

async fn members(
    State(state): State<AppState>,
    _p: Principal,
    Path(list): Path<String>,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Value>> {
    let list = list_name(&list)?;
    let role = role(&pairs, true)?;
    let rows = store::members(&state.pool, &list, role)
        .await
        .map_err(refused)?;
    Ok(Json(json!({"list": list, "members": rows})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Add {
    addresses: Vec<String>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    display_name: String,
    /// The rows' own posting rule: accept, hold, reject, discard or defer.
    #[serde(default)]
    action: Option<String>,
}

async fn add(
    State(state): State<AppState>,
    p: Principal,
    Path(list): Path<String>,
    Body(req): Body<Add>,
) -> ApiResult<Json<store::Added>> {
    let list = list_name(&list)?;
    let addrs = addresses(&req.addresses, "addresses", false)?;
    let role = match &req.role {
        Some(r) => parse_role(r)?,
        None => Role::Member,
    };
    let action = match &req.action {
        Some(a) => Some(
            <Action as clap::ValueEnum>::from_str(a, false).map_err(|_| {
                ApiError::bad_request(format!(
                    "action {a:?}: accept, hold, reject, discard or defer"
                ))
            })?,
        ),
        None => None,
    };
    if req.display_name.chars().count() > pepsi_list::members_csv::MAX_NAME_CHARS
        || req.display_name.chars().any(char::is_control)
    {
        return Err(ApiError::bad_request(format!(
            "display_name: text of at most {} characters, on one line",
            pepsi_list::members_csv::MAX_NAME_CHARS
        )));
    }
    let added = store::add_via(
        &state.pool,
        &who(&p),
        &list,
        &addrs,
        role,
        &req.display_name,
        action,
        "api",
    )
    .await
    .map_err(refused)?;
    Ok(Json(added))
}

async fn remove(
    State(state): State<AppState>,
    p: Principal,
    Path((list, addr)): Path<(String, String)>,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<store::Removed>> {
    let list = list_name(&list)?;
    let addr = address(&addr)?;
    let role = role(&pairs, false)?.unwrap_or(Role::Member);
    let removed = store::remove(
        &state.pool,
        &who(&p),
        &list,
        std::slice::from_ref(&addr),
        role,
    )
    .await
    .map_err(refused)?;
    if removed.removed.is_empty() {
        return Err(ApiError::not_found(format!(
            "{addr} is not {} of {list}",
            role.with_article()
        )));
    }
    Ok(Json(removed))
}

async fn held(
    State(state): State<AppState>,
    _p: Principal,
    Path(list): Path<String>,
) -> ApiResult<Json<Value>> {
    let list = list_name(&list)?;
    let rows = store::held(&state.pool, &list).await.map_err(refused)?;
    Ok(Json(json!({"list": list, "held": rows})))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Decide {
    #[serde(default)]
    reason: String,
    /// The list stage, when several stages run pepsi-stage-list.
    #[serde(default)]
    stage: Option<String>,
}

fn list_stage(state: &AppState, given: Option<&str>) -> ApiResult<String> {
    moderation::list_stage(&state.cfg, given).map_err(|e| match e {
        moderation::NoStage::Usage(m) if given.is_some() => ApiError::bad_request(m),
        moderation::NoStage::Usage(m) => {
            ApiError::conflict(m.replace("--stage NAME", "\"stage\": NAME"))
        }
        moderation::NoStage::Missing(m) => ApiError::conflict(m),
    })
}

async fn decide(
    State(state): State<AppState>,
    p: Principal,
    Path((list, id, action)): Path<(String, String, String)>,
    Body(req): Body<Decide>,
) -> ApiResult<Json<store::Decided>> {
    let list = list_name(&list)?;
    let id: i64 = id.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
        ApiError::bad_request(format!("held post id {id:?} is not a number above 0"))
    })?;
    let reason = moderation::reason(&req.reason)
        .map_err(|e| ApiError::bad_request(e.replace("--reason", "reason")))?;
    if !reason.is_empty() && action != "reject" {
        return Err(ApiError::bad_request("only a rejection takes a reason"));
    }
    let verdict = match action.as_str() {
        "approve" => Verdict::Approve {
            stage: list_stage(&state, req.stage.as_deref())?,
        },
        "reject" => {
            let stage = list_stage(&state, req.stage.as_deref())?;
            let bounce_stage =
                moderation::bounce_stage(&state.cfg, &stage).map_err(ApiError::conflict)?;
            Verdict::Reject {
                stage,
                bounce_stage,
                reason,
            }
        }
        "discard" => Verdict::Discard,
        other => {
            return Err(ApiError::not_found(format!(
                "no action {other:?} on a held post: approve, reject or discard"
            )));
        }
    };
    let decided = store::decide(&state.pool, &who(&p), &list, &[id], &verdict)
        .await
        .map_err(refused)?;
    Ok(Json(decided))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BanReq {
    pattern: String,
    #[serde(default)]
    reason: String,
}

async fn ban_in(
    state: &AppState,
    p: &Principal,
    list: Option<&str>,
    req: BanReq,
) -> ApiResult<(StatusCode, Json<store::BanChange>)> {
    let pattern = moderation::pattern(&req.pattern).map_err(ApiError::bad_request)?;
    let reason = moderation::reason(&req.reason)
        .map_err(|e| ApiError::bad_request(e.replace("--reason", "reason")))?;
    if let moderation::Pattern::Regex(r) = &pattern {
        store::check_regex(&state.pool, r).await.map_err(refused)?;
    }
    let change = store::ban(&state.pool, &who(p), list, pattern.as_str(), &reason)
        .await
        .map_err(refused)?;
    let status = if change.changed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(change)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnbanReq {
    pattern: String,
}

async fn unban_in(
    state: &AppState,
    p: &Principal,
    list: Option<&str>,
    req: UnbanReq,
) -> ApiResult<Json<store::BanChange>> {
    let pattern = moderation::pattern(&req.pattern).map_err(ApiError::bad_request)?;
    let change = store::unban(&state.pool, &who(p), list, pattern.as_str())
        .await
        .map_err(refused)?;
    if !change.changed {
        return Err(ApiError::not_found(format!(
            "no ban of {} on {}",
            pattern.as_str(),
            list.unwrap_or("every list")
        )));
    }
    Ok(Json(change))
}

async fn bans(
    State(state): State<AppState>,
    _p: Principal,
    Path(list): Path<String>,
) -> ApiResult<Json<Value>> {
    let list = list_name(&list)?;
    let rows = store::bans(&state.pool, Some(&list))
        .await
        .map_err(refused)?;
    Ok(Json(json!({"list": list, "bans": rows})))
}

async fn ban(
    State(state): State<AppState>,
    p: Principal,
    Path(list): Path<String>,
    Body(req): Body<BanReq>,
) -> ApiResult<(StatusCode, Json<store::BanChange>)> {
    let list = list_name(&list)?;
    ban_in(&state, &p, Some(&list), req).await
}

async fn unban(
    State(state): State<AppState>,
    p: Principal,
    Path(list): Path<String>,
    Body(req): Body<UnbanReq>,
) -> ApiResult<Json<store::BanChange>> {
    let list = list_name(&list)?;
    unban_in(&state, &p, Some(&list), req).await
}

async fn all_bans(State(state): State<AppState>, _p: Principal) -> ApiResult<Json<Value>> {
    let rows = store::bans(&state.pool, None).await.map_err(refused)?;
    Ok(Json(json!({"list": null, "bans": rows})))
}

async fn ban_all(
    State(state): State<AppState>,
    p: Principal,
    Body(req): Body<BanReq>,
) -> ApiResult<(StatusCode, Json<store::BanChange>)> {
    ban_in(&state, &p, None, req).await
}

async fn unban_all(
    State(state): State<AppState>,
    p: Principal,
    Body(req): Body<UnbanReq>,
) -> ApiResult<Json<store::BanChange>> {
    unban_in(&state, &p, None, req).await
}

async fn pending(
    State(state): State<AppState>,
    _p: Principal,
    Path(list): Path<String>,
) -> ApiResult<Json<Value>> {
    let list = list_name(&list)?;
    let id = moderate::store::list_id(&state.pool, &list).await?;
    let rows = moderate::store::pending(&state.pool, id, false).await?;
    Ok(Json(json!({"list": list, "pending": rows})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideRequest {
    #[serde(default)]
    reason: String,
}

async fn decide_pending(
    State(state): State<AppState>,
    p: Principal,
    Path((list, id, action)): Path<(String, String, String)>,
    Body(req): Body<DecideRequest>,
) -> ApiResult<Json<moderate::store::Decided>> {
    let list = list_name(&list)?;
    let id: i64 = id.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
        ApiError::bad_request(format!("request id {id:?} is not a number above 0"))
    })?;
    let decision = moderate::store::Decision::parse(&action).ok_or_else(|| {
        ApiError::not_found(format!(
            "no action {action:?} on a request: approve or reject"
        ))
    })?;
    let reason = moderation::reason(&req.reason)
        .map_err(|e| ApiError::bad_request(e.replace("--reason", "reason")))?;
    if !reason.is_empty() && decision == moderate::store::Decision::Approve {
        return Err(ApiError::bad_request("only a rejection takes a reason"));
    }
    let route = match decision {
        moderate::store::Decision::Approve => moderate::mail::Route::from_config(&state.cfg)
            .map(Some)
            .map_err(ApiError::conflict)?,
        // Without a list stage the rejection is still made; only its notice is not sent.
        moderate::store::Decision::Reject => moderate::mail::Route::from_config(&state.cfg).ok(),
    };
    let decided = moderate::store::decide_pending(
        &state.pool,
        &who(&p),
        route.as_ref(),
        &list,
        id,
        decision,
        &reason,
    )
    .await?;
    Ok(Json(decided))
}

async fn forget(
    State(state): State<AppState>,
    p: Principal,
    Path(addr): Path<String>,
) -> ApiResult<Json<store::Forgotten>> {
    let addr = address(&addr)?;
    let gone = store::forget(&state.pool, &who(&p), &addr)
        .await
        .map_err(refused)?;
    Ok(Json(gone))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configure_body_reads_as_assignments() {
        let cases: [(&str, Result<&[&str], &str>); 5] = [
            (r#"{"emergency": true}"#, Ok(&["emergency=yes"])),
            (r#"{"emergency": false}"#, Ok(&["emergency=no"])),
            (r#"{"fanout_batch": 50}"#, Ok(&["fanout_batch=50"])),
            (
                r#"{"reply_to_address": null, "held_lifetime": "7d"}"#,
                Ok(&["held_lifetime=7d", "reply_to_address=none"]),
            ),
            (r#"{"emergency": [1]}"#, Err("option emergency")),
        ];
        for (body, want) in cases {
            let map: serde_json::Map<String, Value> = serde_json::from_str(body).unwrap();
            match (assignments(&map), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, w, "{body}"),
                (Err(e), Err(part)) => assert!(e.contains(part), "{body}: {e}"),
                (got, want) => panic!("{body}: {got:?}, wanted {want:?}"),
            }
        }
    }
}
