//! The markup of the secure-link portal (maud: every address, subject and text is escaped;
//! the one HTML splice is a message's HTML after `archive::text::sanitise`), in the frame of
//! `token_page`: no script, no image, no frame, never cached, no Referer.

use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use maud::{Markup, PreEscaped, html};
use pepsi_archive::read::{PartRow, Shown};
use pepsi_secure_link::admin::Link;
use pepsi_secure_link::store::{Access, Refusal};

use super::form::{self, LinkPath};
use crate::archive::text;
use crate::error::ApiError;
use crate::token_page::{self, send};

fn frame(title: &str, content: Markup) -> Markup {
    token_page::frame(title, "Secure message", "secure", content)
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

/// The page of a refusal: its status and plain words.
pub fn refused(r: Refusal) -> Response {
    let (status, title, text) = form::refusal(r);
    message(status, title, &text)
}

/// An error as a page: its status and message (an internal error's is generic).
pub fn error(e: ApiError) -> Response {
    let title = e.status.canonical_reason().unwrap_or("Error");
    message(e.status, title, &e.message)
}

/// The page before the message: mail a code, then type it.
pub fn ask_code(status: StatusCode, link: &LinkPath, notice: Option<&str>) -> Response {
    let path = link.path();
    send(
        status,
        frame(
            "A secure message for you",
            html! {
                h1 { "A secure message for you" }
                @if let Some(n) = notice { p #message role="status" { (n) } }
                p { "To read it, show that this address is yours: we mail a one-time code to \
                     the address the message was sent to. The code works for 10 minutes." }
                form method="post" action=(format!("{path}/code")) {
                    button #send-code type="submit" { "Mail me a code" }
                }
                form method="post" action=(format!("{path}/verify")) {
                    label for="code" { "Code" }
                    input #code name="code" type="text" inputmode="numeric"
                        autocomplete="one-time-code" maxlength="32" required;
                    button #verify type="submit" { "Open the message" }
                }
            },
        ),
    )
}

/// What the page shows of an opened message.
pub struct Opened<'a> {
    pub from: String,
    pub to: String,
    pub subject: String,
    pub date: Option<DateTime<Utc>>,
    pub shown: &'a Shown,
    pub parts: &'a [PartRow],
}

/// The message: its header, its text (or sanitised HTML), its attachments, the reply form.
pub fn opened(link: &LinkPath, m: &Opened<'_>, notice: Option<&str>) -> Response {
    let path = link.path();
    let subject = if m.subject.is_empty() {
        "(no subject)"
    } else {
        &m.subject
    };
    let attachments: Vec<&PartRow> = m.parts.iter().filter(|p| p.file_name.is_some()).collect();
    send(
        StatusCode::OK,
        frame(
            subject,
            html! {
                article.post {
                    h1 #subject { (subject) }
                    @if let Some(n) = notice { p #message role="status" { (n) } }
                    dl.meta {
                        dt { "From" } dd #from { (m.from) }
                        dt { "To" } dd #to { (m.to) }
                        @if let Some(d) = m.date { dt { "Date" } dd { time { (date(d)) } } }
                    }
                    @if let Some(t) = &m.shown.text {
                        pre #body.body { (t) }
                    } @else if let Some(h) = &m.shown.html {
                        div #body.body.html { (PreEscaped(text::sanitise(h))) }
                    } @else {
                        p #body { "(no text)" }
                    }
                    @if m.shown.truncated { p { "(The text is cut here; the whole message is longer.)" } }
                    @if !attachments.is_empty() {
                        h2 { "Attachments" }
                        ul #attachments.attachments {
                            @for x in attachments {
                                li {
                                    a href=(format!("{path}/part/{}", x.part_index)) {
                                        (text::file_name(x.file_name.as_deref(), x.part_index as usize))
                                    }
                                    " (" (x.content_type) ", " (x.size) " bytes)"
                                }
                            }
                        }
                    }
                    h2 { "Reply" }
                    form method="post" action=(format!("{path}/reply")) {
                        label for="reply" { "Your answer goes to " (m.from) " by mail." }
                        textarea #reply name="text" rows="8" maxlength=(form::MAX_REPLY) required {}
                        button #send-reply type="submit" { "Send the reply" }
                    }
                }
            },
        ),
    )
}

/// The sender's page of a link: where it stands, its access log, revoke and resend.
pub fn manage(
    status: StatusCode,
    path: &str,
    link: &Link,
    log: &[Access],
    notice: Option<&str>,
) -> Response {
    let active = link.state == pepsi_secure_link::admin::LinkState::Active;
    send(
        status,
        frame(
            "Your secure message",
            html! {
                h1 { "Your secure message to " (link.recipient) }
                @if let Some(n) = notice { p #message role="status" { (n) } }
                dl.meta {
                    dt { "State" } dd #state { (link.state.as_str()) }
                    dt { "Sent" } dd { time { (date(link.created)) } }
                    dt { "Expires" } dd #expires { time { (date(link.expires)) } }
                    @if let Some(by) = &link.revoked_by { dt { "Withdrawn by" } dd { (by) } }
                    dt { "Link" } dd { "number " (link.generation) }
                }
                @if active {
                    form method="post" action=(format!("{path}/revoke")) {
                        button #revoke type="submit" { "Withdraw the message" }
                    }
                    form method="post" action=(format!("{path}/resend")) {
                        button #resend type="submit" { "Send a new link (the old one stops working)" }
                    }
                }
                h2 { "Access log" }
                table #access-log {
                    thead { tr { th { "When" } th { "What" } th { "From" } th { "Detail" } } }
                    tbody {
                        @for a in log {
                            tr {
                                td { time { (date(a.at)) } }
                                td.event { (a.event) }
                                td { (a.client_key.as_deref().unwrap_or("")) }
                                td { (a.detail.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            },
        ),
    )
}
