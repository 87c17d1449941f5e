//! The archive in PostgreSQL (pepsi-0019.sql): a post stored with its thread, parts and
//! search text ([`archive_post`]), searched ([`search`]) and purged ([`purge_message`],
//! [`purge_address`]; with their `pepsi.event_log` row, as the operator tool and the admin
//! API purge, [`purge_posts`] and [`purge_author`]). Every statement is fixed; input is only
//! ever bound. The writes of one list are serialised by a transaction-scoped advisory lock
//! (`pepsi.archive_lock`, procedures.sql), so two posts of a thread archived at once cannot
//! both open it.

use std::collections::HashMap;

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveTime, Utc};
use mail_parser::{Message, MessageParser, MessagePart, MimeHeaders as _, PartType};
use pepsi_contract::audit::{self, Actor};
use pepsi_contract::message;
use serde::Serialize;
use sqlx::{PgConnection, PgPool, Row as _};

use crate::query::{self, Query, QueryError};
use crate::thread::{self, Known, Outcome, Thread};
use crate::url;

/// The most text of a post's text/plain parts indexed for search, in bytes (a tsvector
/// holds at most 1 MB).
pub const MAX_SEARCH_TEXT: usize = 256 * 1024;
/// The most parts of a post recorded.
pub const MAX_PARTS: usize = 1000;
/// The most hits one search returns.
pub const MAX_HITS: i64 = 200;
/// The most matches of one search ranked: the newest ones; older matches are not found.
pub const MAX_RANKED: i64 = 1000;
/// The longest subject and author name kept, in characters.
const MAX_FIELD: usize = 998;

/// Why the archive could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("archive database: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Query(#[from] QueryError),
}

/// An archived post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedId {
    pub archive_id: i64,
    pub url_id: String,
    pub thread_id: i64,
}

/// One search hit, best first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hit {
    pub url_id: String,
    pub thread_id: i64,
    pub subject: String,
    pub from_address: String,
    pub from_name: String,
    pub date: DateTime<Utc>,
    pub rank: f32,
}

/// What the archive keeps of a post besides its bytes.
struct Post {
    message_id: String,
    message_id_made: bool,
    url_id: String,
    from_address: String,
    from_name: String,
    subject: String,
    date: DateTime<Utc>,
    in_reply_to: Option<String>,
    references: Vec<String>,
    text: String,
    parts: Vec<(i32, String, Option<String>, i64)>,
}

/// `text` without the NUL characters PostgreSQL's text refuses.
fn without_nul(text: &str) -> String {
    text.replace('\0', "")
}

fn bounded(text: &str, max: usize) -> String {
    text.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// Reads what the archive keeps of the post `raw` (header block, CRLF, body).
fn read(headers: &[u8], raw: &[u8], archived_at: DateTime<Utc>) -> Post {
    let first = |name| message::field_values(headers, name).into_iter().next();
    // PostgreSQL's text holds no NUL: ids and text go without it, or one forged post
    // would fail for every member.
    let ids = |v: &str| -> Vec<String> {
        thread::ids(v)
            .iter()
            .filter_map(|id| url::normalise(&without_nul(id)))
            .collect()
    };
    let own = first("Message-ID").and_then(|v| ids(&v).into_iter().next());
    let (message_id, message_id_made) = match own {
        Some(id) => (id, false),
        None => (thread::made_message_id(raw), true),
    };
    let url_id = url::url_id(&message_id).expect("a normalised id is an id");
    let references: Vec<String> = ids(&message::field_values(headers, "References").join(" "));
    let in_reply_to = first("In-Reply-To").and_then(|v| ids(&v).into_iter().next());
    let parsed = MessageParser::default().parse(raw);
    let (mut from_address, mut from_name, mut subject, mut date) =
        (String::new(), String::new(), String::new(), None);
    let mut text = String::new();
    let mut parts = Vec::new();
    if let Some(m) = &parsed {
        if let Some(a) = m.from().and_then(|f| f.first()) {
            from_address = bounded(a.address().unwrap_or_default(), 320);
            from_name = bounded(a.name().unwrap_or_default(), 200);
        }
        subject = bounded(m.subject().unwrap_or_default(), MAX_FIELD);
        date = m
            .date()
            .and_then(|d| DateTime::<Utc>::from_timestamp(d.to_timestamp(), 0));
        for (i, part, content_type, file_name) in leaf_parts(m, raw) {
            add_text(&mut text, part, &content_type, file_name.as_deref());
            parts.push((
                i as i32,
                bounded(&content_type, 255),
                file_name,
                part.len() as i64,
            ));
        }
    }
    // A Date in the future (a wrong clock, or a post that would stay on top) counts as
    // the time archived, as does none.
    let date = date
        .filter(|d| *d <= archived_at + chrono::Duration::days(1))
        .unwrap_or(archived_at);
    Post {
        message_id,
        message_id_made,
        url_id,
        from_address,
        from_name,
        subject,
        date,
        in_reply_to,
        references,
        text,
        parts,
    }
}

/// The leaf parts of `m` (of the bytes `raw`), at most [`MAX_PARTS`]: number, part, content
/// type (lower-case, `text/plain` when none) and file name.
fn leaf_parts<'m>(
    m: &'m Message<'m>,
    raw: &[u8],
) -> impl Iterator<Item = (usize, &'m MessagePart<'m>, String, Option<String>)> {
    m.parts
        .iter()
        .enumerate()
        .take(MAX_PARTS)
        .filter(|(_, part)| !matches!(part.body, PartType::Multipart(_)))
        .map(move |(i, part)| {
            let (h, b) = (part.offset_header as usize, part.offset_body as usize);
            let part_headers = raw.get(h..b).unwrap_or_default();
            let file_name = pepsi_contract::mime::file_name(part_headers)
                .or_else(|| part.attachment_name().map(str::to_owned))
                .map(|n| bounded(&n, 255));
            let content_type = part.content_type().map_or_else(
                || "text/plain".to_owned(),
                |ct| match ct.subtype() {
                    Some(sub) => format!("{}/{sub}", ct.ctype()).to_ascii_lowercase(),
                    None => ct.ctype().to_ascii_lowercase(),
                },
            );
            (i, part, content_type, file_name)
        })
}

