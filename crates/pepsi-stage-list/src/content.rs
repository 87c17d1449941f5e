//! A list's content filter (`pepsi.list_content_filter`): which parts of an accepted post
//! reach the members. Pure: a post in, the post the members get (or nothing left) out,
//! tested as a table.
//!
//! - A leaf part (anything but a `multipart/*`) is removed when its type is in `filter_types`, when `pass_types` is not empty and its type
//!   is not in it, when its file name's extension is in `filter_extensions`, or when
//!   `pass_extensions` is not empty and it has a file name whose extension is not in it.
//!   A type entry is a whole type (`image/png`) or a top-level type (`image`, every
//!   `image/*`). A part without a file name is judged by its type alone; a file name's RFC
//!   2047 words are decoded and trailing dots and blanks dropped, as mail clients do. A
//!   `Content-Type` that cannot be read counts as `application/octet-stream`.
//! - An attached message (`message/rfc822`) that is not removed as a part is entered: its
//!   content is judged like a post's.
//! - A multipart is entered (its parts judged one by one, at most [`MAX_DEPTH`] levels
//!   deep); one left with no part is removed, one left with a single part after a removal
//!   becomes that part.
//! - With `collapse_alternatives`, a `multipart/alternative` becomes its first part (the
//!   plain text, by RFC 2046's order), judged like any other.
//! - A post that loses its top-level entity has nothing left: the list's `empty_action`.
//!
//! What is kept keeps its bytes; a removed part is gone, not replaced by a notice. What the
//! filter cannot read, a mail client might: a multipart without a usable boundary or closing
//! delimiter, nested deeper than [`MAX_DEPTH`] or of more than `mime::MAX_PARTS` parts, an
//! attached message in a transfer encoding, and an entity with two `Content-Type` or
//! `Content-Disposition` fields are removed whole.

pub use pepsi_contract::list::{ContentFilter, EmptyAction};
use pepsi_contract::message;
use pepsi_contract::mime::{self, ContentType};

/// How deep multiparts are entered; deeper ones are kept as they are.
pub const MAX_DEPTH: usize = 32;

/// Why a leaf part of type `ct` named `name` is removed by `f`, or `None` when it stays.
fn removes(f: &ContentFilter, ct: &ContentType, name: Option<&str>) -> Option<String> {
    let what = || match name {
        Some(n) => format!("{} part {n:?}", ct.mime),
        None => format!("{} part", ct.mime),
    };
    let named = |list: &[String]| {
        list.iter()
            .any(|t| *t == ct.mime || (!t.contains('/') && t == ct.main_type()))
    };
    if named(&f.filter_types) || (!f.pass_types.is_empty() && !named(&f.pass_types)) {
        return Some(what());
    }
    let ext = name.and_then(extension)?;
    let listed = |list: &[String]| list.contains(&ext);
    (listed(&f.filter_extensions) || (!f.pass_extensions.is_empty() && !listed(&f.pass_extensions)))
        .then(what)
}
/// The extension of a file name, lower-case, without its dot (`None` for a name without
/// one, or ending in one).
pub fn extension(name: &str) -> Option<String> {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let (_, ext) = base.rsplit_once('.')?;
    let ext = ext.trim();
    (!ext.is_empty()).then(|| ext.to_lowercase())
}

/// What the filter made of a post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filtered {
    /// Nothing removed: the post as it came.
    Unchanged,
    /// The post the members get, and what was removed (e.g. `image/png part "a.png"`).
    Changed {
        headers: Vec<u8>,
        body: Vec<u8>,
        removed: Vec<String>,
    },
    /// Nothing left; what was removed.
    Empty { removed: Vec<String> },
}

/// One entity judged.
enum Outcome {
    Keep,
    Remove,
    Replace(Vec<u8>, Vec<u8>),
}

/// The post (its header block, each field with its CRLF, and body) as the members get it.
pub fn filter(f: &ContentFilter, headers: &[u8], body: &[u8]) -> Filtered {
    if !f.is_active() {
        return Filtered::Unchanged;
    }
    let mut removed = Vec::new();
    match entity(f, headers, body, Default::Text, 0, &mut removed) {
        Outcome::Keep => Filtered::Unchanged,
        Outcome::Remove => Filtered::Empty { removed },
        Outcome::Replace(headers, body) => Filtered::Changed {
            headers,
            body,
            removed,
        },
    }
}

/// The type a part has when it names none (RFC 2046 §5.1.1, §5.1.5).
#[derive(Clone, Copy)]
enum Default {
    Text,
    Message,
}

