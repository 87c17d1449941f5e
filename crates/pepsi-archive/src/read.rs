//! Reading the archive for its readers (docs/archive.md, "The pages"): a list's months and
//! threads, a thread's posts and placeholders, one post with its bytes and parts, and the
//! login links and sessions of private archives (`archive_reader`). Shared by pepsi-httpd's
//! pages and the operator tool; it never writes a post. [`tree`], [`shown`] and
//! [`part_contents`] are pure.
//!
//! A thread's parents come from References that anybody can forge, into cycles too: the
//! walk of [`tree`] visits each node once and is bounded in depth and count.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, NaiveDate, Utc};
use mail_parser::{MessageParser, PartType};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row as _};

/// The most nodes (posts and placeholders) of a thread read.
pub const MAX_THREAD_NODES: i64 = 2000;
/// The most threads a list or month page shows.
pub const MAX_THREADS: i64 = 1000;
/// The most bytes of a post's text its own page shows.
pub const MAX_SHOWN: usize = 1024 * 1024;
/// The most bytes of each post's text a page of many posts (a thread, a feed) shows; the
/// rest is cut before any sanitising, and the post's own page shows it.
pub const MAX_SHOWN_OF_MANY: usize = 64 * 1024;

/// Who may read a list's archive (`mailing_list.archive_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Public,
    Private,
    None,
}

impl Policy {
    /// The policy as `archive_policy` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Public => "public",
            Policy::Private => "private",
            Policy::None => "none",
        }
    }
}

/// A list as its archive shows it.
#[derive(Debug, Clone)]
pub struct ArchiveList {
    pub list_id: i64,
    pub address: String,
    pub display_name: String,
    pub policy: Policy,
}

/// The list of address `address` (as stored).
pub async fn list(pool: &PgPool, address: &str) -> sqlx::Result<Option<ArchiveList>> {
    let row: Option<(i64, String, String, String)> = sqlx::query_as(
        "SELECT list_id, address, display_name, archive_policy FROM pepsi.mailing_list \
          WHERE address = $1",
    )
    .bind(address)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(list_id, address, display_name, p)| ArchiveList {
        list_id,
        address,
        display_name,
        policy: match p.as_str() {
            "public" => Policy::Public,
            "private" => Policy::Private,
            _ => Policy::None,
        },
    }))
}

/// The list's months with posts, newest first: (first day, posts).
pub async fn months(pool: &PgPool, list_id: i64) -> sqlx::Result<Vec<(NaiveDate, i32)>> {
    sqlx::query_as(
        "SELECT month, message_count FROM pepsi.archive_month WHERE list_id = $1 \
          ORDER BY month DESC LIMIT 1200",
    )
    .bind(list_id)
    .fetch_all(pool)
    .await
}

/// A thread as a list of threads shows it.
#[derive(Debug, Clone)]
pub struct ThreadRow {
    pub thread_id: i64,
    pub root_url_id: String,
    pub subject: String,
    pub first_date: DateTime<Utc>,
    pub last_date: DateTime<Utc>,
    pub message_count: i32,
}

/// The threads with the latest posts, latest first, at most `limit`.
pub async fn latest_threads(
    pool: &PgPool,
    list_id: i64,
    limit: i64,
) -> sqlx::Result<Vec<ThreadRow>> {
    let rows = sqlx::query(
        "SELECT thread_id, root_url_id, subject, first_date, last_date, message_count \
           FROM pepsi.archive_thread WHERE list_id = $1 AND message_count > 0 \
          ORDER BY last_date DESC, thread_id DESC LIMIT $2",
    )
    .bind(list_id)
    .bind(limit.clamp(1, MAX_THREADS))
    .fetch_all(pool)
    .await?;
    rows.iter().map(thread_row).collect()
}