/// The leaf parts of the message `raw` as `archive_part` would record them (number, content
/// type, file name, decoded size): for a page that lists the parts of a message it reads
/// whole, such as the secure-link portal's.
pub fn part_rows(raw: &[u8]) -> Vec<crate::read::PartRow> {
    let Some(m) = MessageParser::default().parse(raw) else {
        return Vec::new();
    };
    leaf_parts(&m, raw)
        .map(|(i, part, content_type, file_name)| crate::read::PartRow {
            part_index: i as i32,
            content_type: bounded(&content_type, 255),
            file_name,
            size: part.len() as i64,
        })
        .collect()
}

/// Adds the text of `part` to the search text `text` when it is indexed: a text/plain part
/// that is no attachment, while `text` holds less than [`MAX_SEARCH_TEXT`].
fn add_text(
    text: &mut String,
    part: &MessagePart<'_>,
    content_type: &str,
    file_name: Option<&str>,
) {
    if let PartType::Text(t) = &part.body
        && content_type == "text/plain"
        && file_name.is_none()
        && text.len() < MAX_SEARCH_TEXT
    {
        let room = MAX_SEARCH_TEXT - text.len();
        let cut = t.floor_char_boundary(room.min(t.len()));
        text.extend(t[..cut].chars().filter(|c| *c != '\0'));
        text.push('\n');
    }
}

/// The text of the post `raw` (header block, CRLF, body) that its `search` column holds with
/// weight C: its text/plain parts that are no attachments, decoded, at most
/// [`MAX_SEARCH_TEXT`] bytes. What [`archive_post`] indexes, and [`reindex`] again.
pub fn search_text(raw: &[u8]) -> String {
    let mut text = String::new();
    if let Some(m) = MessageParser::default().parse(raw) {
        for (_, part, content_type, file_name) in leaf_parts(&m, raw) {
            add_text(&mut text, part, &content_type, file_name.as_deref());
        }
    }
    text
}

