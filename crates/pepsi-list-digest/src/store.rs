//! The open digest in the database: posts added to it, and the digest sent.
//!
//! A list has at most one open digest (`list_digest.sent_at` NULL, a unique index), opened
//! by its first post. Sending marks it sent and queues its rows (`pepsi.list_fanout` with
//! `p_mode` `mime_digest`, then `plain_digest`: one row per enabled member in that mode,
//! with the member's VERP envelope sender) in one transaction: the `UPDATE ... WHERE
//! sent_at IS NULL` that marks it is also what decides who sends it, so a digest due by
//! size in the list stage and by period in `pepsi-list maintain` at the same moment goes
//! out once. Its posts are deleted with it: the queue holds the digest from then on.
//!
//! A member who changes between regular delivery and a digest while the list's digest is
//! open ([`switch`]) has a share of their own of it (`list_digest_switch`): the posts they
//! did not get as regular copies, so that a switch to regular loses none of the posts
//! collected before it and a switch from regular repeats none.

use chrono::Utc;
use sqlx::{PgConnection, PgPool, Row as _};

use crate::issue::{self, Last};
use crate::message::{self, Issue, Post};

/// The most posts one digest holds: at this many it goes out whatever its size.
pub const MAX_POSTS: i64 = 1000;

/// The most bytes of posts one digest collects before it goes out, whatever the list's
/// `digest_size_threshold` (which may be up to 1G): the digest is one message, built in
/// memory, and mail servers refuse much larger ones.
pub const MAX_BYTES: i64 = 16 * 1024 * 1024;

/// The most digests one [`send_due`] pass sends.
pub const MAX_DUE_PER_PASS: i64 = 1000;

/// Where a digest's rows start and the domain of its Message-ID.
#[derive(Debug, Clone, Copy)]
pub struct Route<'a> {
    /// The list stage's `DELIVER_STAGE`.
    pub deliver_stage: &'a str,
    /// The list stage's `HOSTNAME`.
    pub hostname: &'a str,
    /// `[pepsi] LIST_WEB_URL`: each member's one-click unsubscribe link
    /// ([`message::unsubscribe_fields`]).
    pub web_url: Option<&'a str>,
}

/// A digest that went out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub list: String,
    pub digest_id: i64,
    pub volume: i32,
    pub number: i32,
    pub posts: usize,
    /// Rows queued for members taking the MIME digest, and the plain one.
    pub mime_members: i32,
    pub plain_members: i32,
}

/// Adds the list copy `post` to the list's open digest (opening one) in the caller's
/// transaction, and sends the digest there when its posts reach the list's
/// `digest_size_threshold` ([`MAX_BYTES`], [`MAX_POSTS`]). `sender` and `subject` are the
/// post's, as the list stage records them.
pub async fn collect(
    conn: &mut PgConnection,
    route: &Route<'_>,
    list_id: i64,
    sender: &str,
    subject: &str,
    post: Post<'_>,
) -> sqlx::Result<Option<Sent>> {
    let digest_id = open(conn, list_id).await?;
    let size = (post.headers.len() + 2 + post.body.len()) as i64;
    sqlx::query(
        "INSERT INTO pepsi.list_digest_message \
         (digest_id, position, sender, subject, headers, body) \
         SELECT $1, COALESCE(max(position), 0) + 1, $2, $3, $4, $5 \
         FROM pepsi.list_digest_message WHERE digest_id = $1",
    )
    .bind(digest_id)
    .bind(sender)
    .bind(subject)
    .bind(post.headers)
    .bind(post.body)
    .execute(&mut *conn)
    .await?;
    let row = sqlx::query(
        "UPDATE pepsi.list_digest d SET size = d.size + $2 FROM pepsi.mailing_list l \
         WHERE d.digest_id = $1 AND l.list_id = d.list_id \
         RETURNING d.size, l.digest_size_threshold, \
           (SELECT count(*) FROM pepsi.list_digest_message WHERE digest_id = $1) AS posts",
    )
    .bind(digest_id)
    .bind(size)
    .fetch_one(&mut *conn)
    .await?;
    let (size, threshold, posts): (i64, i64, i64) = (
        row.try_get("size")?,
        row.try_get("digest_size_threshold")?,
        row.try_get("posts")?,
    );
    if full(size, threshold, posts) {
        return send(conn, route, digest_id).await;
    }
    Ok(None)
}

/// Whether a digest of `posts` posts and `size` bytes goes out now under a list's
/// `threshold`.
pub fn full(size: i64, threshold: i64, posts: i64) -> bool {
    size >= threshold.min(MAX_BYTES) || posts >= MAX_POSTS
}

