//! The markup of the secretary's pages (maud: every address, subject and amount is
//! escaped), in the frame of `token_page`: no script, no image, no frame, never cached, no
//! Referer. A postage URI becomes a link only when it is a `taler` URI.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use pepsi_secretary::mail::shown_subject;
use pepsi_secretary::store::{ChallengeView, Held, Payment};
use pepsi_secretary::token::{self, HumanCheck, Token};

use super::form;
use crate::error::ApiError;
use crate::token_page::{self, send};

fn frame(title: &str, content: Markup) -> Markup {
    token_page::frame(title, "Mail confirmation", "secretary", content)
}

fn date(d: DateTime<Utc>) -> String {
    d.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// A page with a title and one paragraph.
pub fn message(status: StatusCode, title: &str, text: &str) -> Response {
    send(
        status,
        frame(
            title,
            html! { h1 { (title) } p #message role="status" { (text) } },
        ),
    )
}

/// An error as a page: its status and message (an internal error's is generic).
pub fn error(e: ApiError) -> Response {
    let title = e.status.canonical_reason().unwrap_or("Error");
    let mut r = message(e.status, title, &e.message);
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// A confirmation link that is not one of ours (or not whole).
pub fn unknown() -> Response {
    message(
        StatusCode::NOT_FOUND,
        "Link not found",
        "This link is not known here, or it is incomplete. Copy the whole link from the \
         message you received.",
    )
}

/// A challenge past its expiry.
pub fn expired(c: &ChallengeView) -> Response {
    message(
        StatusCode::GONE,
        "Link expired",
        &format!(
            "This link has expired: it can no longer confirm your mail to {}. If you write \
             again, you will get a new link.",
            c.mailbox
        ),
    )
}

/// A challenge confirmed before.
pub fn already(mailbox: &str, confirmed_by: Option<&str>) -> Response {
    message(
        StatusCode::OK,
        "Already confirmed",
        &format!(
            "Your mail to {mailbox} was confirmed {} and has been delivered. Your next \
             messages reach {mailbox} directly.",
            form::confirmed_how(confirmed_by)
        ),
    )
}

/// The answer to a right answer.
pub fn confirmed(mailbox: &str, released: i64) -> Response {
    message(
        StatusCode::OK,
        "Confirmed",
        &format!(
            "Confirmed: {} delivered to {mailbox}. Your next messages reach {mailbox} directly.",
            form::messages(released)
        ),
    )
}

/// Too many wrong answers from this client, or for this link.
pub fn too_many(wait_secs: u64) -> Response {
    error(ApiError {
        status: StatusCode::TOO_MANY_REQUESTS,
        message: format!(
            "Too many wrong answers. Try again in {} minutes.",
            wait_secs.div_ceil(60).max(1)
        ),
        retry_after: Some(wait_secs),
    })
}

/// The sender's page: to whom they wrote, what waits, the question, and postage where
/// it is offered.
pub fn ask(status: StatusCode, token: &Token, c: &ChallengeView, notice: Option<&str>) -> Response {
    let path = token::confirm_url("", token);
    let check = HumanCheck::for_token(token);
    let title = format!("Confirm your mail to {}", c.mailbox);
    let pay = c
        .pay_uri
        .as_deref()
        .filter(|u| u.starts_with("taler://") || u.starts_with("taler+http://"));
    send(
        status,
        frame(
            &title,
            html! {
                h1 { (title) }
                @if let Some(n) = notice { p #message role="alert" { (n) } }
                p #about {
                    "You wrote to " strong #mailbox { (c.mailbox) } " from " (c.sender) ". "
                    (c.mailbox) " reads mail from new senders once they confirm that a person \
                    sent it."
                }
                p #waiting {
                    @if c.waiting > 0 {
                        (form::messages(c.waiting)) " from you "
                        @if c.waiting == 1 { "waits" } @else { "wait" }
                        " until " time { (date(c.expires_at)) } "."
                    } @else {
                        "No message from you waits any longer; confirming lets your next \
                         messages through."
                    }
                }
                form method="post" action=(path) {
                    label for="answer" { (check.question()) }
                    input #answer name="answer" type="text" inputmode="numeric"
                        autocomplete="off" maxlength=(form::MAX_ANSWER) required;
                    button #confirm type="submit" { "Confirm and deliver" }
                }
                @if let Some(uri) = pay {
                    p #postage {
                        "Or pay postage instead"
                        @if let Some(a) = &c.amount { " (" (a) ")" }
                        ": " a #pay href=(uri) { "pay with GNU Taler" } "."
                    }
                }
            },
        ),
    )
}

/// The owner's page: the mailbox's held mail with its two buttons, and auto-pay's payments.
pub fn owner(mailbox: &str, path: &str, held: &[Held], payments: &[Payment]) -> Response {
    let title = format!("Held mail for {mailbox}");
    send(
        StatusCode::OK,
        frame(
            &title,
            html! {
                h1 { (title) }
                @if held.is_empty() {
                    p #none { "No mail is held." }
                } @else {
                    p { "Released mail is delivered to you; discarded mail is dropped without \
                         a word to its sender. Neither puts the sender on your whitelist." }
                    table #held {
                        thead { tr {
                            th { "From" } th { "Subject" } th { "Held" } th { "Why" }
                            th { "Until" } th {}
                        } }
                        tbody {
                            @for h in held {
                                tr id=(format!("held-{}", h.held_id)) {
                                    td.sender { (h.sender) }
                                    td.subject { (shown_subject(&h.subject)) }
                                    td { time { (date(h.held_at)) } }
                                    td.reason { (h.reason) }
                                    td { time { (date(h.expires_at)) } }
                                    td {
                                        form method="post" action=(format!("{path}/{}/release", h.held_id)) {
                                            button.release type="submit" { "Release" }
                                        }
                                        form method="post" action=(format!("{path}/{}/discard", h.held_id)) {
                                            button.discard type="submit" { "Discard" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                @if !payments.is_empty() {
                    h2 { "Postage paid for your mail" }
                    table #payments {
                        thead { tr {
                            th { "When" } th { "To" } th { "Amount" } th { "Result" } th { "Why" }
                        } }
                        tbody {
                            @for p in payments {
                                tr {
                                    td { time { (date(p.created_at)) } }
                                    td { (p.payee) }
                                    td.amount { (p.amount) }
                                    td.status { (p.status) }
                                    td { (p.reason.as_deref().unwrap_or("")) }
                                }
                            }
                        }
                    }
                }
            },
        ),
    )
}

/// An owner's link that is unknown or past its week.
pub fn owner_unknown() -> Response {
    message(
        StatusCode::NOT_FOUND,
        "Link not found",
        "This link is unknown or has expired. The next digest of your held mail brings a \
         new one.",
    )
}
