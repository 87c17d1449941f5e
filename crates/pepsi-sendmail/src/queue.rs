//! Handing a prepared message over: to the database through `pepsi.sendmail_submit` when
//! it answers, else to the drop directory; and the pickup, which inserts the drop
//! directory's files and removes each only once its insert committed.
//!
//! The one rule: a message is either refused (the caller is told, exit status non-zero) or
//! durably somewhere, the queue or a synced file. A database that cannot be reached, or
//! that fails for any reason other than refusing the message itself, sends the message to
//! the drop directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pepsi_contract::db::{LocalSubmission, is_submission_refused, sendmail_submit};
use sqlx::{Connection as _, PgConnection};

use crate::message::Prepared;
use crate::section::{Options, User, user};
use crate::spool::{self, BadFile, SpoolEnvelope};

/// Where a message went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Queued {
    /// In the work queue, this row.
    Database(i64),
    /// In the drop directory, for the pickup.
    Spool(PathBuf),
}

/// Why a message was not taken.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The database refused the message as malformed: sending it again cannot help.
    #[error("the message was refused: {0}")]
    Refused(String),
    /// Neither the database nor the drop directory took it.
    #[error("{0}")]
    Temporary(String),
}

/// Connects as the sendmail role within CONNECT_TIMEOUT.
pub async fn connect(options: &Options) -> Result<PgConnection, String> {
    match tokio::time::timeout(
        options.connect_timeout,
        PgConnection::connect_with(&options.database),
    )
    .await
    {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no connection within {:?} (CONNECT_TIMEOUT)",
            options.connect_timeout
        )),
    }
}

/// Queues `msg` from `who`: the database first, the drop directory when it fails.
pub async fn queue(options: &Options, who: &User, msg: &Prepared) -> Result<Queued, QueueError> {
    let direct = async {
        let mut conn = connect(options).await?;
        let submission = LocalSubmission {
            mail_from: &msg.mail_from,
            rcpt_to: &msg.rcpt_to,
            headers: &msg.headers,
            body: &msg.body,
            dsn: &msg.dsn,
            uid: who.uid,
            user: who.login.as_deref(),
            via: pepsi_contract::state::SubmissionVia::Direct,
            token: None,
        };
        let result = sendmail_submit(&mut conn, &submission).await;
        if let Ok(Some(_)) = &result
            && let Err(e) = pepsi_contract::db::notify_workqueue(&mut conn).await
        {
            // The row is stored; the dispatcher finds it at its next heartbeat.
            tracing::debug!("cannot wake the dispatcher: {e}");
        }
        conn.close().await.ok();
        Ok::<_, String>(result)
    };
    let why = match direct.await {
        Ok(Ok(Some(id))) => return Ok(Queued::Database(id)),
        Ok(Ok(None)) => "the database stored nothing (no token was given)".to_owned(),
        Ok(Err(e)) if is_submission_refused(&e) => {
            return Err(QueueError::Refused(database_message(&e)));
        }
        Ok(Err(e)) => e.to_string(),
        Err(e) => e,
    };
    tracing::info!(
        "the database did not take the message ({why}); writing it to the drop directory"
    );
    let envelope = SpoolEnvelope {
        mail_from: msg.mail_from.clone(),
        rcpt_to: msg.rcpt_to.clone(),
        dsn: msg.dsn.clone(),
        user: who.login.clone(),
    };
    match spool::write(&options.spool_dir, &envelope, &msg.headers, &msg.body) {
        Ok(path) => Ok(Queued::Spool(path)),
        Err(e) => Err(QueueError::Temporary(format!(
            "cannot queue the message: the database failed ({why}) and the drop directory {} failed ({e})",
            options.spool_dir.display()
        ))),
    }
}

fn database_message(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => db.message().to_owned(),
        other => other.to_string(),
    }
}

/// What one pickup pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Files inserted (or found inserted already) and removed.
    pub inserted: usize,
    /// Files set aside as `<name>.bad`.
    pub set_aside: usize,
    /// Files still waiting (the database failed during the pass).
    pub left: usize,
}

