//! Atom feeds (RFC 4287) of a public archive: its latest posts, or one thread's. Written by
//! hand, every value through `text::xml_escape`; addresses hidden as on the anonymous
//! pages, since a feed has no logged-in reader.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use pepsi_archive::read::{ArchiveList, PostRow, Shown};

use super::text::{hide_address, hide_addresses, xml_escape};

/// The most characters of a post's text in a feed entry.
const ENTRY_TEXT: usize = 4000;

/// One entry: the post and what its page shows of it.
pub struct Entry<'a> {
    pub post: &'a PostRow,
    pub shown: Option<&'a Shown>,
}

fn stamp(d: DateTime<Utc>) -> String {
    d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The feed `title` of list `l` at `self_url` (absolute, under `origin`), its entries newest
/// first.
pub fn atom(
    origin: &str,
    l: &ArchiveList,
    title: &str,
    self_url: &str,
    entries: &[Entry],
) -> String {
    let e = xml_escape;
    let updated = entries
        .iter()
        .map(|x| x.post.date)
        .max()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
    let mut out = format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n\
         <feed xmlns=\"http://www.w3.org/2005/Atom\">\n\
         <id>{id}</id>\n<title>{title}</title>\n<updated>{updated}</updated>\n\
         <link rel=\"self\" href=\"{id}\"/>\n<link href=\"{list}\"/>\n",
        id = e(self_url),
        title = e(title),
        updated = stamp(updated),
        list = e(&format!("{origin}/archive/{}", l.address)),
    );
    for x in entries {
        let p = x.post;
        let url = format!("{origin}/archive/{}/m/{}", l.address, p.url_id);
        let name = if p.from_name.is_empty() {
            hide_address(&p.from_address)
        } else {
            hide_addresses(&p.from_name)
        };
        let text: String = x
            .shown
            .and_then(|s| s.text.as_deref())
            .unwrap_or_default()
            .chars()
            .take(ENTRY_TEXT)
            .collect();
        out.push_str(&format!(
            "<entry>\n<id>{url}</id>\n<title>{title}</title>\n<updated>{updated}</updated>\n\
             <author><name>{name}</name></author>\n<link href=\"{url}\"/>\n\
             <content type=\"text\">{text}</content>\n</entry>\n",
            url = e(&url),
            title = e(if p.subject.is_empty() {
                "(no subject)"
            } else {
                &p.subject
            }),
            updated = stamp(p.date),
            name = e(&name),
            text = e(&hide_addresses(&text)),
        ));
    }
    out.push_str("</feed>\n");
    out
}

/// `xml` as an Atom response.
pub fn send(xml: String) -> Response {
    let mut r = (StatusCode::OK, xml).into_response();
    let h = r.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "application/atom+xml; charset=utf-8"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; sandbox",
        ),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    r
}
