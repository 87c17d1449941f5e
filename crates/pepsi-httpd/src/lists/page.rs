//! The markup of the subscriber pages (maud: every list's name, description and address
//! is escaped), in the frame of the pages reached by an emailed link (`token_page`: no
//! script, never cached, no Referer).

use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};

use super::store::{ListInfo, Subscription};
use crate::error::ApiError;
use crate::token_page::{self, send};

fn frame(title: &str, content: Markup) -> Markup {
    token_page::frame(title, "Mailing lists", "lists", content)
}

/// A page with a title and one paragraph.
pub fn message(status: StatusCode, title: &str, text: &str) -> Response {
    send(
        status,
        frame(
            title,
            html! { h1 { (title) } p #message role="status" { (text) } p { a href="/lists" { "All lists" } } },
        ),
    )
}

/// An error as a page: its status and message (an internal error's is generic).
pub fn error(e: ApiError) -> Response {
    let title = e.status.canonical_reason().unwrap_or("Error");
    message(e.status, title, &e.message)
}

fn name_of(l: &ListInfo) -> &str {
    if l.display_name.is_empty() {
        &l.address
    } else {
        &l.display_name
    }
}

fn subscribe_form(l: &ListInfo) -> Markup {
    html! {
        @if l.policy == "closed" {
            p.closed { "This list takes no subscriptions: its owners add its members." }
        } @else {
            form.subscribe method="post" action=(format!("/lists/{}/subscribe", l.address)) {
                label { "Your address " input name="address" type="email" required maxlength="254" autocomplete="email"; }
                label { "Your name (optional) " input name="display_name" maxlength="200" autocomplete="name"; }
                button type="submit" { "Subscribe" }
            }
        }
    }
}

/// `/lists`: the advertised lists, each with its subscribe form.
pub fn index(lists: &[ListInfo]) -> Response {
    send(
        StatusCode::OK,
        frame(
            "Mailing lists",
            html! {
                h1 { "Mailing lists" }
                @if lists.is_empty() { p { "No list is advertised here." } }
                @for l in lists {
                    section.list {
                        h2 { a href=(format!("/lists/{}", l.address)) { (name_of(l)) } }
                        p.address { code { (l.address) } }
                        @if !l.description.is_empty() { p.description { (l.description) } }
                        (subscribe_form(l))
                    }
                }
                p.hint { "Every subscription is confirmed by mail before it takes effect." }
            },
        ),
    )
}

/// `/lists/{address}`: one list, with its subscribe form, or the answer to a form
/// (`note`).
pub fn list(status: StatusCode, l: &ListInfo, note: Option<&str>) -> Response {
    send(
        status,
        frame(
            name_of(l),
            html! {
                h1 { (name_of(l)) }
                p.address { "Posts go to " code { (l.address) } "." }
                @if !l.description.is_empty() { p.description { (l.description) } }
                @if let Some(n) = note { p #message role="status" { (n) } }
                (subscribe_form(l))
                p.hint {
                    "Subscribed already? "
                    a href=(format!("/lists/{}/manage", l.address)) { "Get a link to your subscription's page" }
                    " to change how you receive the list or to leave it."
                }
            },
        ),
    )
}

/// `/lists/{address}/manage`: the form that asks for a member's link.
pub fn manage(status: StatusCode, l: &ListInfo, note: Option<&str>) -> Response {
    send(
        status,
        frame(
            "Your subscription",
            html! {
                h1 { "Your subscription to " (name_of(l)) }
                p { "Members of " code { (l.address) } " get a link to their subscription's page by mail. Give your address:" }
                form method="post" {
                    label { "Address " input name="address" type="email" required maxlength="254" autocomplete="email"; }
                    button type="submit" { "Mail me a link" }
                }
                @if let Some(n) = note { p #message role="status" { (n) } }
            },
        ),
    )
}

/// `GET /lists/confirm/{token}`: what the confirmation would do, and its one button.
pub fn confirm(list: &str, address: &str, kind: &str) -> Response {
    let what = if kind == "unsubscribe" {
        format!("Remove {address} from {list}?")
    } else {
        format!("Subscribe {address} to {list}?")
    };
    send(
        StatusCode::OK,
        frame(
            "Confirm",
            html! {
                h1 { "Confirm" }
                p { (what) }
                form method="post" { button #confirm type="submit" { "Confirm" } }
                p.hint { "Nothing changes until you press the button." }
            },
        ),
    )
}

/// `GET /lists/unsubscribe/{token}`: the one button that leaves the list. Its form posts
/// the RFC 8058 body, as a mail client's one-click does.
pub fn unsubscribe(list: &str, address: &str) -> Response {
    send(
        StatusCode::OK,
        frame(
            "Unsubscribe",
            html! {
                h1 { "Unsubscribe" }
                p { "Remove " (address) " from " (list) "?" }
                form method="post" {
                    input type="hidden" name="List-Unsubscribe" value="One-Click";
                    button #unsubscribe type="submit" { "Unsubscribe" }
                }
                p.hint { "Nothing changes until you press the button." }
            },
        ),
    )
}

fn mode_option(current: &str, value: &str, label: &str) -> Markup {
    html! {
        @if current == value { option value=(value) selected { (label) } }
        @else { option value=(value) { (label) } }
    }
}

/// `/lists/member/{token}`: `address`'s subscriptions with their choices, each form
/// carrying `csrf`.
pub fn member(
    status: StatusCode,
    address: &str,
    subs: &[Subscription],
    csrf: &str,
    notice: Option<&str>,
) -> Response {
    send(
        status,
        frame(
            "Your subscriptions",
            html! {
                h1 { "Subscriptions of " (address) }
                @if let Some(n) = notice { p #message role="status" { (n) } }
                @if subs.is_empty() { p #none { "No subscription." } }
                @for s in subs {
                    section.subscription {
                        h2 { (if s.display_name.is_empty() { &s.list } else { &s.display_name }) " " code { (s.list) } }
                        form method="post" {
                            input type="hidden" name="csrf" value=(csrf);
                            input type="hidden" name="member" value=(s.member_id);
                            input type="hidden" name="do" value="save";
                            label { "Delivery "
                                select name="delivery_mode" {
                                    (mode_option(&s.delivery_mode, "regular", "every post as it comes"))
                                    @if s.digests_enabled || s.delivery_mode != "regular" {
                                        (mode_option(&s.delivery_mode, "mime_digest", "a digest (MIME)"))
                                        (mode_option(&s.delivery_mode, "plain_digest", "a digest (plain text)"))
                                    }
                                }
                            }
                            label {
                                @if s.receive_own_postings { input type="checkbox" name="receive_own_postings" checked; }
                                @else { input type="checkbox" name="receive_own_postings"; }
                                " my own posts too"
                            }
                            label {
                                @if s.hide_address { input type="checkbox" name="hide_address" checked; }
                                @else { input type="checkbox" name="hide_address"; }
                                " hide my address from the list of members"
                            }
                            button type="submit" { "Save" }
                        }
                        form method="post" {
                            input type="hidden" name="csrf" value=(csrf);
                            input type="hidden" name="member" value=(s.member_id);
                            input type="hidden" name="do" value="unsubscribe";
                            button.danger type="submit" { "Unsubscribe from " (s.list) }
                        }
                    }
                }
            },
        ),
    )
}
