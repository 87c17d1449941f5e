//! The subscriber-facing list pages (docs/lists.md, "On the web"), for anyone, without a
//! login:
//!
//! - `GET /lists`: the advertised lists, each with a subscribe form; `GET /lists/{list}`
//!   one list (advertised or not); `POST /lists/{list}/subscribe` asks to subscribe: a
//!   `list_pending` row and a confirmation mail (double opt-in, always), within the list's
//!   limits per address and per client (`pepsi_contract::list::count_confirmation`, the
//!   list stage's windows). Past a limit, for a member, a banned address, nothing is sent
//!   and the page says what it says on success, so it tells nobody who is subscribed.
//! - `GET /lists/confirm/{token}` shows what the confirmation would do and one button;
//!   only `POST` carries it out (a link scanner's GET changes nothing).
//! - `GET /lists/unsubscribe/{token}`, the RFC 8058 URL of `List-Unsubscribe`: a page with
//!   one button; `POST` (body `List-Unsubscribe=One-Click`) unsubscribes and mails a
//!   goodbye; posted again, it answers alike and sends nothing.
//! - `GET /lists/{list}/manage` asks a member's address and `POST` mails a link
//!   (`list_member_link`, a day of life) to `/lists/member/{token}`: that member's
//!   subscriptions with their choices, changed by `POST`, and an unsubscribe button (a
//!   goodbye mailed, as after a one-click).
//!
//! Forms that act without a token (subscribe, a member's link) are refused when a browser
//! says they come from another site (`form::same_origin`); the member page's forms also
//! carry a token bound to its link. Every field is bounded (`form`). `[pepsi] LIST_WEB_URL`
//! and the list stage's `DELIVER_STAGE` are read once, when the routes are made.

pub(crate) mod form;
mod mail;
mod page;
mod store;

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Extension, Form, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::get;
use axum::{Router, routing::post};
use sha2::{Digest, Sha256};

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, ClientAddr};
use crate::moderate::mail::{Route, configured_web_url};
use crate::throttle::address_key;

use store::Asked;

/// What the pages read from the configuration at start.
pub struct Web {
    /// `[pepsi] LIST_WEB_URL`: the public base of the links mailed; `None`: mail carries
    /// none (a confirmation then asks for a reply only).
    pub base: Option<String>,
    /// Where the lists' mail starts (the list stage's `DELIVER_STAGE`), or why it cannot
    /// be sent.
    route: Result<Route, String>,
    /// `https` when pepsi-httpd serves TLS itself (for the same-origin check).
    scheme: &'static str,
}

impl Web {
    /// The configuration's: an unusable LIST_WEB_URL is an error (pepsi-httpd does not
    /// start); a missing list stage only stops the pages from sending mail.
    pub fn from_state(state: &AppState) -> Result<Web, String> {
        Ok(Web {
            base: configured_web_url(&state.cfg)?,
            route: Route::from_config(&state.cfg),
            scheme: if state.options.tls.is_some() {
                "https"
            } else {
                "http"
            },
        })
    }

    fn route(&self) -> ApiResult<&Route> {
        self.route.as_ref().map_err(|e| {
            tracing::error!("the list pages cannot send mail: {e}");
            ApiError::busy(
                "this server sends no list mail now (its configuration has no usable list stage)",
                3600,
            )
        })
    }
}

/// Refuses to start with an unusable `[pepsi] LIST_WEB_URL`.
pub fn check(cfg: &pepsi_conf::config::Config) -> anyhow::Result<()> {
    configured_web_url(cfg).map_err(anyhow::Error::msg)?;
    Ok(())
}

/// The routes of the subscriber pages.
pub fn routes(state: &AppState) -> Router<AppState> {
    let web = Web::from_state(state).unwrap_or_else(|e| {
        // `check` refused this before the server started; never reached in `serve`.
        tracing::error!("{e}: the list pages send no links");
        Web {
            base: None,
            route: Route::from_config(&state.cfg),
            scheme: "http",
        }
    });
    Router::new()
        .route("/lists", get(index))
        .route("/lists/confirm/{token}", get(confirm_page).post(confirm))
        .route(
            "/lists/unsubscribe/{token}",
            get(unsubscribe_page).post(unsubscribe),
        )
        .route("/lists/member/{token}", get(member_page).post(member_act))
        .route("/lists/{list}", get(list_page))
        .route("/lists/{list}/subscribe", post(subscribe))
        .route("/lists/{list}/manage", get(manage_page).post(manage))
        .layer(Extension(Arc::new(web)))
}