/// Serialises the archive writes of `list_id` until the transaction ends. Through
/// `pepsi.archive_lock` (SECURITY DEFINER, procedures.sql), which takes that one key and no
/// other: the httpd role, which purges for the admin API, may not call the advisory lock
/// functions themselves (docs/setup.md).
async fn lock_list(tx: &mut PgConnection, list_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pepsi.archive_lock($1)")
        .bind(list_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Archives the post (`headers`, `body`) in the list `list_id`, in the caller's transaction
/// `tx`: its message, body, parts, search text, thread (placeholders for ancestors not
/// archived, replacing its own placeholder, merging threads it joins) and month count.
/// `None` when the list's archive holds its Message-ID already: archiving is idempotent per
/// list and Message-ID (a post without one gets one made from its hash).
pub async fn archive_post(
    tx: &mut PgConnection,
    list_id: i64,
    headers: &[u8],
    body: &[u8],
    archived_at: DateTime<Utc>,
) -> Result<Option<ArchivedId>, Error> {
    let raw = message::join(headers, body);
    let post = read(headers, &raw, archived_at);
    let in_reply_to: Vec<String> = post.in_reply_to.iter().cloned().collect();
    let chain_ids = thread::chain(&post.message_id, &post.references, &in_reply_to);
    // Keys are url ids; the ids themselves are kept for the placeholders.
    let mut id_of: HashMap<String, String> = HashMap::new();
    let chain: Vec<String> = chain_ids
        .iter()
        .filter_map(|id| {
            let key = url::url_id(id)?;
            id_of.insert(key.clone(), id.clone());
            Some(key)
        })
        .collect();
    lock_list(tx, list_id).await?;
    let mut keys = chain.clone();
    keys.push(post.url_id.clone());
    let mut known: HashMap<String, Known> = HashMap::new();
    let rows = sqlx::query(
        "SELECT url_id, thread_id, NULL::text AS parent, true AS archived, false AS purged \
           FROM pepsi.archive_message WHERE list_id = $1 AND url_id = ANY($2) \
         UNION ALL \
         SELECT url_id, thread_id, parent_url_id, false, purged \
           FROM pepsi.archive_placeholder WHERE list_id = $1 AND url_id = ANY($2)",
    )
    .bind(list_id)
    .bind(&keys)
    .fetch_all(&mut *tx)
    .await?;
    for row in rows {
        let key: String = row.try_get("url_id")?;
        // The placeholder of a purged post: its Message-ID comes back only as a duplicate,
        // never in the purged post's place.
        if key == post.url_id && row.try_get::<bool, _>("purged")? {
            return Ok(None);
        }
        let thread: i64 = row.try_get("thread_id")?;
        let k = if row.try_get("archived")? {
            Known::Message { thread }
        } else {
            Known::Placeholder {
                thread,
                parent: row.try_get("parent")?,
            }
        };
        known.insert(key, k);
    }
    let Outcome::Archive(decision) = thread::decide(&post.url_id, &chain, &known) else {
        return Ok(None);
    };
    if !decision.unmerged.is_empty() {
        tracing::debug!(
            list_id,
            url_id = %post.url_id,
            threads = ?decision.unmerged,
            "the post's References name other threads, which are not merged"
        );
    }
    let thread_id: i64 = match &decision.thread {
        Thread::Existing(t) => *t,
        Thread::New { root } => {
            sqlx::query_scalar(
                "INSERT INTO pepsi.archive_thread \
                 (list_id, root_url_id, subject, first_date, last_date) \
                 VALUES ($1, $2, $3, $4, $4) RETURNING thread_id",
            )
            .bind(list_id)
            .bind(root)
            .bind(&post.subject)
            .bind(post.date)
            .fetch_one(&mut *tx)
            .await?
        }
    };
    if !decision.merge.is_empty() {
        merge_threads(tx, thread_id, &decision.merge).await?;
    }
    for (key, parent) in &decision.placeholders {
        sqlx::query(
            "INSERT INTO pepsi.archive_placeholder \
             (list_id, url_id, message_id, thread_id, parent_url_id) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(list_id)
        .bind(key)
        .bind(&id_of[key])
        .bind(thread_id)
        .bind(parent)
        .execute(&mut *tx)
        .await?;
    }
    for (key, parent) in &decision.adopt {
        sqlx::query(
            "UPDATE pepsi.archive_placeholder SET parent_url_id = $3 \
             WHERE list_id = $1 AND url_id = $2 AND parent_url_id IS NULL",
        )
        .bind(list_id)
        .bind(key)
        .bind(parent)
        .execute(&mut *tx)
        .await?;
    }
    if decision.replaces_placeholder {
        sqlx::query("DELETE FROM pepsi.archive_placeholder WHERE list_id = $1 AND url_id = $2")
            .bind(list_id)
            .bind(&post.url_id)
            .execute(&mut *tx)
            .await?;
    }
    let archive_id: i64 = sqlx::query_scalar(
        "INSERT INTO pepsi.archive_message \
         (list_id, url_id, message_id, message_id_made, from_address, from_name, subject, \
          date, in_reply_to, message_references, thread_id, parent_url_id, search, size, \
          archived_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
           setweight(to_tsvector('simple', $7), 'A') \
           || setweight(to_tsvector('simple', $6 || ' ' || $5), 'B') \
           || setweight(to_tsvector('simple', $13), 'C'), $14, $15) \
         RETURNING archive_id",
    )
    .bind(list_id)
    .bind(&post.url_id)
    .bind(&post.message_id)
    .bind(post.message_id_made)
    .bind(&post.from_address)
    .bind(&post.from_name)
    .bind(&post.subject)
    .bind(post.date)
    .bind(&post.in_reply_to)
    .bind(&post.references)
    .bind(thread_id)
    .bind(&decision.parent)
    .bind(&post.text)
    .bind(raw.len() as i64)
    .bind(archived_at)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO pepsi.archive_body (archive_id, raw) VALUES ($1, $2)")
        .bind(archive_id)
        .bind(&raw)
        .execute(&mut *tx)
        .await?;
    let (index, types, names, sizes): (Vec<i32>, Vec<String>, Vec<Option<String>>, Vec<i64>) =
        post.parts.into_iter().fold(Default::default(), |mut a, p| {
            a.0.push(p.0);
            a.1.push(p.1);
            a.2.push(p.2);
            a.3.push(p.3);
            a
        });
    sqlx::query(
        "INSERT INTO pepsi.archive_part (archive_id, part_index, content_type, file_name, size) \
         SELECT $1, * FROM unnest($2::int[], $3::text[], $4::text[], $5::int8[])",
    )
    .bind(archive_id)
    .bind(&index)
    .bind(&types)
    .bind(&names)
    .bind(&sizes)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE pepsi.archive_thread SET message_count = message_count + 1, \
         first_date = least(first_date, $2), last_date = greatest(last_date, $2), \
         subject = CASE WHEN root_url_id = $3 OR subject = '' THEN $4 ELSE subject END \
         WHERE thread_id = $1",
    )
    .bind(thread_id)
    .bind(post.date)
    .bind(&post.url_id)
    .bind(&post.subject)
    .execute(&mut *tx)
    .await?;
    month_add(tx, list_id, post.date, 1).await?;
    Ok(Some(ArchivedId {
        archive_id,
        url_id: post.url_id,
        thread_id,
    }))
}

/// Moves the posts and placeholders of the threads `merged` into `into`, their counts and
/// dates with them, and deletes those threads.
async fn merge_threads(
    tx: &mut PgConnection,
    into: i64,
    merged: &[i64],
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE pepsi.archive_message SET thread_id = $1 WHERE thread_id = ANY($2)")
        .bind(into)
        .bind(merged)
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE pepsi.archive_placeholder SET thread_id = $1 WHERE thread_id = ANY($2)")
        .bind(into)
        .bind(merged)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE pepsi.archive_thread t SET message_count = t.message_count + m.n, \
         first_date = least(t.first_date, m.first), last_date = greatest(t.last_date, m.last) \
         FROM (SELECT sum(message_count)::int AS n, min(first_date) AS first, \
                      max(last_date) AS last \
                 FROM pepsi.archive_thread WHERE thread_id = ANY($2)) m \
         WHERE t.thread_id = $1 AND m.n IS NOT NULL",
    )
    .bind(into)
    .bind(merged)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM pepsi.archive_thread WHERE thread_id = ANY($1)")
        .bind(merged)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Adds `n` to the list's count of posts in the month of `date` (UTC); a month at 0 goes.
async fn month_add(
    tx: &mut PgConnection,
    list_id: i64,
    date: DateTime<Utc>,
    n: i32,
) -> Result<(), sqlx::Error> {
    // A purge only takes away, from a month its post counted in: an UPDATE, without the
    // INSERT the httpd role (purging for the admin API) does not hold on archive_month.
    let sql = if n < 0 {
        "UPDATE pepsi.archive_month SET message_count = greatest(message_count + $3, 0) \
          WHERE list_id = $1 AND month = date_trunc('month', $2 AT TIME ZONE 'UTC')::date"
    } else {
        "INSERT INTO pepsi.archive_month (list_id, month, message_count) \
         VALUES ($1, date_trunc('month', $2 AT TIME ZONE 'UTC')::date, greatest($3, 0)) \
         ON CONFLICT (list_id, month) \
         DO UPDATE SET message_count = greatest(archive_month.message_count + $3, 0)"
    };
    sqlx::query(sql)
        .bind(list_id)
        .bind(date)
        .bind(n)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM pepsi.archive_month WHERE list_id = $1 AND message_count = 0")
        .bind(list_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The posts of the list `list_id` matching `q` (the syntax of [`crate::query`]), best
/// first (`ts_rank_cd`, then newest), at most `limit` (1 to [`MAX_HITS`]). A query without
/// words ranks all matches alike, newest first. Only the newest [`MAX_RANKED`] matches are
/// ranked, so one search costs a bounded sort.
///
/// `addresses_shown`: whether the reader sees authors' addresses. When not, `from:` matches
/// only a part of the author's name or the whole address (case ignored), never a part of
/// an address, which would let a reader rebuild a hidden address letter by letter.
pub async fn search(
    pool: &PgPool,
    list_id: i64,
    q: &str,
    limit: i64,
    addresses_shown: bool,
) -> Result<Vec<Hit>, Error> {
    let Query {
        text,
        from,
        subject,
        after,
        before,
    } = query::parse(q)?;
    let day = |d: Option<chrono::NaiveDate>| d.map(|d| d.and_time(NaiveTime::MIN).and_utc());
    let rows = sqlx::query(
        "SELECT url_id, thread_id, subject, from_address, from_name, date, \
                CASE WHEN $2 = '' THEN 0 \
                     ELSE ts_rank_cd(search, websearch_to_tsquery('simple', $2)) END::real AS rank \
           FROM (SELECT archive_id, url_id, thread_id, subject, from_address, from_name, date, \
                        search \
                   FROM pepsi.archive_message \
                  WHERE list_id = $1 \
                    AND ($2 = '' OR search @@ websearch_to_tsquery('simple', $2)) \
                    AND NOT EXISTS (SELECT 1 FROM unnest($3::text[]) f WHERE CASE WHEN $8 \
                          THEN strpos(lower(from_address || ' ' || from_name), lower(f)) = 0 \
                          ELSE strpos(lower(from_name), lower(f)) = 0 \
                               AND lower(from_address) <> lower(f) END) \
                    AND ($4 = '' OR to_tsvector('simple', subject) \
                                    @@ websearch_to_tsquery('simple', $4)) \
                    AND ($5::timestamptz IS NULL OR date >= $5) \
                    AND ($6::timestamptz IS NULL OR date < $6) \
                  ORDER BY date DESC, archive_id DESC LIMIT $9) matches \
          ORDER BY rank DESC, date DESC, archive_id DESC LIMIT $7",
    )
    .bind(list_id)
    .bind(&text)
    .bind(&from)
    .bind(&subject)
    .bind(day(after))
    .bind(day(before))
    .bind(limit.clamp(1, MAX_HITS))
    .bind(addresses_shown)
    .bind(MAX_RANKED)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(Hit {
                url_id: r.try_get("url_id")?,
                thread_id: r.try_get("thread_id")?,
                subject: r.try_get("subject")?,
                from_address: r.try_get("from_address")?,
                from_name: r.try_get("from_name")?,
                date: r.try_get("date")?,
                rank: r.try_get("rank")?,
            })
        })
        .collect()
}

/// Deletes the post `url_id` of the list `list_id`: its message, body, parts and search
/// text. A post others reply to leaves a placeholder (its Message-ID, nothing else, marked
/// purged: that Message-ID archived again is a duplicate) so its thread keeps its shape,
/// whose subject and dates are then those of the posts left; a thread left without posts
/// goes. Logged in `archive_event_log`
/// as `purge.message` by `actor`, with the url id only. `false` when there was no such post.
pub async fn purge_message(
    tx: &mut PgConnection,
    list_id: i64,
    url_id: &str,
    actor: &str,
) -> Result<bool, Error> {
    lock_list(tx, list_id).await?;
    let purged = purge_one(tx, list_id, url_id).await?;
    if purged {
        log(
            tx,
            Some(list_id),
            actor,
            "purge.message",
            serde_json::json!({"url_id": url_id}),
        )
        .await?;
    }
    Ok(purged)
}

async fn purge_one(tx: &mut PgConnection, list_id: i64, url_id: &str) -> Result<bool, sqlx::Error> {
    let Some(row) = sqlx::query(
        "DELETE FROM pepsi.archive_message WHERE list_id = $1 AND url_id = $2 \
         RETURNING message_id, thread_id, parent_url_id, date",
    )
    .bind(list_id)
    .bind(url_id)
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(false);
    };
    let message_id: String = row.try_get("message_id")?;
    let thread_id: i64 = row.try_get("thread_id")?;
    let parent: Option<String> = row.try_get("parent_url_id")?;
    let date: DateTime<Utc> = row.try_get("date")?;
    sqlx::query(
        "INSERT INTO pepsi.archive_placeholder \
         (list_id, url_id, message_id, thread_id, parent_url_id, purged) \
         SELECT $1, $2, $3, $4, $5, true WHERE EXISTS \
           (SELECT 1 FROM pepsi.archive_message WHERE list_id = $1 AND parent_url_id = $2 \
            UNION ALL \
            SELECT 1 FROM pepsi.archive_placeholder WHERE list_id = $1 AND parent_url_id = $2) \
         ON CONFLICT DO NOTHING",
    )
    .bind(list_id)
    .bind(url_id)
    .bind(&message_id)
    .bind(thread_id)
    .bind(&parent)
    .execute(&mut *tx)
    .await?;
    // A thread without posts goes, its placeholders with it (ON DELETE CASCADE). Two
    // statements: a DELETE cannot see the row its own statement's CTE updated.
    let left: Option<i32> = sqlx::query_scalar(
        "UPDATE pepsi.archive_thread SET message_count = message_count - 1 \
         WHERE thread_id = $1 RETURNING message_count",
    )
    .bind(thread_id)
    .fetch_optional(&mut *tx)
    .await?;
    if left == Some(0) {
        sqlx::query("DELETE FROM pepsi.archive_thread WHERE thread_id = $1")
            .bind(thread_id)
            .execute(&mut *tx)
            .await?;
    } else if left.is_some() {
        // Nothing of the purged post stays in its thread's row: the subject is the root
        // post's, else the earliest post's, and the dates are those of the posts left.
        sqlx::query(
            "UPDATE pepsi.archive_thread t SET \
               first_date = m.first, last_date = m.last, \
               subject = coalesce( \
                 (SELECT subject FROM pepsi.archive_message \
                   WHERE thread_id = t.thread_id AND url_id = t.root_url_id), \
                 (SELECT subject FROM pepsi.archive_message WHERE thread_id = t.thread_id \
                   ORDER BY date, archive_id LIMIT 1), '') \
             FROM (SELECT min(date) AS first, max(date) AS last FROM pepsi.archive_message \
                    WHERE thread_id = $1) m \
             WHERE t.thread_id = $1 AND m.first IS NOT NULL",
        )
        .bind(thread_id)
        .execute(&mut *tx)
        .await?;
    }
    month_add(tx, list_id, date, -1).await?;
    Ok(true)
}

