//! pepsi-keymat: stored-key loading. The key-encryption keys (KEKs) come from a `secrets.d`
//! fragment, `[crypto] KEK` (the current one) and `RETIRED_KEKS` (older ones that still
//! open what they sealed until `pepsi-keys rewrap` has moved every row on); private keys
//! are sealed with AES-256-GCM under the current KEK before they are stored and opened
//! only in the process that needs them; identities, peer keys and trusted CAs are read
//! from the key store (pepsi-0013.sql).
//!
//! Invariants: an unsealed private key lives in a [`Zeroizing`] buffer and is never
//! logged, stored or returned in an error; a KEK never comes from the main configuration
//! file or the database overlay (only a secrets fragment, which the loader checks is not
//! world-readable); a sealed key is bound to its row's scheme and fingerprint, so a
//! ciphertext moved onto another identity does not open.

pub mod kek;
pub mod store;

pub use kek::{KeymatError, Keyring, new_kek};
pub use zeroize::Zeroizing;