type Fields = Result<Form<Vec<(String, String)>>, FormRejection>;

/// The posted fields, or the page saying why there are none.
// The error is the handler's whole answer, returned at once: no gain in boxing it.
#[allow(clippy::result_large_err)]
fn fields(f: Fields) -> Result<Vec<(String, String)>, Response> {
    f.map(|Form(v)| v).map_err(|e| {
        page::error(ApiError::new(
            e.status(),
            format!("the request is not a form (application/x-www-form-urlencoded): {e}"),
        ))
    })
}

/// Whether a form posted with `headers` may act (`form::same_origin`, for a server reached
/// by `scheme` whose public base is `base`), or why not: the lists' and the archive's forms.
pub(crate) fn same_site(
    scheme: &'static str,
    base: Option<&str>,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let h = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if form::same_origin(
        h("sec-fetch-site"),
        h(header::ORIGIN.as_str()),
        h(header::HOST.as_str()),
        scheme,
        base,
    ) {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "a form of another site may not act here",
        ))
    }
}

/// Whether the form may act (`same_site`), or the 403 page.
#[allow(clippy::result_large_err)]
fn from_this_site(web: &Web, headers: &HeaderMap) -> Result<(), Response> {
    same_site(web.scheme, web.base.as_deref(), headers).map_err(page::error)
}

/// The list a path names, or the 404 page naming it.
async fn named(state: &AppState, text: &str) -> Result<store::ListInfo, Response> {
    let list = pepsi_list::names::named_list(text)
        .map_err(|e| page::error(ApiError::not_found(format!("there is no such list: {e}"))))?;
    store::list(&state.pool, &list).await.map_err(page::error)
}

/// What a form posted to a list's page starts with: a request from this site, a form,
/// and an existing list; else the page saying which is wrong.
// The error is the handler's whole answer, returned at once: no gain in boxing it.
#[allow(clippy::result_large_err)]
async fn posted(
    state: &AppState,
    web: &Web,
    headers: &HeaderMap,
    list: &str,
    f: Fields,
) -> Result<(store::ListInfo, Vec<(String, String)>), Response> {
    from_this_site(web, headers)?;
    let fields = fields(f)?;
    Ok((named(state, list).await?, fields))
}

async fn index(State(state): State<AppState>) -> Response {
    match store::advertised(&state.pool).await {
        Ok(lists) => page::index(&lists),
        Err(e) => page::error(e),
    }
}

async fn list_page(State(state): State<AppState>, Path(list): Path<String>) -> Response {
    match named(&state, &list).await {
        Ok(l) => page::list(StatusCode::OK, &l, None),
        Err(r) => r,
    }
}

/// The answer to every subscription that is not refused outright: the same whether a
/// confirmation went out or not.
fn neutral_subscribe(address: &str, list: &str) -> String {
    format!(
        "If {address} may subscribe to {list}, a message asking to confirm is on its way \
         there. Nothing changes until it is confirmed."
    )
}

async fn subscribe(
    State(state): State<AppState>,
    Extension(web): Extension<Arc<Web>>,
    Path(list): Path<String>,
    client: ClientAddr,
    headers: HeaderMap,
    f: Fields,
) -> Response {
    let (l, fields) = match posted(&state, &web, &headers, &list, f).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let asked = match form::subscribe(&fields, pepsi_list::names::member_address) {
        Ok(a) => a,
        Err(e) => return page::list(StatusCode::BAD_REQUEST, &l, Some(&e)),
    };
    let client = address_key(client.ip());
    match store::subscribe(
        &state.pool,
        &web,
        &l,
        &asked.address,
        &asked.display_name,
        &client,
    )
    .await
    {
        Ok(Asked::Closed) => page::list(
            StatusCode::FORBIDDEN,
            &l,
            Some("This list takes no subscriptions."),
        ),
        Ok(Asked::Sent | Asked::Quiet) => page::list(
            StatusCode::OK,
            &l,
            Some(&neutral_subscribe(&asked.address, &l.address)),
        ),
        Err(e) => page::error(e),
    }
}

