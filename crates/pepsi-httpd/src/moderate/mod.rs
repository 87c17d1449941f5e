//! Moderating a list on the web, for its owners and moderators, who need no administrator
//! account (docs/lists.md, "Moderating on the web"):
//!
//! - `GET /moderate/{list}` asks for an address; `POST` mails a link to it when it is an
//!   owner or a moderator of the list (`store::send_link`: a `list_member_link` row with
//!   `list_id` set, an hour of life, at most `LINKS_PER_ADDRESS` an hour, and per client
//!   address `ASKS_PER_CLIENT` in ten minutes), and answers the same whatever the address;
//! - `GET /moderate/link/{token}` is the list's page: held posts (sender, subject, reason, a
//!   text excerpt) with approve, reject, discard and ban; subscriptions waiting for a
//!   moderator with approve and reject; for an owner, the list's options. Its forms post to
//!   the same URL. The link works while it lives and while its address still runs the list.
//! - An administrator logged into pepsi-httpd sees the same page of any list at
//!   `GET /moderate/{list}`, its forms posting to `/moderate/{list}/act`.
//!
//! Every change is `pepsi_list::store`'s (or `store`'s for subscriptions), so it leaves the
//! rows `pepsi-list` leaves, with the moderator's address (or the administrator's name) as
//! actor. The forms carry a CSRF token bound to the link (or to the session), and a POST a
//! browser marks cross-site is refused. Pages are maud's, so every text of a post is
//! escaped; no script runs on them.

pub mod mail;
mod page;
pub mod store;

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use pepsi_list::store::{Verdict, Who};
use pepsi_list::{moderation, names, options};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::extract::{AppState, ClientAddr, Via, actor_named, authenticate};
use crate::throttle::{Throttle, address_key};

/// Link requests one client address may make in `ASK_WINDOW`.
pub const ASKS_PER_CLIENT: u32 = 10;
const ASK_WINDOW: Duration = Duration::from_secs(600);
/// The most fields a form may post.
const MAX_FIELDS: usize = 64;

/// The routes of the moderation pages.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/moderate/link/{token}", get(link_page).post(link_act))
        .route("/moderate/{list}", get(ask_page).post(ask))
        .route("/moderate/{list}/act", post(admin_act))
}

/// Who moderates, on which list, and what the page's forms carry.
pub struct Moderator {
    pub list: String,
    pub list_id: i64,
    pub who: Who,
    /// Owners (and administrators) also change the list's options.
    pub owner: bool,
    /// The forms' CSRF token; empty when the request needs none (an API token).
    pub csrf: String,
    /// Where the forms post.
    pub action: String,
}

/// The CSRF token of a page opened by the link `token`.
pub fn link_csrf(token: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"pepsi-httpd moderate\0");
    h.update(token.as_bytes());
    crate::credentials::hex(&h.finalize()[..16])
}

/// What a form asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    Approve(i64),
    Reject(i64, String),
    Discard(i64),
    /// Ban the held post's sender from the list, and discard the post.
    Ban(i64),
    AcceptRequest(i64),
    RefuseRequest(i64, String),
    /// The list's options as submitted: (name, value).
    Configure(Vec<(String, String)>),
}

/// A form's fields read as the act they ask for (pure: the fields only). `csrf` is left to
/// the caller; option fields are `opt_<name>`.
pub fn read_form(fields: &[(String, String)]) -> Result<Act, String> {
    if fields.len() > MAX_FIELDS {
        return Err(format!("more than {MAX_FIELDS} form fields"));
    }
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let id = || -> Result<i64, String> {
        let text = get("id").ok_or("the form has no id")?;
        text.trim()
            .parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("id {text:?} is not a number above 0"))
    };
    let reason = || -> Result<String, String> {
        moderation::reason(get("reason").unwrap_or_default())
            .map_err(|e| e.replace("--reason", "the reason"))
    };
    match get("do") {
        Some("approve") => Ok(Act::Approve(id()?)),
        Some("reject") => Ok(Act::Reject(id()?, reason()?)),
        Some("discard") => Ok(Act::Discard(id()?)),
        Some("ban") => Ok(Act::Ban(id()?)),
        Some("accept-request") => Ok(Act::AcceptRequest(id()?)),
        Some("refuse-request") => Ok(Act::RefuseRequest(id()?, reason()?)),
        Some("configure") => Ok(Act::Configure(
            fields
                .iter()
                .filter_map(|(k, v)| k.strip_prefix("opt_").map(|n| (n.to_owned(), v.clone())))
                .collect(),
        )),
        Some(other) => Err(format!(
            "unknown action {other:?}: approve, reject, discard, ban, accept-request, \
             refuse-request or configure"
        )),
        None => Err("the form says no action".into()),
    }
}

