//! The credential tables (`pepsi.admin_account`, `pepsi.admin_session`, `pepsi.api_token`,
//! patch pepsi-0006): the only SQL that touches them. Secrets arrive here as digests
//! (`credentials::digest`) and never leave as anything else; every change writes its
//! `pepsi.event_log` row in the same transaction (`admin.create`, `admin.login`,
//! `admin.logout`, `token.create`). Expiry is decided in the statements that read a session,
//! so a session past its idle or absolute limit is never honoured, whatever the clock of the
//! process asking.

use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pepsi_contract::audit::{self, Actor};
use serde_json::json;
use sqlx::PgPool;

/// Why a credential was not created.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Exists(String),
    #[error("{0}")]
    NotFound(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// How many administrator accounts there are.
pub async fn admin_count(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM pepsi.admin_account")
        .fetch_one(pool)
        .await
}

/// Creates administrator `name` with the Argon2id `hash`.
pub async fn create_admin(
    pool: &PgPool,
    actor: &Actor,
    name: &str,
    hash: &str,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    let n = sqlx::query(
        "INSERT INTO pepsi.admin_account (name, password_hash) VALUES ($1, $2) \
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(name)
    .bind(hash)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if n == 0 {
        return Err(StoreError::Exists(format!(
            "administrator {name} exists already"
        )));
    }
    audit::record(&mut tx, actor, "admin.create", None, json!({"name": name})).await?;
    tx.commit().await?;
    Ok(())
}

/// Creates administrator `name` only when there is none at all: the setup page's first
/// account. Two requests at once cannot both succeed (the table is locked against writers
/// until the transaction ends). Whether it was created.
pub async fn create_first_admin(
    pool: &PgPool,
    actor: &Actor,
    name: &str,
    hash: &str,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("LOCK TABLE pepsi.admin_account IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    let n = sqlx::query(
        "INSERT INTO pepsi.admin_account (name, password_hash) SELECT $1, $2 \
         WHERE NOT EXISTS (SELECT 1 FROM pepsi.admin_account)",
    )
    .bind(name)
    .bind(hash)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if n == 0 {
        return Ok(false);
    }
    audit::record(
        &mut tx,
        actor,
        "admin.create",
        None,
        json!({"name": name, "first": true}),
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// The password hash of the enabled administrator `name`.
pub async fn admin_hash(pool: &PgPool, name: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT password_hash FROM pepsi.admin_account WHERE name = $1 AND enabled")
        .bind(name)
        .fetch_optional(pool)
        .await
}

/// Records a failed login for `name` from `client` (`admin.login_failed`; the name as typed,
/// cut to 64 characters, whether or not such an administrator exists).
pub async fn login_failed(
    pool: &PgPool,
    actor: &Actor,
    name: &str,
    client: IpAddr,
    why: &str,
) -> Result<(), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let shown: String = name.chars().take(64).collect();
    let detail = json!({"name": shown, "client_addr": client.to_string(), "reason": why});
    audit::record(&mut conn, actor, "admin.login_failed", None, detail).await
}

/// Stores a new session of `admin` under `digest`; `admin.login`.
pub async fn create_session(
    pool: &PgPool,
    actor: &Actor,
    digest: &[u8],
    admin: &str,
    client: IpAddr,
) -> Result<DateTime<Utc>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let created: DateTime<Utc> = sqlx::query_scalar(
        "INSERT INTO pepsi.admin_session (digest, admin, client_addr) VALUES ($1, $2, $3::inet) \
         RETURNING created_at",
    )
    .bind(digest)
    .bind(admin)
    .bind(client.to_string())
    .fetch_one(&mut *tx)
    .await?;
    let detail = json!({"client_addr": client.to_string()});
    audit::record(&mut tx, actor, "admin.login", None, detail).await?;
    tx.commit().await?;
    Ok(created)
}

/// The administrator whose live session has `digest`, marking it used now. A session idle
/// longer than `idle`, older than `max_age`, or of a disabled administrator is not live.
pub async fn touch_session(
    pool: &PgPool,
    digest: &[u8],
    idle: Duration,
    max_age: Duration,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE pepsi.admin_session s SET last_seen_at = now() \
         FROM pepsi.admin_account a \
         WHERE s.digest = $1 AND a.name = s.admin AND a.enabled \
           AND s.last_seen_at > now() - make_interval(secs => $2) \
           AND s.created_at > now() - make_interval(secs => $3) \
         RETURNING s.admin",
    )
    .bind(digest)
    .bind(idle.as_secs_f64())
    .bind(max_age.as_secs_f64())
    .fetch_optional(pool)
    .await
}

/// Ends the session with `digest`; `admin.logout`.
pub async fn delete_session(
    pool: &PgPool,
    actor: &Actor,
    digest: &[u8],
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("DELETE FROM pepsi.admin_session WHERE digest = $1")
        .bind(digest)
        .execute(&mut *tx)
        .await?;
    audit::record(&mut tx, actor, "admin.logout", None, json!({})).await?;
    tx.commit().await?;
    Ok(())
}

/// Deletes sessions past their idle or absolute limit; returns how many.
pub async fn purge_sessions(
    pool: &PgPool,
    idle: Duration,
    max_age: Duration,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM pepsi.admin_session \
         WHERE last_seen_at <= now() - make_interval(secs => $1) \
            OR created_at <= now() - make_interval(secs => $2)",
    )
    .bind(idle.as_secs_f64())
    .bind(max_age.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected())
}