fn token_gone() -> Response {
    page::message(
        StatusCode::NOT_FOUND,
        "Link used or expired",
        "No request waits for this confirmation: it was used already or has expired. \
         Ask again on the list's page.",
    )
}

async fn confirm_page(State(state): State<AppState>, Path(token): Path<String>) -> Response {
    let Some(token) = form::list_token(&token) else {
        return token_gone();
    };
    match store::pending(&state.pool, &token).await {
        Ok(Some((list, address, kind))) => page::confirm(&list, &address, &kind),
        Ok(None) => token_gone(),
        Err(e) => page::error(e),
    }
}

async fn confirm(
    State(state): State<AppState>,
    Extension(web): Extension<Arc<Web>>,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = from_this_site(&web, &headers) {
        return r;
    }
    let Some(token) = form::list_token(&token) else {
        return token_gone();
    };
    match store::confirm(&state.pool, &web, &token).await {
        Ok(Some((list, carried))) => {
            let text = match carried.event {
                "member.subscribe" => format!("{} is now subscribed to {list}.", carried.address),
                "subscription.confirmed" => format!(
                    "The subscription of {} to {list} is confirmed; a moderator of the list \
                     decides on it next.",
                    carried.address
                ),
                _ => format!("{} has left {list}.", carried.address),
            };
            page::message(StatusCode::OK, "Confirmed", &text)
        }
        Ok(None) => token_gone(),
        Err(e) => page::error(e),
    }
}

fn unknown_unsubscribe() -> Response {
    page::message(
        StatusCode::NOT_FOUND,
        "Unknown link",
        "This unsubscribe link is not known here. Each list message carries its own.",
    )
}

fn left(list: &str) -> Response {
    page::message(
        StatusCode::OK,
        "Unsubscribed",
        &format!("You are no longer subscribed to {list}."),
    )
}

async fn unsubscribe_page(State(state): State<AppState>, Path(token): Path<String>) -> Response {
    let Some(token) = form::unsubscribe_token(&token) else {
        return unknown_unsubscribe();
    };
    match store::one_click(&state.pool, &token).await {
        Ok(store::OneClick::Member(_, list, address)) => page::unsubscribe(&list, &address),
        Ok(store::OneClick::Gone(list)) => left(&list),
        Ok(store::OneClick::Unknown) => unknown_unsubscribe(),
        Err(e) => page::error(e),
    }
}

/// RFC 8058: a mail provider's POST comes from anywhere, so no origin is asked; the token
/// is the whole authority.
async fn unsubscribe(
    State(state): State<AppState>,
    Extension(web): Extension<Arc<Web>>,
    Path(token): Path<String>,
    f: Fields,
) -> Response {
    let fields = match fields(f) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let Some(token) = form::unsubscribe_token(&token) else {
        return unknown_unsubscribe();
    };
    if !form::one_click(&fields) {
        return page::error(ApiError::bad_request(
            "the body must be List-Unsubscribe=One-Click (RFC 8058), as the page's button sends",
        ));
    }
    match store::unsubscribe_one_click(&state.pool, &web, &token).await {
        Ok(Some(list)) => left(&list),
        Ok(None) => unknown_unsubscribe(),
        Err(e) => page::error(e),
    }
}

async fn manage_page(State(state): State<AppState>, Path(list): Path<String>) -> Response {
    match named(&state, &list).await {
        Ok(l) => page::manage(StatusCode::OK, &l, None),
        Err(r) => r,
    }
}