/// The threads with posts dated in the month starting `month` (UTC), in the order of
/// their first post of that month.
pub async fn month_threads(
    pool: &PgPool,
    list_id: i64,
    month: NaiveDate,
) -> sqlx::Result<Vec<ThreadRow>> {
    let rows = sqlx::query(
        "SELECT t.thread_id, t.root_url_id, t.subject, t.first_date, t.last_date, \
                t.message_count \
           FROM pepsi.archive_thread t \
           JOIN (SELECT thread_id, min(date) AS first_in_month FROM pepsi.archive_message \
                  WHERE list_id = $1 AND date >= ($2::date AT TIME ZONE 'UTC') \
                    AND date < (($2::date + interval '1 month') AT TIME ZONE 'UTC') \
                  GROUP BY thread_id) m USING (thread_id) \
          ORDER BY m.first_in_month, t.thread_id LIMIT $3",
    )
    .bind(list_id)
    .bind(month)
    .bind(MAX_THREADS)
    .fetch_all(pool)
    .await?;
    rows.iter().map(thread_row).collect()
}

/// The thread holding the post or placeholder `url_id`.
pub async fn thread_of(
    pool: &PgPool,
    list_id: i64,
    url_id: &str,
) -> sqlx::Result<Option<ThreadRow>> {
    let row = sqlx::query(
        "SELECT thread_id, root_url_id, subject, first_date, last_date, message_count \
           FROM pepsi.archive_thread WHERE thread_id = \
           (SELECT thread_id FROM pepsi.archive_message WHERE list_id = $1 AND url_id = $2 \
            UNION ALL \
            SELECT thread_id FROM pepsi.archive_placeholder WHERE list_id = $1 AND url_id = $2 \
            LIMIT 1)",
    )
    .bind(list_id)
    .bind(url_id)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(thread_row).transpose()
}

fn thread_row(r: &PgRow) -> sqlx::Result<ThreadRow> {
    Ok(ThreadRow {
        thread_id: r.try_get("thread_id")?,
        root_url_id: r.try_get("root_url_id")?,
        subject: r.try_get("subject")?,
        first_date: r.try_get("first_date")?,
        last_date: r.try_get("last_date")?,
        message_count: r.try_get("message_count")?,
    })
}

fn post_row(r: &PgRow) -> sqlx::Result<PostRow> {
    Ok(PostRow {
        archive_id: r.try_get("archive_id")?,
        url_id: r.try_get("url_id")?,
        message_id: r.try_get("message_id")?,
        subject: r.try_get("subject")?,
        from_address: r.try_get("from_address")?,
        from_name: r.try_get("from_name")?,
        date: r.try_get("date")?,
        thread_id: r.try_get("thread_id")?,
        parent_url_id: r.try_get("parent_url_id")?,
    })
}

/// An archived post without its bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PostRow {
    /// The row's id, for [`raw`] and [`parts`]; not for anyone to see (the url id is).
    #[serde(skip)]
    pub archive_id: i64,
    pub url_id: String,
    pub message_id: String,
    pub subject: String,
    pub from_address: String,
    pub from_name: String,
    pub date: DateTime<Utc>,
    pub thread_id: i64,
    pub parent_url_id: Option<String>,
}

macro_rules! post_sql {
    () => {
        "SELECT archive_id, url_id, message_id, subject, from_address, from_name, date, \
                thread_id, parent_url_id FROM pepsi.archive_message"
    };
}

/// The post `url_id` of the list.
pub async fn post(pool: &PgPool, list_id: i64, url_id: &str) -> sqlx::Result<Option<PostRow>> {
    let row = sqlx::query(concat!(post_sql!(), " WHERE list_id = $1 AND url_id = $2"))
        .bind(list_id)
        .bind(url_id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(post_row).transpose()
}

/// The list's latest posts, newest first, at most `limit` (1 to 200).
pub async fn latest_posts(pool: &PgPool, list_id: i64, limit: i64) -> sqlx::Result<Vec<PostRow>> {
    let rows = sqlx::query(concat!(
        post_sql!(),
        " WHERE list_id = $1 ORDER BY date DESC, archive_id DESC LIMIT $2"
    ))
    .bind(list_id)
    .bind(limit.clamp(1, 200))
    .fetch_all(pool)
    .await?;
    rows.iter().map(post_row).collect()
}

/// One node of a thread: a post, or a placeholder (`post` none) for a Message-ID the
/// archive does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub url_id: String,
    pub parent: Option<String>,
    pub post: Option<PostRow>,
}