/// Stores an API token of `admin`: its public `id` and the digest of its secret half;
/// `token.create`.
pub async fn create_token(
    pool: &PgPool,
    actor: &Actor,
    id: &str,
    digest: &[u8],
    admin: &str,
    label: &str,
    expires_at: Option<DateTime<Utc>>,
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    let known: Option<String> =
        sqlx::query_scalar("SELECT name FROM pepsi.admin_account WHERE name = $1")
            .bind(admin)
            .fetch_optional(&mut *tx)
            .await?;
    if known.is_none() {
        return Err(StoreError::NotFound(format!(
            "there is no administrator {admin}"
        )));
    }
    sqlx::query(
        "INSERT INTO pepsi.api_token (token_id, digest, admin, label, expires_at) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(digest)
    .bind(admin)
    .bind(label)
    .bind(expires_at)
    .execute(&mut *tx)
    .await?;
    let detail = json!({"token_id": id, "admin": admin, "label": label, "expires_at": expires_at});
    audit::record(&mut tx, actor, "token.create", None, detail).await?;
    tx.commit().await?;
    Ok(())
}

/// An API token as listed: never its secret or digest.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenListing {
    pub token_id: String,
    pub admin: String,
    pub label: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
}

/// Every API token, oldest first.
pub async fn list_tokens(pool: &PgPool) -> Result<Vec<TokenListing>, sqlx::Error> {
    use sqlx::Row as _;
    let rows = sqlx::query(
        "SELECT token_id, admin, label, created_at, expires_at, last_used_at \
         FROM pepsi.api_token ORDER BY created_at, token_id",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(TokenListing {
                token_id: r.try_get("token_id")?,
                admin: r.try_get("admin")?,
                label: r.try_get("label")?,
                created_at: r.try_get("created_at")?,
                expires_at: r.try_get("expires_at")?,
                last_used_at: r.try_get("last_used_at")?,
            })
        })
        .collect()
}

/// Deletes the API token `id` (the part after `pepsi_`, or the whole token); `token.revoke`.
/// A request with it is refused from then on.
pub async fn revoke_token(pool: &PgPool, actor: &Actor, id: &str) -> Result<(), StoreError> {
    let mut tx = pool.begin().await?;
    let gone: Option<String> =
        sqlx::query_scalar("DELETE FROM pepsi.api_token WHERE token_id = $1 RETURNING admin")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(admin) = gone else {
        return Err(StoreError::NotFound(format!("there is no API token {id}")));
    };
    audit::record(
        &mut tx,
        actor,
        "token.revoke",
        None,
        json!({"token_id": id, "admin": admin}),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The administrator a live token (`id`, secret `digest`) belongs to, marking it used.
pub async fn check_token(
    pool: &PgPool,
    id: &str,
    digest: &[u8],
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE pepsi.api_token t SET last_used_at = now() \
         FROM pepsi.admin_account a \
         WHERE t.token_id = $1 AND t.digest = $2 AND a.name = t.admin AND a.enabled \
           AND (t.expires_at IS NULL OR t.expires_at > now()) \
         RETURNING t.admin",
    )
    .bind(id)
    .bind(digest)
    .fetch_optional(pool)
    .await
}
