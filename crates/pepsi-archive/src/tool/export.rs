//! `pepsi-archive export`: a list's archive (or one month, one thread) as an mboxrd file,
//! in date order, optionally gzip'ed, to stdout or a file, through the library's
//! [`crate::export`] (shared with pepsi-httpd's admin API).

use anyhow::Context as _;
use serde_json::json;
use sqlx::PgPool;

use super::{Done, db, other, print};
use crate::export::write_all;
use crate::read;
use crate::store::Scope;

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
        None => write_all(pool, found.list_id, scope, std::io::stdout().lock(), e.gzip)
            .await
            .map_err(anyhow::Error::new)?,
        Some(path) => {
            let file = std::fs::File::create(path).with_context(|| format!("creating {path}"))?;
            match write_all(pool, found.list_id, scope, file, e.gzip).await {
                Ok(n) => n,
                Err(err) => {
                    // Half an mbox is worse than none: it reads as a whole one.
                    let _ = std::fs::remove_file(path);
                    return Err(anyhow::Error::new(err)
                        .context(format!("writing {path}"))
                        .into());
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
