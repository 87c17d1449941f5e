//! A list's archive for administrators (docs/api.md, "The lists' archive"; docs/archive.md,
//! "The admin API"): its summary with the imports, search, one post with its parts, purge,
//! and the mbox export as a gzip download. Everything goes through `pepsi_archive` as the
//! operator tool `pepsi-archive` does it: the search of `store::search` (addresses shown, the
//! syntax of `pepsi_archive::query`), the purges of `store::purge_posts` and
//! `store::purge_author` (their `archive_event_log` and `event_log` rows, the administrator
//! as actor), the mbox of `pepsi_archive::export`. No SQL of its own.
//!
//! Status codes: 400 for input that is not valid (the message names it), 404 for a list or
//! post that is not there, and for reading the posts of a list whose `archive_policy` is
//! `none` (its summary still answers).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper::body::{Bytes, Frame};
use pepsi_archive::export::{self, Export, GzipChunks};
use pepsi_archive::read::{self, ArchiveList, PartRow, Policy, PostRow};
use pepsi_archive::store::{self, Hit, Scope, Summary};
use pepsi_list::names;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::error::{ApiError, ApiResult};
use crate::extract::{AppState, Body, Pairs, Principal};

/// Hits a search answers unless `limit` says otherwise (at most `store::MAX_HITS`).
const DEFAULT_HITS: i64 = 20;
/// The most imports the summary lists, newest first.
const MAX_IMPORTS: i64 = 100;

/// The routes of the archive API.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/lists/{list}/archive", get(summary))
        .route("/api/lists/{list}/archive/search", get(search))
        .route("/api/lists/{list}/archive/messages/{url_id}", get(message))
        .route("/api/lists/{list}/archive/purge", post(purge))
        .route("/api/lists/{list}/archive/export", get(download))
}

/// The list `text` names: 400 for no list address, 404 for no such list.
async fn list(state: &AppState, text: &str) -> ApiResult<ArchiveList> {
    let address = names::named_list(text).map_err(ApiError::bad_request)?;
    read::list(&state.pool, &address)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("there is no list {address}")))
}

/// The list `text` names, for reading its posts: also 404 when it keeps no archive.
async fn archived(state: &AppState, text: &str) -> ApiResult<ArchiveList> {
    let l = list(state, text).await?;
    if l.policy == Policy::None {
        return Err(ApiError::not_found(format!(
            "the list {} keeps no archive (archive_policy none)",
            l.address
        )));
    }
    Ok(l)
}

fn url_id(text: &str) -> ApiResult<String> {
    if pepsi_archive::url::is_url_id(text) {
        Ok(text.to_owned())
    } else {
        Err(ApiError::bad_request(format!(
            "{text:?} is not a url id: expected the 32 lower-case hex digits of a post's link"
        )))
    }
}

fn no_post(l: &ArchiveList, url_id: &str) -> ApiError {
    ApiError::not_found(format!("the archive of {} has no post {url_id}", l.address))
}

fn failed(e: store::Error) -> ApiError {
    match e {
        store::Error::Query(q) => ApiError::bad_request(format!("query: {q}")),
        store::Error::Database(e) => e.into(),
    }
}

