//! A list's header filters (`pepsi.list_header_filter`): `pepsi-list filter LIST HEADER
//! PATTERN ACTION [--position N]` adds one, `unfilter LIST POSITION` removes one, `filters
//! LIST` lists them. The list stage tries them in position order on a post's header fields;
//! the first whose field's value matches its pattern (a POSIX regular expression, without
//! regard to case) decides the post's action.
//!
//! The checks are pure functions (`header`, `pattern`, `action`, `position`); whether
//! PostgreSQL compiles a pattern is its own answer (`store::regex_error`). Each change is
//! one transaction with its `filter.add` or `filter.remove` event and its `list.filter` or
//! `list.unfilter` audit row.

use std::fmt::Write as _;

use pepsi_conf::cli::ToolFailure as Failure;
use pepsi_contract::audit;
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;

use crate::names::Action;
use crate::store::{self, Who};
pub use crate::store::{Filter, of_list};

/// The longest header field name a filter names.
pub const MAX_HEADER_CHARS: usize = 100;
/// The length of a pattern, in characters (the schema's CHECK).
pub const PATTERN_CHARS: (usize, usize) = (1, 500);
/// The filters one list may have.
pub const MAX_FILTERS: i64 = 100;
/// The positions `--position` takes.
pub const POSITIONS: (i32, i32) = (1, 1_000_000);
/// The gap between a new last filter and the one before it, room to insert between them.
pub const STEP: i32 = 10;

/// A header field name as stored: printable ASCII without ':' or space (RFC 5322's
/// field-name), 1 to `MAX_HEADER_CHARS` characters, as given.
pub fn header(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= MAX_HEADER_CHARS
        && text
            .bytes()
            .all(|b| (b'!'..=b'~').contains(&b) && b != b':');
    if !ok {
        return Err(format!(
            "header {text:?} is not a header field name: 1 to {MAX_HEADER_CHARS} printable \
             ASCII characters without ':' or space, e.g. Subject or X-Spam-Flag"
        ));
    }
    Ok(text.to_owned())
}

/// A pattern as stored: 1 to 500 characters on one line (PostgreSQL still has to compile
/// it).
pub fn pattern(text: &str) -> Result<String, String> {
    let n = text.chars().count();
    if n < PATTERN_CHARS.0 || n > PATTERN_CHARS.1 || text.chars().any(char::is_control) {
        return Err(format!(
            "pattern {text:?} is not valid: a regular expression of {} to {} characters on \
             one line",
            PATTERN_CHARS.0, PATTERN_CHARS.1
        ));
    }
    Ok(text.to_owned())
}

/// The action a filter takes, by its name (any letter case).
pub fn action(text: &str) -> Result<Action, String> {
    const ALL: [Action; 5] = [
        Action::Accept,
        Action::Hold,
        Action::Reject,
        Action::Discard,
        Action::Defer,
    ];
    ALL.into_iter()
        .find(|a| a.as_str().eq_ignore_ascii_case(text))
        .ok_or_else(|| {
            format!("action {text:?} is not one of accept, hold, reject, discard, defer")
        })
}

/// A `--position` or `unfilter` position: within `POSITIONS`.
pub fn position(n: i64) -> Result<i32, String> {
    i32::try_from(n)
        .ok()
        .filter(|p| (POSITIONS.0..=POSITIONS.1).contains(p))
        .ok_or_else(|| {
            format!(
                "position {n} is not valid: a whole number from {} to {}",
                POSITIONS.0, POSITIONS.1
            )
        })
}

/// A filter as checked, before it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFilter {
    pub header: String,
    pub pattern: String,
    pub action: Action,
    /// None: after the last (its position plus `STEP`).
    pub position: Option<i32>,
}

/// What `filter` or `unfilter` did.
#[derive(Debug, Clone, Serialize)]
pub struct FilterChange {
    pub list: String,
    pub filter: Filter,
}

/// The filters of `list`, in position order.
pub async fn list(pool: &PgPool, list: &str) -> Result<Vec<Filter>, Failure> {
    let id = store::list_id(pool, list).await?;
    let mut conn = pool.acquire().await?;
    Ok(of_list(&mut conn, id).await?)
}

