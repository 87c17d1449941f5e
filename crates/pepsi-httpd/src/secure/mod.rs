//! The secure-link portal (docs/secure-link.md, "The portal"), through
//! `pepsi_secure_link::store`, never with SQL of its own:
//!
//! - The recipient's pages, under `/secure/{link_id}/{generation}/{half}` (the link's one
//!   form is `pepsi_secure_link::url`): `GET` shows the message to a browser holding an open
//!   session of the link, else the code form; `POST .../code` mails a one-time code to the
//!   link's recipient (only when the half in the path opens the message, within the store's
//!   codes per hour); `POST .../verify` checks a typed code and sets the session cookie
//!   (HttpOnly, SameSite=Lax, limited to `/secure/{link_id}`); `GET .../part/{n}` downloads
//!   an attachment; `POST .../reply` queues the recipient's answer to the sender.
//! - The sender's pages, under `/secure/manage/{link_id}/{token}`: where the link stands and
//!   its access log; `POST .../revoke` withdraws it; `POST .../resend` re-seals the message
//!   and mails the recipient a new link, after which only the new one works.
//! - Mail goes out through `pepsi.secure_link_queue_mail` (the httpd role may not write the
//!   queue), at the secure-link stage's `NOTICE_STAGE` (codes, new links) or
//!   `RECEIPT_STAGE` (replies), read from the configuration at start (`Route`).
//!
//! The link half and the sender's token are in the paths: pepsi-httpd writes no request
//! path to its log, and pages go out with `Referrer-Policy: no-referrer` and `no-store`.
//! Every form is checked to come from this site.

mod form;
mod mail;
mod page;

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::FormRejection;
use axum::extract::{Extension, Form, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use pepsi_secure_link::store::{self, Error, ManageToken, SessionToken};
use pepsi_secure_link::{admin, url};

use crate::error::ApiError;
use crate::extract::{AppState, ClientAddr};
use crate::throttle::address_key;
use form::LinkPath;
pub use mail::Route;

/// What the portal's routes read from the configuration at start.
struct Portal {
    /// `[pepsi] SECURE_LINK_URL`: the base of the links mailed.
    base: Option<String>,
    /// Where the portal's mail starts, or why none can be sent.
    route: Result<Route, String>,
    /// `https` when pepsi-httpd serves TLS itself.
    scheme: &'static str,
}

impl Portal {
    /// Whether the cookie may travel over plain HTTP: not when the public base is https.
    fn secure(&self) -> bool {
        self.scheme == "https" || self.base.is_some()
    }
}

/// The routes of the portal.
pub fn routes(state: &AppState) -> Router<AppState> {
    let base = state
        .cfg
        .section("pepsi")
        .string_opt("SECURE_LINK_URL")
        .map_err(|e| e.to_string())
        .and_then(|v| url::portal_base(v.as_deref()));
    let base = match base {
        Ok(b) => b,
        Err(e) => {
            tracing::error!("the secure-link portal mails no links: {e}");
            None
        }
    };
    let portal = Portal {
        base,
        route: Route::from_config(&state.cfg),
        scheme: if state.options.tls.is_some() {
            "https"
        } else {
            "http"
        },
    };
    Router::new()
        .route("/secure/manage/{link_id}/{token}", get(manage_page))
        .route("/secure/manage/{link_id}/{token}/revoke", post(revoke))
        .route("/secure/manage/{link_id}/{token}/resend", post(resend))
        .route("/secure/{link_id}/{generation}/{half}", get(view))
        .route(
            "/secure/{link_id}/{generation}/{half}/code",
            post(send_code),
        )
        .route("/secure/{link_id}/{generation}/{half}/verify", post(verify))
        .route("/secure/{link_id}/{generation}/{half}/part/{n}", get(part))
        .route("/secure/{link_id}/{generation}/{half}/reply", post(reply))
        .layer(Extension(Arc::new(portal)))
}

type Fields = Result<Form<Vec<(String, String)>>, FormRejection>;

/// A store error as a page: a refusal's own page, bad input 400, the rest 503 or 500.
fn failed(e: Error) -> Response {
    match e {
        Error::Refused(r) => page::refused(r),
        Error::Invalid(m) => page::error(ApiError::bad_request(m)),
        Error::Db(e) => page::error(e.into()),
        Error::Random(e) => page::error(ApiError::internal(e)),
    }
}

/// The link a path names, or the page saying it is not one.
#[allow(clippy::result_large_err)]
fn link_of(link_id: &str, generation: &str, half: &str) -> Result<LinkPath, Response> {
    LinkPath::parse(link_id, generation, half).ok_or_else(|| page::refused(store::Refusal::Unknown))
}

/// Whether a form posted here may act (`lists::same_site`), or the 403 page.
#[allow(clippy::result_large_err)]
fn from_this_site(portal: &Portal, headers: &HeaderMap) -> Result<(), Response> {
    crate::lists::same_site(portal.scheme, portal.base.as_deref(), headers).map_err(page::error)
}

/// The session token in the request's `Cookie` fields, if one is well-formed.
fn session_of(headers: &HeaderMap) -> Option<SessionToken> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, value)| *name == form::COOKIE && form::is_token(value))
        .map(|(_, value)| SessionToken(value.to_owned()))
}