/// Every parameter of `pairs` is one of `known`.
fn only(pairs: &[(String, String)], known: &[&str]) -> ApiResult<()> {
    match pairs.iter().find(|(k, _)| !known.contains(&k.as_str())) {
        Some((k, _)) => Err(ApiError::bad_request(format!(
            "unknown parameter {k:?}: this route takes {}",
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

fn param<'p>(pairs: &'p [(String, String)], name: &str) -> Option<&'p str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `GET /api/lists/{list}/archive`.
#[derive(Serialize)]
pub struct ArchiveSummary {
    list: String,
    archive_policy: Policy,
    #[serde(flatten)]
    counts: Summary,
    /// Newest first, at most `MAX_IMPORTS`.
    imports: Vec<store::Import>,
}

async fn summary(
    State(state): State<AppState>,
    _who: Principal,
    Path(text): Path<String>,
) -> ApiResult<Json<ArchiveSummary>> {
    let l = list(&state, &text).await?;
    let counts = store::summary(&state.pool, l.list_id)
        .await
        .map_err(failed)?;
    let imports = store::imports(&state.pool, l.list_id, MAX_IMPORTS)
        .await
        .map_err(failed)?;
    Ok(Json(ArchiveSummary {
        list: l.address,
        archive_policy: l.policy,
        counts,
        imports,
    }))
}

/// `GET /api/lists/{list}/archive/search`.
#[derive(Serialize)]
pub struct Hits {
    list: String,
    query: String,
    limit: i64,
    /// Best first.
    hits: Vec<Hit>,
}

async fn search(
    State(state): State<AppState>,
    _who: Principal,
    Path(text): Path<String>,
    Pairs(pairs): Pairs,
) -> ApiResult<Json<Hits>> {
    only(&pairs, &["q", "limit"])?;
    let q = param(&pairs, "q")
        .ok_or_else(|| ApiError::bad_request("q is required: what to find (docs/archive.md)"))?;
    let limit = match param(&pairs, "limit") {
        None => DEFAULT_HITS,
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=store::MAX_HITS).contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "limit {v:?} is not valid: 1 to {}",
                    store::MAX_HITS
                ))
            })?,
    };
    pepsi_archive::query::parse(q).map_err(|e| ApiError::bad_request(format!("q {q:?}: {e}")))?;
    let l = archived(&state, &text).await?;
    // The administrator sees addresses, so `from:` matches any part of one.
    let hits = store::search(&state.pool, l.list_id, q, limit, true)
        .await
        .map_err(failed)?;
    Ok(Json(Hits {
        list: l.address,
        query: q.to_owned(),
        limit,
        hits,
    }))
}

/// `GET /api/lists/{list}/archive/messages/{url_id}`.
#[derive(Serialize)]
pub struct Message {
    list: String,
    #[serde(flatten)]
    post: PostRow,
    /// The post's bytes as archived.
    size: usize,
    /// Its leaf parts, in order.
    parts: Vec<PartRow>,
    /// Its first text/plain body part, at most `read::MAX_SHOWN` bytes; none for a post
    /// without one (HTML alone).
    text: Option<String>,
    /// The text was cut.
    truncated: bool,
}

async fn message(
    State(state): State<AppState>,
    _who: Principal,
    Path((text, id)): Path<(String, String)>,
) -> ApiResult<Json<Message>> {
    let id = url_id(&id)?;
    let l = archived(&state, &text).await?;
    let post = read::post(&state.pool, l.list_id, &id)
        .await?
        .ok_or_else(|| no_post(&l, &id))?;
    // Purged between the two reads: gone.
    let raw = read::raw(&state.pool, post.archive_id)
        .await?
        .ok_or_else(|| no_post(&l, &id))?;
    let parts = read::parts(&state.pool, post.archive_id).await?;
    let shown = read::shown(&raw);
    Ok(Json(Message {
        list: l.address,
        post,
        size: raw.len(),
        parts,
        truncated: shown.text.is_some() && shown.truncated,
        text: shown.text,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Purge {
    /// The post to purge.
    url_id: Option<String>,
    /// Or the author whose every post of the list is purged.
    address: Option<String>,
}

async fn purge(
    State(state): State<AppState>,
    p: Principal,
    Path(text): Path<String>,
    Body(req): Body<Purge>,
) -> ApiResult<Response> {
    let who = store::Who {
        actor: p.actor(),
        name: p.name.clone(),
    };
    match (req.url_id, req.address) {
        (Some(id), None) => {
            let id = url_id(&id)?;
            let l = list(&state, &text).await?;
            let mut tx = state.pool.begin().await?;
            let done = store::purge_posts(
                &mut tx,
                &who,
                l.list_id,
                &l.address,
                std::slice::from_ref(&id),
            )
            .await
            .map_err(failed)?;
            if done.purged.is_empty() {
                return Err(no_post(&l, &id));
            }
            tx.commit().await?;
            Ok(Json(done).into_response())
        }
        (None, Some(address)) => {
            let address = store::author_address(&address)
                .map_err(|e| ApiError::bad_request(format!("address {e}")))?;
            let l = list(&state, &text).await?;
            let mut tx = state.pool.begin().await?;
            let done = store::purge_author(&mut tx, &who, &address, Some((l.list_id, &l.address)))
                .await
                .map_err(failed)?;
            if done.purged == 0 {
                return Err(ApiError::not_found(format!(
                    "the archive of {} has no post by {address}",
                    l.address
                )));
            }
            tx.commit().await?;
            Ok(Json(done).into_response())
        }
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "give url_id or address, not both: one purge at a time",
        )),
        (None, None) => Err(ApiError::bad_request(
            "give the url_id of a post, or the address of an author whose posts go",
        )),
    }
}

/// The compressed mbox as it is made, a batch of posts at a time.
struct Chunks(mpsc::Receiver<std::io::Result<Bytes>>);

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|c| c.map(|r| r.map(Frame::data)))
    }
}

