//! The lists' archive on the web (docs/archive.md, "The pages"), read through
//! `pepsi_archive::read`, never with SQL of its own:
//!
//! - `GET /archive/{list}`: the months with their counts and the latest threads;
//!   `/archive/{list}/{YYYY-MM}` a month's threads; `/archive/{list}/thread/{url_id}` a
//!   thread as a tree (walked with a bound, as References can be forged into cycles);
//!   `/archive/{list}/m/{url_id}` one post (its text, or its HTML sanitised by ammonia,
//!   and its attachments), with `/raw` (text/plain, members only) and `/part/{n}` (an
//!   attachment's download; a text or message attachment for members only);
//!   `/archive/{list}/search?q=` ranked hits, paged.
//! - Who reads: a `public` archive anyone, a `private` one the members logged in by an
//!   emailed link (`POST /archive/{list}/login` mails it, within the list's limits per
//!   address and per client, and answers alike for anyone; `GET /archive/{list}/login/{token}`
//!   shows a button whose `POST` sets the session cookie), membership asked at each
//!   request; `none`: 404. Readers who are not logged-in members see addresses hidden.
//! - Atom feeds of public archives: `/archive/{list}/atom`, `/archive/{list}/thread/{url_id}/atom`.
//!
//! Pages go out in `token_page`'s frame and headers: a CSP without script, image or frame.
//! Downloads are `application/octet-stream` attachments whatever the post says they are.

mod feed;
mod page;
pub(crate) mod text;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::FormRejection;
use axum::extract::{Extension, Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use pepsi_archive::read::{self, ArchiveList, Policy};
use pepsi_contract::list::{self as contract, RateKey};
use serde::Deserialize;

use crate::credentials;
use crate::error::ApiError;
use crate::extract::{AppState, ClientAddr};
use crate::lists::form;
use crate::moderate::mail::{Route, configured_web_url};
use crate::throttle::address_key;
use page::Addresses;

/// The session cookie of a private archive's reader.
const COOKIE: &str = "pepsi_archive";
/// How long an emailed login link works.
const LINK_SECS: f64 = 86_400.0;
/// How long a reader's session lasts.
const SESSION_SECS: u64 = 30 * 86_400;
/// Hits per search page, and the most pages (`store::MAX_HITS` in all).
pub const PAGE_SIZE: usize = 20;
const MAX_PAGE: usize = 10;
/// How deep a thread's tree is drawn, and how many of its nodes at most.
const MAX_DEPTH: usize = 30;
const MAX_NODES: usize = 500;
/// The nodes of a thread one page shows (`?page=N`), each post's text at most
/// `read::MAX_SHOWN_OF_MANY` bytes.
pub const THREAD_PAGE: usize = 100;
/// The posts whose bytes are read at once.
const BATCH: usize = 20;
/// Entries of a feed.
const FEED_ENTRIES: i64 = 50;

/// What the archive's routes read from the configuration at start.
struct Web {
    /// `[pepsi] LIST_WEB_URL`: the base of the login links mailed and of the feeds' URLs.
    base: Option<String>,
    /// Where the lists' mail starts, or why none can be sent.
    route: Result<Route, String>,
    /// `https` when pepsi-httpd serves TLS itself.
    scheme: &'static str,
}

impl Web {
    /// Whether the cookie may travel over plain HTTP: not when the public base is https.
    fn secure(&self) -> bool {
        self.scheme == "https"
            || self
                .base
                .as_deref()
                .is_some_and(|b| b.to_ascii_lowercase().starts_with("https://"))
    }
}

/// The routes of the archive.
pub fn routes(state: &AppState) -> Router<AppState> {
    let web = Web {
        // `lists::check` refused an unusable LIST_WEB_URL before the server started.
        base: configured_web_url(&state.cfg).ok().flatten(),
        route: Route::from_config(&state.cfg),
        scheme: if state.options.tls.is_some() {
            "https"
        } else {
            "http"
        },
    };
    Router::new()
        .route("/archive/{list}", get(index))
        .route("/archive/{list}/login", post(ask_link))
        .route("/archive/{list}/login/{token}", get(link_page).post(log_in))
        .route("/archive/{list}/search", get(search))
        .route("/archive/{list}/atom", get(list_atom))
        .route("/archive/{list}/thread/{url_id}", get(thread))
        .route("/archive/{list}/thread/{url_id}/atom", get(thread_atom))
        .route("/archive/{list}/m/{url_id}", get(message))
        .route("/archive/{list}/m/{url_id}/raw", get(raw))
        .route("/archive/{list}/m/{url_id}/part/{n}", get(part))
        .route("/archive/{list}/{month}", get(month))
        .layer(Extension(Arc::new(web)))
}

fn db(e: sqlx::Error) -> Response {
    page::error(e.into())
}

fn no_archive(what: &str) -> Response {
    page::message(
        StatusCode::NOT_FOUND,
        None,
        "Not found",
        &format!("there is no archive {what}"),
    )
}

/// The list a path names when it has an archive (`public` or `private`), else 404.
async fn archived_list(state: &AppState, text: &str) -> Result<ArchiveList, Response> {
    let Ok(name) = pepsi_list::names::named_list(text) else {
        return Err(no_archive(&format!("of a list named {text:?}")));
    };
    match read::list(&state.pool, &name).await {
        Ok(Some(l)) if l.policy != Policy::None => Ok(l),
        Ok(_) => Err(no_archive(&format!("of {name}"))),
        Err(e) => Err(db(e)),
    }
}

/// The session secret in the request's `Cookie` fields, if one is well-formed.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, value)| *name == COOKIE && credentials::is_secret(value))
        .map(|(_, value)| value)
}