/// The list's open digest, locked for this transaction; opened when there is none, with the
/// next volume and number ([`issue::next`]).
async fn open(conn: &mut PgConnection, list_id: i64) -> sqlx::Result<i64> {
    const OPEN: &str = "SELECT digest_id FROM pepsi.list_digest \
                        WHERE list_id = $1 AND sent_at IS NULL FOR UPDATE";
    if let Some(id) = sqlx::query_scalar(OPEN)
        .bind(list_id)
        .fetch_optional(&mut *conn)
        .await?
    {
        return Ok(id);
    }
    let last = sqlx::query(
        "SELECT volume, number, sent_at FROM pepsi.list_digest \
         WHERE list_id = $1 AND sent_at IS NOT NULL \
         ORDER BY volume DESC, number DESC LIMIT 1",
    )
    .bind(list_id)
    .fetch_optional(&mut *conn)
    .await?
    .map(|r| -> sqlx::Result<Last> {
        Ok(Last {
            volume: r.try_get("volume")?,
            number: r.try_get("number")?,
            sent_at: r.try_get("sent_at")?,
        })
    })
    .transpose()?;
    let (volume, number) = issue::next(last, Utc::now());
    // Another transaction opening the list's digest at the same moment wins the unique
    // index; this one then takes the digest it opened.
    let opened: Option<i64> = sqlx::query_scalar(
        "INSERT INTO pepsi.list_digest (list_id, volume, number) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING RETURNING digest_id",
    )
    .bind(list_id)
    .bind(volume)
    .bind(number)
    .fetch_optional(&mut *conn)
    .await?;
    match opened {
        Some(id) => Ok(id),
        None => {
            sqlx::query_scalar(OPEN)
                .bind(list_id)
                .fetch_one(&mut *conn)
                .await
        }
    }
}

/// Records, in the caller's transaction and before the member's
/// `list_member_preference.delivery_mode` is changed, that member `member_id` changes it to
/// `to` (`regular`, `mime_digest` or `plain_digest`) while their list's digest is open:
/// the posts collected so far come to them with that digest, in the kind of digest they
/// took, when they leave digests; and those they got as regular copies do not come again
/// when they take digests. The open digest is locked, so a post collected at the same
/// moment is counted on one side of the switch. Nothing is recorded without an open digest,
/// or for a change from one kind of digest to the other (the digest goes out in the kind
/// the member takes when it is sent). pepsi-list set-mode and pepsi-httpd's member page
/// both call it.
pub async fn switch(conn: &mut PgConnection, member_id: i64, to: &str) -> sqlx::Result<()> {
    let Some(row) = sqlx::query(
        "SELECT m.list_id, COALESCE(p.delivery_mode, 'regular') AS mode \
         FROM pepsi.list_member m LEFT JOIN pepsi.list_member_preference p USING (member_id) \
         WHERE m.member_id = $1 FOR UPDATE OF m",
    )
    .bind(member_id)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(());
    };
    let list_id: i64 = row.try_get("list_id")?;
    let from: String = row.try_get("mode")?;
    if (from == "regular") == (to == "regular") {
        return Ok(());
    }
    let Some(digest_id): Option<i64> = sqlx::query_scalar(
        "SELECT digest_id FROM pepsi.list_digest \
         WHERE list_id = $1 AND sent_at IS NULL FOR UPDATE",
    )
    .bind(list_id)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(());
    };
    // The posts collected so far are positions 1..=last. Leaving digests: those after
    // `last` come as regular copies. Taking them: those up to `last` came so.
    let (sql, mode) = if to == "regular" {
        (
            "INSERT INTO pepsi.list_digest_switch (digest_id, member_id, mode, regular) \
             SELECT $1, $2, $4, int4multirange(int4range($3, NULL, '()')) \
             ON CONFLICT (digest_id, member_id) DO UPDATE SET mode = EXCLUDED.mode, \
             regular = pepsi.list_digest_switch.regular + EXCLUDED.regular",
            from.as_str(),
        )
    } else {
        (
            "INSERT INTO pepsi.list_digest_switch (digest_id, member_id, mode, regular) \
             SELECT $1, $2, $4, int4multirange(int4range(NULL, $3, '[]')) \
             ON CONFLICT (digest_id, member_id) DO UPDATE SET mode = EXCLUDED.mode, \
             regular = pepsi.list_digest_switch.regular * EXCLUDED.regular",
            to,
        )
    };
    let last = last_position(conn, digest_id).await?;
    sqlx::query(sql)
        .bind(digest_id)
        .bind(member_id)
        .bind(last)
        .bind(mode)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Locks the list's open digest, if it has one, for the caller's transaction. The list