impl Node {
    fn date(&self) -> Option<DateTime<Utc>> {
        self.post.as_ref().map(|p| p.date)
    }
}

/// The posts and placeholders of thread `thread_id`, at most [`MAX_THREAD_NODES`] (the
/// earliest posts first).
pub async fn thread_nodes(pool: &PgPool, thread_id: i64) -> sqlx::Result<Vec<Node>> {
    let posts = sqlx::query(concat!(
        post_sql!(),
        " WHERE thread_id = $1 ORDER BY date, archive_id LIMIT $2"
    ))
    .bind(thread_id)
    .bind(MAX_THREAD_NODES)
    .fetch_all(pool)
    .await?
    .iter()
    .map(post_row)
    .collect::<sqlx::Result<Vec<_>>>()?;
    let room = MAX_THREAD_NODES - posts.len() as i64;
    let placeholders: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT url_id, parent_url_id FROM pepsi.archive_placeholder WHERE thread_id = $1 \
          ORDER BY created_at, url_id LIMIT $2",
    )
    .bind(thread_id)
    .bind(room.max(0))
    .fetch_all(pool)
    .await?;
    let mut nodes: Vec<Node> = posts
        .into_iter()
        .map(|p| Node {
            url_id: p.url_id.clone(),
            parent: p.parent_url_id.clone(),
            post: Some(p),
        })
        .collect();
    nodes.extend(placeholders.into_iter().map(|(url_id, parent)| Node {
        url_id,
        parent,
        post: None,
    }));
    Ok(nodes)
}

/// The order a thread is shown in: (depth, index into `nodes`), each node at most once,
/// depth-first from the roots, children by date (a placeholder by its earliest child's).
/// A root is a node without a parent in `nodes`; nodes only reachable through a cycle are
/// walked from their earliest one after the rest. Depth is capped at `max_depth` (deeper
/// nodes are shown at it) and the walk stops after `max_count` nodes.
pub fn tree(nodes: &[Node], max_depth: usize, max_count: usize) -> Vec<(usize, usize)> {
    let index: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.url_id.as_str(), i))
        .collect();
    let parent_of = |i: usize| {
        nodes[i]
            .parent
            .as_deref()
            .and_then(|p| index.get(p).copied())
            .filter(|p| *p != i)
    };
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for i in 0..nodes.len() {
        if let Some(p) = parent_of(i) {
            children[p].push(i);
        }
    }
    // A placeholder sorts by the earliest of its children's dates.
    let key: Vec<(Option<DateTime<Utc>>, &str)> = (0..nodes.len())
        .map(|i| {
            let date = nodes[i]
                .date()
                .or_else(|| children[i].iter().filter_map(|c| nodes[*c].date()).min());
            (date, nodes[i].url_id.as_str())
        })
        .collect();
    for c in &mut children {
        c.sort_by_key(|i| key[*i]);
    }
    let mut roots: Vec<usize> = (0..nodes.len())
        .filter(|i| parent_of(*i).is_none())
        .collect();
    roots.sort_by_key(|i| key[*i]);
    let mut rest: Vec<usize> = (0..nodes.len()).collect();
    rest.sort_by_key(|i| key[*i]);
    let mut seen: HashSet<usize> = HashSet::new();
    let mut out = Vec::new();
    for start in roots.into_iter().chain(rest) {
        if seen.contains(&start) {
            continue;
        }
        let mut stack = vec![(0usize, start)];
        while let Some((depth, i)) = stack.pop() {
            if out.len() >= max_count {
                return out;
            }
            if !seen.insert(i) {
                continue;
            }
            out.push((depth.min(max_depth), i));
            for c in children[i].iter().rev() {
                if !seen.contains(c) {
                    stack.push((depth + 1, *c));
                }
            }
        }
    }
    out
}

/// The bytes of archived post `archive_id` (header block, CRLF, body).
pub async fn raw(pool: &PgPool, archive_id: i64) -> sqlx::Result<Option<Vec<u8>>> {
    sqlx::query_scalar("SELECT raw FROM pepsi.archive_body WHERE archive_id = $1")
        .bind(archive_id)
        .fetch_optional(pool)
        .await
}