async fn manage(
    State(state): State<AppState>,
    Extension(web): Extension<Arc<Web>>,
    Path(list): Path<String>,
    client: ClientAddr,
    headers: HeaderMap,
    f: Fields,
) -> Response {
    let (l, fields) = match posted(&state, &web, &headers, &list, f).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let address = match form::subscribe(&fields, pepsi_list::names::member_address) {
        Ok(a) => a.address,
        Err(e) => return page::manage(StatusCode::BAD_REQUEST, &l, Some(&e)),
    };
    let Some(base) = web.base.as_deref() else {
        return page::manage(
            StatusCode::SERVICE_UNAVAILABLE,
            &l,
            Some(
                "Links by mail need [pepsi] LIST_WEB_URL, which this server does not set. \
                 To leave the list, write to its -leave address.",
            ),
        );
    };
    let client = address_key(client.ip());
    match store::send_member_link(&state.pool, &web, base, &l, &address, &client).await {
        Ok(_) => page::manage(
            StatusCode::OK,
            &l,
            Some(&format!(
                "If {address} is subscribed to {}, a link to its subscription's page is on its \
                 way there. It works for a day.",
                l.address
            )),
        ),
        Err(e) => page::error(e),
    }
}

/// The CSRF token of a member page opened by link `token`.
fn member_csrf(token: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"pepsi-httpd list member\0");
    h.update(token.as_bytes());
    crate::credentials::hex(&h.finalize()[..16])
}

fn link_gone() -> Response {
    page::message(
        StatusCode::NOT_FOUND,
        "Link expired",
        "This link is unknown or has expired. Ask for a new one on the list's page.",
    )
}

/// The link's address and reach, or the page saying it is gone.
async fn by_link(state: &AppState, token: &str) -> Result<(String, String, Option<i64>), Response> {
    let Some(token) = form::list_token(token) else {
        return Err(link_gone());
    };
    match store::member_link(&state.pool, &token).await {
        Ok(Some((address, list_id))) => Ok((token, address, list_id)),
        Ok(None) => Err(link_gone()),
        Err(e) => Err(page::error(e)),
    }
}

async fn show_member(
    state: &AppState,
    status: StatusCode,
    token: &str,
    address: &str,
    list_id: Option<i64>,
    notice: Option<&str>,
) -> Response {
    match store::subscriptions(&state.pool, address, list_id).await {
        Ok(subs) => page::member(status, address, &subs, &member_csrf(token), notice),
        Err(e) => page::error(e),
    }
}

async fn member_page(State(state): State<AppState>, Path(token): Path<String>) -> Response {
    match by_link(&state, &token).await {
        Ok((token, address, list_id)) => {
            show_member(&state, StatusCode::OK, &token, &address, list_id, None).await
        }
        Err(r) => r,
    }
}

async fn member_act(
    State(state): State<AppState>,
    Extension(web): Extension<Arc<Web>>,
    Path(token): Path<String>,
    headers: HeaderMap,
    f: Fields,
) -> Response {
    if let Err(r) = from_this_site(&web, &headers) {
        return r;
    }
    let fields = match fields(f) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let (token, address, list_id) = match by_link(&state, &token).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let sent = form::field(&fields, "csrf").unwrap_or_default();
    if !crate::credentials::same(sent.as_bytes(), member_csrf(&token).as_bytes()) {
        return page::error(ApiError::forbidden(
            "the form's CSRF token is missing or wrong: reload the page",
        ));
    }
    let act = match form::member_act(&fields) {
        Ok(a) => a,
        Err(e) => {
            return show_member(
                &state,
                StatusCode::BAD_REQUEST,
                &token,
                &address,
                list_id,
                Some(&e),
            )
            .await;
        }
    };
    let done = match act {
        form::MemberAct::Save(member, p) => {
            store::save_preferences(&state.pool, &address, list_id, member, &p)
                .await
                .map(|l| format!("Your choices for {l} are saved."))
        }
        form::MemberAct::Unsubscribe(member) => {
            store::leave(&state.pool, &web, &address, list_id, member)
                .await
                .map(|l| format!("You are no longer subscribed to {l}."))
        }
    };
    match done {
        Ok(notice) => {
            show_member(
                &state,
                StatusCode::OK,
                &token,
                &address,
                list_id,
                Some(&notice),
            )
            .await
        }
        Err(e) if e.status.is_client_error() => {
            show_member(
                &state,
                e.status,
                &token,
                &address,
                list_id,
                Some(&e.message),
            )
            .await
        }
        Err(e) => page::error(e),
    }
}
