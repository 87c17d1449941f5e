//! The confirm-to-send secretary's pages (docs/secretary.md; docs/httpd.md, "The secretary's
//! pages"), through `pepsi_secretary::store`, never with SQL of its own:
//!
//! - The sender's page, `/secretary/{token}` (the challenge mail's link): `GET` says to whom
//!   they wrote, how many messages wait and asks the token's human check
//!   (`token::HumanCheck`), with the postage link where the challenge offers one; it never
//!   confirms anything, so a link scanner's visit does nothing. `POST` with the right
//!   `answer` confirms (`store::confirm`, by link): the held messages of that sender for
//!   that mailbox that the sender was asked about are released and the sender whitelisted.
//!   A wrong answer is 422 with the
//!   form again; wrong answers are counted per client address and per challenge, and past
//!   their limits every answer is refused for a while (429).
//! - The owner's page, `/secretary/held/{token}` (the digest's link, a
//!   `secretary_owner_link` row): the mailbox's held mail with Release and Discard
//!   (`POST .../{held_id}/release|discard`, `store::decide` for that mailbox alone, then 303
//!   back to the page), and auto-pay's payments.
//!
//! Tokens are in the paths: pepsi-httpd writes no request path to its log, and pages go
//! out with `Referrer-Policy: no-referrer` and `no-store` (`token_page`). Every form is
//! checked to come from this site (`lists::same_site`), the public base being
//! `[pepsi] SECRETARY_URL`, else `SECURE_LINK_URL`, as the secretary stage mails it.

