//! The key-encryption keys and the sealing of private keys under them.
//!
//! A KEK is written `id:base64` (32 bytes of key; the id a short name of letters, digits,
//! `-`, `_` and `.`, stored with every row it seals, so rotation knows which KEK opens
//! which row). A sealed key is `0x01 || nonce (12) || ciphertext || tag (16)`; the
//! additional data binds it to `pepsi-keymat/1`, the scheme and the fingerprint.

use openssl::symm::{Cipher, decrypt_aead, encrypt_aead};
use pepsi_conf::config::Config;
use pepsi_crypto::Scheme;
use zeroize::Zeroizing;

/// The version byte of a sealed key.
const SEALED_V1: u8 = 1;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
const KEY_LEN: usize = 32;

/// Why a KEK could not be loaded or a key not be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum KeymatError {
    /// `[crypto] KEK` / `RETIRED_KEKS` missing or malformed (the message names which).
    #[error("{0}")]
    Config(String),
    /// A row was sealed under a KEK this configuration does not hold.
    #[error(
        "the private key of {fingerprint} is sealed under key-encryption key {kek_id:?}, which \
         [crypto] KEK and RETIRED_KEKS do not hold"
    )]
    UnknownKek { kek_id: String, fingerprint: String },
    /// The sealed bytes do not open: altered, moved from another row, or the KEK with this
    /// id is not the one that sealed them.
    #[error(
        "the private key of {fingerprint} does not open under key-encryption key {kek_id:?} \
         (altered, moved from another identity, or a different key under the same id)"
    )]
    Unseal { kek_id: String, fingerprint: String },
    /// Reading the key store failed; a temporary condition.
    #[error("key store: {0}")]
    Database(#[from] sqlx::Error),
    /// A stored key that the crypto library does not read.
    #[error("{0}")]
    Crypto(#[from] pepsi_crypto::CryptoError),
}

impl KeymatError {
    /// Whether trying again later may succeed (the database), as opposed to a configuration
    /// or data problem a person must fix.
    pub fn is_temporary(&self) -> bool {
        matches!(self, KeymatError::Database(_))
    }
}

/// One key-encryption key.
struct Kek {
    id: String,
    key: Zeroizing<[u8; KEY_LEN]>,
}

impl Kek {
    fn parse(text: &str, option: &str) -> Result<Kek, KeymatError> {
        let bad = |why: &str| KeymatError::Config(format!("[crypto] {option}: {why}"));
        let (id, b64) = text
            .trim()
            .split_once(':')
            .ok_or_else(|| bad("expected `id:base64-key` (pepsi-keys kek-new prints one)"))?;
        check_id(id).map_err(|e| bad(&e))?;
        let bytes = Zeroizing::new(
            pepsi_smtp::encoding::base64_decode(b64.trim())
                .ok_or_else(|| bad(&format!("the key of {id:?} is not base64")))?,
        );
        if bytes.len() != KEY_LEN {
            return Err(bad(&format!(
                "the key of {id:?} is {} bytes; AES-256 needs {KEY_LEN}",
                bytes.len()
            )));
        }
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        key.copy_from_slice(&bytes);
        Ok(Kek {
            id: id.to_owned(),
            key,
        })
    }
}

fn check_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "key id {id:?} must be 1-64 letters, digits, '-', '_' or '.'"
        ))
    }
}

/// A fresh KEK line, `id:base64`, for a secrets fragment.
pub fn new_kek(id: &str) -> Result<String, KeymatError> {
    check_id(id).map_err(KeymatError::Config)?;
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    openssl::rand::rand_bytes(&mut key[..])
        .map_err(|e| KeymatError::Config(format!("no random bytes for a new key: {e}")))?;
    Ok(format!(
        "{id}:{}",
        pepsi_smtp::encoding::base64_encode(&key[..])
    ))
}

