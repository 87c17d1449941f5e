//! The archive's search syntax, read into the parts one fixed query uses: words and quoted
//! phrases (PostgreSQL's `websearch_to_tsquery`, so `-word` and `or` work too) over the
//! subject, author and text; `from:` (a piece of the author's address or name),
//! `subject:` (words of the subject), `after:YYYY-MM-DD` (on or after that day, UTC) and
//! `before:YYYY-MM-DD` (before that day). Pure; the input is bounded.

use chrono::NaiveDate;

/// The longest query read, in characters.
pub const MAX_QUERY_LEN: usize = 500;
/// The most terms (words, phrases and prefixed terms) in a query.
pub const MAX_TERMS: usize = 32;

/// A query read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// For `websearch_to_tsquery` over the whole post; empty for none.
    pub text: String,
    /// Each must occur in the author's address or name (case ignored).
    pub from: Vec<String>,
    /// For `websearch_to_tsquery` over the subject; empty for none.
    pub subject: String,
    pub after: Option<NaiveDate>,
    pub before: Option<NaiveDate>,
}

impl Query {
    /// Whether the query asks nothing at all.
    pub fn is_empty(&self) -> bool {
        *self == Query::default()
    }
}

/// Why a query was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("the query is longer than {MAX_QUERY_LEN} characters")]
    TooLong,
    #[error("the query has more than {MAX_TERMS} terms")]
    TooManyTerms,
    #[error("{0} has no value (give e.g. {0}alice)")]
    Empty(&'static str),
    #[error("{0}{1:?} is not a date: expected YYYY-MM-DD")]
    Date(&'static str, String),
    #[error("after:{0} is not before before:{1}: no post can match")]
    EmptyRange(NaiveDate, NaiveDate),
    #[error("a quotation mark is not closed")]
    Unclosed,
}

/// The terms of `q`: blank-separated, a quoted span kept whole with its quotation marks.
fn terms(q: &str) -> Result<Vec<String>, QueryError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in q.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if quoted {
        return Err(QueryError::Unclosed);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    if out.len() > MAX_TERMS {
        return Err(QueryError::TooManyTerms);
    }
    Ok(out)
}

/// `term` without its prefix `prefix` (any letter case), if it has it.
fn value<'a>(term: &'a str, prefix: &str) -> Option<&'a str> {
    term.get(..prefix.len())
        .filter(|p| p.eq_ignore_ascii_case(prefix))
        .map(|_| &term[prefix.len()..])
}

fn unquote(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(v)
}

fn date(prefix: &'static str, v: &str) -> Result<NaiveDate, QueryError> {
    NaiveDate::parse_from_str(v, "%Y-%m-%d").map_err(|_| QueryError::Date(prefix, v.to_owned()))
}

/// Reads a search query (see the module).
pub fn parse(q: &str) -> Result<Query, QueryError> {
    if q.chars().count() > MAX_QUERY_LEN {
        return Err(QueryError::TooLong);
    }
    let mut out = Query::default();
    let mut text: Vec<String> = Vec::new();
    let mut subject: Vec<String> = Vec::new();
    for term in terms(q)? {
        let prefixed = |p: &'static str| value(&term, p).map(|v| (p, v));
        if let Some((p, v)) = prefixed("from:") {
            let v = unquote(v).trim();
            if v.is_empty() {
                return Err(QueryError::Empty(p));
            }
            out.from.push(v.to_owned());
        } else if let Some((p, v)) = prefixed("subject:") {
            if unquote(v).trim().is_empty() {
                return Err(QueryError::Empty(p));
            }
            subject.push(v.to_owned());
        } else if let Some((p, v)) = prefixed("after:") {
            out.after = Some(date(p, v)?);
        } else if let Some((p, v)) = prefixed("before:") {
            out.before = Some(date(p, v)?);
        } else {
            text.push(term);
        }
    }
    if let (Some(a), Some(b)) = (out.after, out.before)
        && a >= b
    {
        return Err(QueryError::EmptyRange(a, b));
    }
    out.text = text.join(" ");
    out.subject = subject.join(" ");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Option<NaiveDate> {
        Some(NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap())
    }

    fn check(q: &str, want: Result<Query, &str>) {
        match (parse(q), want) {
            (Ok(g), Ok(w)) => assert_eq!(g, w, "{q:?}"),
            (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{q:?}: {e} lacks {w:?}"),
            (g, w) => panic!("{q:?}: {g:?}, wanted {w:?}"),
        }
    }

    #[test]
    fn queries_are_read_into_text_fields_and_dates() {
        let text = |t: &str| Query {
            text: t.into(),
            ..Query::default()
        };
        let cases: Vec<(&str, Result<Query, &str>)> = vec![
            ("lunch", Ok(text("lunch"))),
            ("  lunch   plans ", Ok(text("lunch plans"))),
            (
                "\"lunch plans\" -friday",
                Ok(text("\"lunch plans\" -friday")),
            ),
            (
                "from:alice lunch",
                Ok(Query {
                    text: "lunch".into(),
                    from: vec!["alice".into()],
                    ..Query::default()
                }),
            ),
            (
                "FROM:\"Alice Smith\" from:example.test",
                Ok(Query {
                    from: vec!["Alice Smith".into(), "example.test".into()],
                    ..Query::default()
                }),
            ),
            (
                "subject:lunch subject:\"next week\"",
                Ok(Query {
                    subject: "lunch \"next week\"".into(),
                    ..Query::default()
                }),
            ),
            (
                "after:2026-01-01 before:2026-02-01 x",
                Ok(Query {
                    text: "x".into(),
                    after: d("2026-01-01"),
                    before: d("2026-02-01"),
                    ..Query::default()
                }),
            ),
            ("", Ok(Query::default())),
            ("from:", Err("from: has no value")),
            ("from:\"\"", Err("from: has no value")),
            ("subject:", Err("subject: has no value")),
            (
                "after:yesterday",
                Err("after:\"yesterday\" is not a date: expected YYYY-MM-DD"),
            ),
            (
                "before:2026-13-01",
                Err("before:\"2026-13-01\" is not a date"),
            ),
            ("after:2026-02-01 before:2026-02-01", Err("is not before")),
            ("\"lunch", Err("a quotation mark is not closed")),
        ];
        for (q, want) in cases {
            check(q, want);
        }
        check(&"x".repeat(MAX_QUERY_LEN + 1), Err("longer than 500"));
        check(&"x ".repeat(MAX_TERMS + 1), Err("more than 32 terms"));
        assert!(parse("").unwrap().is_empty());
    }
}