/// Adds `new` (checked) to `list`, refusing a pattern PostgreSQL does not compile, a taken
/// position and a list that has `MAX_FILTERS` already.
pub async fn add(
    pool: &PgPool,
    who: &Who,
    list: &str,
    new: &NewFilter,
) -> Result<FilterChange, Failure> {
    if let Some(e) = store::regex_error(pool, &new.pattern).await? {
        return Err(Failure::Invalid(format!(
            "pattern {:?} is not a valid regular expression: {e}",
            new.pattern
        )));
    }
    let mut tx = pool.begin().await?;
    let list_id = store::lock_list(&mut tx, list).await?;
    let (count, last): (i64, Option<i32>) = sqlx::query_as(
        "SELECT count(*), max(position) FROM pepsi.list_header_filter WHERE list_id = $1",
    )
    .bind(list_id)
    .fetch_one(&mut *tx)
    .await?;
    if count >= MAX_FILTERS {
        return Err(store::other(format!(
            "{list} has {count} header filters, the most a list may have; remove one first \
             (`pepsi-list unfilter`)"
        )));
    }
    let position = match new.position {
        Some(p) => {
            let taken: Option<(String, String)> = sqlx::query_as(
                "SELECT header, pattern FROM pepsi.list_header_filter \
                  WHERE list_id = $1 AND position = $2",
            )
            .bind(list_id)
            .bind(p)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some((h, pat)) = taken {
                return Err(store::other(format!(
                    "position {p} of {list} is taken (by the filter {h} ~ {pat:?}); give \
                     another --position, or remove that one first (`pepsi-list unfilter {list} \
                     {p}`)"
                )));
            }
            p
        }
        None => last.unwrap_or(0).saturating_add(STEP),
    };
    sqlx::query(
        "INSERT INTO pepsi.list_header_filter (list_id, position, header, pattern, action) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(list_id)
    .bind(position)
    .bind(&new.header)
    .bind(&new.pattern)
    .bind(new.action.as_str())
    .execute(&mut *tx)
    .await?;
    let filter = Filter {
        position,
        header: new.header.clone(),
        pattern: new.pattern.clone(),
        action: new.action.as_str().to_owned(),
    };
    let detail = json!({"list": list, "filter": &filter});
    store::event(
        &mut tx,
        who,
        Some(list_id),
        "",
        "filter.add",
        detail.clone(),
    )
    .await?;
    audit::record(&mut tx, &who.actor, "list.filter", None, detail).await?;
    tx.commit().await?;
    Ok(FilterChange {
        list: list.to_owned(),
        filter,
    })
}

/// Removes the filter at `position` of `list`; none there is an error.
pub async fn remove(
    pool: &PgPool,
    who: &Who,
    list: &str,
    position: i32,
) -> Result<FilterChange, Failure> {
    let mut tx = pool.begin().await?;
    let list_id = store::lock_list(&mut tx, list).await?;
    let gone: Option<(String, String, String)> = sqlx::query_as(
        "DELETE FROM pepsi.list_header_filter WHERE list_id = $1 AND position = $2 \
         RETURNING header, pattern, action",
    )
    .bind(list_id)
    .bind(position)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((header, pattern, action)) = gone else {
        return Err(store::other(format!(
            "{list} has no header filter at position {position} (`pepsi-list filters {list}` \
             lists them)"
        )));
    };
    let filter = Filter {
        position,
        header,
        pattern,
        action,
    };
    let detail = json!({"list": list, "filter": &filter});
    store::event(
        &mut tx,
        who,
        Some(list_id),
        "",
        "filter.remove",
        detail.clone(),
    )
    .await?;
    audit::record(&mut tx, &who.actor, "list.unfilter", None, detail).await?;
    tx.commit().await?;
    Ok(FilterChange {
        list: list.to_owned(),
        filter,
    })
}

fn line(f: &Filter) -> String {
    format!("{} ~ {:?}: {}", f.header, f.pattern, f.action)
}

pub fn render_added(c: &FilterChange) -> String {
    format!(
        "added to {} at position {}: {}\n",
        c.list,
        c.filter.position,
        line(&c.filter)
    )
}

pub fn render_removed(c: &FilterChange) -> String {
    format!(
        "removed from {} at position {}: {}\n",
        c.list,
        c.filter.position,
        line(&c.filter)
    )
}

/// The filters as a table, or a line saying there are none.
pub fn render_list(list: &str, rows: &[Filter]) -> String {
    if rows.is_empty() {
        return format!("{list} has no header filters\n");
    }
    let width = rows
        .iter()
        .map(|f| f.header.len())
        .max()
        .unwrap_or(0)
        .max("HEADER".len());
    let mut out = format!("POSITION  {:width$}  ACTION   PATTERN\n", "HEADER");
    for f in rows {
        let _ = writeln!(
            out,
            "{:>8}  {:width$}  {:7}  {}",
            f.position, f.header, f.action, f.pattern
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_table() {
        let long = "X".repeat(MAX_HEADER_CHARS);
        let cases: &[(&str, bool)] = &[
            ("Subject", true),
            ("X-Spam-Flag", true),
            ("list-id", true),
            (&long, true),
            ("", false),
            ("X-Spam:", false),
            ("X Spam", false),
            ("Sübject", false),
            ("X-\tTab", false),
        ];
        for (text, ok) in cases {
            assert_eq!(header(text).is_ok(), *ok, "{text:?}");
        }
        let too_long = "X".repeat(MAX_HEADER_CHARS + 1);
        assert!(header(&too_long).is_err());
        let e = header("X-Spam:").unwrap_err();
        assert!(
            e.contains("\"X-Spam:\"") && e.contains("without ':'"),
            "{e}"
        );
    }

    /// The schema's CHECK on `header` takes what `header` takes.
    #[test]
    fn the_schema_checks_the_same_characters() {
        const SCHEMA: &str = include_str!("../../pepsi-setup/db/pepsi-0016.sql");
        assert!(SCHEMA.contains("header         text NOT NULL CHECK (header ~ '^[!-9;-~]+$')"));
        // '!'..'9' and ';'..'~' are '!'..'~' without ':' (0x3a).
        assert_eq!(b'9' + 1, b':');
        assert_eq!(b':' + 1, b';');
    }

    #[test]
    fn patterns_actions_and_positions_table() {
        assert_eq!(pattern("^yes$").unwrap(), "^yes$");
        assert_eq!(pattern("x").unwrap(), "x");
        assert!(pattern("").unwrap_err().contains("1 to 500"));
        assert!(pattern("a\nb").unwrap_err().contains("one line"));
        assert!(pattern(&"a".repeat(500)).is_ok());
        assert!(pattern(&"a".repeat(501)).is_err());

        let actions: &[(&str, Option<Action>)] = &[
            ("accept", Some(Action::Accept)),
            ("HOLD", Some(Action::Hold)),
            ("reject", Some(Action::Reject)),
            ("discard", Some(Action::Discard)),
            ("defer", Some(Action::Defer)),
            ("drop", None),
            ("", None),
        ];
        for (text, want) in actions {
            assert_eq!(action(text).ok(), *want, "{text:?}");
        }
        assert!(action("drop").unwrap_err().contains("\"drop\""));

        let positions: &[(i64, Option<i32>)] = &[
            (1, Some(1)),
            (10, Some(10)),
            (1_000_000, Some(1_000_000)),
            (0, None),
            (-5, None),
            (1_000_001, None),
            (i64::MAX, None),
        ];
        for (n, want) in positions {
            assert_eq!(position(*n).ok(), *want, "{n}");
        }
    }

    #[test]
    fn filters_render_in_order_with_their_fields() {
        let rows = vec![
            Filter {
                position: 10,
                header: "X-Spam-Flag".into(),
                pattern: "^yes$".into(),
                action: "discard".into(),
            },
            Filter {
                position: 20,
                header: "Subject".into(),
                pattern: "viagra".into(),
                action: "hold".into(),
            },
        ];
        assert_eq!(
            render_list("team@example.org", &rows),
            "POSITION  HEADER       ACTION   PATTERN\n\
             \x20     10  X-Spam-Flag  discard  ^yes$\n\
             \x20     20  Subject      hold     viagra\n"
        );
        assert_eq!(
            render_list("team@example.org", &[]),
            "team@example.org has no header filters\n"
        );
        let c = FilterChange {
            list: "team@example.org".into(),
            filter: rows[0].clone(),
        };
        assert_eq!(
            render_added(&c),
            "added to team@example.org at position 10: X-Spam-Flag ~ \"^yes$\": discard\n"
        );
    }
}