/// The current KEK and the retired ones still accepted for opening.
pub struct Keyring {
    current: Kek,
    retired: Vec<Kek>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("current", &self.current.id)
            .field(
                "retired",
                &self.retired.iter().map(|k| &k.id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Keyring {
    /// Reads `[crypto] KEK` and `RETIRED_KEKS` (comma separated), both of which must come
    /// from a `secrets.d` fragment.
    pub fn from_config(cfg: &Config) -> Result<Keyring, KeymatError> {
        let section = cfg.section("crypto");
        let config = |e: pepsi_conf::config::ConfigError| KeymatError::Config(e.to_string());
        let current = section.string_opt("KEK").map_err(config)?.ok_or_else(|| {
            KeymatError::Config(
                "[crypto] KEK is not set: put `[crypto]` and `KEK = <id>:<key>` (from \
                 `pepsi-keys kek-new`) in a secrets.d fragment readable by the crypto user only"
                    .into(),
            )
        })?;
        for option in ["KEK", "RETIRED_KEKS"] {
            if section.has(option) && !cfg.is_secret("crypto", option) {
                return Err(KeymatError::Config(format!(
                    "[crypto] {option} must be set in a secrets.d fragment, not in {} or the \
                     database overlay: a key-encryption key beside the keys it seals protects \
                     nothing",
                    cfg.file().display()
                )));
            }
        }
        let retired = section
            .list_opt("RETIRED_KEKS")
            .map_err(config)?
            .unwrap_or_default();
        Self::parse(&current, &retired)
    }

    /// A keyring from KEK lines (`id:base64`): the current one and retired ones.
    pub fn parse(current: &str, retired: &[String]) -> Result<Keyring, KeymatError> {
        let current = Kek::parse(current, "KEK")?;
        let mut seen = vec![current.id.clone()];
        let mut old = Vec::new();
        for line in retired {
            let kek = Kek::parse(line, "RETIRED_KEKS")?;
            if seen.contains(&kek.id) {
                return Err(KeymatError::Config(format!(
                    "[crypto] RETIRED_KEKS: key id {:?} is given twice",
                    kek.id
                )));
            }
            seen.push(kek.id.clone());
            old.push(kek);
        }
        Ok(Keyring {
            current,
            retired: old,
        })
    }

    /// The id of the KEK new seals use.
    pub fn current_id(&self) -> &str {
        &self.current.id
    }

    /// Whether `kek_id` is a KEK this keyring holds.
    pub fn holds(&self, kek_id: &str) -> bool {
        self.find(kek_id).is_some()
    }

    fn find(&self, kek_id: &str) -> Option<&Kek> {
        std::iter::once(&self.current)
            .chain(&self.retired)
            .find(|k| k.id == kek_id)
    }

    /// Seals `secret` under the current KEK for the identity `scheme`/`fingerprint`.
    /// Returns the sealed bytes; the row stores [`Keyring::current_id`] beside them.
    pub fn seal(
        &self,
        scheme: Scheme,
        fingerprint: &str,
        secret: &[u8],
    ) -> Result<Vec<u8>, KeymatError> {
        let mut nonce = [0u8; NONCE_LEN];
        openssl::rand::rand_bytes(&mut nonce)
            .map_err(|e| KeymatError::Config(format!("no random bytes for a nonce: {e}")))?;
        let mut tag = [0u8; TAG_LEN];
        let sealed = encrypt_aead(
            Cipher::aes_256_gcm(),
            &self.current.key[..],
            Some(&nonce),
            &aad(scheme, fingerprint),
            secret,
            &mut tag,
        )
        .map_err(|e| KeymatError::Config(format!("AES-256-GCM refused to seal: {e}")))?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + sealed.len() + TAG_LEN);
        out.push(SEALED_V1);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out.extend_from_slice(&tag);
        Ok(out)
    }

    /// Opens what [`Keyring::seal`] made for the same scheme and fingerprint under the KEK
    /// named `kek_id`.
    pub fn open(
        &self,
        kek_id: &str,
        scheme: Scheme,
        fingerprint: &str,
        sealed: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, KeymatError> {
        let kek = self.find(kek_id).ok_or_else(|| KeymatError::UnknownKek {
            kek_id: kek_id.to_owned(),
            fingerprint: fingerprint.to_owned(),
        })?;
        let unseal = || KeymatError::Unseal {
            kek_id: kek_id.to_owned(),
            fingerprint: fingerprint.to_owned(),
        };
        if sealed.len() < 1 + NONCE_LEN + TAG_LEN || sealed[0] != SEALED_V1 {
            return Err(unseal());
        }
        let nonce = &sealed[1..1 + NONCE_LEN];
        let (ciphertext, tag) =
            sealed[1 + NONCE_LEN..].split_at(sealed.len() - 1 - NONCE_LEN - TAG_LEN);
        decrypt_aead(
            Cipher::aes_256_gcm(),
            &kek.key[..],
            Some(nonce),
            &aad(scheme, fingerprint),
            ciphertext,
            tag,
        )
        .map(Zeroizing::new)
        .map_err(|_| unseal())
    }
}

/// The additional authenticated data of a seal: what the row claims to be.
fn aad(scheme: Scheme, fingerprint: &str) -> Vec<u8> {
    format!(
        "pepsi-keymat/1\0{}\0{}",
        scheme.as_str(),
        fingerprint.to_ascii_uppercase()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring::parse(&new_kek("k2").unwrap(), &[new_kek("k1").unwrap()]).unwrap()
    }

    #[test]
    fn a_sealed_key_opens_only_as_the_identity_it_was_sealed_for() {
        let ring = ring();
        let sealed = ring.seal(Scheme::OpenPgp, "ABCD", b"secret key").unwrap();
        assert!(!sealed.windows(10).any(|w| w == b"secret key"));
        let opened = ring.open("k2", Scheme::OpenPgp, "abcd", &sealed).unwrap();
        assert_eq!(&opened[..], b"secret key");
        for (kek, scheme, fpr) in [
            ("k2", Scheme::Smime, "ABCD"),
            ("k2", Scheme::OpenPgp, "ABCE"),
            ("k1", Scheme::OpenPgp, "ABCD"),
        ] {
            assert!(
                matches!(
                    ring.open(kek, scheme, fpr, &sealed),
                    Err(KeymatError::Unseal { .. })
                ),
                "{kek} {scheme} {fpr}"
            );
        }
        let mut altered = sealed.clone();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert!(ring.open("k2", Scheme::OpenPgp, "ABCD", &altered).is_err());
        assert!(matches!(
            ring.open("k9", Scheme::OpenPgp, "ABCD", &sealed),
            Err(KeymatError::UnknownKek { .. })
        ));
        // Two seals of one key differ (a fresh nonce each time).
        assert_ne!(
            sealed,
            ring.seal(Scheme::OpenPgp, "ABCD", b"secret key").unwrap()
        );
    }

    #[test]
    fn a_retired_kek_still_opens_what_it_sealed() {
        let old_line = new_kek("old").unwrap();
        let old = Keyring::parse(&old_line, &[]).unwrap();
        let sealed = old.seal(Scheme::Smime, "00FF", b"k").unwrap();
        let rotated = Keyring::parse(&new_kek("new").unwrap(), &[old_line]).unwrap();
        assert_eq!(rotated.current_id(), "new");
        assert_eq!(
            &rotated.open("old", Scheme::Smime, "00FF", &sealed).unwrap()[..],
            b"k"
        );
    }

    #[test]
    fn malformed_keks_are_refused_with_the_reason() {
        let check = |line: &str, want: &str| {
            let err = Keyring::parse(line, &[]).unwrap_err().to_string();
            assert!(err.contains(want), "{line:?}: {err}");
        };
        check("nocolon", "expected `id:base64-key`");
        check("bad id:AAAA", "key id \"bad id\"");
        check("k:not base64!", "is not base64");
        check("k:AAAA", "is 3 bytes; AES-256 needs 32");
        let line = new_kek("same").unwrap();
        let err = Keyring::parse(&line, std::slice::from_ref(&line)).unwrap_err();
        assert!(err.to_string().contains("given twice"), "{err}");
        assert!(new_kek("").is_err());
    }
}