/// Who reads an archive page.
struct Access {
    l: ArchiveList,
    /// The logged-in member, if any.
    reader: Option<String>,
}

impl Access {
    fn addresses(&self) -> Addresses {
        if self.reader.is_some() {
            Addresses::Shown
        } else {
            Addresses::Hidden
        }
    }
}

/// The list and its reader when the request may read its archive; else 404 (no archive)
/// or, for a private archive without a member's session, 403 with the login form.
async fn access(state: &AppState, list: &str, headers: &HeaderMap) -> Result<Access, Response> {
    let l = archived_list(state, list).await?;
    let reader = match session_cookie(headers) {
        Some(secret) => read::reader(&state.pool, l.list_id, &credentials::digest(secret))
            .await
            .map_err(db)?,
        None => None,
    };
    if l.policy == Policy::Private && reader.is_none() {
        return Err(page::login_form(StatusCode::FORBIDDEN, &l, None));
    }
    Ok(Access { l, reader })
}

async fn index(
    State(state): State<AppState>,
    Path(list): Path<String>,
    headers: HeaderMap,
) -> Response {
    let a = match access(&state, &list, &headers).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let months = read::months(&state.pool, a.l.list_id).await;
    let latest = read::latest_threads(&state.pool, a.l.list_id, 30).await;
    match (months, latest) {
        (Ok(m), Ok(t)) => page::index(&a.l, &m, &t, a.reader.as_deref()),
        (Err(e), _) | (_, Err(e)) => db(e),
    }
}

