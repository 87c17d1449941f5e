//! The frame of the pages reached by an emailed link (the subscriber pages, `lists`, and
//! the moderation pages, `moderate`): sent with a Content-Security-Policy that allows this
//! server's style sheet and forms and nothing else (no script, no image, no frame), never
//! cached, and without a Referer, so a page's token never reaches another site's logs.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

const CSP: &str = "default-src 'none'; style-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// `markup` as an HTML response with `status` and the headers above.
pub fn send(status: StatusCode, markup: Markup) -> Response {
    let mut r = (status, markup.into_string()).into_response();
    let h = r.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CACHE_CONTROL, "no-store"),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    r
}

/// A whole page: `title` followed by `site` in the window title, `content` in a `main` of
/// class `class` (the style sheet's hook).
pub fn frame(title: &str, site: &str, class: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · " (site) }
                link rel="stylesheet" href="/ui/pepsi.css";
            }
            body { main class=(class) { (content) } }
        }
    }
}