/// Purges every post whose author is `address` (case ignored), in every list, as
/// [`purge_message`] does, and the archive login links issued to it. Logged per list as
/// `purge.address` with the number of posts, never the address. Returns the posts purged.
pub async fn purge_address(
    tx: &mut PgConnection,
    address: &str,
    actor: &str,
) -> Result<u64, Error> {
    let per_list = purge_address_in(tx, address, None, actor).await?;
    Ok(per_list.iter().map(|(_, n)| n).sum())
}

/// [`purge_address`] in the list `list_id` alone (its posts, its login links) when given,
/// in every list when `None`. Returns the posts purged per list id, in list id order.
pub async fn purge_address_in(
    tx: &mut PgConnection,
    address: &str,
    list_id: Option<i64>,
    actor: &str,
) -> Result<Vec<(i64, u64)>, Error> {
    let posts: Vec<(i64, String)> = sqlx::query_as(
        "SELECT list_id, url_id FROM pepsi.archive_message \
         WHERE lower(from_address) = lower($1) AND ($2::int8 IS NULL OR list_id = $2) \
         ORDER BY list_id, archive_id",
    )
    .bind(address)
    .bind(list_id)
    .fetch_all(&mut *tx)
    .await?;
    let mut per_list: Vec<(i64, u64)> = Vec::new();
    for (list_id, url_id) in &posts {
        lock_list(tx, *list_id).await?;
        if purge_one(tx, *list_id, url_id).await? {
            match per_list.last_mut() {
                Some((l, n)) if l == list_id => *n += 1,
                _ => per_list.push((*list_id, 1)),
            }
        }
    }
    sqlx::query(
        "DELETE FROM pepsi.archive_reader \
          WHERE lower(address) = lower($1) AND ($2::int8 IS NULL OR list_id = $2)",
    )
    .bind(address)
    .bind(list_id)
    .execute(&mut *tx)
    .await?;
    for (list_id, n) in &per_list {
        log(
            tx,
            Some(*list_id),
            actor,
            "purge.address",
            serde_json::json!({"posts": n}),
        )
        .await?;
    }
    Ok(per_list)
}

