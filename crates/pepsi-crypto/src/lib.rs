//! pepsi-crypto: the protocol code of end-to-end encryption at the server — OpenPGP/MIME
//! (RFC 3156) on sequoia-openpgp, S/MIME (RFC 8551) on OpenSSL's CMS, and Autocrypt Level 1
//! headers. Keys are generated, inspected, and used to encrypt, sign, decrypt and verify
//! whole messages given as a header block and a body.
//!
//! Pure: no database, no files, no network, no clock but the one key validity asks for.
//! Private keys enter and leave as bytes; sealing them for storage is `pepsi-keymat`'s, and
//! choosing whom to encrypt to is the stages'.

pub mod autocrypt;
pub mod mime;
pub mod openpgp;
pub mod smime;

use std::fmt;

/// Why an operation failed. Every variant is permanent for the message at hand: the same
/// input with the same keys fails the same way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// The message is not of the encrypted (or signed) form the operation reads.
    #[error("not an {0} message")]
    NotProtected(&'static str),
    /// None of the keys given can do what was asked (decrypt this message, encrypt to this
    /// recipient, sign).
    #[error("no usable key: {0}")]
    NoKey(String),
    /// Input that does not parse: a key, a certificate or a MIME structure.
    #[error("malformed {what}: {why}")]
    Malformed { what: &'static str, why: String },
    /// The library refused the operation for another reason.
    #[error("{0}")]
    Failed(String),
}

pub type Result<T> = std::result::Result<T, CryptoError>;

/// Whether a message is encrypted already, by its content and not only its label: an RFC
/// 3156 message whose body holds an armored OpenPGP message, or an S/MIME one whose body
/// decodes to CMS enveloped (or authenticated-enveloped) data. A plaintext message labelled
/// as encrypted is not.
pub fn carries_ciphertext(headers: &[u8], body: &[u8]) -> bool {
    if openpgp::is_encrypted(headers) {
        // The second of exactly two parts must be the armored message itself.
        let Some(ct) = mime::content_type(headers) else {
            return false;
        };
        return mime::two_parts(&ct, body, "multipart/encrypted").is_ok_and(|(_, payload)| {
            payload
                .trim_ascii_start()
                .starts_with(b"-----BEGIN PGP MESSAGE-----")
        });
    }
    if smime::is_encrypted(headers) {
        // id-envelopedData (1.2.840.113549.1.7.3) and id-ct-authEnvelopedData
        // (1.2.840.113549.1.9.16.1.23), as their DER object identifiers.
        const ENVELOPED: &[u8] = &[
            0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x03,
        ];
        const AUTH_ENVELOPED: &[u8] = &[
            0x06, 0x0b, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x10, 0x01, 0x17,
        ];
        let Ok(der) = mime::decode_body(headers, body) else {
            return false;
        };
        let head = &der[..der.len().min(32)];
        return head.windows(ENVELOPED.len()).any(|w| w == ENVELOPED)
            || head
                .windows(AUTH_ENVELOPED.len())
                .any(|w| w == AUTH_ENVELOPED);
    }
    false
}

/// The two standards a key or message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    OpenPgp,
    Smime,
}

impl Scheme {
    /// The name stored in the key tables (`openpgp`, `smime`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::OpenPgp => "openpgp",
            Scheme::Smime => "smime",
        }
    }

    pub fn parse(s: &str) -> Option<Scheme> {
        match s.trim().to_ascii_lowercase().as_str() {
            "openpgp" | "pgp" => Some(Scheme::OpenPgp),
            "smime" | "s/mime" => Some(Scheme::Smime),
            _ => None,
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a public key or certificate is good for, read from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub scheme: Scheme,
    /// Upper-case hex without spaces: the OpenPGP certificate fingerprint, or the SHA-256
    /// of an X.509 certificate's DER.
    pub fingerprint: String,
    /// The e-mail addresses the key is bound to (OpenPGP user IDs; a certificate's
    /// rfc822Name subject alternative names and subject emailAddress), lower-case.
    pub addresses: Vec<String>,
    /// Usable now for encryption (an encryption-capable, unexpired, unrevoked key).
    pub can_encrypt: bool,
    /// Usable now for signing; for a public key only, whether it can verify such signatures.
    pub can_sign: bool,
    /// Seconds since the Unix epoch after which the key is no longer valid, if it expires.
    pub expires_at: Option<i64>,
    /// Revoked by its holder.
    pub revoked: bool,
    /// Whether the input held the private half (an OpenPGP TSK, a certificate with its key).
    pub has_secret: bool,
}

/// A key pair made or imported: the public half to publish and store in the clear, the
/// private half to seal before it is stored.
#[derive(Clone)]
pub struct KeyPair {
    /// OpenPGP: the certificate, binary. S/MIME: the certificate, DER, followed by any
    /// chain certificates, each DER (read back with `smime::certificates`).
    pub public: Vec<u8>,
    /// OpenPGP: the transferable secret key, binary. S/MIME: the private key, PKCS#8 DER.
    pub secret: Vec<u8>,
    pub info: KeyInfo,
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPair")
            .field("info", &self.info)
            .field("public", &self.public.len())
            .field("secret", &"(not shown)")
            .finish()
    }
}

/// What a signature check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SigStatus {
    /// The content carried no signature.
    Unsigned,
    /// A valid signature by a key we hold (a peer key, or for S/MIME a certificate that
    /// chains to a trusted CA); `signer` names it.
    Good,
    /// A signature whose key we do not have (OpenPGP) or whose certificate does not reach
    /// a trusted CA (S/MIME). `signer` names what the signature claims, when it does.
    Unverified(String),
    /// A signature that does not verify: the content was altered or the signature is
    /// corrupt.
    Bad(String),
}

impl SigStatus {
    /// The word recorded in `state` and in the result header: `none`, `good`,
    /// `unverified` or `bad`.
    pub fn as_str(&self) -> &'static str {
        match self {
            SigStatus::Unsigned => "none",
            SigStatus::Good => "good",
            SigStatus::Unverified(_) => "unverified",
            SigStatus::Bad(_) => "bad",
        }
    }
}

/// A signature check's verdict and who signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    pub status: SigStatus,
    /// The signing key's fingerprint (OpenPGP) or certificate's SHA-256 (S/MIME).
    pub signer: Option<String>,
    /// The signer's addresses, as the key or certificate binds them (lower-case).
    pub signer_addresses: Vec<String>,
}

impl Verification {
    pub fn unsigned() -> Self {
        Verification {
            status: SigStatus::Unsigned,
            signer: None,
            signer_addresses: Vec::new(),
        }
    }
}

/// A decrypted message: the outer header block with the content fields of the inner
/// entity in place of the encrypted ones, and the inner body.
#[derive(Debug, Clone)]
pub struct Decrypted {
    pub headers: Vec<u8>,
    pub body: Vec<u8>,
    /// The signature inside the encryption, if any.
    pub verification: Verification,
    /// Which key decrypted it (fingerprint of the identity).
    pub decrypted_with: String,
}

/// A message after encryption or signing: the new header block and body.
#[derive(Debug, Clone)]
pub struct Protected {
    pub headers: Vec<u8>,
    pub body: Vec<u8>,
}