mod form;
mod page;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::rejection::FormRejection;
use axum::extract::{Extension, Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use pepsi_secretary::store::{self, DecideError, Decision, How};
use pepsi_secretary::token::{HumanCheck, Token};

use crate::extract::{AppState, ClientAddr, now};
use crate::throttle::{Throttle, address_key};
use form::Standing;

/// The most held messages the owner's page lists.
const MAX_SHOWN: i64 = 200;
/// The most payments the owner's page lists.
const MAX_PAYMENTS: i64 = 50;

/// Wrong answers counted in this process: per client address and per challenge.
struct Wrong {
    by_client: Throttle,
    by_token: Throttle,
}

/// What the pages read from the configuration at start, and the wrong answers counted.
struct Secretary {
    /// `[pepsi] SECRETARY_URL`, else `SECURE_LINK_URL`: the public base of the links.
    base: Option<String>,
    /// `https` when pepsi-httpd serves TLS itself.
    scheme: &'static str,
    wrong: Mutex<Wrong>,
}

/// The public base the secretary's links carry, as the stage reads it; an unusable value
/// is logged and the origin check falls back to the request's own host.
fn public_base(cfg: &pepsi_conf::config::Config) -> Option<String> {
    let pepsi = cfg.section("pepsi");
    let chosen = match pepsi.string_opt("SECRETARY_URL") {
        Ok(Some(v)) if !v.trim().is_empty() => Ok(("SECRETARY_URL", Some(v))),
        Ok(_) => pepsi
            .string_opt("SECURE_LINK_URL")
            .map(|v| ("SECURE_LINK_URL", v)),
        Err(e) => Err(e),
    };
    let base = chosen.map_err(|e| e.to_string()).and_then(|(name, v)| {
        pepsi_conf::config::https_origin(
            name,
            "the public base of pepsi-httpd's pages",
            v.as_deref(),
        )
    });
    base.unwrap_or_else(|e| {
        tracing::error!("the secretary's pages: {e}");
        None
    })
}

/// The routes of the secretary's pages.
pub fn routes(state: &AppState) -> Router<AppState> {
    let secretary = Secretary {
        base: public_base(&state.cfg),
        scheme: if state.options.tls.is_some() {
            "https"
        } else {
            "http"
        },
        wrong: Mutex::new(Wrong {
            by_client: Throttle::new(form::WRONG_WINDOW, form::WRONG_PER_CLIENT, 100_000),
            by_token: Throttle::new(form::WRONG_WINDOW, form::WRONG_PER_TOKEN, 100_000),
        }),
    };
    Router::new()
        .route("/secretary/{token}", get(challenge_page).post(confirm))
        .route("/secretary/held/{token}", get(owner_page))
        .route("/secretary/held/{token}/{held_id}/release", post(release))
        .route("/secretary/held/{token}/{held_id}/discard", post(discard))
        .layer(Extension(Arc::new(secretary)))
}

type Fields = Result<Form<Vec<(String, String)>>, FormRejection>;

/// Whether a form posted here may act (`lists::same_site`), or the 403 page.
#[allow(clippy::result_large_err)]
fn from_this_site(s: &Secretary, headers: &HeaderMap) -> Result<(), Response> {
    crate::lists::same_site(s.scheme, s.base.as_deref(), headers).map_err(page::error)
}

/// The challenge of a path's token, when it is open; else the page saying where it stands.
async fn open_challenge(
    state: &AppState,
    text: &str,
) -> Result<(Token, store::ChallengeView), Response> {
    let Some(token) = Token::parse(text) else {
        return Err(page::unknown());
    };
    let c = match store::challenge(&state.pool, &token).await {
        Ok(Some(c)) => c,
        Ok(None) => return Err(page::unknown()),
        Err(e) => return Err(page::error(e.into())),
    };
    match form::standing(&c, chrono::Utc::now()) {
        Standing::Open => Ok((token, c)),
        Standing::Confirmed => Err(page::already(&c.mailbox, c.confirmed_by.as_deref())),
        Standing::Expired => Err(page::expired(&c)),
    }
}

/// `GET /secretary/{token}`: the question. It changes nothing.
async fn challenge_page(State(state): State<AppState>, Path(token): Path<String>) -> Response {
    match open_challenge(&state, &token).await {
        Ok((token, c)) => page::ask(StatusCode::OK, &token, &c, None),
        Err(r) => r,
    }
}

/// `POST /secretary/{token}`: the answer; the right one confirms.
async fn confirm(
    State(state): State<AppState>,
    Extension(s): Extension<Arc<Secretary>>,
    Path(token): Path<String>,
    client: ClientAddr,
    headers: HeaderMap,
    f: Fields,
) -> Response {
    if let Err(r) = from_this_site(&s, &headers) {
        return r;
    }
    let (token, c) = match open_challenge(&state, &token).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let fields = match f {
        Ok(Form(v)) => v,
        Err(e) => return page::ask(e.status(), &token, &c, Some(&e.body_text())),
    };
    let answer = match form::answer(&fields) {
        Ok(a) => a,
        Err(e) => return page::ask(StatusCode::UNPROCESSABLE_ENTITY, &token, &c, Some(&e)),
    };
    // Counted before it is checked, in the same critical section as the limits, so that
    // answers sent at once cannot all pass; a right answer gives its count back.
    let (client, token_key) = (address_key(client.ip()), form::token_key(&token));
    let reserved = {
        let mut w = s.wrong.lock().unwrap_or_else(|e| e.into_inner());
        let t = now();
        let wait = w
            .by_client
            .blocked(&client, t)
            .max(w.by_token.blocked(&token_key, t));
        if let Some(wait) = wait {
            return page::too_many(wait.as_secs().max(1));
        }
        (
            w.by_client.reserve(&client, t),
            w.by_token.reserve(&token_key, t),
        )
    };
    if !HumanCheck::for_token(&token).accepts(answer) {
        return page::ask(
            StatusCode::UNPROCESSABLE_ENTITY,
            &token,
            &c,
            Some(
                "That is not the right answer. Read the question again and type the sum in digits.",
            ),
        );
    }
    {
        let mut w = s.wrong.lock().unwrap_or_else(|e| e.into_inner());
        w.by_client.release(&client, reserved.0);
        w.by_token.release(&token_key, reserved.1);
    }
    match store::confirm(&state.pool, &token.digest(), How::Link).await {
        Ok(r) if r.changed => {
            let mailbox = r.mailbox.as_deref().unwrap_or(&c.mailbox);
            tracing::info!(
                %mailbox,
                released = r.released,
                "a sender confirmed on the secretary's page"
            );
            page::confirmed(mailbox, r.released)
        }
        Ok(r) if !r.found => page::unknown(),
        // Confirmed or expired between the page's reading and this call.
        Ok(r) if r.confirmed_by.is_some() => page::already(
            r.mailbox.as_deref().unwrap_or(&c.mailbox),
            r.confirmed_by.as_deref(),
        ),
        Ok(_) => page::expired(&c),
        Err(e) => page::error(e.into()),
    }
}

/// The mailbox a path's owner token opens, or the 404 page.
async fn owner_of(state: &AppState, text: &str) -> Result<(Token, String), Response> {
    let Some(token) = Token::parse(text) else {
        return Err(page::owner_unknown());
    };
    match store::owner_of(&state.pool, &token).await {
        Ok(Some(mailbox)) => Ok((token, mailbox)),
        Ok(None) => Err(page::owner_unknown()),
        Err(e) => Err(page::error(e.into())),
    }
}

/// `GET /secretary/held/{token}`: the owner's held mail and payments.
async fn owner_page(State(state): State<AppState>, Path(token): Path<String>) -> Response {
    let (token, mailbox) = match owner_of(&state, &token).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let read = async {
        let held = store::held(&state.pool, Some(&mailbox), false, MAX_SHOWN).await?;
        let payments = store::payments(&state.pool, Some(&mailbox), MAX_PAYMENTS).await?;
        Ok::<_, sqlx::Error>((held, payments))
    }
    .await;
    match read {
        Ok((held, payments)) => page::owner(&mailbox, &store::owner_path(&token), &held, &payments),
        Err(e) => page::error(e.into()),
    }
}

/// `POST /secretary/held/{token}/{held_id}/release`.
async fn release(
    State(state): State<AppState>,
    Extension(s): Extension<Arc<Secretary>>,
    Path((token, held_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    decide(&state, &s, &token, &held_id, &headers, Decision::Release).await
}

/// `POST /secretary/held/{token}/{held_id}/discard`.
async fn discard(
    State(state): State<AppState>,
    Extension(s): Extension<Arc<Secretary>>,
    Path((token, held_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    decide(&state, &s, &token, &held_id, &headers, Decision::Discard).await
}

/// The owner's decision on one of the mailbox's held messages, then back to the page.
async fn decide(
    state: &AppState,
    s: &Secretary,
    token: &str,
    held_id: &str,
    headers: &HeaderMap,
    decision: Decision,
) -> Response {
    if let Err(r) = from_this_site(s, headers) {
        return r;
    }
    let (token, mailbox) = match owner_of(state, token).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let not_held = || {
        page::message(
            StatusCode::NOT_FOUND,
            "No such message",
            "That message is not among your held mail.",
        )
    };
    let Some(id) = form::held_id(held_id) else {
        return not_held();
    };
    let by = format!("owner:{mailbox}");
    match store::decide(&state.pool, id, Some(&mailbox), decision, &by).await {
        Ok(d) => {
            if d.changed {
                tracing::info!(%mailbox, held_id = id, status = %d.status, "held mail decided by its owner");
            }
            Redirect::to(&store::owner_path(&token)).into_response()
        }
        Err(DecideError::NotFound(_)) => not_held(),
        Err(DecideError::Database(e)) => page::error(e.into()),
    }
}