/// A value as the options form shows it, and as `configure` reads it back.
pub fn form_text(v: &options::Value) -> String {
    match v {
        options::Value::Text(t) => t.clone(),
        other => other.display(),
    }
}

/// The `NAME=VALUE` assignments of the options whose submitted text differs from the form
/// text of their current value; an option not submitted is left alone.
pub fn changed_assignments(
    current: &[(&'static str, options::Value)],
    submitted: &[(String, String)],
) -> Vec<String> {
    submitted
        .iter()
        .filter(|(name, text)| {
            current
                .iter()
                .find(|(n, _)| n == name)
                .is_none_or(|(_, v)| form_text(v) != *text)
        })
        .map(|(name, text)| format!("{name}={text}"))
        .collect()
}

/// A client's link requests, counted in this process.
fn asks() -> &'static Mutex<Throttle> {
    static ASKS: OnceLock<Mutex<Throttle>> = OnceLock::new();
    ASKS.get_or_init(|| Mutex::new(Throttle::new(ASK_WINDOW, ASKS_PER_CLIENT, 100_000)))
}

/// A list named in a path, as stored, or 404.
async fn named_list(state: &AppState, text: &str) -> Result<(String, i64), ApiError> {
    let list = names::named_list(text).map_err(ApiError::not_found)?;
    let id = store::list_id(&state.pool, &list).await?;
    Ok((list, id))
}

/// The administrator of the request, as a moderator of `list`; `None` without a login.
async fn admin(
    state: &AppState,
    parts: &axum::http::request::Parts,
    list: &str,
    list_id: i64,
) -> Result<Option<Moderator>, ApiError> {
    let Some(p) = authenticate(parts, state).await? else {
        return Ok(None);
    };
    let csrf = match &p.via {
        Via::Session { secret } => crate::credentials::csrf_token(secret),
        Via::Token { .. } => String::new(),
    };
    Ok(Some(Moderator {
        list: list.to_owned(),
        list_id,
        who: Who {
            actor: p.actor(),
            name: p.name.clone(),
        },
        owner: true,
        csrf,
        action: format!("/moderate/{list}/act"),
    }))
}

/// The moderator a link opens for, or the page that says why not.
async fn by_link(state: &AppState, token: &str) -> Result<Moderator, Response> {
    let gone = || {
        page::message(
            StatusCode::NOT_FOUND,
            "Link expired",
            "This link is unknown or has expired. Ask for a new one on the list's moderation page.",
        )
    };
    let link = match store::link(&state.pool, token).await {
        Ok(Some(l)) => l,
        Ok(None) => return Err(gone()),
        Err(e) => return Err(page::error(e)),
    };
    let (owner, moderator) = match store::runs(&state.pool, link.list_id, &link.address).await {
        Ok(r) => r,
        Err(e) => return Err(page::error(e)),
    };
    if !owner && !moderator {
        return Err(page::message(
            StatusCode::FORBIDDEN,
            "Not a moderator",
            &format!(
                "{} is no longer an owner or a moderator of {}.",
                link.address, link.list
            ),
        ));
    }
    Ok(Moderator {
        who: Who {
            actor: actor_named(&link.address),
            name: link.address.clone(),
        },
        list: link.list,
        list_id: link.list_id,
        owner,
        csrf: link_csrf(token),
        action: format!("/moderate/link/{token}"),
    })
}

/// `GET /moderate/{list}`: the page for a logged-in administrator, else the request form.
async fn ask_page(
    State(state): State<AppState>,
    Path(list): Path<String>,
    req: axum::extract::Request,
) -> Response {
    let (list, list_id) = match named_list(&state, &list).await {
        Ok(l) => l,
        Err(e) => return page::error(e),
    };
    let (parts, _) = req.into_parts();
    match admin(&state, &parts, &list, list_id).await {
        Ok(Some(m)) => page::moderation(&state, &m, None).await,
        Ok(None) | Err(_) => page::ask(&list, StatusCode::OK, None),
    }
}

#[derive(serde::Deserialize)]
struct AskForm {
    address: String,
}

/// `POST /moderate/{list}`: mails a link when the address runs the list; the answer is the
/// same either way.
async fn ask(
    State(state): State<AppState>,
    Path(list): Path<String>,
    client: ClientAddr,
    headers: HeaderMap,
    Form(form): Form<AskForm>,
) -> Response {
    if cross_site(&headers) {
        return page::error(cross_site_refusal());
    }
    let (list, list_id) = match named_list(&state, &list).await {
        Ok(l) => l,
        Err(e) => return page::error(e),
    };
    let key = address_key(client.ip());
    {
        let mut t = asks().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(wait) = t.blocked(&key, crate::extract::now()) {
            return page::ask(
                &list,
                StatusCode::TOO_MANY_REQUESTS,
                Some(&format!(
                    "Too many requests from your network: try again in {} minutes.",
                    wait.as_secs().div_ceil(60)
                )),
            );
        }
        let _counted = t.reserve(&key, crate::extract::now());
    }
    let address = match names::member_address(form.address.trim()) {
        Ok(a) => a,
        Err(e) => return page::ask(&list, StatusCode::BAD_REQUEST, Some(&e)),
    };
    let base = match mail::configured_web_url(&state.cfg) {
        Ok(Some(b)) => b,
        Ok(None) => {
            return page::message(
                StatusCode::SERVICE_UNAVAILABLE,
                "Not offered",
                "Links by mail need [pepsi] LIST_WEB_URL, which this server does not set. \
                 Ask the list's administrator.",
            );
        }
        Err(e) => return page::error(ApiError::internal(e)),
    };
    let neutral = format!(
        "If {address} is an owner or a moderator of {list}, a link to its moderation page is on \
         its way there. It works for an hour."
    );
    let runs = match store::runs(&state.pool, list_id, &address).await {
        Ok((o, m)) => o || m,
        Err(e) => return page::error(e),
    };
    if runs {
        let route = match mail::Route::from_config(&state.cfg) {
            Ok(r) => r,
            Err(e) => return page::error(ApiError::internal(e)),
        };
        match store::send_link(&state.pool, &route, &base, &list, list_id, &address).await {
            Ok(sent) => {
                tracing::info!(%list, %address, sent, "moderator link requested");
            }
            Err(e) => return page::error(e),
        }
    }
    page::message(StatusCode::OK, "Link requested", &neutral)
}

/// `GET /moderate/link/{token}`.
async fn link_page(State(state): State<AppState>, Path(token): Path<String>) -> Response {
    match by_link(&state, &token).await {
        Ok(m) => page::moderation(&state, &m, None).await,
        Err(r) => r,
    }
}

/// `POST /moderate/link/{token}`.
async fn link_act(
    State(state): State<AppState>,
    Path(token): Path<String>,
    headers: HeaderMap,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let m = match by_link(&state, &token).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    act(&state, &m, &headers, &fields).await
}

/// `POST /moderate/{list}/act`: an administrator's form.
async fn admin_act(
    State(state): State<AppState>,
    Path(list): Path<String>,
    req: axum::extract::Request,
) -> Response {
    let (list, list_id) = match named_list(&state, &list).await {
        Ok(l) => l,
        Err(e) => return page::error(e),
    };
    let (parts, body) = req.into_parts();
    let m = match admin(&state, &parts, &list, list_id).await {
        Ok(Some(m)) => m,
        Ok(None) => {
            return page::error(ApiError::unauthorized(
                "log in as an administrator (/login), or use the link a moderator is mailed",
            ));
        }
        Err(e) => return page::error(e),
    };
    let req = axum::extract::Request::from_parts(parts.clone(), body);
    let fields =
        match <Form<Vec<(String, String)>> as axum::extract::FromRequest<AppState>>::from_request(
            req, &state,
        )
        .await
        {
            Ok(Form(f)) => f,
            Err(e) => return page::error(ApiError::bad_request(format!("bad form: {e}"))),
        };
    act(&state, &m, &parts.headers, &fields).await
}

fn cross_site(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"))
}

fn cross_site_refusal() -> ApiError {
    ApiError::forbidden("a form of another site may not act here")
}

/// Carries out a posted form and shows the page again with what happened.
async fn act(
    state: &AppState,
    m: &Moderator,
    headers: &HeaderMap,
    fields: &[(String, String)],
) -> Response {
    if cross_site(headers) {
        return page::error(cross_site_refusal());
    }
    if !m.csrf.is_empty() {
        let sent = fields
            .iter()
            .find(|(k, _)| k == "csrf")
            .map(|(_, v)| v.as_str())
            .unwrap_or_default();
        if !crate::credentials::same(sent.as_bytes(), m.csrf.as_bytes()) {
            return page::error(ApiError::forbidden(
                "the form's CSRF token is missing or wrong: reload the page",
            ));
        }
    }
    let act = match read_form(fields) {
        Ok(a) => a,
        Err(e) => return page::moderation_status(state, m, StatusCode::BAD_REQUEST, &e).await,
    };
    match carry_out(state, m, act).await {
        Ok(done) => page::moderation(state, m, Some(&done)).await,
        Err(e) => page::moderation_status(state, m, e.status, &e.message).await,
    }
}

/// The stage an approved post goes back to (the configuration's only list stage).
fn approve_verdict(state: &AppState) -> Result<Verdict, ApiError> {
    let stage = moderation::list_stage(&state.cfg, None).map_err(|e| match e {
        moderation::NoStage::Usage(m) | moderation::NoStage::Missing(m) => ApiError::conflict(m),
    })?;
    Ok(Verdict::Approve { stage })
}

/// The verdict of a rejection with `reason`.
fn reject_verdict(state: &AppState, reason: String) -> Result<Verdict, ApiError> {
    let Verdict::Approve { stage } = approve_verdict(state)? else {
        unreachable!("approve_verdict approves")
    };
    let bounce_stage = moderation::bounce_stage(&state.cfg, &stage).map_err(ApiError::conflict)?;
    Ok(Verdict::Reject {
        stage,
        bounce_stage,
        reason,
    })
}

async fn carry_out(state: &AppState, m: &Moderator, act: Act) -> Result<String, ApiError> {
    let pool = &state.pool;
    let refused = store::refused;
    let list = m.list.as_str();
    match act {
        Act::Approve(id) => {
            let v = approve_verdict(state)?;
            pepsi_list::store::decide(pool, &m.who, list, &[id], &v)
                .await
                .map_err(refused)?;
            Ok(format!("Post {id} approved: it goes to the members."))
        }
        Act::Reject(id, reason) => {
            let v = reject_verdict(state, reason)?;
            pepsi_list::store::decide(pool, &m.who, list, &[id], &v)
                .await
                .map_err(refused)?;
            Ok(format!("Post {id} rejected: its sender is told."))
        }
        Act::Discard(id) => {
            pepsi_list::store::decide(pool, &m.who, list, &[id], &Verdict::Discard)
                .await
                .map_err(refused)?;
            Ok(format!("Post {id} discarded."))
        }
        Act::Ban(id) => {
            let held = pepsi_list::store::held(pool, list).await.map_err(refused)?;
            let post = held
                .iter()
                .find(|p| p.id == id)
                .ok_or_else(|| ApiError::not_found(format!("no held post {id} on {list}")))?;
            let pattern = moderation::pattern(&post.sender).map_err(ApiError::bad_request)?;
            pepsi_list::store::ban(
                pool,
                &m.who,
                Some(list),
                pattern.as_str(),
                &format!("banned from held post {id}"),
            )
            .await
            .map_err(refused)?;
            pepsi_list::store::decide(pool, &m.who, list, &[id], &Verdict::Discard)
                .await
                .map_err(refused)?;
            Ok(format!(
                "{} is banned from {list}, and post {id} discarded.",
                pattern.as_str()
            ))
        }
        Act::AcceptRequest(id) => {
            let route = mail::Route::from_config(&state.cfg).ok();
            let d = store::decide_pending(
                pool,
                &m.who,
                route.as_ref(),
                list,
                id,
                store::Decision::Approve,
                "",
            )
            .await?;
            Ok(format!("The request of {} is approved.", d.address))
        }
        Act::RefuseRequest(id, reason) => {
            let route = mail::Route::from_config(&state.cfg).ok();
            let d = store::decide_pending(
                pool,
                &m.who,
                route.as_ref(),
                list,
                id,
                store::Decision::Reject,
                &reason,
            )
            .await?;
            Ok(format!("The request of {} is rejected.", d.address))
        }
        Act::Configure(submitted) => {
            if !m.owner {
                return Err(ApiError::forbidden(
                    "only an owner of the list changes its options",
                ));
            }
            let shown = pepsi_list::store::show(pool, list).await.map_err(refused)?;
            let assignments = changed_assignments(&shown.options.0, &submitted);
            if assignments.is_empty() {
                return Ok("Nothing changed.".into());
            }
            let changes =
                options::parse_assignments(&assignments).map_err(ApiError::bad_request)?;
            let changed = pepsi_list::store::configure(pool, &m.who, list, changes)
                .await
                .map_err(refused)?;
            let names: Vec<&str> = changed.iter().map(|c| c.option).collect();
            Ok(format!("Changed: {}.", names.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_form_reads_as_its_act() {
        // (the form's fields, the act, or a part of the error)
        type Case<'a> = (Vec<(&'a str, &'a str)>, Result<Act, &'a str>);
        let cases: Vec<Case> = vec![
            (vec![("do", "approve"), ("id", "7")], Ok(Act::Approve(7))),
            (
                vec![("do", "reject"), ("id", "7"), ("reason", " off topic ")],
                Ok(Act::Reject(7, "off topic".into())),
            ),
            (
                vec![("do", "reject"), ("id", "7")],
                Ok(Act::Reject(7, String::new())),
            ),
            (vec![("do", "discard"), ("id", "3")], Ok(Act::Discard(3))),
            (vec![("do", "ban"), ("id", "3")], Ok(Act::Ban(3))),
            (
                vec![("do", "accept-request"), ("id", "9")],
                Ok(Act::AcceptRequest(9)),
            ),
            (
                vec![("do", "refuse-request"), ("id", "9"), ("reason", "no")],
                Ok(Act::RefuseRequest(9, "no".into())),
            ),
            (
                vec![("csrf", "x"), ("do", "configure"), ("opt_emergency", "yes")],
                Ok(Act::Configure(vec![("emergency".into(), "yes".into())])),
            ),
            (vec![("do", "approve")], Err("no id")),
            (vec![("do", "approve"), ("id", "-1")], Err("above 0")),
            (vec![("do", "approve"), ("id", "x")], Err("not a number")),
            (
                vec![("do", "reject"), ("id", "1"), ("reason", "a\nb")],
                Err("the reason"),
            ),
            (vec![("do", "explode"), ("id", "1")], Err("unknown action")),
            (vec![("id", "1")], Err("no action")),
        ];
        for (given, want) in cases {
            let got = read_form(&fields(&given));
            match (&got, &want) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{given:?}"),
                (Err(e), Err(part)) => assert!(e.contains(part), "{given:?}: {e}"),
                _ => panic!("{given:?}: {got:?}, wanted {want:?}"),
            }
        }
        let many: Vec<(String, String)> = (0..=MAX_FIELDS)
            .map(|i| (format!("f{i}"), String::new()))
            .collect();
        assert!(read_form(&many).unwrap_err().contains("more than"));
    }

    #[test]
    fn only_the_options_that_differ_are_assigned() {
        use options::Value;
        let current = vec![
            ("subject_prefix", Value::Text(String::new())),
            ("emergency", Value::Bool(false)),
            ("held_lifetime", Value::Seconds(14 * 86400)),
            ("reply_to_address", Value::None),
        ];
        // (the submitted fields, the assignments)
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: [Case; 5] = [
            (&[("subject_prefix", ""), ("emergency", "no")], &[]),
            (
                &[("held_lifetime", "14d"), ("reply_to_address", "none")],
                &[],
            ),
            (&[("emergency", "yes")], &["emergency=yes"]),
            (&[("subject_prefix", "[t] ")], &["subject_prefix=[t] "]),
            (&[("unknown", "1")], &["unknown=1"]),
        ];
        for (given, want) in cases {
            assert_eq!(
                changed_assignments(&current, &fields(given)),
                want,
                "{given:?}"
            );
        }
    }

    #[test]
    fn the_csrf_token_of_a_link_is_its_own() {
        let a = link_csrf("aaaa");
        assert_eq!(a.len(), 32);
        assert_eq!(a, link_csrf("aaaa"));
        assert_ne!(a, link_csrf("aaab"));
    }
}
