//! A list's content filter (`pepsi.list_content_filter`): `pepsi-list content-filter LIST`
//! shows it; with options it changes what they name and keeps the rest; `--clear` removes
//! it. The list stage applies it to every post it accepts (`pepsi_stage_list::content`):
//! MIME types and file extensions removed, HTML alternatives collapsed, and a post left
//! with nothing held, refused or discarded (`empty_action`).
//!
//! The checks are pure functions (`types`, `extensions`, `yes_no`, `empty_action`); each
//! change is one transaction with its `content_filter.set` or `content_filter.clear` event
//! and its `list.content-filter` audit row.

use std::fmt::Write as _;

use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_contract::audit;
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;

use crate::store::{self, Who};
pub use pepsi_contract::list::{ContentFilter, EmptyAction};

/// The most entries one of the four lists may hold.
pub const MAX_ENTRIES: usize = 100;
/// The longest extension, in characters.
pub const MAX_EXTENSION_CHARS: usize = 20;
/// The longest type entry (RFC 6838 allows 127 characters on each side of the slash).
pub const MAX_TYPE_CHARS: usize = 255;

/// The changes `content-filter` was given, checked; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    pub filter_types: Option<Vec<String>>,
    pub pass_types: Option<Vec<String>>,
    pub filter_extensions: Option<Vec<String>>,
    pub pass_extensions: Option<Vec<String>>,
    pub collapse_alternatives: Option<bool>,
    pub empty_action: Option<EmptyAction>,
}

impl Change {
    pub fn is_empty(&self) -> bool {
        *self == Change::default()
    }

    /// `current` with this change applied.
    pub fn apply(&self, current: &ContentFilter) -> ContentFilter {
        ContentFilter {
            filter_types: self
                .filter_types
                .clone()
                .unwrap_or_else(|| current.filter_types.clone()),
            pass_types: self
                .pass_types
                .clone()
                .unwrap_or_else(|| current.pass_types.clone()),
            filter_extensions: self
                .filter_extensions
                .clone()
                .unwrap_or_else(|| current.filter_extensions.clone()),
            pass_extensions: self
                .pass_extensions
                .clone()
                .unwrap_or_else(|| current.pass_extensions.clone()),
            collapse_alternatives: self
                .collapse_alternatives
                .unwrap_or(current.collapse_alternatives),
            empty_action: self.empty_action.unwrap_or(current.empty_action),
        }
    }
}

/// Comma-separated entries, trimmed, empty ones dropped, each once in their order; an
/// empty text is the empty list. More than `MAX_ENTRIES` is refused.
fn entries(option: &str, text: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for e in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let e = e.to_lowercase();
        if !out.contains(&e) {
            out.push(e);
        }
    }
    if out.len() > MAX_ENTRIES {
        return Err(format!(
            "{option} has {} entries, more than the {MAX_ENTRIES} a list may have",
            out.len()
        ));
    }
    Ok(out)
}

/// Whether `s` is an RFC 6838 restricted-name (letters, digits and `!#$&-^_.+`, starting
/// with a letter or digit).
fn restricted_name(s: &str) -> bool {
    s.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
}

/// `--filter-types` or `--pass-types`: media types (`image/png`) or top-level types
/// (`image`), lower-cased. A multipart is entered, never removed, so it is refused.
pub fn types(option: &str, text: &str) -> Result<Vec<String>, String> {
    let out = entries(option, text)?;
    for t in &out {
        let (main, sub) = match t.split_once('/') {
            Some((m, s)) => (m, Some(s)),
            None => (t.as_str(), None),
        };
        if t.len() > MAX_TYPE_CHARS
            || !restricted_name(main)
            || sub.is_some_and(|s| !restricted_name(s))
        {
            return Err(format!(
                "{option}: {t:?} is not a media type: a type like image/png or a top-level \
                 type like image (letters, digits and !#$&-^_.+)"
            ));
        }
        if main == "multipart" {
            return Err(format!(
                "{option}: {t:?} cannot be filtered: a multipart is entered and its parts \
                 judged one by one (use --collapse-alternatives for multipart/alternative)"
            ));
        }
    }
    Ok(out)
}

/// `--filter-extensions` or `--pass-extensions`: file name extensions, lower-cased, with or
/// without their dot (`pdf`, `.exe`).
pub fn extensions(option: &str, text: &str) -> Result<Vec<String>, String> {
    let out: Vec<String> = entries(option, text)?
        .into_iter()
        .map(|e| e.trim_start_matches('.').to_owned())
        .collect();
    for e in &out {
        let ok = !e.is_empty()
            && e.chars().count() <= MAX_EXTENSION_CHARS
            && e.chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '+');
        if !ok {
            return Err(format!(
                "{option}: {e:?} is not a file name extension: 1 to {MAX_EXTENSION_CHARS} \
                 letters, digits, '_', '-' or '+', e.g. pdf or exe"
            ));
        }
    }
    Ok(out)
}