#[allow(clippy::result_large_err)]
fn route_of(portal: &Portal) -> Result<&Route, Response> {
    portal.route.as_ref().map_err(|e| {
        tracing::error!("the secure-link portal sends no mail: {e}");
        page::error(ApiError::busy(
            "this server sends no mail from the portal now (its configuration has no usable \
             secure-link stage)",
            3600,
        ))
    })
}

/// The message behind `link` for the session in `headers`: `Ok(None)` when there is no
/// session (or it ended, or opened an older link of the message), so the caller shows the
/// code form.
async fn open(
    state: &AppState,
    link: &LinkPath,
    headers: &HeaderMap,
    client: &str,
) -> Result<Option<(SessionToken, Vec<u8>)>, Response> {
    let Some(session) = session_of(headers) else {
        return Ok(None);
    };
    match store::open(&state.pool, &link.link_id, &link.half, &session, client).await {
        Ok(raw) => Ok(Some((session, raw))),
        Err(Error::Refused(store::Refusal::NoSession)) => Ok(None),
        // A session of an older link: the page's own link decides (a code for the newest
        // link, else the page saying it was replaced).
        Err(Error::Refused(store::Refusal::Superseded)) => {
            store::check_link(&state.pool, &link.link_id, link.generation, &link.half)
                .await
                .map_err(failed)?;
            Ok(None)
        }
        Err(e) => Err(failed(e)),
    }
}

/// `GET /secure/{link_id}/{generation}/{half}`: the message, or the code form.
async fn view(
    State(state): State<AppState>,
    Path((link_id, generation, half)): Path<(String, String, String)>,
    client: ClientAddr,
    headers: HeaderMap,
) -> Response {
    let link = match link_of(&link_id, &generation, &half) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let client = address_key(client.ip());
    match open(&state, &link, &headers, &client).await {
        Ok(Some((_, raw))) => show(&link, &raw, None),
        Ok(None) => {
            match store::check_link(&state.pool, &link.link_id, link.generation, &link.half).await {
                Ok(()) => page::ask_code(StatusCode::OK, &link, None),
                Err(e) => failed(e),
            }
        }
        Err(r) => r,
    }
}

fn show(link: &LinkPath, raw: &[u8], notice: Option<&str>) -> Response {
    let shown = pepsi_archive::read::shown(raw);
    let parts = pepsi_archive::store::part_rows(raw);
    let head = mail::Head::of(raw);
    page::opened(
        link,
        &page::Opened {
            from: head.from,
            to: head.to,
            subject: head.subject,
            date: head.date,
            shown: &shown,
            parts: &parts,
        },
        notice,
    )
}

/// `POST .../code`: a one-time code mailed to the link's recipient.
async fn send_code(
    State(state): State<AppState>,
    Extension(portal): Extension<Arc<Portal>>,
    Path((link_id, generation, half)): Path<(String, String, String)>,
    client: ClientAddr,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = from_this_site(&portal, &headers) {
        return r;
    }
    let link = match link_of(&link_id, &generation, &half) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let route = match route_of(&portal) {
        Ok(r) => r,
        Err(r) => return r,
    };
    if let Err(e) = store::check_link(&state.pool, &link.link_id, link.generation, &link.half).await
    {
        return failed(e);
    }
    let client = address_key(client.ip());
    match mail_code(&state, route, &link, &client).await {
        Ok(()) => page::ask_code(
            StatusCode::OK,
            &link,
            Some("A code is on its way to the address this message was sent to. Type it below."),
        ),
        Err(Error::Refused(r @ store::Refusal::TooManyCodes)) => {
            let (status, _, text) = form::refusal(r);
            page::ask_code(status, &link, Some(&text))
        }
        Err(e) => failed(e),
    }
}

/// Records a code and queues its mail, in one transaction.
async fn mail_code(
    state: &AppState,
    route: &Route,
    link: &LinkPath,
    client: &str,
) -> Result<(), Error> {
    // The code mail's `To:`; the database sends it to the link's recipient whatever the
    // field says.
    let to = admin::get(&state.pool, &link.link_id).await?.recipient;
    let mut tx = state.pool.begin().await?;
    let code = store::send_code(&mut tx, &link.link_id, link.generation, client).await?;
    let raw = mail::code(route, &to, code.as_str()).map_err(Error::Invalid)?;
    mail::queue(&mut tx, &link.link_id, mail::Kind::Code, route, &raw, None).await?;
    tx.commit().await?;
    crate::moderate::store::wake(&state.pool).await;
    Ok(())
}