/// Who changes the archive: the actor of the `pepsi.event_log` row (the program, and the
/// administrator or the user running it) and the name `archive_event_log` records.
#[derive(Debug, Clone)]
pub struct Who {
    pub actor: Actor,
    pub name: String,
}

impl Who {
    /// The `pepsi.event_log` row of `action`, in the transaction that did it.
    pub async fn audit(
        &self,
        tx: &mut PgConnection,
        action: &str,
        detail: serde_json::Value,
    ) -> Result<(), sqlx::Error> {
        audit::record(tx, &self.actor, action, None, detail).await
    }
}

/// What [`purge_posts`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PostsPurged {
    /// The list's address.
    pub list: String,
    pub purged: Vec<String>,
    pub not_in_archive: Vec<String>,
}

/// Purges the posts `url_ids` of the list `list_id` (address `list`) with
/// [`purge_message`] and records the purge as an `archive.purge` row of `pepsi.event_log`
/// (the url ids purged), all in `tx`: `pepsi-archive purge LIST URL_ID...` and the admin
/// API's purge.
pub async fn purge_posts(
    tx: &mut PgConnection,
    who: &Who,
    list_id: i64,
    list: &str,
    url_ids: &[String],
) -> Result<PostsPurged, Error> {
    let (mut purged, mut not_in_archive) = (Vec::new(), Vec::new());
    for u in url_ids {
        if purge_message(tx, list_id, u, &who.name).await? {
            purged.push(u.clone());
        } else {
            not_in_archive.push(u.clone());
        }
    }
    who.audit(
        tx,
        "archive.purge",
        serde_json::json!({"list": list, "url_ids": purged}),
    )
    .await?;
    Ok(PostsPurged {
        list: list.to_owned(),
        purged,
        not_in_archive,
    })
}