/// The bytes of several posts, by archive id.
pub async fn raws(pool: &PgPool, archive_ids: &[i64]) -> sqlx::Result<HashMap<i64, Vec<u8>>> {
    let rows =
        sqlx::query("SELECT archive_id, raw FROM pepsi.archive_body WHERE archive_id = ANY($1)")
            .bind(archive_ids)
            .fetch_all(pool)
            .await?;
    rows.into_iter()
        .map(|r| Ok((r.try_get("archive_id")?, r.try_get("raw")?)))
        .collect()
}

/// One leaf part of a post, as `archive_part` records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartRow {
    pub part_index: i32,
    pub content_type: String,
    pub file_name: Option<String>,
    pub size: i64,
}

/// The leaf parts of post `archive_id`, in order.
pub async fn parts(pool: &PgPool, archive_id: i64) -> sqlx::Result<Vec<PartRow>> {
    let rows: Vec<(i32, String, Option<String>, i64)> = sqlx::query_as(
        "SELECT part_index, content_type, file_name, size FROM pepsi.archive_part \
          WHERE archive_id = $1 ORDER BY part_index",
    )
    .bind(archive_id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(part_index, content_type, file_name, size)| PartRow {
            part_index,
            content_type,
            file_name,
            size,
        })
        .collect())
}

/// What a page shows of a post: its first text/plain body part, else its first HTML body
/// part (to be sanitised by the caller, never shown as it is), each cut to a bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shown {
    pub text: Option<String>,
    pub html: Option<String>,
    /// The text or HTML was cut.
    pub truncated: bool,
}

/// [`Shown`] of the post `raw`, at most [`MAX_SHOWN`] bytes.
pub fn shown(raw: &[u8]) -> Shown {
    shown_within(raw, MAX_SHOWN)
}

/// [`Shown`] of the post `raw`, its text or HTML cut to at most `max` bytes (at a
/// character's boundary).
pub fn shown_within(raw: &[u8], max: usize) -> Shown {
    let Some(m) = MessageParser::default().parse(raw) else {
        return Shown::default();
    };
    let mut truncated = false;
    let mut cut = |t: &str| {
        let end = t.floor_char_boundary(max.min(t.len()));
        truncated = end < t.len();
        t[..end].to_owned()
    };
    let text = m
        .text_body
        .iter()
        .find_map(|i| match &m.parts.get(*i as usize)?.body {
            PartType::Text(t) => Some(cut(t)),
            _ => None,
        });
    let html = match text {
        Some(_) => None,
        None => m
            .html_body
            .iter()
            .find_map(|i| match &m.parts.get(*i as usize)?.body {
                PartType::Html(t) => Some(cut(t)),
                _ => None,
            }),
    };
    Shown {
        text,
        html,
        truncated,
    }
}

/// The decoded contents of leaf part `index` of the post `raw` (the numbering of
/// `archive_part`), or `None` for no such leaf part.
pub fn part_contents(raw: &[u8], index: usize) -> Option<Vec<u8>> {
    let m = MessageParser::default().parse(raw)?;
    let part = m.parts.get(index)?;
    match &part.body {
        PartType::Multipart(_) => None,
        PartType::Text(t) | PartType::Html(t) => Some(t.as_bytes().to_vec()),
        PartType::Binary(b) | PartType::InlineBinary(b) => Some(b.to_vec()),
        PartType::Message(msg) => Some(msg.raw_message().to_vec()),
    }
}

/// Records a login link to the private archive of `list_id` for `address`: the sha256 of
/// its token, unused (`used_at` null), working for `lifetime_secs`. Expired rows of every
/// list go at the same time.
pub async fn add_login_link(
    tx: &mut PgConnection,
    list_id: i64,
    address: &str,
    token_hash: &[u8],
    lifetime_secs: f64,
) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM pepsi.archive_reader WHERE expires_at < now()")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO pepsi.archive_reader (list_id, address, token_hash, expires_at) \
         VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
    )
    .bind(list_id)
    .bind(address)
    .bind(token_hash)
    .bind(lifetime_secs)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The address of the unused, unexpired login link `link_hash` of `list_id`.