/// `POST .../verify`: the typed code checked; the right one opens a session.
async fn verify(
    State(state): State<AppState>,
    Extension(portal): Extension<Arc<Portal>>,
    Path((link_id, generation, half)): Path<(String, String, String)>,
    client: ClientAddr,
    headers: HeaderMap,
    f: Fields,
) -> Response {
    if let Err(r) = from_this_site(&portal, &headers) {
        return r;
    }
    let link = match link_of(&link_id, &generation, &half) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let fields = match f {
        Ok(Form(v)) => v,
        Err(e) => return page::ask_code(e.status(), &link, Some(&e.body_text())),
    };
    let typed = match form::typed_code(&fields) {
        Ok(c) => c,
        Err(e) => return page::ask_code(StatusCode::BAD_REQUEST, &link, Some(&e)),
    };
    let client = address_key(client.ip());
    match store::check_code(&state.pool, &link.link_id, link.generation, typed, &client).await {
        Ok(session) => {
            let mut r = Redirect::to(&link.path()).into_response();
            let cookie = form::session_cookie(
                &link,
                &session.0,
                store::SESSION_LIFETIME.num_seconds(),
                portal.secure(),
            );
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(Error::Refused(r)) if form::refusal(r).0 == StatusCode::FORBIDDEN => {
            let (status, _, text) = form::refusal(r);
            page::ask_code(status, &link, Some(&text))
        }
        Err(e) => failed(e),
    }
}

/// `GET .../part/{n}`: an attachment of the message, as a download.
async fn part(
    State(state): State<AppState>,
    Path((link_id, generation, half, n)): Path<(String, String, String, String)>,
    client: ClientAddr,
    headers: HeaderMap,
) -> Response {
    let link = match link_of(&link_id, &generation, &half) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let client = address_key(client.ip());
    let raw = match open(&state, &link, &headers, &client).await {
        Ok(Some((_, raw))) => raw,
        Ok(None) => return page::ask_code(StatusCode::FORBIDDEN, &link, None),
        Err(r) => return r,
    };
    let not_found = || page::error(ApiError::not_found("there is no such attachment"));
    let Ok(index) = n.parse::<usize>() else {
        return not_found();
    };
    let parts = pepsi_archive::store::part_rows(&raw);
    let Some(p) = parts
        .iter()
        .find(|p| p.part_index as usize == index && p.file_name.is_some())
    else {
        return not_found();
    };
    let Some(bytes) = pepsi_archive::read::part_contents(&raw, index) else {
        return not_found();
    };
    let name = crate::archive::text::file_name(p.file_name.as_deref(), index);
    if let Ok(mut tx) = state.pool.begin().await {
        let logged = store::record(
            &mut tx,
            &link.link_id,
            "attachment_downloaded",
            &client,
            Some(&name),
        )
        .await;
        if logged.is_ok() {
            let _ = tx.commit().await;
        }
    }
    let mut r = (StatusCode::OK, bytes).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    for (k, v) in [
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; sandbox",
        ),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    r
}

/// `POST .../reply`: the recipient's answer, queued to the sender.
async fn reply(
    State(state): State<AppState>,
    Extension(portal): Extension<Arc<Portal>>,
    Path((link_id, generation, half)): Path<(String, String, String)>,
    client: ClientAddr,
    headers: HeaderMap,
    f: Fields,
) -> Response {
    if let Err(r) = from_this_site(&portal, &headers) {
        return r;
    }
    let link = match link_of(&link_id, &generation, &half) {
        Ok(l) => l,
        Err(r) => return r,
    };
    let route = match route_of(&portal) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let client = address_key(client.ip());
    let (session, raw) = match open(&state, &link, &headers, &client).await {
        Ok(Some(o)) => o,
        Ok(None) => return page::ask_code(StatusCode::FORBIDDEN, &link, None),
        Err(r) => return r,
    };
    let fields = match f {
        Ok(Form(v)) => v,
        Err(e) => return show(&link, &raw, Some(&e.body_text())),
    };
    let text = match form::reply_text(&fields) {
        Ok(t) => t,
        Err(e) => return show(&link, &raw, Some(&format!("Not sent: {e}."))),
    };
    let head = mail::Head::of(&raw);
    let sent = async {
        let link_row = admin::get(&state.pool, &link.link_id).await?;
        let out = mail::reply(route, &link_row, &head, &text).map_err(Error::Invalid)?;
        let mut tx = state.pool.begin().await?;
        mail::queue(
            &mut tx,
            &link.link_id,
            mail::Kind::Reply,
            route,
            &out,
            Some(&store::session_hash(&session)),
        )
        .await?;
        store::record(&mut tx, &link.link_id, "reply_sent", &client, None).await?;
        tx.commit().await?;
        crate::moderate::store::wake(&state.pool).await;
        Ok::<_, Error>(link_row.sender)
    }
    .await;
    match sent {
        Ok(sender) => show(
            &link,
            &raw,
            Some(&format!("Your reply was sent to {sender}.")),
        ),
        Err(e) => failed(e),
    }
}

/// The sender's link from its path, checked against the store; else the page refusing.
async fn sender_link(
    state: &AppState,
    link_id: &str,
    token: &str,
) -> Result<(ManageToken, admin::Link), Response> {
    if !url::is_link_id(link_id) || !form::is_token(token) {
        return Err(page::refused(store::Refusal::Unknown));
    }
    let token = ManageToken(token.to_owned());
    store::check_sender(&state.pool, link_id, &token)
        .await
        .map_err(failed)?;
    let link = admin::get(&state.pool, link_id).await.map_err(failed)?;
    Ok((token, link))
}

async fn manage_view(
    state: &AppState,
    link_id: &str,
    token: &ManageToken,
    status: StatusCode,
    notice: Option<&str>,
) -> Response {
    let link = match admin::get(&state.pool, link_id).await {
        Ok(l) => l,
        Err(e) => return failed(e),
    };
    match store::access_log(&state.pool, link_id).await {
        Ok(log) => page::manage(
            status,
            &url::manage_url("", link_id, &token.0),
            &link,
            &log,
            notice,
        ),
        Err(e) => failed(e),
    }
}

/// `GET /secure/manage/{link_id}/{token}`: the sender's page.
async fn manage_page(
    State(state): State<AppState>,
    Path((link_id, token)): Path<(String, String)>,
) -> Response {
    match sender_link(&state, &link_id, &token).await {
        Ok((token, _)) => manage_view(&state, &link_id, &token, StatusCode::OK, None).await,
        Err(r) => r,
    }
}

/// `POST .../revoke`: the sender withdraws the message.
async fn revoke(
    State(state): State<AppState>,
    Extension(portal): Extension<Arc<Portal>>,
    Path((link_id, token)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = from_this_site(&portal, &headers) {
        return r;
    }
    let (token, link) = match sender_link(&state, &link_id, &token).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let done = async {
        let mut tx = state.pool.begin().await?;
        store::revoke_by_sender(&mut tx, &link_id, &token, &link.sender).await?;
        tx.commit().await?;
        Ok::<_, Error>(())
    }
    .await;
    match done {
        Ok(()) => {
            tracing::info!(link = %link_id, sender = %link.sender, "secure link revoked by its sender");
            manage_view(
                &state,
                &link_id,
                &token,
                StatusCode::OK,
                Some("The message is withdrawn: its link no longer opens it."),
            )
            .await
        }
        Err(Error::Refused(r)) => {
            let (status, _, text) = form::refusal(r);
            manage_view(&state, &link_id, &token, status, Some(&text)).await
        }
        Err(e) => failed(e),
    }
}

/// `POST .../resend`: the message re-sealed and a new link mailed to the recipient.
async fn resend(
    State(state): State<AppState>,
    Extension(portal): Extension<Arc<Portal>>,
    Path((link_id, token)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = from_this_site(&portal, &headers) {
        return r;
    }
    let route = match route_of(&portal) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Some(base) = portal.base.as_deref() else {
        return page::error(ApiError::busy(
            "new links need [pepsi] SECURE_LINK_URL, which this server does not set",
            3600,
        ));
    };
    let (token, link) = match sender_link(&state, &link_id, &token).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let done = async {
        let mut tx = state.pool.begin().await?;
        let resent = store::resend_by_sender(&mut tx, &link_id, &token).await?;
        let url = url::link_url(base, &link_id, resent.generation, &resent.link_half);
        let raw = mail::notice(route, &link, &url).map_err(Error::Invalid)?;
        mail::queue(&mut tx, &link_id, mail::Kind::Notice, route, &raw, None).await?;
        tx.commit().await?;
        crate::moderate::store::wake(&state.pool).await;
        Ok::<_, Error>(())
    }
    .await;
    match done {
        Ok(()) => {
            manage_view(
                &state,
                &link_id,
                &token,
                StatusCode::OK,
                Some(&format!(
                    "A new link is on its way to {}; the old one no longer works.",
                    link.recipient
                )),
            )
            .await
        }
        Err(Error::Refused(r)) => {
            let (status, _, text) = form::refusal(r);
            manage_view(&state, &link_id, &token, status, Some(&text)).await
        }
        Err(e) => failed(e),
    }
}
