//! The markup of the archive's pages (maud: every subject, name, address and text is
//! escaped; the one HTML splice is a post's HTML after `text::sanitise`), in the frame of
//! `token_page` (no script, no image, no frame, never cached, no Referer). A reader who is
//! not a logged-in member sees addresses hidden (`text::hide_addresses`).

use std::collections::HashMap;

use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, NaiveDate, Utc};
use maud::{Markup, PreEscaped, html};
use pepsi_archive::read::{ArchiveList, Node, PartRow, PostRow, Shown, ThreadRow};
use pepsi_archive::store::Hit;

use super::text;
use crate::error::ApiError;
use crate::token_page::{self, send};

/// How a page shows addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addresses {
    Shown,
    Hidden,
}

impl Addresses {
    pub fn apply(self, text: &str) -> String {
        match self {
            Addresses::Shown => text.to_owned(),
            Addresses::Hidden => text::hide_addresses(text),
        }
    }
}

fn frame(title: &str, l: Option<&ArchiveList>, content: Markup) -> Markup {
    token_page::frame(
        title,
        "Archive",
        "archive",
        html! {
            @if let Some(l) = l {
                nav {
                    a href=(base(l)) { (name_of(l)) }
                    " · "
                    a href=(format!("{}/search", base(l))) { "Search" }
                }
            }
            (content)
        },
    )
}

fn name_of(l: &ArchiveList) -> &str {
    if l.display_name.is_empty() {
        &l.address
    } else {
        &l.display_name
    }
}

/// The path of the list's archive.
pub fn base(l: &ArchiveList) -> String {
    format!("/archive/{}", l.address)
}

