//! Reading the database overlay: the rows of `pepsi.config_override` for a scope, every row for
//! a stage worker, and the notification that they changed. Which rows apply and what they may
//! set is `pepsi_conf::config`'s ([`Config::with_overrides`]); this module only reads.

use std::future::Future;

use pepsi_conf::config::{Config, ConfigError, OverrideRow, Scope};
use sqlx::PgPool;
use sqlx::postgres::PgListener;

/// The channel the `config_changed` trigger NOTIFYs after a change to `pepsi.config_override`.
pub const CONFIG_CHANGED_CHANNEL: &str = "config_changed";

/// A configuration with the database's overrides for a scope applied.
pub trait DbOverlay {
    /// This configuration with the database overrides for `scope` applied.
    fn with_db_overlay(
        &self,
        pool: &PgPool,
        scope: &Scope,
    ) -> impl Future<Output = Result<Config, ConfigError>> + Send;
}

impl DbOverlay for Config {
    async fn with_db_overlay(&self, pool: &PgPool, scope: &Scope) -> Result<Config, ConfigError> {
        let rows = load_overrides(pool, scope).await?;
        Ok(self.with_overrides(&rows, scope))
    }
}

/// Fetches, in one query, the `global` rows and those of the scope's domain and address.
/// Ordered by `updated_at` so that of two rows differing only in letter case the newer wins.
pub async fn load_overrides(pool: &PgPool, scope: &Scope) -> Result<Vec<OverrideRow>, ConfigError> {
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT scope, section, option, value FROM pepsi.config_override \
         WHERE lower(scope) = ANY($1) ORDER BY updated_at, scope, section, option",
    )
    .bind(scope.db_scopes())
    .fetch_all(pool)
    .await
    .map_err(ConfigError::database)?;
    Ok(rows.into_iter().map(OverrideRow::from).collect())
}

/// The most override rows a stage worker reads at start (`load_all_overrides`).
pub const MAX_OVERRIDE_ROWS: i64 = 100_000;

/// Every row, of every scope, in the order `load_overrides` uses: for a stage worker, which
/// applies `global` rows to everything and `domain:`/`address:` rows to the messages they
/// are for (`stage::scope`). At most [`MAX_OVERRIDE_ROWS`].
pub async fn load_all_overrides(pool: &PgPool) -> Result<Vec<OverrideRow>, ConfigError> {
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT scope, section, option, value FROM pepsi.config_override \
         ORDER BY updated_at, scope, section, option LIMIT $1",
    )
    .bind(MAX_OVERRIDE_ROWS)
    .fetch_all(pool)
    .await
    .map_err(ConfigError::database)?;
    Ok(rows.into_iter().map(OverrideRow::from).collect())
}

/// A listener subscribed to [`CONFIG_CHANGED_CHANNEL`]; a notification means the overrides
/// changed and a long-running component should rebuild its configuration.
pub async fn listen_config_changed(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = crate::db::listener(pool).await?;
    listener.listen(CONFIG_CHANGED_CHANNEL).await?;
    Ok(listener)
}