/// What [`purge_author`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuthorPurged {
    pub address: String,
    /// The posts purged in all.
    pub purged: u64,
    /// The posts purged per list address.
    pub lists: BTreeMap<String, u64>,
}

/// Purges the posts of `address` (and its archive login links) in the list `list` (id and
/// address) or, when `None`, in every list, with [`purge_address_in`], and records the purge
/// as an `archive.purge` row of `pepsi.event_log` (counts, never the address), all in `tx`:
/// `pepsi-archive purge --address` and the admin API's purge.
pub async fn purge_author(
    tx: &mut PgConnection,
    who: &Who,
    address: &str,
    list: Option<(i64, &str)>,
) -> Result<AuthorPurged, Error> {
    let per_list = purge_address_in(tx, address, list.map(|l| l.0), &who.name).await?;
    let ids: Vec<i64> = per_list.iter().map(|p| p.0).collect();
    let names: BTreeMap<i64, String> = match list {
        Some((id, name)) => BTreeMap::from([(id, name.to_owned())]),
        None => sqlx::query_as::<_, (i64, String)>(
            "SELECT list_id, address FROM pepsi.mailing_list WHERE list_id = ANY($1)",
        )
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .collect(),
    };
    let purged: u64 = per_list.iter().map(|p| p.1).sum();
    let mut detail = serde_json::json!({
        "by_address": true,
        "posts": purged,
        "lists": per_list.len(),
    });
    if let Some((_, name)) = list {
        detail["list"] = name.into();
    }
    who.audit(tx, "archive.purge", detail).await?;
    Ok(AuthorPurged {
        address: address.to_owned(),
        purged,
        lists: per_list
            .iter()
            .map(|(id, n)| (names.get(id).cloned().unwrap_or_default(), *n))
            .collect(),
    })
}