fn entity(
    f: &ContentFilter,
    headers: &[u8],
    body: &[u8],
    default: Default,
    depth: usize,
    removed: &mut Vec<String>,
) -> Outcome {
    // Two readers of one entity must not see two types: a part that names its type or its
    // disposition twice is removed, as one that cannot be read.
    let fields = |name: &str| message::field_values(headers, name).len();
    if fields("Content-Type") > 1 || fields("Content-Disposition") > 1 {
        removed.push("a part with two Content-Type or Content-Disposition fields".to_owned());
        return Outcome::Remove;
    }
    let ct = match mime::content_type(headers) {
        Some(ct) => ct,
        // A type named but not readable is judged as what it may be: anything.
        None if fields("Content-Type") > 0 => ContentType {
            mime: "application/octet-stream".to_owned(),
            params: Vec::new(),
        },
        None => ContentType {
            mime: match default {
                Default::Text => "text/plain",
                Default::Message => "message/rfc822",
            }
            .to_owned(),
            params: Vec::new(),
        },
    };
    if ct.main_type() != "multipart" {
        if let Some(why) = removes(f, &ct, file_name(headers).as_deref()) {
            removed.push(why);
            return Outcome::Remove;
        }
        return if ct.mime == "message/rfc822" {
            attached(f, headers, body, depth, removed)
        } else {
            Outcome::Keep
        };
    }
    // A multipart the filter cannot read (no boundary, no closing delimiter, too many
    // parts, too deep) could still be read by a mail client: it is removed whole.
    let unreadable = |removed: &mut Vec<String>| {
        removed.push(format!("{} the filter cannot read", ct.mime));
        Outcome::Remove
    };
    let Some(boundary) = ct.param("boundary").filter(|_| depth < MAX_DEPTH) else {
        return unreadable(removed);
    };
    let Ok(multipart) = mime::multipart(body, boundary) else {
        return unreadable(removed);
    };
    let inner = if ct.mime == "multipart/digest" {
        Default::Message
    } else {
        Default::Text
    };
    if f.collapse_alternatives && ct.mime == "multipart/alternative" {
        let Some(first) = multipart.parts.first() else {
            return Outcome::Keep;
        };
        for other in &multipart.parts[1..] {
            let (h, _) = message::split(other);
            let ct = mime::content_type(h).map_or_else(|| "text/plain".to_owned(), |c| c.mime);
            removed.push(format!("{ct} alternative"));
        }
        let (h, b) = message::split(first);
        return match entity(f, h, b, inner, depth + 1, removed) {
            Outcome::Remove => Outcome::Remove,
            Outcome::Keep => Outcome::Replace(adopt(headers, h), b.to_vec()),
            Outcome::Replace(h, b) => Outcome::Replace(adopt(headers, &h), b),
        };
    }
    let mut changed = false;
    let mut kept: Vec<Vec<u8>> = Vec::with_capacity(multipart.parts.len());
    let mut kept_split: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for part in &multipart.parts {
        let (h, b) = message::split(part);
        match entity(f, h, b, inner, depth + 1, removed) {
            Outcome::Keep => {
                kept.push(part.to_vec());
                kept_split.push((h.to_vec(), b.to_vec()));
            }
            Outcome::Remove => changed = true,
            Outcome::Replace(h, b) => {
                changed = true;
                kept.push(message::join(&h, &b));
                kept_split.push((h, b));
            }
        }
    }
    if !changed {
        return Outcome::Keep;
    }
    match kept_split.len() {
        0 => Outcome::Remove,
        1 => {
            let (h, b) = kept_split.remove(0);
            Outcome::Replace(adopt(headers, &h), b)
        }
        _ => {
            let parts: Vec<&[u8]> = kept.iter().map(Vec::as_slice).collect();
            Outcome::Replace(headers.to_vec(), multipart.rebuild(boundary, &parts))
        }
    }
}

/// An attached message (`message/rfc822`) the filter did not remove: its own content judged
/// like a post's. A transfer encoding other than 7bit, 8bit or binary (not allowed there by
/// RFC 2046) cannot be read through: the part is removed.
fn attached(
    f: &ContentFilter,
    headers: &[u8],
    body: &[u8],
    depth: usize,
    removed: &mut Vec<String>,
) -> Outcome {
    let encoding = message::field_values(headers, "Content-Transfer-Encoding")
        .into_iter()
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    if !matches!(encoding.as_str(), "" | "7bit" | "8bit" | "binary") || depth >= MAX_DEPTH {
        removed.push("a message/rfc822 part the filter cannot read".to_owned());
        return Outcome::Remove;
    }
    let (h, b) = message::split(body);
    match entity(f, h, b, Default::Text, depth + 1, removed) {
        Outcome::Keep => Outcome::Keep,
        Outcome::Remove => Outcome::Remove,
        Outcome::Replace(h, b) => Outcome::Replace(headers.to_vec(), message::join(&h, &b)),
    }
}

