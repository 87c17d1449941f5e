//! Password hashes: Argon2id PHC strings (`$argon2id$v=19$m=…,t=…,p=…$salt$hash`), the one
//! form every Pepsi credential table stores (`mailbox_password`, `admin_account`).
//!
//! Hashing and checking are deliberately slow: async callers run them on the blocking pool
//! (`tokio::task::spawn_blocking`), never on the workers that carry other connections. A
//! check for an unknown name should still cost one verification (`dummy_hash`), so that a
//! login's timing does not tell which names exist. Nothing here logs or keeps a password.

use std::sync::OnceLock;

use argon2::{Argon2, PasswordHasher as _, PasswordVerifier};

/// The longest password accepted anywhere, in bytes: an input bound, far above any real one.
pub const MAX_PASSWORD_LEN: usize = 1024;

/// An Argon2id PHC string for `password` with a fresh random salt from the operating system.
pub fn hash_password(password: &[u8]) -> Result<String, argon2::password_hash::Error> {
    Ok(Argon2::default().hash_password(password)?.to_string())
}

/// True when `password` matches the PHC string `hash`; a malformed hash never matches.
pub fn check_hash(hash: &str, password: &[u8]) -> bool {
    PasswordVerifier::<str>::verify_password(&Argon2::default(), password, hash).is_ok()
}

/// A valid Argon2id hash no password matches in practice, to check against when the name is
/// unknown: such a login costs as long as one with a wrong password.
pub fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        Argon2::default()
            .hash_password_with_salt(b"no such account", b"pepsi-dummy-salt")
            .map(|h| h.to_string())
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_check_and_salts_differ() {
        let hash = Argon2::default()
            .hash_password_with_salt(b"secret", b"somesaltsomesalt")
            .unwrap()
            .to_string();
        assert!(hash.starts_with("$argon2id$"));
        let cases: [(&str, &[u8], bool); 4] = [
            (&hash, b"secret", true),
            (&hash, b"Secret", false),
            ("not a hash", b"secret", false),
            (dummy_hash(), b"", false),
        ];
        for (h, pw, want) in cases {
            assert_eq!(check_hash(h, pw), want, "{h} / {pw:?}");
        }
        let fresh = hash_password(b"pw").unwrap();
        assert!(check_hash(&fresh, b"pw"));
        assert_ne!(fresh, hash_password(b"pw").unwrap(), "salts must differ");
        assert!(dummy_hash().starts_with("$argon2id$"));
    }
}
