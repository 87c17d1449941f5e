//! The tool's own SQL beside the archive's (`store`): the list a command names and the
//! `archive_import` row of an import (the list itself through `read::list`). Every statement is fixed; input is only ever bound.

use std::collections::HashMap;

use pepsi_conf::cli::ToolFailure as Failure;
use sqlx::{PgConnection, PgPool};

/// A list as the tool needs it.
pub(crate) struct List {
    pub list_id: i64,
    pub archive_policy: &'static str,
}

/// The list `address` (stored form), as the archive's pages read it; no such list is a
/// failure naming it.
pub(crate) async fn list(pool: &PgPool, address: &str) -> Result<List, Failure> {
    let found = crate::read::list(pool, address).await?.ok_or_else(|| {
        super::other(format!(
            "there is no list {address} (`pepsi-list lists` shows them)"
        ))
    })?;
    Ok(List {
        list_id: found.list_id,
        archive_policy: found.policy.as_str(),
    })
}

/// The addresses of the lists `ids`.
pub(crate) async fn list_names(
    pool: &PgPool,
    ids: &[i64],
) -> Result<HashMap<i64, String>, sqlx::Error> {
    let rows: Vec<(i64, String)> =
        sqlx::query_as("SELECT list_id, address FROM pepsi.mailing_list WHERE list_id = ANY($1)")
            .bind(ids)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().collect())
}

/// The number of archived posts of the list (of every list when `None`).
pub(crate) async fn post_count(pool: &PgPool, list_id: Option<i64>) -> Result<u64, sqlx::Error> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.archive_message WHERE $1::int8 IS NULL OR list_id = $1",
    )
    .bind(list_id)
    .fetch_one(pool)
    .await?;
    Ok(n as u64)
}

/// What an import has counted so far.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub(crate) struct Counts {
    pub read: u64,
    pub archived: u64,
    pub duplicates: u64,
    pub too_long: u64,
    pub failed: u64,
}

/// Starts the `archive_import` row of an import of `file_name` by `who`; its id.
pub(crate) async fn import_begin(
    pool: &PgPool,
    list_id: i64,
    file_name: &str,
    who: &str,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO pepsi.archive_import (list_id, file_name, started_by) \
         VALUES ($1, $2, $3) RETURNING import_id",
    )
    .bind(list_id)
    .bind(file_name)
    .bind(who)
    .fetch_one(pool)
    .await
}

/// Records the counts of the import so far in its row, in the transaction of the batch they
/// count, and marks it finished when `finished`.
pub(crate) async fn import_counts(
    tx: &mut PgConnection,
    import_id: i64,
    c: &Counts,
    finished: bool,
) -> Result<(), sqlx::Error> {
    let int = |n: u64| i32::try_from(n).unwrap_or(i32::MAX);
    sqlx::query(
        "UPDATE pepsi.archive_import SET read = $2, archived = $3, duplicates = $4, \
         failed = $5, too_long = $7, \
         finished_at = CASE WHEN $6 THEN now() ELSE finished_at END WHERE import_id = $1",
    )
    .bind(import_id)
    .bind(int(c.read))
    .bind(int(c.archived))
    .bind(int(c.duplicates))
    .bind(int(c.failed))
    .bind(finished)
    .bind(int(c.too_long))
    .execute(&mut *tx)
    .await?;
    Ok(())
}