/// `--collapse-alternatives`: yes or no (true/false, on/off).
pub fn yes_no(option: &str, text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "yes" | "true" | "on" => Ok(true),
        "no" | "false" | "off" => Ok(false),
        _ => Err(format!("{option}: {text:?} is not yes or no")),
    }
}

/// `--empty-action`: hold, reject or discard.
pub fn empty_action(text: &str) -> Result<EmptyAction, String> {
    EmptyAction::parse(&text.to_ascii_lowercase())
        .ok_or_else(|| format!("--empty-action: {text:?} is not one of hold, reject, discard"))
}

/// What `content-filter` shows or did: the list's filter (`None`: it has none).
#[derive(Debug, Clone, Serialize)]
pub struct Shown {
    pub list: String,
    pub content_filter: Option<ContentFilter>,
    /// Whether this run changed it.
    pub changed: bool,
}

const SELECT: &str = "SELECT filter_types, pass_types, filter_extensions, pass_extensions, \
    collapse_alternatives, empty_action FROM pepsi.list_content_filter WHERE list_id = $1";

type Row = (
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    bool,
    String,
);

fn from_row(r: Row) -> Result<ContentFilter, Failure> {
    Ok(ContentFilter {
        filter_types: r.0,
        pass_types: r.1,
        filter_extensions: r.2,
        pass_extensions: r.3,
        collapse_alternatives: r.4,
        empty_action: EmptyAction::parse(&r.5)
            .ok_or_else(|| store::other(format!("list_content_filter.empty_action = {:?}", r.5)))?,
    })
}

/// The content filter of `list`.
pub async fn show(pool: &PgPool, list: &str) -> Result<Shown, Failure> {
    let id = store::list_id(pool, list).await?;
    let row: Option<Row> = sqlx::query_as(SELECT).bind(id).fetch_optional(pool).await?;
    Ok(Shown {
        list: list.to_owned(),
        content_filter: row.map(from_row).transpose()?,
        changed: false,
    })
}

/// Applies `change` to `list`'s filter (made from the defaults when it has none).
pub async fn set(pool: &PgPool, who: &Who, list: &str, change: &Change) -> Result<Shown, Failure> {
    let mut tx = pool.begin().await?;
    let list_id = store::lock_list(&mut tx, list).await?;
    let current: Option<Row> = sqlx::query_as(SELECT)
        .bind(list_id)
        .fetch_optional(&mut *tx)
        .await?;
    let before = current.map(from_row).transpose()?;
    let after = change.apply(before.as_ref().unwrap_or(&ContentFilter::default()));
    sqlx::query(
        "INSERT INTO pepsi.list_content_filter (list_id, filter_types, pass_types, \
           filter_extensions, pass_extensions, collapse_alternatives, empty_action) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (list_id) DO UPDATE SET filter_types = EXCLUDED.filter_types, \
           pass_types = EXCLUDED.pass_types, filter_extensions = EXCLUDED.filter_extensions, \
           pass_extensions = EXCLUDED.pass_extensions, \
           collapse_alternatives = EXCLUDED.collapse_alternatives, \
           empty_action = EXCLUDED.empty_action, updated_at = now()",
    )
    .bind(list_id)
    .bind(&after.filter_types)
    .bind(&after.pass_types)
    .bind(&after.filter_extensions)
    .bind(&after.pass_extensions)
    .bind(after.collapse_alternatives)
    .bind(after.empty_action.as_str())
    .execute(&mut *tx)
    .await?;
    let detail = json!({"list": list, "before": before, "after": &after});
    store::event(
        &mut tx,
        who,
        Some(list_id),
        "",
        "content_filter.set",
        detail.clone(),
    )
    .await?;
    audit::record(&mut tx, &who.actor, "list.content-filter", None, detail).await?;
    tx.commit().await?;
    Ok(Shown {
        list: list.to_owned(),
        content_filter: Some(after),
        changed: true,
    })
}

/// Removes `list`'s filter; a list without one is reported, not an error.
pub async fn clear(pool: &PgPool, who: &Who, list: &str) -> Result<Shown, Failure> {
    let mut tx = pool.begin().await?;
    let list_id = store::lock_list(&mut tx, list).await?;
    let gone: Option<Row> = sqlx::query_as(
        "DELETE FROM pepsi.list_content_filter WHERE list_id = $1 RETURNING filter_types, \
         pass_types, filter_extensions, pass_extensions, collapse_alternatives, empty_action",
    )
    .bind(list_id)
    .fetch_optional(&mut *tx)
    .await?;
    let changed = gone.is_some();
    if let Some(before) = gone.map(from_row).transpose()? {
        let detail = json!({"list": list, "before": before, "after": null});
        store::event(
            &mut tx,
            who,
            Some(list_id),
            "",
            "content_filter.clear",
            detail.clone(),
        )
        .await?;
        audit::record(&mut tx, &who.actor, "list.content-filter", None, detail).await?;
    }
    tx.commit().await?;
    Ok(Shown {
        list: list.to_owned(),
        content_filter: None,
        changed,
    })
}