fn date(d: DateTime<Utc>) -> String {
    d.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// A page with a title and one paragraph.
pub fn message(status: StatusCode, l: Option<&ArchiveList>, title: &str, text: &str) -> Response {
    send(
        status,
        frame(
            title,
            l,
            html! { h1 { (title) } p #message role="status" { (text) } },
        ),
    )
}

/// An error as a page: its status and message (an internal error's is generic).
pub fn error(e: ApiError) -> Response {
    let title = e.status.canonical_reason().unwrap_or("Error");
    message(e.status, None, title, &e.message)
}

fn author(p: &PostRow, a: Addresses) -> String {
    let address = a.apply(&p.from_address);
    match (p.from_name.is_empty(), address.is_empty()) {
        (true, _) => address,
        (false, true) => a.apply(&p.from_name),
        (false, false) => format!("{} <{address}>", a.apply(&p.from_name)),
    }
}

fn subject(s: &str) -> &str {
    if s.is_empty() { "(no subject)" } else { s }
}

fn threads(l: &ArchiveList, rows: &[ThreadRow]) -> Markup {
    html! {
        @if rows.is_empty() {
            p { "No posts." }
        } @else {
            ul.threads {
                @for t in rows {
                    li {
                        a href=(format!("{}/thread/{}", base(l), t.root_url_id)) { (subject(&t.subject)) }
                        " — " (t.message_count) @if t.message_count == 1 { " post" } @else { " posts" }
                        ", " time { (date(t.first_date)) }
                        @if t.last_date != t.first_date { " to " time { (date(t.last_date)) } }
                    }
                }
            }
        }
    }
}

/// The form asking for a login link to a private archive.
pub fn login_form(status: StatusCode, l: &ArchiveList, notice: Option<&str>) -> Response {
    send(
        status,
        frame(
            &format!("Archive of {}", l.address),
            None,
            html! {
                h1 { "Archive of " (name_of(l)) }
                @if let Some(n) = notice { p #message role="status" { (n) } }
                p { "This archive is for the members of " (l.address) ". Give your address: \
                     if it is a member's, a link to read the archive is mailed to it." }
                form.login method="post" action=(format!("{}/login", base(l))) {
                    label { "Your address " input name="address" type="email" required maxlength="254" autocomplete="email"; }
                    button type="submit" { "Mail me a link" }
                }
            },
        ),
    )
}

/// The page of an emailed login link: one button, since only a POST logs in.
pub fn login_link(l: &ArchiveList, path: &str) -> Response {
    send(
        StatusCode::OK,
        frame(
            "Open the archive",
            None,
            html! {
                h1 { "Archive of " (name_of(l)) }
                form.login method="post" action=(path) {
                    button type="submit" { "Open the archive" }
                }
            },
        ),
    )
}

/// `/archive/{list}`: the months with their counts and the latest threads.
pub fn index(
    l: &ArchiveList,
    months: &[(NaiveDate, i32)],
    latest: &[ThreadRow],
    reader: Option<&str>,
) -> Response {
    send(
        StatusCode::OK,
        frame(
            &format!("Archive of {}", l.address),
            Some(l),
            html! {
                h1 { "Archive of " (name_of(l)) }
                @if let Some(r) = reader { p.reader { "Reading as " (r) "." } }
                @if l.policy == pepsi_archive::read::Policy::Public {
                    p { a href=(format!("{}/atom", base(l))) { "Atom feed of the latest posts" } }
                }
                h2 { "Latest threads" }
                (threads(l, latest))
                h2 { "By month" }
                ul.months {
                    @for (m, n) in months {
                        li { a href=(format!("{}/{}", base(l), m.format("%Y-%m"))) { (m.format("%Y-%m")) } " (" (n) ")" }
                    }
                }
            },
        ),
    )
}

/// `/archive/{list}/{YYYY-MM}`: the month's threads in date order.
pub fn month(l: &ArchiveList, month: NaiveDate, rows: &[ThreadRow]) -> Response {
    let title = format!("{} in {}", l.address, month.format("%Y-%m"));
    send(
        StatusCode::OK,
        frame(&title, Some(l), html! { h1 { (title) } (threads(l, rows)) }),
    )
}

/// A post's text; `whole` the page of the post, linked when the text was cut.
fn body(shown: &Shown, a: Addresses, whole: &str) -> Markup {
    html! {
        @if let Some(t) = &shown.text {
            pre.text { (a.apply(t)) }
        } @else if let Some(h) = &shown.html {
            div.html { (PreEscaped(a.apply(&text::sanitise(h)))) }
        } @else {
            p.empty { "(no text)" }
        }
        @if shown.truncated {
            p.truncated { "The text is cut here: " a href=(whole) { "the whole post" } }
        }
    }
}

/// Which page of a long thread is shown, and whether a next one exists.
#[derive(Debug, Clone, Copy)]
pub struct Paging {
    pub page: usize,
    pub more: bool,
}

/// `/archive/{list}/thread/{url_id}`: the thread as a tree, in `order` (`read::tree`).
pub fn thread(
    l: &ArchiveList,
    t: &ThreadRow,
    nodes: &[Node],
    order: &[(usize, usize)],
    paging: Paging,
    texts: &HashMap<i64, Shown>,
    a: Addresses,
) -> Response {
    let link = |p: usize| format!("{}/thread/{}?page={p}", base(l), t.root_url_id);
    let nav = html! {
        @if paging.page > 1 || paging.more {
            nav.paging {
                @if paging.page > 1 { a rel="prev" href=(link(paging.page - 1)) { "Previous" } " " }
                @if paging.more { a rel="next" href=(link(paging.page + 1)) { "Next" } }
            }
        }
    };
    send(
        StatusCode::OK,
        frame(
            subject(&t.subject),
            Some(l),
            html! {
                h1 { (subject(&t.subject)) }
                @if l.policy == pepsi_archive::read::Policy::Public {
                    p { a href=(format!("{}/thread/{}/atom", base(l), t.root_url_id)) { "Atom feed of this thread" } }
                }
                @for (depth, i) in order {
                    @let n = &nodes[*i];
                    article class=(format!("post depth-{}", depth.min(&10))) id=(n.url_id) data-depth=(depth) {
                        @if let Some(p) = &n.post {
                            header {
                                h2 { a href=(format!("{}/m/{}", base(l), p.url_id)) { (subject(&p.subject)) } }
                                p.meta { span.author { (author(p, a)) } ", " time { (date(p.date)) } }
                            }
                            @match texts.get(&p.archive_id) {
                                Some(s) => (body(s, a, &format!("{}/m/{}", base(l), p.url_id))),
                                None => p.empty { "(no text)" },
                            }
                        } @else {
                            p.placeholder { "A message not in the archive" }
                        }
                    }
                }
                (nav)
            },
        ),
    )
}

/// `/archive/{list}/m/{url_id}`: one post, its text and its attachments.
pub fn post(
    l: &ArchiveList,
    p: &PostRow,
    shown: &Shown,
    parts: &[PartRow],
    a: Addresses,
) -> Response {
    let m = format!("{}/m/{}", base(l), p.url_id);
    let attachments: Vec<&PartRow> = parts.iter().filter(|x| x.file_name.is_some()).collect();
    let members_only = html! { " (for members)" };
    send(
        StatusCode::OK,
        frame(
            subject(&p.subject),
            Some(l),
            html! {
                article.post {
                    h1 { (subject(&p.subject)) }
                    p.meta { span.author { (author(p, a)) } ", " time { (date(p.date)) } }
                    p.links {
                        a href=(format!("{}/thread/{}", base(l), p.url_id)) { "Thread" }
                        @if a == Addresses::Shown { " · " a href=(format!("{m}/raw")) { "Raw" } }
                    }
                    (body(shown, a, &m))
                    @if !attachments.is_empty() {
                        h2 { "Attachments" }
                        ul.attachments {
                            @for x in attachments {
                                li {
                                    @let name = text::file_name(x.file_name.as_deref(), x.part_index as usize);
                                    @if super::downloadable(x, a) {
                                        a href=(format!("{m}/part/{}", x.part_index)) { (name) }
                                    } @else {
                                        (name) (members_only)
                                    }
                                    " (" (x.content_type) ", " (x.size) " bytes)"
                                }
                            }
                        }
                    }
                }
            },
        ),
    )
}

/// The query syntax, as the search page explains it.
fn syntax() -> Markup {
    html! {
        details.syntax {
            summary { "How to search" }
            ul {
                li { code { "word" } ", " code { "\"a phrase\"" } ", " code { "-word" } ", " code { "a or b" } ": in the subject, author or text" }
                li { code { "from:alice" } ", " code { "from:\"Alice Smith\"" } ": the author's address or name contains it" }
                li { code { "subject:word" } ": a word of the subject" }
                li { code { "after:2026-03-01" } ", " code { "before:2026-04-01" } ": dated on or after, or before, that day (UTC)" }
            }
        }
    }
}

/// The search page: the form, the syntax, and a page of hits (`more` when a next page
/// exists).
#[allow(clippy::too_many_arguments)]
pub fn search(
    status: StatusCode,
    l: &ArchiveList,
    q: &str,
    hits: &[Hit],
    page: usize,
    more: bool,
    notice: Option<&str>,
    a: Addresses,
) -> Response {
    let link = |p: usize| {
        let mut s = url_encode(q);
        s.insert_str(0, &format!("{}/search?q=", base(l)));
        s.push_str(&format!("&page={p}"));
        s
    };
    send(
        status,
        frame(
            &format!("Search {}", l.address),
            Some(l),
            html! {
                h1 { "Search the archive of " (name_of(l)) }
                form.search method="get" action=(format!("{}/search", base(l))) {
                    input name="q" type="search" maxlength="500" value=(q);
                    button type="submit" { "Search" }
                }
                (syntax())
                @if let Some(n) = notice { p #message role="status" { (n) } }
                @if !q.is_empty() && notice.is_none() {
                    @if hits.is_empty() { p { "Nothing found." } }
                    ol.hits start=((page - 1) * super::PAGE_SIZE + 1) {
                        @for h in hits {
                            li {
                                a href=(format!("{}/m/{}", base(l), h.url_id)) { (subject(&h.subject)) }
                                " — " (a.apply(&if h.from_name.is_empty() { h.from_address.clone() } else { format!("{} <{}>", h.from_name, h.from_address) }))
                                ", " time { (date(h.date)) }
                            }
                        }
                    }
                    nav.paging {
                        @if page > 1 { a rel="prev" href=(link(page - 1)) { "Previous" } " " }
                        @if more { a rel="next" href=(link(page + 1)) { "Next" } }
                    }
                }
            },
        ),
    )
}

/// `text` percent-encoded for a query string.
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