/// stage takes it before it reads who takes a post as a regular copy, so that a member's
/// [`switch`] falls wholly before or wholly after the post: it is neither lost to them nor
/// sent to them twice.
pub async fn lock_open(conn: &mut PgConnection, list_id: i64) -> sqlx::Result<()> {
    sqlx::query(
        "SELECT 1 FROM pepsi.list_digest WHERE list_id = $1 AND sent_at IS NULL FOR UPDATE",
    )
    .bind(list_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The position of the last post collected in `digest_id`, 0 when none is.
async fn last_position(conn: &mut PgConnection, digest_id: i64) -> sqlx::Result<i32> {
    sqlx::query_scalar(
        "SELECT COALESCE(max(position), 0) FROM pepsi.list_digest_message WHERE digest_id = $1",
    )
    .bind(digest_id)
    .fetch_one(conn)
    .await
}

/// Sends the digest `digest_id` in the caller's transaction: marks it sent, queues the MIME
/// digest to the members who take it and the plain one to theirs, each member who changed
/// mode while it was open their own share of it ([`switch`]), and deletes its posts.
/// `None` when it was sent already (or does not exist).
pub async fn send(
    conn: &mut PgConnection,
    route: &Route<'_>,
    digest_id: i64,
) -> sqlx::Result<Option<Sent>> {
    let Some(row) = sqlx::query(
        "UPDATE pepsi.list_digest d SET sent_at = now() FROM pepsi.mailing_list l \
         WHERE d.digest_id = $1 AND d.sent_at IS NULL AND l.list_id = d.list_id \
         RETURNING d.list_id, d.volume, d.number, d.sent_at, l.address, l.display_name",
    )
    .bind(digest_id)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let list_id: i64 = row.try_get("list_id")?;
    let list: String = row.try_get("address")?;
    let display_name: String = row.try_get("display_name")?;
    let sent_at: chrono::DateTime<Utc> = row.try_get("sent_at")?;
    let (volume, number): (i32, i32) = (row.try_get("volume")?, row.try_get("number")?);
    let stored: Vec<(i32, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT position, headers, body FROM pepsi.list_digest_message WHERE digest_id = $1 \
         ORDER BY position LIMIT $2",
    )
    .bind(digest_id)
    .bind(MAX_POSTS)
    .fetch_all(&mut *conn)
    .await?;
    let posts: Vec<Post<'_>> = stored
        .iter()
        .map(|(_, headers, body)| Post { headers, body })
        .collect();
    // The shares of the members who changed mode while the digest was open: per kind and
    // set of posts, who gets it. They get no share of the whole digest.
    let shares: Vec<(String, Vec<i32>, Vec<String>)> = sqlx::query_as(
        "SELECT kind, positions, array_agg(address ORDER BY address) FROM ( \
           SELECT m.address, \
                  CASE WHEN COALESCE(p.delivery_mode, 'regular') = 'regular' THEN s.mode \
                       ELSE p.delivery_mode END AS kind, \
                  ARRAY(SELECT d.position FROM pepsi.list_digest_message d \
                        WHERE d.digest_id = s.digest_id AND NOT s.regular @> d.position \
                        ORDER BY d.position) AS positions \
           FROM pepsi.list_digest_switch s JOIN pepsi.list_member m USING (member_id) \
           LEFT JOIN pepsi.list_member_preference p USING (member_id) \
           WHERE s.digest_id = $1) t \
         GROUP BY kind, positions ORDER BY kind, positions",
    )
    .bind(digest_id)
    .fetch_all(&mut *conn)
    .await?;
    let switched: Vec<String> = shares
        .iter()
        .flat_map(|(_, _, addresses)| addresses.iter().cloned())
        .collect();
    let message_id = |part: usize| {
        format!(
            "digest.{digest_id}.{}.{part}@{}",
            sent_at.timestamp_micros(),
            route.hostname
        )
    };
    let whole_id = message_id(0);
    let issue = Issue {
        list: &list,
        display_name: &display_name,
        volume,
        number,
        date: sent_at.timestamp(),
        message_id: &whole_id,
    };
    let fields = message::unsubscribe_fields(&list, route.web_url);
    let to = |mode, skip| Recipients {
        mode,
        skip,
        only: None,
    };
    let mime = message::mime(&issue, &posts);
    let mut mime_members = fan_out(
        conn,
        route,
        list_id,
        to("mime_digest", &switched),
        &mime,
        &fields,
    )
    .await?;
    let plain = message::plain(&issue, &posts);
    let mut plain_members = fan_out(
        conn,
        route,
        list_id,
        to("plain_digest", &switched),
        &plain,
        &fields,
    )
    .await?;
    for (part, (kind, positions, addresses)) in shares.iter().enumerate() {
        let share: Vec<Post<'_>> = stored
            .iter()
            .filter(|(position, _, _)| positions.contains(position))
            .map(|(_, headers, body)| Post { headers, body })
            .collect();
        if share.is_empty() {
            continue;
        }
        let share_id = message_id(part + 1);
        let issue = Issue {
            message_id: &share_id,
            ..issue
        };
        let (raw, members) = if kind == "plain_digest" {
            (message::plain(&issue, &share), &mut plain_members)
        } else {
            (message::mime(&issue, &share), &mut mime_members)
        };
        let only = Recipients {
            mode: kind,
            skip: &[],
            only: Some(addresses),
        };
        *members += fan_out(conn, route, list_id, only, &raw, &fields).await?;
    }
    sqlx::query(
        "WITH s AS (DELETE FROM pepsi.list_digest_switch WHERE digest_id = $1) \
         DELETE FROM pepsi.list_digest_message WHERE digest_id = $1",
    )
    .bind(digest_id)
    .execute(&mut *conn)
    .await?;
    Ok(Some(Sent {
        list,
        digest_id,
        volume,
        number,
        posts: posts.len(),
        mime_members,
        plain_members,
    }))
}

/// Who gets a digest: the enabled members whose delivery mode is `mode` but those in
/// `skip`; with `only`, the enabled members among those addresses whatever their mode.
struct Recipients<'a> {
    mode: &'a str,
    skip: &'a [String],
    only: Option<&'a [String]>,
}

/// One row per member of `to`, carrying `raw` and the member's own unsubscribe `fields`.
async fn fan_out(
    conn: &mut PgConnection,
    route: &Route<'_>,
    list_id: i64,
    to: Recipients<'_>,
    raw: &[u8],
    fields: &str,
) -> sqlx::Result<i32> {
    let (headers, body) = message::split(raw);
    sqlx::query_scalar(
        "SELECT pepsi.list_fanout(p_list_id => $1, p_role => 'member', p_stage => $2, \
         p_headers => $3, p_body => $4, p_mail_from => '', p_verp => true, \
         p_skip => $5, p_mode => $6, p_member_fields => $7, p_only => $8)",
    )
    .bind(list_id)
    .bind(route.deliver_stage)
    .bind(headers)
    .bind(body)
    .bind(to.skip)
    .bind(to.mode)
    .bind(fields)
    .bind(to.only)
    .fetch_one(&mut *conn)
    .await
}

/// Sends every open digest whose list's `digest_period` has passed since its first post (at
/// most [`MAX_DUE_PER_PASS`], the oldest first), each in a transaction of its own, and wakes
/// the dispatcher when one queued rows. A digest the list stage sends at the same moment is
/// sent once.
pub async fn send_due(pool: &PgPool, route: &Route<'_>) -> sqlx::Result<Vec<Sent>> {
    let due: Vec<i64> = sqlx::query_scalar(
        "SELECT d.digest_id FROM pepsi.list_digest d \
         JOIN pepsi.mailing_list l USING (list_id) \
         WHERE d.sent_at IS NULL AND d.opened_at + l.digest_period <= now() \
         ORDER BY d.opened_at, d.digest_id LIMIT $1",
    )
    .bind(MAX_DUE_PER_PASS)
    .fetch_all(pool)
    .await?;
    let mut sent = Vec::new();
    for digest_id in due {
        let mut tx = pool.begin().await?;
        let Some(s) = send(&mut tx, route, digest_id).await? else {
            tx.rollback().await?;
            continue;
        };
        tx.commit().await?;
        if s.mime_members + s.plain_members > 0 {
            pepsi_contract::db::notify_workqueue(pool).await?;
        }
        sent.push(s);
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_a_digest_is_full_table() {
        let cases: &[(i64, i64, i64, bool)] = &[
            (29_000, 30_720, 5, false),
            (30_720, 30_720, 5, true),
            (40_000, 30_720, 1, true),
            // A threshold above the bound: the bound decides.
            (MAX_BYTES - 1, 1 << 30, 10, false),
            (MAX_BYTES, 1 << 30, 10, true),
            // Many small posts: the count decides.
            (1_000, 1 << 30, MAX_POSTS - 1, false),
            (1_000, 1 << 30, MAX_POSTS, true),
        ];
        for (size, threshold, posts, want) in cases {
            assert_eq!(
                full(*size, *threshold, *posts),
                *want,
                "{size} {threshold} {posts}"
            );
        }
    }
}