async fn month(
    State(state): State<AppState>,
    Path((list, month)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let a = match access(&state, &list, &headers).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let Some(first) = text::month(&month) else {
        return no_archive(&format!("page {month:?}: a month is YYYY-MM"));
    };
    match read::month_threads(&state.pool, a.l.list_id, first).await {
        Ok(t) => page::month(&a.l, first, &t),
        Err(e) => db(e),
    }
}

/// What a page of many posts shows of each post of `ids` (at most
/// `read::MAX_SHOWN_OF_MANY` bytes each), their bytes read [`BATCH`] posts at a time.
async fn shown(state: &AppState, ids: &[i64]) -> Result<HashMap<i64, read::Shown>, Response> {
    let mut out = HashMap::with_capacity(ids.len());
    for batch in ids.chunks(BATCH) {
        let raws = read::raws(&state.pool, batch).await.map_err(db)?;
        out.extend(
            raws.into_iter()
                .map(|(id, raw)| (id, read::shown_within(&raw, read::MAX_SHOWN_OF_MANY))),
        );
    }
    Ok(out)
}

#[derive(Debug, Deserialize)]
struct ThreadParams {
    page: Option<String>,
}

async fn thread(
    State(state): State<AppState>,
    Path((list, url_id)): Path<(String, String)>,
    headers: HeaderMap,
    params: Result<Query<ThreadParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let a = match access(&state, &list, &headers).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let pages = MAX_NODES.div_ceil(THREAD_PAGE);
    let page_no = match params.map(|Query(p)| p.page) {
        Ok(None) => 1,
        Ok(Some(p)) => match p.parse::<usize>() {
            Ok(n) if (1..=pages).contains(&n) => n,
            _ => {
                return page::message(
                    StatusCode::BAD_REQUEST,
                    Some(&a.l),
                    "Bad request",
                    &format!("page must be a number from 1 to {pages}"),
                );
            }
        },
        Err(_) => {
            return page::message(
                StatusCode::BAD_REQUEST,
                Some(&a.l),
                "Bad request",
                "the query string is not page=N",
            );
        }
    };
    let t = match text::url_id(&url_id) {
        Some(id) => read::thread_of(&state.pool, a.l.list_id, id).await,
        None => Ok(None),
    };
    let t = match t {
        Ok(Some(t)) => t,
        Ok(None) => return no_archive(&format!("thread {url_id} in {}", a.l.address)),
        Err(e) => return db(e),
    };
    let nodes = match read::thread_nodes(&state.pool, t.thread_id).await {
        Ok(n) => n,
        Err(e) => return db(e),
    };
    let order = read::tree(&nodes, MAX_DEPTH, MAX_NODES);
    let (this, more) = page_of(&order, page_no, THREAD_PAGE);
    let ids: Vec<i64> = this
        .iter()
        .filter_map(|(_, i)| nodes[*i].post.as_ref().map(|p| p.archive_id))
        .collect();
    match shown(&state, &ids).await {
        Ok(texts) => page::thread(
            &a.l,
            &t,
            &nodes,
            this,
            page::Paging {
                page: page_no,
                more,
            },
            &texts,
            a.addresses(),
        ),
        Err(r) => r,
    }
}

/// Page `page_no` (from 1) of `items` at `size` a page, and whether a next page exists.
fn page_of<T>(items: &[T], page_no: usize, size: usize) -> (&[T], bool) {
    let start = (page_no.saturating_sub(1) * size).min(items.len());
    let end = (start + size).min(items.len());
    (&items[start..end], end < items.len())
}

/// Whether a reader may download the part `row`: an attachment (a part with a file name,
/// as a post's page links it), and for a reader who is not a logged-in member, no
/// `text/*` or `message/*` part, whose addresses no one has hidden.
fn downloadable(row: &read::PartRow, a: Addresses) -> bool {
    let ct = row.content_type.to_ascii_lowercase();
    row.file_name.is_some()
        && (a == Addresses::Shown || !(ct.starts_with("text/") || ct.starts_with("message/")))
}

/// The post a path names, with its bytes.
async fn post_of(
    state: &AppState,
    a: &Access,
    url_id: &str,
) -> Result<(read::PostRow, Vec<u8>), Response> {
    let gone = || no_archive(&format!("post {url_id} in {}", a.l.address));
    let Some(id) = text::url_id(url_id) else {
        return Err(gone());
    };
    let p = read::post(&state.pool, a.l.list_id, id)
        .await
        .map_err(db)?
        .ok_or_else(gone)?;
    let raw = read::raw(&state.pool, p.archive_id)
        .await
        .map_err(db)?
        .ok_or_else(gone)?;
    Ok((p, raw))
}

async fn message(
    State(state): State<AppState>,
    Path((list, url_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let a = match access(&state, &list, &headers).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let (p, raw) = match post_of(&state, &a, &url_id).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    match read::parts(&state.pool, p.archive_id).await {
        Ok(parts) => page::post(&a.l, &p, &read::shown(&raw), &parts, a.addresses()),
        Err(e) => db(e),
    }
}

/// Bytes as a download or a raw view: never sniffed, never run, never cached (a
/// member's bytes hold addresses unhidden).
fn bytes(body: Vec<u8>, content_type: &'static str, disposition: &str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; sandbox",
        ),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    if let Ok(v) = HeaderValue::from_str(disposition) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

async fn raw(
    State(state): State<AppState>,
    Path((list, url_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let a = match access(&state, &list, &headers).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let (p, raw) = match post_of(&state, &a, &url_id).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    // The bytes hold addresses in encoded words and base64 bodies no text search hides:
    // members only.
    if a.addresses() == Addresses::Hidden {
        return page::message(
            StatusCode::FORBIDDEN,
            Some(&a.l),
            "Members only",
            "The raw post is for the list's members, logged in: it shows the addresses \
             this archive hides from others.",
        );
    }
    bytes(
        raw,
        "text/plain; charset=utf-8",
        &format!("inline; filename=\"{}.eml\"", p.url_id),
    )
}

async fn part(
    State(state): State<AppState>,
    Path((list, url_id, n)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let a = match access(&state, &list, &headers).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let (p, raw) = match post_of(&state, &a, &url_id).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let gone = || no_archive(&format!("part {n} of post {url_id}"));
    let Ok(index) = n.parse::<i32>() else {
        return gone();
    };
    let parts = match read::parts(&state.pool, p.archive_id).await {
        Ok(parts) => parts,
        Err(e) => return db(e),
    };
    let Some(row) = parts
        .iter()
        .find(|x| x.part_index == index && downloadable(x, a.addresses()))
    else {
        return gone();
    };
    let Some(contents) = read::part_contents(&raw, index as usize) else {
        return gone();
    };
    let name = text::file_name(row.file_name.as_deref(), index as usize);
    bytes(
        contents,
        "application/octet-stream",
        &format!("attachment; filename=\"{name}\""),
    )
}

#[derive(Debug, Deserialize)]
struct SearchParams {
    q: Option<String>,
    page: Option<String>,
}

async fn search(
    State(state): State<AppState>,
    Path(list): Path<String>,
    headers: HeaderMap,
    params: Result<Query<SearchParams>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let a = match access(&state, &list, &headers).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let Ok(Query(params)) = params else {
        return page::search(
            StatusCode::BAD_REQUEST,
            &a.l,
            "",
            &[],
            1,
            false,
            Some("the query string is not q=...&page=N"),
            a.addresses(),
        );
    };
    let q = params.q.unwrap_or_default();
    let page_no = match params.page.as_deref().map(str::parse::<usize>) {
        None => 1,
        Some(Ok(p)) if (1..=MAX_PAGE).contains(&p) => p,
        Some(_) => {
            return page::search(
                StatusCode::BAD_REQUEST,
                &a.l,
                &q,
                &[],
                1,
                false,
                Some(&format!("page must be a number from 1 to {MAX_PAGE}")),
                a.addresses(),
            );
        }
    };
    if q.trim().is_empty() {
        return page::search(StatusCode::OK, &a.l, "", &[], 1, false, None, a.addresses());
    }
    let want = (page_no * PAGE_SIZE + 1) as i64;
    let shown = a.addresses() == Addresses::Shown;
    match pepsi_archive::store::search(&state.pool, a.l.list_id, &q, want, shown).await {
        Ok(hits) => {
            let more = hits.len() > page_no * PAGE_SIZE;
            let shown: Vec<_> = hits
                .into_iter()
                .skip((page_no - 1) * PAGE_SIZE)
                .take(PAGE_SIZE)
                .collect();
            page::search(
                StatusCode::OK,
                &a.l,
                &q,
                &shown,
                page_no,
                more,
                None,
                a.addresses(),
            )
        }
        Err(pepsi_archive::store::Error::Query(e)) => page::search(
            StatusCode::BAD_REQUEST,
            &a.l,
            &q,
            &[],
            1,
            false,
            Some(&format!("The query cannot be read: {e}.")),
            a.addresses(),
        ),
        Err(pepsi_archive::store::Error::Database(e)) => db(e),
    }
}

/// The origin of the feeds' URLs: the public base, else the request's.
fn origin(web: &Web, headers: &HeaderMap) -> String {
    match &web.base {
        Some(b) => b.trim_end_matches('/').to_owned(),
        None => {
            let host = headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("localhost");
            format!("{}://{host}", web.scheme)
        }
    }
}

/// The list of a feed: public archives only.
async fn public_list(state: &AppState, list: &str) -> Result<ArchiveList, Response> {
    let l = archived_list(state, list).await?;
    if l.policy == Policy::Public {
        Ok(l)
    } else {
        Err(no_archive(&format!("feed of {}", l.address)))
    }
}

async fn list_atom(
    State(state): State<AppState>,
    Extension(web): Extension<Arc<Web>>,
    Path(list): Path<String>,
    headers: HeaderMap,
) -> Response {
    let l = match public_list(&state, &list).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let posts = match read::latest_posts(&state.pool, l.list_id, FEED_ENTRIES).await {
        Ok(p) => p,
        Err(e) => return db(e),
    };
    let posts: Vec<&read::PostRow> = posts.iter().collect();
    let o = origin(&web, &headers);
    let self_url = format!("{o}/archive/{}/atom", l.address);
    feed_of(
        &state,
        &o,
        &l,
        &format!("Archive of {}", l.address),
        &self_url,
        &posts,
    )
    .await
}

/// The Atom feed of `posts` (newest first), each with its text as a reader sees it.
async fn feed_of(
    state: &AppState,
    origin: &str,
    l: &ArchiveList,
    title: &str,
    self_url: &str,
    posts: &[&read::PostRow],
) -> Response {
    let ids: Vec<i64> = posts.iter().map(|p| p.archive_id).collect();
    let texts = match shown(state, &ids).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let entries: Vec<feed::Entry> = posts
        .iter()
        .map(|p| feed::Entry {
            post: p,
            shown: texts.get(&p.archive_id),
        })
        .collect();
    feed::send(feed::atom(origin, l, title, self_url, &entries))
}

async fn thread_atom(
    State(state): State<AppState>,
    Extension(web): Extension<Arc<Web>>,
    Path((list, url_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let l = match public_list(&state, &list).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let t = match text::url_id(&url_id) {
        Some(id) => read::thread_of(&state.pool, l.list_id, id).await,
        None => Ok(None),
    };
    let t = match t {
        Ok(Some(t)) => t,
        Ok(None) => return no_archive(&format!("thread {url_id} in {}", l.address)),
        Err(e) => return db(e),
    };
    let nodes = match read::thread_nodes(&state.pool, t.thread_id).await {
        Ok(n) => n,
        Err(e) => return db(e),
    };
    let mut posts: Vec<&read::PostRow> = nodes.iter().filter_map(|n| n.post.as_ref()).collect();
    posts.sort_by_key(|p| std::cmp::Reverse((p.date, p.archive_id)));
    posts.truncate(FEED_ENTRIES as usize);
    let o = origin(&web, &headers);
    let self_url = format!("{o}/archive/{}/thread/{}/atom", l.address, t.root_url_id);
    let subject = if t.subject.is_empty() {
        "(no subject)"
    } else {
        &t.subject
    };
    feed_of(&state, &o, &l, subject, &self_url, &posts).await
}

type Fields = Result<Form<Vec<(String, String)>>, FormRejection>;

/// Whether a form posted here may act (`lists::same_site`), or the 403 page.
#[allow(clippy::result_large_err)]
fn from_this_site(web: &Web, headers: &HeaderMap) -> Result<(), Response> {
    crate::lists::same_site(web.scheme, web.base.as_deref(), headers).map_err(page::error)
}

/// `POST /archive/{list}/login`: a login link mailed when the address is a member, within
/// the list's limits per address and per client (those of the lists' mailed links); the
/// answer is the same whatever happened.
async fn ask_link(
    State(state): State<AppState>,
    Extension(web): Extension<Arc<Web>>,
    Path(list): Path<String>,
    client: ClientAddr,
    headers: HeaderMap,
    f: Fields,
) -> Response {
    if let Err(r) = from_this_site(&web, &headers) {
        return r;
    }
    let l = match archived_list(&state, &list).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let fields = match f {
        Ok(Form(v)) => v,
        Err(e) => {
            return page::login_form(
                e.status(),
                &l,
                Some(&format!(
                    "the request is not a form (application/x-www-form-urlencoded): {e}"
                )),
            );
        }
    };
    let address = match form::bounded(&fields).and_then(|()| {
        pepsi_list::names::member_address(form::field(&fields, "address").unwrap_or_default())
    }) {
        Ok(a) => a,
        Err(e) => return page::login_form(StatusCode::BAD_REQUEST, &l, Some(&e)),
    };
    let Some(base) = web.base.as_deref() else {
        return page::login_form(
            StatusCode::SERVICE_UNAVAILABLE,
            &l,
            Some("Links by mail need [pepsi] LIST_WEB_URL, which this server does not set."),
        );
    };
    let route = match &web.route {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("the archive cannot send login links: {e}");
            return page::error(ApiError::busy(
                "this server sends no list mail now (its configuration has no usable list stage)",
                3600,
            ));
        }
    };
    let client = address_key(client.ip());
    if let Err(e) = send_link(&state, route, base, &l, &address, &client).await {
        return page::error(e);
    }
    page::login_form(
        StatusCode::OK,
        &l,
        Some(&format!(
            "If {address} is a member of {}, a link to read its archive is on its way there. \
             It works for a day.",
            l.address
        )),
    )
}

/// Counts the request against both limits (both, even when the first refuses) and, when
/// they allow it and `address` is a member, records the link and queues its mail, in one
/// transaction.
async fn send_link(
    state: &AppState,
    route: &Route,
    base: &str,
    l: &ArchiveList,
    address: &str,
    client: &str,
) -> Result<(), ApiError> {
    let mut tx = state.pool.begin().await?;
    let by_address =
        contract::count_confirmation(&mut tx, l.list_id, RateKey::Address, address).await?;
    let by_client =
        contract::count_confirmation(&mut tx, l.list_id, RateKey::Client, client).await?;
    if !(by_address && by_client) {
        tx.commit().await?;
        tracing::warn!(list = %l.address, %address, %client, "archive link limit reached: none sent");
        return Ok(());
    }
    if !contract::is_member(&mut *tx, l.list_id, address).await? {
        tx.commit().await?;
        return Ok(());
    }
    let token =
        contract::new_token().map_err(|e| ApiError::internal(format!("no random bytes: {e}")))?;
    read::add_login_link(
        &mut tx,
        l.list_id,
        address,
        &contract::token_hash(&token),
        LINK_SECS,
    )
    .await?;
    let text = format!(
        "Someone, probably you, asked to read the archive of {list}.\r\n\r\n\
         Open this link within a day to read it:\r\n\r\n\
         {base}/archive/{list}/login/{token}\r\n\r\n\
         If you did not ask, ignore this message.\r\n",
        list = l.address,
        base = base.trim_end_matches('/'),
    );
    let raw = crate::moderate::mail::compose(
        route,
        &l.address,
        address,
        &format!("The archive of {}", l.address),
        &text,
        None,
    )
    .map_err(ApiError::internal)?;
    crate::moderate::mail::queue(&mut tx, route, &l.address, address, &raw).await?;
    tx.commit().await?;
    crate::moderate::store::wake(&state.pool).await;
    Ok(())
}

fn link_gone(l: &ArchiveList) -> Response {
    page::message(
        StatusCode::NOT_FOUND,
        Some(l),
        "Link used or expired",
        "This login link is unknown, used already or expired. Ask for a new one on the \
         archive's page.",
    )
}

async fn link_page(
    State(state): State<AppState>,
    Path((list, token)): Path<(String, String)>,
) -> Response {
    let l = match archived_list(&state, &list).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let Some(token) = form::list_token(&token) else {
        return link_gone(&l);
    };
    match read::login_link(&state.pool, l.list_id, &contract::token_hash(&token)).await {
        Ok(Some(_)) => page::login_link(&l, &format!("{}/login/{token}", page::base(&l))),
        Ok(None) => link_gone(&l),
        Err(e) => db(e),
    }
}

/// `POST /archive/{list}/login/{token}`: the link used once, a session opened and its
/// cookie set (HttpOnly, SameSite=Lax, Secure over https, for the list's archive alone).
async fn log_in(
    State(state): State<AppState>,
    Extension(web): Extension<Arc<Web>>,
    Path((list, token)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = from_this_site(&web, &headers) {
        return r;
    }
    let l = match archived_list(&state, &list).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let Some(token) = form::list_token(&token) else {
        return link_gone(&l);
    };
    let secret = credentials::new_secret();
    let opened = read::open_session(
        &state.pool,
        l.list_id,
        &contract::token_hash(&token),
        &credentials::digest(&secret),
        SESSION_SECS as f64,
    )
    .await;
    match opened {
        Ok(Some(address)) => {
            let mut r = page::message(
                StatusCode::OK,
                Some(&l),
                "Logged in",
                &format!("You read the archive of {} as {address}.", l.address),
            );
            let cookie = format!(
                "{COOKIE}={secret}; Path={}; Max-Age={SESSION_SECS}; HttpOnly; SameSite=Lax{}",
                page::base(&l),
                if web.secure() { "; Secure" } else { "" }
            );
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            tracing::info!(list = %l.address, %address, "archive reader logged in");
            r
        }
        Ok(None) => link_gone(&l),
        Err(e) => db(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_a_slice_and_says_whether_more_follow() {
        let items: Vec<u32> = (0..250).collect();
        let cases: &[(usize, usize, usize, bool)] = &[
            (1, 0, 100, true),
            (2, 100, 100, true),
            (3, 200, 50, false),
            (4, 250, 0, false),
        ];
        for (page, first, len, more) in cases {
            let (got, m) = page_of(&items, *page, 100);
            assert_eq!(got.len(), *len, "page {page}");
            assert_eq!(
                got.first().copied(),
                items.get(*first).copied(),
                "page {page}"
            );
            assert_eq!(m, *more, "page {page}");
        }
        assert_eq!(page_of(&items[..100], 1, 100), (&items[..100], false));
    }

    #[test]
    fn attachments_only_and_no_text_or_message_parts_for_others() {
        let part = |ct: &str, name: Option<&str>| read::PartRow {
            part_index: 1,
            content_type: ct.into(),
            file_name: name.map(Into::into),
            size: 1,
        };
        let cases: &[(&str, Option<&str>, bool, bool)] = &[
            // (type, file name, for others, for members)
            ("application/pdf", Some("a.pdf"), true, true),
            ("image/png", Some("a.png"), true, true),
            ("text/plain", None, false, false),
            ("application/pdf", None, false, false),
            ("text/html", Some("a.html"), false, true),
            ("TEXT/Plain", Some("a.txt"), false, true),
            ("message/rfc822", Some("fwd.eml"), false, true),
        ];
        for (ct, name, others, members) in cases {
            assert_eq!(
                downloadable(&part(ct, *name), Addresses::Hidden),
                *others,
                "{ct} {name:?}"
            );
            assert_eq!(
                downloadable(&part(ct, *name), Addresses::Shown),
                *members,
                "{ct} {name:?}"
            );
        }
    }
}