/// `name` with only ASCII letters, digits, `.`, `-`, `_` and `@` (others `_`), for a file
/// name in a header.
fn file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

async fn download(
    State(state): State<AppState>,
    _who: Principal,
    Path(text): Path<String>,
    Pairs(pairs): Pairs,
) -> ApiResult<Response> {
    only(&pairs, &["month", "thread"])?;
    let wanted = match (param(&pairs, "month"), param(&pairs, "thread")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give month or thread, not both (neither: the whole archive)",
            ));
        }
        (Some(m), None) => {
            let month = export::month(m).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "month {m:?} is not a month: expected YYYY-MM, e.g. 2026-03"
                ))
            })?;
            Some(Ok(month))
        }
        (None, Some(t)) => Some(Err(url_id(t)?)),
        (None, None) => None,
    };
    let l = archived(&state, &text).await?;
    let (scope, name) = match wanted {
        None => (Scope::All, l.address.clone()),
        Some(Ok(month)) => (
            Scope::Month(month),
            format!("{}-{}", l.address, month.format("%Y-%m")),
        ),
        Some(Err(id)) => {
            let thread = read::thread_of(&state.pool, l.list_id, &id)
                .await?
                .ok_or_else(|| no_post(&l, &id))?;
            (
                Scope::Thread(thread.thread_id),
                format!("{}-thread-{id}", l.address),
            )
        }
    };
    // The first batch here, so that a failure to read is still a 500 of its own; the rest
    // as the client takes it (a failure then cuts the download, and gzip says so).
    let mut export = Export::new(l.list_id, scope);
    let mut gz = GzipChunks::new();
    export
        .next_batch(&state.pool, &mut gz)
        .await
        .map_err(ApiError::internal)?;
    let (tx, rx) = mpsc::channel(2);
    let first = gz.take();
    if !first.is_empty() {
        let _ = tx.try_send(Ok(Bytes::from(first)));
    }
    let pool = state.pool.clone();
    let list_name = l.address.clone();
    tokio::spawn(async move {
        loop {
            match export.next_batch(&pool, &mut gz).await {
                Ok(true) => {
                    let chunk = gz.take();
                    // Nothing compressed out yet; an empty frame would say nothing.
                    if !chunk.is_empty() && tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                        return;
                    }
                }
                Ok(false) => break,
                Err(e) => {
                    tracing::error!("the archive export of {list_name} stopped: {e}");
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
            }
        }
        let last = gz.finish();
        let _ = tx.send(last.map(Bytes::from)).await;
    });
    let mut r = axum::body::Body::new(Chunks(rx)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/gzip"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"{}.mbox.gz\"",
        file_name(&name)
    )) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    // The posts' bytes hold every address unhidden.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn download_names_keep_to_safe_characters() {
        let cases = [
            ("team@example.org-2026-03", "team@example.org-2026-03"),
            ("a\"b@x.test", "a_b@x.test"),
            ("é b;c@x.test", "__b_c@x.test"),
        ];
        for (name, want) in cases {
            assert_eq!(file_name(name), want, "{name}");
        }
    }
}