/// A part's file name as a mail client shows it: RFC 2047 encoded words decoded, the blanks
/// and dots Windows drops from its end dropped (`run.exe.` is `run.exe`).
fn file_name(headers: &[u8]) -> Option<String> {
    let name = mime::file_name(headers)?;
    let name = if name.contains("=?") {
        decoded_words(&name).unwrap_or(name)
    } else {
        name
    };
    Some(name.trim_end_matches(['.', ' ']).to_owned())
}

/// `text` with its RFC 2047 encoded words decoded (mail-parser reads it as a Subject).
fn decoded_words(text: &str) -> Option<String> {
    let field = format!("Subject: {}\r\n\r\n", text.replace(['\r', '\n'], " "));
    let parsed = mail_parser::MessageParser::default().parse_headers(field.as_bytes())?;
    parsed.subject().map(str::to_owned)
}

/// The header block of an entity that takes the place of the multipart `outer`: `outer`'s
/// own fields (a message's From, Subject...) with the content fields of `inner`. A part
/// that names no type gets RFC 2045's default spelled out, so it does not read as the
/// outer multipart's.
fn adopt(outer: &[u8], inner: &[u8]) -> Vec<u8> {
    let (mut out, _) = mime::split_content(outer);
    if message::has_field(outer, "MIME-Version") {
        out.extend_from_slice(b"MIME-Version: 1.0\r\n");
    }
    let (_, content) = mime::split_content(inner);
    if !message::has_field(&content, "Content-Type") {
        out.extend_from_slice(b"Content-Type: text/plain; charset=us-ascii\r\n");
    }
    out.extend_from_slice(&content);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> ContentFilter {
        ContentFilter {
            filter_types: vec![],
            pass_types: vec![],
            filter_extensions: vec![],
            pass_extensions: vec![],
            collapse_alternatives: false,
            empty_action: EmptyAction::Reject,
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    const TOP: &str = "From: a@example.org\r\nSubject: s\r\nMIME-Version: 1.0\r\n\
        Content-Type: multipart/mixed; boundary=\"b1\"\r\n";

    /// A text part, an image, a PDF and an executable in a multipart/mixed.
    const MIXED: &str = "--b1\r\nContent-Type: text/plain\r\n\r\nhello\r\n\
        --b1\r\nContent-Type: image/png; name=\"a.png\"\r\n\r\nPNG\r\n\
        --b1\r\nContent-Type: application/pdf\r\n\
        Content-Disposition: attachment; filename=\"plan.PDF\"\r\n\r\nPDF\r\n\
        --b1\r\nContent-Type: application/octet-stream\r\n\
        Content-Disposition: attachment; filename=run.exe\r\n\r\nMZ\r\n--b1--\r\n";

    const ALTERNATIVE_TOP: &str = "From: a@example.org\r\nMIME-Version: 1.0\r\n\
        Content-Type: multipart/alternative; boundary=alt\r\n";
    const ALTERNATIVE: &str = "--alt\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nplain\r\n\
        --alt\r\nContent-Type: text/html\r\n\r\n<p>html</p>\r\n--alt--\r\n";

    /// The parts' bodies the members get, in order (the top level's when not multipart).
    fn bodies(headers: &[u8], body: &[u8]) -> Vec<String> {
        match mime::content_type(headers)
            .filter(|c| c.main_type() == "multipart")
            .and_then(|c| c.param("boundary").map(str::to_owned))
        {
            Some(b) => mime::multipart_parts(body, &b)
                .unwrap()
                .into_iter()
                .flat_map(|p| {
                    let (h, b) = message::split(p);
                    bodies(h, b)
                })
                .collect(),
            None => vec![String::from_utf8_lossy(body).trim_end().to_owned()],
        }
    }

    #[test]
    fn filter_table() {
        type Case = (
            &'static str,
            fn(&mut ContentFilter),
            Option<Vec<&'static str>>,
            usize,
        );
        // (what, the filter, the bodies left (None: nothing left), parts removed)
        let cases: Vec<Case> = vec![
            (
                "no filter",
                |_| {},
                Some(vec!["hello", "PNG", "PDF", "MZ"]),
                0,
            ),
            (
                "a whole type",
                |f| f.filter_types = strings(&["image/png"]),
                Some(vec!["hello", "PDF", "MZ"]),
                1,
            ),
            (
                "a top-level type",
                |f| f.filter_types = strings(&["application"]),
                Some(vec!["hello", "PNG"]),
                2,
            ),
            (
                "an extension, any letter case",
                |f| f.filter_extensions = strings(&["exe", "pdf"]),
                Some(vec!["hello", "PNG"]),
                2,
            ),
            (
                "pass types keep only those",
                |f| f.pass_types = strings(&["text/plain", "image"]),
                Some(vec!["hello", "PNG"]),
                2,
            ),
            (
                "pass extensions judge named parts only",
                |f| f.pass_extensions = strings(&["pdf", "png"]),
                Some(vec!["hello", "PNG", "PDF"]),
                1,
            ),
            (
                "one part left becomes the message",
                |f| f.pass_types = strings(&["text"]),
                Some(vec!["hello"]),
                3,
            ),
            (
                "nothing left",
                |f| f.filter_types = strings(&["text", "image", "application"]),
                None,
                4,
            ),
        ];
        for (what, change, want, n_removed) in cases {
            let mut f = none();
            change(&mut f);
            let got = filter(&f, TOP.as_bytes(), MIXED.as_bytes());
            match (got, want) {
                (Filtered::Unchanged, Some(want)) => {
                    assert_eq!(n_removed, 0, "{what}");
                    assert_eq!(bodies(TOP.as_bytes(), MIXED.as_bytes()), want, "{what}");
                }
                (
                    Filtered::Changed {
                        headers,
                        body,
                        removed,
                    },
                    Some(want),
                ) => {
                    assert_eq!(bodies(&headers, &body), want, "{what}");
                    assert_eq!(removed.len(), n_removed, "{what}: {removed:?}");
                    assert!(message::has_field(&headers, "Subject"), "{what}");
                    assert_eq!(
                        message::field_values(&headers, "Content-Type").len(),
                        1,
                        "{what}"
                    );
                }
                (Filtered::Empty { removed }, None) => {
                    assert_eq!(removed.len(), n_removed, "{what}: {removed:?}")
                }
                (got, want) => panic!("{what}: got {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn a_kept_part_keeps_its_bytes_and_the_removal_is_named() {
        let mut f = none();
        f.filter_extensions = strings(&["exe"]);
        let Filtered::Changed { body, removed, .. } = filter(&f, TOP.as_bytes(), MIXED.as_bytes())
        else {
            panic!("a part removed")
        };
        let want = MIXED.replace(
            "--b1\r\nContent-Type: application/octet-stream\r\n\
             Content-Disposition: attachment; filename=run.exe\r\n\r\nMZ\r\n",
            "",
        );
        assert_eq!(String::from_utf8(body).unwrap(), want);
        assert_eq!(removed, vec!["application/octet-stream part \"run.exe\""]);
    }

    #[test]
    fn the_only_part_left_takes_the_messages_place() {
        let mut f = none();
        f.pass_types = strings(&["text/plain"]);
        let Filtered::Changed { headers, body, .. } = filter(&f, TOP.as_bytes(), MIXED.as_bytes())
        else {
            panic!("parts removed")
        };
        let headers = String::from_utf8(headers).unwrap();
        assert_eq!(
            headers,
            "From: a@example.org\r\nSubject: s\r\nMIME-Version: 1.0\r\nContent-Type: text/plain\r\n"
        );
        assert_eq!(body, b"hello");
    }

    #[test]
    fn alternatives_collapse_to_the_first() {
        let mut f = none();
        f.collapse_alternatives = true;
        let Filtered::Changed {
            headers,
            body,
            removed,
        } = filter(&f, ALTERNATIVE_TOP.as_bytes(), ALTERNATIVE.as_bytes())
        else {
            panic!("collapsed")
        };
        assert_eq!(
            message::field_values(&headers, "Content-Type"),
            vec!["text/plain; charset=utf-8"]
        );
        assert_eq!(body, b"plain");
        assert_eq!(removed, vec!["text/html alternative"]);
        // Nested in a mixed with an attachment: the alternative collapses in place.
        let nested = format!(
            "--b1\r\nContent-Type: multipart/alternative; boundary=alt\r\n\r\n{ALTERNATIVE}\r\n\
             --b1\r\nContent-Type: image/png\r\n\r\nPNG\r\n--b1--\r\n"
        );
        let Filtered::Changed { headers, body, .. } = filter(&f, TOP.as_bytes(), nested.as_bytes())
        else {
            panic!("collapsed")
        };
        assert_eq!(bodies(&headers, &body), vec!["plain", "PNG"]);
        // Without the option, an HTML alternative removed by type leaves the plain one.
        let mut f = none();
        f.filter_types = strings(&["text/html"]);
        let Filtered::Changed { body, headers, .. } =
            filter(&f, ALTERNATIVE_TOP.as_bytes(), ALTERNATIVE.as_bytes())
        else {
            panic!("filtered")
        };
        assert_eq!(bodies(&headers, &body), vec!["plain"]);
    }

    #[test]
    fn plain_posts_and_unreadable_multiparts() {
        let plain = b"From: a@example.org\r\nSubject: s\r\n";
        let mut f = none();
        f.filter_types = strings(&["image"]);
        assert_eq!(filter(&f, plain, b"text"), Filtered::Unchanged);
        // No Content-Type is text/plain: a pass list without text removes it.
        f.pass_types = strings(&["image"]);
        assert!(matches!(filter(&f, plain, b"text"), Filtered::Empty { .. }));
        // A multipart without its closing delimiter is removed whole: nothing is left.
        let mut f = none();
        f.filter_types = strings(&["image"]);
        let open = MIXED.replace("--b1--\r\n", "");
        assert_eq!(
            filter(&f, TOP.as_bytes(), open.as_bytes()),
            Filtered::Empty {
                removed: vec!["multipart/mixed the filter cannot read".into()]
            }
        );
        // An inactive filter changes nothing, even with an empty action.
        assert!(!none().is_active());
    }

    #[test]
    fn extensions_table() {
        for (name, want) in [
            ("a.PDF", Some("pdf")),
            ("dir/a.tar.gz", Some("gz")),
            ("C:\\x\\b.Exe", Some("exe")),
            ("noext", None),
            ("dot.", None),
            ("dir.d/noext", None),
        ] {
            assert_eq!(extension(name).as_deref(), want, "{name}");
        }
    }

    /// The ways a part could hide from the filter: each is removed.
    #[test]
    fn evasions_table() {
        let mut f = none();
        f.filter_extensions = strings(&["exe"]);
        f.filter_types = strings(&["application/x-msdownload"]);
        let part = |headers: &str| {
            format!(
                "--b1\r\nContent-Type: text/plain\r\n\r\nhello\r\n\
                 --b1\r\n{headers}\r\nMZ\r\n--b1--\r\n"
            )
        };
        let cases = [
            (
                "an RFC 2047 file name",
                part(
                    "Content-Type: application/octet-stream\r\n\
                      Content-Disposition: attachment; filename=\"=?utf-8?B?cnVuLmV4ZQ==?=\"\r\n",
                ),
            ),
            (
                "a trailing dot",
                part(
                    "Content-Type: application/octet-stream\r\n\
                      Content-Disposition: attachment; filename=\"run.exe.\"\r\n",
                ),
            ),
            (
                "two Content-Type fields",
                part("Content-Type: text/plain\r\nContent-Type: application/x-msdownload\r\n"),
            ),
            (
                "a type that does not parse, in a pass list of text",
                part("Content-Type: application/x-msdownload (x)\r\n"),
            ),
            (
                "an attached message holding the executable",
                part(
                    "Content-Type: message/rfc822\r\n\r\nFrom: a@example.org\r\n\
                     Content-Type: application/octet-stream; name=run.exe\r\n",
                ),
            ),
        ];
        for (what, body) in cases {
            let mut f = f.clone();
            if what.contains("pass list") {
                f.pass_types = strings(&["text"]);
            }
            match filter(&f, TOP.as_bytes(), body.as_bytes()) {
                Filtered::Changed { body, .. } => {
                    let text = String::from_utf8(body).unwrap();
                    assert!(!text.contains("MZ"), "{what}: {text}");
                    assert!(text.contains("hello"), "{what}: {text}");
                }
                other => panic!("{what}: {other:?}"),
            }
        }
        // An attached message whose content passes is kept as it was.
        let fine = part(
            "Content-Type: message/rfc822\r\n\r\nFrom: a@example.org\r\n\
             Content-Type: text/plain\r\n",
        );
        assert_eq!(
            filter(&f, TOP.as_bytes(), fine.as_bytes()),
            Filtered::Unchanged
        );
    }
}
