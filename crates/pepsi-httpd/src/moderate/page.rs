//! The markup of the moderation pages (maud: every splice escaped, so a post's sender,
//! subject and text are shown as text and never as markup), in the frame of the pages
//! reached by an emailed link (`token_page`: no script, no image, no frame, never cached,
//! no Referer).

use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use pepsi_list::options::{self, Kind};

use super::{Moderator, form_text, store};
use crate::error::ApiError;
use crate::extract::AppState;
use crate::token_page::{self, send};

/// The characters of a held post's text shown.
pub const EXCERPT_CHARS: usize = 600;

fn frame(title: &str, content: Markup) -> Markup {
    token_page::frame(title, "Pepsi", "moderate", content)
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

/// An error as a page: its status and message (an internal error's message is generic).
pub fn error(e: ApiError) -> Response {
    let title = e.status.canonical_reason().unwrap_or("Error");
    message(e.status, title, &e.message)
}

/// The form that asks for a moderator's link.
pub fn ask(list: &str, status: StatusCode, note: Option<&str>) -> Response {
    send(
        status,
        frame(
            "Moderate",
            html! {
                h1 { "Moderate " (list) }
                p { "Owners and moderators of " (list) " get a link to its moderation page by mail. Give your address:" }
                form method="post" {
                    label { "Address " input #address name="address" type="email" required autocomplete="email"; }
                    button #send type="submit" { "Mail me a link" }
                }
                @if let Some(n) = note { p #message role="alert" { (n) } }
                p.hint { "Administrators who are logged in see the page at once." }
            },
        ),
    )
}

/// The text of a message for a moderator's glance: its first text part (or the HTML part's
/// text), control characters dropped, runs of blank lines made one, cut at `max` characters.
pub fn excerpt(raw: &[u8], max: usize) -> String {
    let parsed = mail_parser::MessageParser::default().parse(raw);
    let text = parsed
        .as_ref()
        .and_then(|m| m.body_text(0))
        .map(|t| t.into_owned())
        .unwrap_or_default();
    let mut out = String::new();
    let mut blank = 0;
    for line in text.lines() {
        let line: String = line
            .chars()
            .filter(|c| !c.is_control() || *c == '\t')
            .collect();
        let line = line.trim_end();
        if line.is_empty() {
            blank += 1;
            if blank > 1 || out.is_empty() {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    let out = out.trim_end();
    if out.chars().count() > max {
        let cut: String = out.chars().take(max).collect();
        format!("{cut}…")
    } else {
        out.to_owned()
    }
}

fn hidden(m: &Moderator, what: &str, id: i64) -> Markup {
    html! {
        input type="hidden" name="csrf" value=(m.csrf);
        input type="hidden" name="do" value=(what);
        input type="hidden" name="id" value=(id);
    }
}

/// The moderation page of `m`'s list, with `notice` (what the last form did).
pub async fn moderation(state: &AppState, m: &Moderator, notice: Option<&str>) -> Response {
    render(state, m, StatusCode::OK, notice, None).await
}

/// The page with the refusal of the last form.
pub async fn moderation_status(
    state: &AppState,
    m: &Moderator,
    status: StatusCode,
    text: &str,
) -> Response {
    render(state, m, status, None, Some(text)).await
}

async fn render(
    state: &AppState,
    m: &Moderator,
    status: StatusCode,
    notice: Option<&str>,
    problem: Option<&str>,
) -> Response {
    let refused = store::refused;
    let held = match pepsi_list::store::held(&state.pool, &m.list).await {
        Ok(h) => h,
        Err(e) => return error(refused(e)),
    };
    let starts = match store::held_starts(&state.pool, m.list_id).await {
        Ok(s) => s,
        Err(e) => return error(e),
    };
    let pending = match store::pending(&state.pool, m.list_id, true).await {
        Ok(p) => p,
        Err(e) => return error(e),
    };
    let shown = if m.owner {
        match pepsi_list::store::show(&state.pool, &m.list).await {
            Ok(s) => Some(s),
            Err(e) => return error(refused(e)),
        }
    } else {
        None
    };
    let text_of = |id: i64| {
        starts
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, raw)| excerpt(raw, EXCERPT_CHARS))
            .unwrap_or_default()
    };
    let markup = frame(
        &format!("Moderate {}", m.list),
        html! {
            header.bar {
                h1 { "Moderating " (m.list) }
                span.who { "as " b { (m.who.name) } @if m.owner { " (owner)" } }
            }
            @if let Some(n) = notice { p #notice role="status" { (n) } }
            @if let Some(p) = problem { p #problem role="alert" { (p) } }
            section #held {
                h2 { "Held posts " small { "(" (held.len()) ")" } }
                @if held.is_empty() { p #no-held { "No post waits for a moderator." } }
                @for p in &held {
                    article.held id=(format!("held-{}", p.id)) {
                        dl {
                            dt { "From" } dd.sender { (p.sender) }
                            dt { "Subject" } dd.subject { (p.subject) }
                            dt { "Held because" } dd.reason { (p.reason) }
                            dt { "Held" } dd { (p.held_at.format("%Y-%m-%d %H:%M UTC")) ", " (p.size) " bytes, expires " (p.expires_at.format("%Y-%m-%d %H:%M UTC")) }
                        }
                        pre.excerpt { (text_of(p.id)) }
                        div.actions {
                            form method="post" action=(m.action) {
                                (hidden(m, "approve", p.id))
                                button id=(format!("approve-{}", p.id)) type="submit" { "Approve" }
                            }
                            form method="post" action=(m.action) {
                                (hidden(m, "discard", p.id))
                                button id=(format!("discard-{}", p.id)) type="submit" { "Discard" }
                            }
                            form method="post" action=(m.action) {
                                (hidden(m, "ban", p.id))
                                button id=(format!("ban-{}", p.id)) type="submit" { "Ban sender and discard" }
                            }
                            form method="post" action=(m.action) {
                                (hidden(m, "reject", p.id))
                                input name="reason" maxlength="300" placeholder="reason (optional)";
                                button id=(format!("reject-{}", p.id)) type="submit" { "Reject" }
                            }
                        }
                    }
                }
            }
            section #requests {
                h2 { "Subscriptions waiting for approval " small { "(" (pending.len()) ")" } }
                @if pending.is_empty() { p { "None." } }
                @for r in &pending {
                    article.request id=(format!("request-{}", r.id)) {
                        p { b { (r.address) } @if !r.display_name.is_empty() { " (" (r.display_name) ")" } " asks to " (r.kind) ", since " (r.created_at.format("%Y-%m-%d %H:%M UTC")) }
                        div.actions {
                            form method="post" action=(m.action) {
                                (hidden(m, "accept-request", r.id))
                                button id=(format!("accept-request-{}", r.id)) type="submit" { "Approve" }
                            }
                            form method="post" action=(m.action) {
                                (hidden(m, "refuse-request", r.id))
                                input name="reason" maxlength="300" placeholder="reason (optional)";
                                button id=(format!("refuse-request-{}", r.id)) type="submit" { "Reject" }
                            }
                        }
                    }
                }
            }
            @if let Some(shown) = &shown {
                section #settings {
                    h2 { "Settings" }
                    form method="post" action=(m.action) {
                        input type="hidden" name="csrf" value=(m.csrf);
                        input type="hidden" name="do" value="configure";
                        table {
                            @for o in options::OPTIONS {
                                @let now = shown.options.get(o.name).map(form_text).unwrap_or_default();
                                tr {
                                    th { label for=(format!("opt-{}", o.name)) { (o.name) } }
                                    td {
                                        @match o.kind {
                                            Kind::Choice(words) => {
                                                select id=(format!("opt-{}", o.name)) name=(format!("opt_{}", o.name)) {
                                                    @for w in words { option value=(w) selected[*w == now] { (w) } }
                                                }
                                            }
                                            Kind::Bool => {
                                                select id=(format!("opt-{}", o.name)) name=(format!("opt_{}", o.name)) {
                                                    option value="yes" selected[now == "yes"] { "yes" }
                                                    option value="no" selected[now == "no"] { "no" }
                                                }
                                            }
                                            Kind::Text { lines: true, .. } => {
                                                textarea id=(format!("opt-{}", o.name)) name=(format!("opt_{}", o.name)) rows="3" { (now) }
                                            }
                                            _ => {
                                                input id=(format!("opt-{}", o.name)) name=(format!("opt_{}", o.name)) value=(now);
                                            }
                                        }
                                    }
                                    td.hint { (o.meaning) " (" (o.kind.expected()) ")" }
                                }
                            }
                        }
                        button #save-settings type="submit" { "Save settings" }
                    }
                }
            }
        },
    );
    send(status, markup)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_the_text_of_the_post() {
        let cases: [(&str, &str); 5] = [
            (
                "Subject: x\r\n\r\nHello\r\n\r\n\r\n\r\nthere\r\n",
                "Hello\n\nthere",
            ),
            (
                "Subject: x\r\n\r\n<script>alert(1)</script>\x07bell\r\n",
                "<script>alert(1)</script>bell",
            ),
            (
                "Content-Type: text/html\r\n\r\n<p>Hi <b>you</b></p>",
                "Hi you",
            ),
            (
                "Content-Type: multipart/alternative; boundary=b\r\n\r\n--b\r\n\
                 Content-Type: text/plain\r\n\r\nplain part\r\n--b\r\n\
                 Content-Type: text/html\r\n\r\n<p>html part</p>\r\n--b--\r\n",
                "plain part",
            ),
            ("Subject: x\r\n\r\n", ""),
        ];
        for (raw, want) in cases {
            assert_eq!(excerpt(raw.as_bytes(), 100), want, "{raw:?}");
        }
        let long = format!("Subject: x\r\n\r\n{}\r\n", "é".repeat(50));
        assert_eq!(excerpt(long.as_bytes(), 10), format!("{}…", "é".repeat(10)));
    }

    #[test]
    fn a_posts_text_is_escaped_on_the_page() {
        let text = excerpt(b"Subject: x\r\n\r\n<img src=x onerror=alert(1)>&\r\n", 100);
        let page = html! { pre { (text) } }.into_string();
        assert_eq!(page, "<pre>&lt;img src=x onerror=alert(1)&gt;&amp;</pre>");
    }
}
