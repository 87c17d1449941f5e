//! The mailbox account store (`pepsi.mailbox_account`, `pepsi.mailbox_password`, patch
//! pepsi-0002): password checks for AUTH (the recipient check is crate::recipients).
//!
//! Argon2id verification is deliberately slow, so it runs on the blocking pool, never on
//! the async workers that carry every other session.

use pepsi_admin::password::{check_hash, dummy_hash};
use sqlx::PgPool;

pub use pepsi_admin::password::hash_password;

/// Why a login failed; the client sees the same reply for the first two.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("invalid credentials for {0:?}")]
    Invalid(String),
    #[error("account store unavailable: {0}")]
    Temporary(#[from] sqlx::Error),
    #[error("the account store did not answer within LOOKUP_TIMEOUT ({0:?})")]
    TimedOut(std::time::Duration),
}

/// Checks `password` for the mailbox `user` (an address, matched without regard to case).
/// Returns the canonical (lower-case) account name on success.
pub async fn verify_password(
    pool: &PgPool,
    user: &str,
    password: &[u8],
) -> Result<String, AuthError> {
    let name = user.to_lowercase();
    let hash: Option<String> = sqlx::query_scalar(
        "SELECT p.password_hash FROM pepsi.mailbox_password p \
         JOIN pepsi.mailbox_account a USING (address) WHERE a.address = $1 AND a.enabled",
    )
    .bind(&name)
    .fetch_optional(pool)
    .await?;
    let known = hash.is_some();
    let hash = hash.unwrap_or_else(|| dummy_hash().to_owned());
    let password = password.to_vec();
    let ok = tokio::task::spawn_blocking(move || check_hash(&hash, &password))
        .await
        .unwrap_or(false);
    if ok && known {
        Ok(name)
    } else {
        Err(AuthError::Invalid(name))
    }
}