fn joined(v: &[String]) -> String {
    if v.is_empty() {
        "-".to_owned()
    } else {
        v.join(", ")
    }
}

/// The filter as text.
pub fn render(s: &Shown) -> String {
    let Some(f) = &s.content_filter else {
        return if s.changed {
            format!("removed the content filter of {}\n", s.list)
        } else {
            format!("{} has no content filter: posts go out whole\n", s.list)
        };
    };
    let mut out = format!(
        "{}the content filter of {}:\n",
        if s.changed { "set " } else { "" },
        s.list
    );
    let _ = writeln!(out, "  filter types:          {}", joined(&f.filter_types));
    let _ = writeln!(out, "  pass types:            {}", joined(&f.pass_types));
    let _ = writeln!(
        out,
        "  filter extensions:     {}",
        joined(&f.filter_extensions)
    );
    let _ = writeln!(
        out,
        "  pass extensions:       {}",
        joined(&f.pass_extensions)
    );
    let _ = writeln!(
        out,
        "  collapse alternatives: {}",
        if f.collapse_alternatives { "yes" } else { "no" }
    );
    let _ = writeln!(out, "  a post left empty:     {}", f.empty_action.as_str());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_table() {
        let ok: &[(&str, &[&str])] = &[
            ("image/png, Image", &["image/png", "image"]),
            ("application/vnd.ms-excel", &["application/vnd.ms-excel"]),
            ("text/html,text/html,", &["text/html"]),
            ("", &[]),
            (" , ", &[]),
        ];
        for (text, want) in ok {
            assert_eq!(types("--filter-types", text).unwrap(), *want, "{text:?}");
        }
        for bad in [
            "image/",
            "/png",
            "image/png/x",
            "ima ge",
            "multipart/alternative",
            "multipart",
        ] {
            let e = types("--pass-types", bad).unwrap_err();
            assert!(e.starts_with("--pass-types: "), "{e}");
        }
        let many: Vec<String> = (0..=MAX_ENTRIES).map(|n| format!("x/y{n}")).collect();
        assert!(
            types("--filter-types", &many.join(","))
                .unwrap_err()
                .contains("more than")
        );
    }

    #[test]
    fn extensions_and_words_table() {
        assert_eq!(
            extensions("--filter-extensions", ".EXE, bat,,pdf").unwrap(),
            vec!["exe", "bat", "pdf"]
        );
        for bad in [".", "tar.gz", "a b", &"x".repeat(MAX_EXTENSION_CHARS + 1)] {
            assert!(extensions("--pass-extensions", bad).is_err(), "{bad:?}");
        }
        assert_eq!(yes_no("--collapse-alternatives", "Yes"), Ok(true));
        assert_eq!(yes_no("--collapse-alternatives", "off"), Ok(false));
        assert!(yes_no("--collapse-alternatives", "maybe").is_err());
        assert_eq!(empty_action("HOLD").unwrap(), EmptyAction::Hold);
        assert!(
            empty_action("accept")
                .unwrap_err()
                .contains("hold, reject, discard")
        );
    }

    #[test]
    fn a_change_keeps_what_it_does_not_name() {
        let current = ContentFilter {
            filter_types: vec!["image".into()],
            collapse_alternatives: true,
            ..ContentFilter::default()
        };
        let change = Change {
            filter_extensions: Some(vec!["exe".into()]),
            empty_action: Some(EmptyAction::Discard),
            ..Change::default()
        };
        let after = change.apply(&current);
        assert_eq!(after.filter_types, vec!["image"]);
        assert!(after.collapse_alternatives);
        assert_eq!(after.filter_extensions, vec!["exe"]);
        assert_eq!(after.empty_action, EmptyAction::Discard);
        assert!(Change::default().is_empty());
        assert!(!change.is_empty());
    }

    #[test]
    fn renders() {
        let none = Shown {
            list: "team@example.org".into(),
            content_filter: None,
            changed: false,
        };
        assert_eq!(
            render(&none),
            "team@example.org has no content filter: posts go out whole\n"
        );
        let set = Shown {
            content_filter: Some(ContentFilter {
                filter_types: vec!["image".into(), "video".into()],
                ..ContentFilter::default()
            }),
            changed: true,
            ..none
        };
        let text = render(&set);
        assert!(
            text.starts_with("set the content filter of team@example.org:\n"),
            "{text}"
        );
        assert!(
            text.contains("  filter types:          image, video\n"),
            "{text}"
        );
        assert!(text.contains("  pass types:            -\n"), "{text}");
        assert!(text.contains("  a post left empty:     reject\n"), "{text}");
    }
}