pub async fn login_link(
    pool: &PgPool,
    list_id: i64,
    link_hash: &[u8],
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT address FROM pepsi.archive_reader WHERE list_id = $1 AND token_hash = $2 \
            AND used_at IS NULL AND expires_at > now()",
    )
    .bind(list_id)
    .bind(link_hash)
    .fetch_optional(pool)
    .await
}

/// Uses the login link `link_hash` of `list_id` once: the link's row goes, and a session
/// row takes its place, with `session_hash`, `used_at` now (a session is a used link) and
/// `session_secs` to live, when its address is still a member. Returns the address, or
/// `None` for a link unknown, used, expired, or of one who is no longer a member.
pub async fn open_session(
    pool: &PgPool,
    list_id: i64,
    link_hash: &[u8],
    session_hash: &[u8],
    session_secs: f64,
) -> sqlx::Result<Option<String>> {
    let mut tx = pool.begin().await?;
    let address: Option<String> = sqlx::query_scalar(
        "DELETE FROM pepsi.archive_reader WHERE list_id = $1 AND token_hash = $2 \
            AND used_at IS NULL AND expires_at > now() RETURNING address",
    )
    .bind(list_id)
    .bind(link_hash)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(address) = address else {
        return Ok(None);
    };
    if !pepsi_contract::list::is_member(&mut *tx, list_id, &address).await? {
        tx.commit().await?;
        return Ok(None);
    }
    sqlx::query(
        "INSERT INTO pepsi.archive_reader (list_id, address, token_hash, expires_at, used_at) \
         VALUES ($1, $2, $3, now() + make_interval(secs => $4), now())",
    )
    .bind(list_id)
    .bind(&address)
    .bind(session_hash)
    .bind(session_secs)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(address))
}

