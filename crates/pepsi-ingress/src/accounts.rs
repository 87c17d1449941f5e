//! The mailbox account store (`pepsi.mailbox_account`, `pepsi.mailbox_password`, patch
//! pepsi-0002): password checks for AUTH (the recipient check is crate::recipients).
//!
//! Argon2id verification is deliberately slow, so it runs on the blocking pool, never on
//! the async workers that carry every other session.

use std::sync::OnceLock;

use argon2::{Argon2, PasswordHasher as _, PasswordVerifier};
use sqlx::PgPool;

/// An Argon2id hash checked when the account has no password, so that a login for an
/// unknown name costs as long as one with a wrong password (no user enumeration by timing).
fn dummy_hash() -> String {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY
        .get_or_init(|| {
            Argon2::default()
                .hash_password_with_salt(b"no such account", b"pepsi-ingress-dummy")
                .map(|h| h.to_string())
                .unwrap_or_default()
        })
        .clone()
}

/// Why a login failed; the client sees the same reply for the first two.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("invalid credentials for {0:?}")]
    Invalid(String),
    #[error("account store unavailable: {0}")]
    Temporary(#[from] sqlx::Error),
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
    let hash = hash.unwrap_or_else(dummy_hash);
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

/// An Argon2id PHC string for `password` with a fresh random salt (from the operating
/// system), in the form `pepsi.mailbox_password.password_hash` takes.
pub fn hash_password(password: &[u8]) -> Result<String, argon2::password_hash::Error> {
    Ok(Argon2::default().hash_password(password)?.to_string())
}

/// True when `password` matches the PHC string `hash`; a malformed hash never matches.
pub fn check_hash(hash: &str, password: &[u8]) -> bool {
    PasswordVerifier::<str>::verify_password(&Argon2::default(), password, hash).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_checks() {
        let hash = Argon2::default()
            .hash_password_with_salt(b"secret", b"somesaltsomesalt")
            .unwrap()
            .to_string();
        assert!(hash.starts_with("$argon2id$"));
        assert!(check_hash(&hash, b"secret"));
        assert!(!check_hash(&hash, b"Secret"));
        assert!(!check_hash("not a hash", b"secret"));
        let fresh = hash_password(b"pw").unwrap();
        assert!(check_hash(&fresh, b"pw"));
        assert_ne!(fresh, hash_password(b"pw").unwrap(), "salts must differ");
        assert!(dummy_hash().starts_with("$argon2id$"));
        assert!(!check_hash(&dummy_hash(), b""));
    }
}