/// An author's address as [`purge_author`] takes it: an address (`pepsi_conf::address`),
/// at most 320 characters, without blanks; trimmed. The error names the value.
pub fn author_address(text: &str) -> Result<String, String> {
    let t = text.trim();
    pepsi_conf::address::Address::parse(t).map_err(|e| e.to_string())?;
    if t.len() > 320 || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{text:?} is not an address: at most 320 characters, no blanks"
        ));
    }
    Ok(t.to_owned())
}

/// What [`export`] takes of a list's archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every post.
    All,
    /// The posts dated in the month (UTC) starting on this day.
    Month(chrono::NaiveDate),
    /// The posts of one thread.
    Thread(i64),
}

/// A post as [`export`] reads it: what its From_ line needs and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub archive_id: i64,
    pub url_id: String,
    pub from_address: String,
    pub date: DateTime<Utc>,
    pub raw: Vec<u8>,
}

/// The next posts of `scope` in date order (then archive order) after `after` (the date and
/// archive id of the last post of the batch before), at most `limit`: a long archive is read
/// in batches, never whole.
pub async fn export(
    pool: &PgPool,
    list_id: i64,
    scope: &Scope,
    after: Option<(DateTime<Utc>, i64)>,
    limit: i64,
) -> Result<Vec<Exported>, Error> {
    let (month, thread) = match scope {
        Scope::All => (None, None),
        Scope::Month(m) => (Some(m.and_time(NaiveTime::MIN).and_utc()), None),
        Scope::Thread(t) => (None, Some(*t)),
    };
    let rows = sqlx::query(
        "SELECT m.archive_id, m.url_id, m.from_address, m.date, b.raw \
           FROM pepsi.archive_message m JOIN pepsi.archive_body b USING (archive_id) \
          WHERE m.list_id = $1 \
            AND ($2::timestamptz IS NULL \
                 OR (m.date >= $2 AND m.date < ($2 AT TIME ZONE 'UTC' + interval '1 month') \
                                                  AT TIME ZONE 'UTC')) \
            AND ($3::int8 IS NULL OR m.thread_id = $3) \
            AND ($4::timestamptz IS NULL OR (m.date, m.archive_id) > ($4, $5)) \
          ORDER BY m.date, m.archive_id LIMIT $6",
    )
    .bind(list_id)
    .bind(month)
    .bind(thread)
    .bind(after.map(|a| a.0))
    .bind(after.map_or(0, |a| a.1))
    .bind(limit.max(1))
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(Exported {
                archive_id: r.try_get("archive_id")?,
                url_id: r.try_get("url_id")?,
                from_address: r.try_get("from_address")?,
                date: r.try_get("date")?,
                raw: r.try_get("raw")?,
            })
        })
        .collect()
}

/// How much a list's archive holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub posts: i64,
    pub threads: i64,
    pub months: i64,
    pub bytes: i64,
    pub first_post: Option<DateTime<Utc>>,
    pub last_post: Option<DateTime<Utc>>,
}

/// The counts of the list's archive: posts, threads, months with posts, bytes, first and
/// last post's date.
pub async fn summary(pool: &PgPool, list_id: i64) -> Result<Summary, Error> {
    let row = sqlx::query(
        "SELECT count(*) AS posts, coalesce(sum(size), 0)::int8 AS bytes, \
                min(date) AS first_post, max(date) AS last_post, \
                (SELECT count(*) FROM pepsi.archive_thread WHERE list_id = $1) AS threads, \
                (SELECT count(*) FROM pepsi.archive_month WHERE list_id = $1) AS months \
           FROM pepsi.archive_message WHERE list_id = $1",
    )
    .bind(list_id)
    .fetch_one(pool)
    .await?;
    Ok(Summary {
        posts: row.try_get("posts")?,
        threads: row.try_get("threads")?,
        months: row.try_get("months")?,
        bytes: row.try_get("bytes")?,
        first_post: row.try_get("first_post")?,
        last_post: row.try_get("last_post")?,
    })
}

/// One import of an mbox into a list's archive (an `archive_import` row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Import {
    pub import_id: i64,
    pub file_name: String,
    pub started_by: String,
    pub started_at: DateTime<Utc>,
    /// `None` while it runs, or when it stopped part way.
    pub finished_at: Option<DateTime<Utc>>,
    pub read: i32,
    pub archived: i32,
    pub duplicates: i32,
    pub too_long: i32,
    pub failed: i32,
}