/// One pickup pass over the drop directory. Errors only when the directory cannot be read
/// or the database fails (the files stay for the next pass).
pub async fn pickup(options: &Options) -> anyhow::Result<PassReport> {
    let dir = &options.spool_dir;
    if let Ok(n) = spool::sweep_tmp(dir, Duration::from_secs(3600))
        && n > 0
    {
        tracing::warn!(
            removed = n,
            "removed files a writer left unfinished over an hour ago"
        );
    }
    let names = spool::list(dir)
        .map_err(|e| anyhow::anyhow!("cannot read the drop directory {}: {e}", dir.display()))?;
    let mut report = PassReport::default();
    if names.is_empty() {
        return Ok(report);
    }
    let mut conn = connect(options).await.map_err(|e| {
        anyhow::anyhow!("cannot reach the database: {e}; {} files wait", names.len())
    })?;
    for (i, name) in names.iter().enumerate() {
        match insert_one(&mut conn, options, dir, name).await {
            Ok(Some(())) => report.inserted += 1,
            Ok(None) => report.set_aside += 1,
            Err(e) => {
                report.left = names.len() - i;
                if report.inserted > 0 {
                    let _ = pepsi_contract::db::notify_workqueue(&mut conn).await;
                }
                return Err(e.context(format!("{} files wait for the next pass", report.left)));
            }
        }
    }
    if report.inserted > 0
        && let Err(e) = pepsi_contract::db::notify_workqueue(&mut conn).await
    {
        tracing::debug!("cannot wake the dispatcher: {e}");
    }
    conn.close().await.ok();
    Ok(report)
}

/// Inserts file `name` and removes it: Some(()) when inserted (or inserted before), None
/// when set aside as unusable, an error when the database failed.
async fn insert_one(
    conn: &mut PgConnection,
    options: &Options,
    dir: &Path,
    name: &str,
) -> anyhow::Result<Option<()>> {
    let file = match spool::read(dir, name, options.limits.max_size) {
        Ok(f) => f,
        Err(BadFile::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            // Another pickup took it meanwhile.
            return Ok(Some(()));
        }
        Err(e) => {
            let aside = spool::set_aside(dir, name);
            tracing::error!(file = name, set_aside = ?aside, "cannot insert a file of the drop directory: {e}");
            return Ok(None);
        }
    };
    // The file's owner submitted it: a user can write anything into a file of their own,
    // never make it someone else's.
    let owner = user(file.uid);
    let token = format!("sendmail:{name}");
    let submission = LocalSubmission {
        mail_from: &file.envelope.mail_from,
        rcpt_to: &file.envelope.rcpt_to,
        headers: &file.headers,
        body: &file.body,
        dsn: &file.envelope.dsn,
        uid: file.uid,
        user: owner.login.as_deref(),
        via: pepsi_contract::state::SubmissionVia::Spool,
        token: Some(&token),
    };
    match sendmail_submit(&mut *conn, &submission).await {
        Ok(id) => {
            // The insert has committed (one statement, its own transaction): only now may
            // the file go. A crash right here leaves it, and the token makes the next
            // pass remove it without a second insert.
            std::fs::remove_file(&file.path)
                .map_err(|e| anyhow::anyhow!("inserted {name} but cannot remove it: {e}"))?;
            match id {
                Some(id) => tracing::info!(
                    file = name,
                    id,
                    uid = file.uid,
                    "inserted from the drop directory"
                ),
                None => tracing::info!(file = name, "inserted before; removed"),
            }
            Ok(Some(()))
        }
        Err(e) if is_submission_refused(&e) => {
            let aside = spool::set_aside(dir, name);
            tracing::error!(file = name, set_aside = ?aside, uid = file.uid,
                "the database refused a file of the drop directory: {}", database_message(&e));
            Ok(None)
        }
        Err(e) => Err(anyhow::anyhow!("cannot insert {name}: {e}")),
    }
}