/// The reader of session `session_hash` on `list_id`, while it is unexpired and its
/// address a member of the list: membership is asked each time, so one who left reads no
/// more.
pub async fn reader(
    pool: &PgPool,
    list_id: i64,
    session_hash: &[u8],
) -> sqlx::Result<Option<String>> {
    let address: Option<String> = sqlx::query_scalar(
        "SELECT address FROM pepsi.archive_reader WHERE list_id = $1 AND token_hash = $2 \
            AND used_at IS NOT NULL AND expires_at > now()",
    )
    .bind(list_id)
    .bind(session_hash)
    .fetch_optional(pool)
    .await?;
    match address {
        Some(a) if pepsi_contract::list::is_member(pool, list_id, &a).await? => Ok(Some(a)),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(url: &str, parent: Option<&str>, minute: u32) -> Node {
        Node {
            url_id: url.into(),
            parent: parent.map(Into::into),
            post: Some(PostRow {
                archive_id: 0,
                url_id: url.into(),
                message_id: format!("{url}@x"),
                subject: String::new(),
                from_address: String::new(),
                from_name: String::new(),
                date: DateTime::from_timestamp(i64::from(minute) * 60, 0).unwrap(),
                thread_id: 1,
                parent_url_id: parent.map(Into::into),
            }),
        }
    }

    fn gap(url: &str, parent: Option<&str>) -> Node {
        Node {
            url_id: url.into(),
            parent: parent.map(Into::into),
            post: None,
        }
    }

    /// The walk as "depth:url" items.
    fn check(nodes: &[Node], max_depth: usize, max_count: usize, expected: &str) {
        let got: Vec<String> = tree(nodes, max_depth, max_count)
            .into_iter()
            .map(|(d, i)| format!("{d}:{}", nodes[i].url_id))
            .collect();
        assert_eq!(got.join(" "), expected, "{nodes:?}");
    }

    #[test]
    fn threads_walk_in_order_once_and_bounded() {
        let cases: &[(&[Node], usize, usize, &str)] = &[
            // Replies by date under their parents, depth first.
            (
                &[
                    post("a", None, 1),
                    post("c", Some("a"), 3),
                    post("b", Some("a"), 2),
                    post("d", Some("b"), 4),
                ],
                50,
                100,
                "0:a 1:b 2:d 1:c",
            ),
            // A placeholder root sorts by its earliest child.
            (
                &[post("r", Some("p"), 5), gap("p", None), post("s", None, 1)],
                50,
                100,
                "0:s 0:p 1:r",
            ),
            // A parent outside the thread makes a root.
            (&[post("a", Some("zz"), 1)], 50, 100, "0:a"),
            // A cycle (forged References) is walked once, from its earliest node.
            (
                &[post("a", Some("b"), 2), post("b", Some("a"), 1)],
                50,
                100,
                "0:b 1:a",
            ),
            // A post that is its own parent is a root.
            (&[post("a", Some("a"), 1)], 50, 100, "0:a"),
            // Depth is capped, nothing is dropped.
            (
                &[
                    post("a", None, 1),
                    post("b", Some("a"), 2),
                    post("c", Some("b"), 3),
                ],
                1,
                100,
                "0:a 1:b 1:c",
            ),
            // The count bounds the walk.
            (
                &[
                    post("a", None, 1),
                    post("b", Some("a"), 2),
                    post("c", Some("b"), 3),
                ],
                50,
                2,
                "0:a 1:b",
            ),
            (&[], 50, 100, ""),
        ];
        for (nodes, depth, count, expected) in cases {
            check(nodes, *depth, *count, expected);
        }
    }

    #[test]
    fn shown_prefers_text_and_keeps_html_apart() {
        let cases: &[(&str, Option<&str>, Option<&str>)] = &[
            ("Subject: x\r\n\r\nhello\r\n", Some("hello\r\n"), None),
            (
                "Subject: x\r\nContent-Type: text/html\r\n\r\n<p>hi</p>",
                None,
                Some("<p>hi</p>"),
            ),
            (
                "Content-Type: multipart/alternative; boundary=b\r\n\r\n--b\r\n\
                 Content-Type: text/plain\r\n\r\nplain\r\n--b\r\n\
                 Content-Type: text/html\r\n\r\n<b>rich</b>\r\n--b--\r\n",
                Some("plain"),
                None,
            ),
        ];
        for (raw, text, html) in cases {
            let s = shown(raw.as_bytes());
            assert_eq!(s.text.as_deref(), *text, "{raw}");
            assert_eq!(s.html.as_deref(), *html, "{raw}");
            assert!(!s.truncated, "{raw}");
        }
    }

    #[test]
    fn shown_within_cuts_at_a_character_boundary() {
        // (post, bound, text, HTML, cut)
        type Case<'a> = (&'a str, usize, Option<&'a str>, Option<&'a str>, bool);
        let cases: &[Case] = &[
            ("Subject: x\r\n\r\nhello", 3, Some("hel"), None, true),
            ("Subject: x\r\n\r\nhello", 5, Some("hello"), None, false),
            // "é" is two bytes: a cut inside it keeps the character out.
            (
                "Subject: x\r\nContent-Type: text/plain; charset=utf-8\r\n\r\naé",
                2,
                Some("a"),
                None,
                true,
            ),
            (
                "Subject: x\r\nContent-Type: text/html\r\n\r\n<p>hi</p>",
                4,
                None,
                Some("<p>h"),
                true,
            ),
        ];
        for (raw, max, text, html, truncated) in cases {
            let s = shown_within(raw.as_bytes(), *max);
            assert_eq!(s.text.as_deref(), *text, "{raw}");
            assert_eq!(s.html.as_deref(), *html, "{raw}");
            assert_eq!(s.truncated, *truncated, "{raw}");
        }
    }

    #[test]
    fn part_contents_decodes_leaf_parts_only() {
        let raw = b"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\n\
                    Content-Type: text/plain\r\n\r\nhi\r\n--b\r\n\
                    Content-Type: application/pdf\r\nContent-Transfer-Encoding: base64\r\n\
                    Content-Disposition: attachment; filename=a.pdf\r\n\r\naGVsbG8=\r\n--b--\r\n";
        assert_eq!(part_contents(raw, 0), None);
        assert_eq!(part_contents(raw, 2).as_deref(), Some(&b"hello"[..]));
        assert_eq!(part_contents(raw, 9), None);
    }
}