/// The list's imports, newest first, at most `limit`.
pub async fn imports(pool: &PgPool, list_id: i64, limit: i64) -> Result<Vec<Import>, Error> {
    let rows = sqlx::query(
        "SELECT import_id, file_name, started_by, started_at, finished_at, read, archived, \
                duplicates, too_long, failed \
           FROM pepsi.archive_import WHERE list_id = $1 \
          ORDER BY started_at DESC, import_id DESC LIMIT $2",
    )
    .bind(list_id)
    .bind(limit.max(1))
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(Import {
                import_id: r.try_get("import_id")?,
                file_name: r.try_get("file_name")?,
                started_by: r.try_get("started_by")?,
                started_at: r.try_get("started_at")?,
                finished_at: r.try_get("finished_at")?,
                read: r.try_get("read")?,
                archived: r.try_get("archived")?,
                duplicates: r.try_get("duplicates")?,
                too_long: r.try_get("too_long")?,
                failed: r.try_get("failed")?,
            })
        })
        .collect()
}

/// Of `url_ids`, those the list's archive holds a post of.
pub async fn existing(
    pool: &PgPool,
    list_id: i64,
    url_ids: &[String],
) -> Result<Vec<String>, Error> {
    Ok(sqlx::query_scalar(
        "SELECT url_id FROM pepsi.archive_message WHERE list_id = $1 AND url_id = ANY($2)",
    )
    .bind(list_id)
    .bind(url_ids)
    .fetch_all(pool)
    .await?)
}

/// The number of posts whose author is `address` (case ignored), per list id: what
/// [`purge_address`] would purge.
pub async fn count_by_address(pool: &PgPool, address: &str) -> Result<Vec<(i64, i64)>, Error> {
    Ok(sqlx::query_as(
        "SELECT list_id, count(*) FROM pepsi.archive_message \
          WHERE lower(from_address) = lower($1) GROUP BY list_id ORDER BY list_id",
    )
    .bind(address)
    .fetch_all(pool)
    .await?)
}

/// Fresh planner statistics of the archive's tables (`pepsi.archive_analyze`), after a bulk
/// change such as an import or a reindex: without them a list that just grew is searched by
/// date instead of through the search index until autovacuum gets to it.
pub async fn analyze(pool: &PgPool) -> Result<(), Error> {
    sqlx::query("SELECT pepsi.archive_analyze()")
        .execute(pool)
        .await?;
    Ok(())
}

/// Rebuilds the `search` column of the next posts of `list_id` (every list when `None`)
/// after the archive id `after`, at most `limit`, from their stored bytes (the text of
/// [`search_text`]) and their subject and author, as [`archive_post`] builds it. Returns
/// the number done and the last archive id, to continue from; 0 at the end.
pub async fn reindex(
    tx: &mut PgConnection,
    list_id: Option<i64>,
    after: i64,
    limit: i64,
) -> Result<(u64, i64), Error> {
    let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
        "SELECT m.archive_id, b.raw \
           FROM pepsi.archive_message m JOIN pepsi.archive_body b USING (archive_id) \
          WHERE ($1::int8 IS NULL OR m.list_id = $1) AND m.archive_id > $2 \
          ORDER BY m.archive_id LIMIT $3",
    )
    .bind(list_id)
    .bind(after)
    .bind(limit.max(1))
    .fetch_all(&mut *tx)
    .await?;
    let Some(last) = rows.last().map(|r| r.0) else {
        return Ok((0, after));
    };
    let (ids, texts): (Vec<i64>, Vec<String>) =
        rows.iter().map(|(id, raw)| (*id, search_text(raw))).unzip();
    sqlx::query(
        "UPDATE pepsi.archive_message m SET search = \
           setweight(to_tsvector('simple', m.subject), 'A') \
           || setweight(to_tsvector('simple', m.from_name || ' ' || m.from_address), 'B') \
           || setweight(to_tsvector('simple', t.text), 'C') \
           FROM unnest($1::int8[], $2::text[]) AS t(archive_id, text) \
          WHERE m.archive_id = t.archive_id",
    )
    .bind(&ids)
    .bind(&texts)
    .execute(&mut *tx)
    .await?;
    Ok((ids.len() as u64, last))
}

/// Appends an `archive_event_log` row: `event` done by `actor` to the list (`None`: to
/// every list), its `detail` never an address or a post's content.
pub async fn log(
    tx: &mut PgConnection,
    list_id: Option<i64>,
    actor: &str,
    event: &str,
    detail: serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO pepsi.archive_event_log (list_id, actor, event, detail) \
         VALUES ($1, $2, $3, $4)",
    )
    .bind(list_id)
    .bind(actor)
    .bind(event)
    .bind(detail)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_characters_leave_the_ids_and_the_search_text() {
        let headers = b"Message-ID: <a\0b@X.test>\r\nIn-Reply-To: <p\0@x.test>\r\n\
                        References: <\0> <r\0@x.test>\r\n";
        let raw = message::join(headers, b"one\0two\r\n");
        let post = read(headers, &raw, Utc::now());
        assert_eq!(post.message_id, "ab@x.test");
        assert_eq!(post.in_reply_to.as_deref(), Some("p@x.test"));
        assert_eq!(
            post.references,
            ["r@x.test"],
            "an id of a NUL alone is none"
        );
        assert_eq!(post.text, "onetwo\r\n\n");
        assert_eq!(search_text(&raw), post.text);
    }
}
