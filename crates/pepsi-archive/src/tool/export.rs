//! `pepsi-archive export`: a list's archive (or one month, one thread) as an mboxrd file,
//! in date order, read [`BATCH`] posts at a time, optionally gzip'ed, to stdout or a file.

use std::io::{BufWriter, Write};

use anyhow::Context as _;
use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::json;
use sqlx::PgPool;

use super::{Done, db, other, print};
use crate::store::{self, Scope};
use crate::{mbox, read};

/// Posts read per query.
const BATCH: i64 = 200;

/// Which posts to write.
pub(super) enum Wanted {
    All,
    Month(chrono::NaiveDate),
    /// The thread of the post (or placeholder) with this url id.
    Thread(String),
}

pub(super) struct Export {
    pub list: String,
    pub wanted: Wanted,
    pub gzip: bool,
    pub output: Option<String>,
    pub json: bool,
}

/// Writes the posts of `scope` to `out`; the number of posts and of their bytes.
async fn write_posts<W: Write>(
    pool: &PgPool,
    list_id: i64,
    scope: &Scope,
    out: &mut W,
) -> anyhow::Result<(u64, u64)> {
    let (mut posts, mut bytes) = (0u64, 0u64);
    let mut after = None;
    loop {
        let batch = store::export(pool, list_id, scope, after, BATCH).await?;
        let Some(last) = batch.last() else { break };
        after = Some((last.date, last.archive_id));
        for p in &batch {
            let from_line = mbox::from_line_of(&p.from_address, p.date);
            mbox::write_message(out, &from_line, &p.raw).context("writing the mbox")?;
            posts += 1;
            bytes += p.raw.len() as u64;
        }
    }
    Ok((posts, bytes))
}

async fn write_all(
    pool: &PgPool,
    list_id: i64,
    scope: &Scope,
    sink: Box<dyn Write>,
    gzip: bool,
) -> anyhow::Result<(u64, u64)> {
    let mut buffered = BufWriter::with_capacity(1 << 16, sink);
    if gzip {
        let mut gz = GzEncoder::new(buffered, Compression::default());
        let n = write_posts(pool, list_id, scope, &mut gz).await?;
        gz.finish()
            .and_then(|mut w| w.flush())
            .context("writing the mbox")?;
        Ok(n)
    } else {
        let n = write_posts(pool, list_id, scope, &mut buffered).await?;
        buffered.flush().context("writing the mbox")?;
        Ok(n)
    }
}

pub(super) async fn run(pool: &PgPool, e: Export) -> Done {
    let found = db::list(pool, &e.list).await?;
    let (scope, month, thread) = match &e.wanted {
        Wanted::All => (Scope::All, None, None),
        Wanted::Month(m) => (Scope::Month(*m), Some(m.format("%Y-%m").to_string()), None),
        Wanted::Thread(u) => {
            let t = read::thread_of(pool, found.list_id, u)
                .await?
                .map(|t| t.thread_id)
                .ok_or_else(|| {
                    other(format!(
                        "the archive of {} has no post {u} (`pepsi-archive search` shows \
                         the url ids)",
                        e.list
                    ))
                })?;
            (Scope::Thread(t), None, Some(u.clone()))
        }
    };
    let (posts, bytes) = match &e.output {
        None => {
            write_all(
                pool,
                found.list_id,
                &scope,
                Box::new(std::io::stdout().lock()),
                e.gzip,
            )
            .await?
        }
        Some(path) => {
            let file = std::fs::File::create(path).with_context(|| format!("creating {path}"))?;
            match write_all(pool, found.list_id, &scope, Box::new(file), e.gzip).await {
                Ok(n) => n,
                Err(err) => {
                    // Half an mbox is worse than none: it reads as a whole one.
                    let _ = std::fs::remove_file(path);
                    return Err(err.context(format!("writing {path}")).into());
                }
            }
        }
    };
    let Some(path) = &e.output else {
        return Ok(());
    };
    print(
        e.json,
        &json!({
            "list": e.list,
            "file": path,
            "posts": posts,
            "bytes": bytes,
            "gzip": e.gzip,
            "month": month,
            "thread": thread,
        }),
        || {
            let of = match (&month, &thread) {
                (Some(m), _) => format!(" of {m}"),
                (None, Some(t)) => format!(" of the thread of {t}"),
                _ => String::new(),
            };
            format!(
                "wrote {posts} posts{of} of {} ({bytes} bytes{}) to {path}\n",
                e.list,
                if e.gzip { ", gzip'ed" } else { "" }
            )
        },
    )
}
