//! Sealing a message under a split key, pure: no I/O, no database.
//!
//! Each message gets two fresh 32-byte random halves. The database keeps one (`db_half`)
//! beside the ciphertext; only the link carries the other (`link half`). The content key is
//! HKDF-SHA256 with the link half as input keying material, the db half as salt and
//! `"pepsi secure-link v1" || link id` as info; the message is sealed with
//! ChaCha20-Poly1305 under it, the link id as associated data. So neither the stored row
//! nor the link alone opens the message, and a row moved under another link id does not
//! open either. Every key is used for one message, once.

use aws_lc_rs::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use hkdf::Hkdf;
use sha2::Sha256;

use crate::RandomUnavailable;

/// The bytes of each key half.
pub const HALF_LEN: usize = 32;
/// The HKDF info's prefix; the link id follows it.
const INFO: &[u8] = b"pepsi secure-link v1";

/// What the database stores of a sealed message: all of it together reads nothing without
/// the link half.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub nonce: [u8; NONCE_LEN],
    /// The sealed message followed by its 16-byte tag.
    pub ciphertext: Vec<u8>,
    pub db_half: [u8; HALF_LEN],
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealed({} bytes)", self.ciphertext.len())
    }
}

/// The half of the key only the link carries. Its `Debug` shows nothing of it, so it
/// cannot end up in a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct LinkHalf([u8; HALF_LEN]);

impl std::fmt::Debug for LinkHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkHalf(..)")
    }
}

impl LinkHalf {
    pub fn from_bytes(bytes: [u8; HALF_LEN]) -> Self {
        Self(bytes)
    }

    /// base64url without padding (43 characters), for the link.
    pub fn encode(&self) -> String {
        crate::b64(&self.0)
    }

    /// The link half from its form in a link.
    pub fn parse(text: &str) -> Result<Self, SealError> {
        crate::b64_exact::<HALF_LEN>(text)
            .map(Self)
            .ok_or(SealError::BadLinkHalf)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error(transparent)]
    Random(#[from] RandomUnavailable),
    /// The link half, the link id or the stored parts do not belong together, or were
    /// changed: the message cannot be read.
    #[error("the message does not open with this link")]
    DoesNotOpen,
    #[error("the link's key is not 43 characters of base64url")]
    BadLinkHalf,
}

fn key(link_id: &str, db_half: &[u8; HALF_LEN], link_half: &LinkHalf) -> LessSafeKey {
    let mut info = Vec::with_capacity(INFO.len() + link_id.len());
    info.extend_from_slice(INFO);
    info.extend_from_slice(link_id.as_bytes());
    let mut okm = [0u8; 32];
    Hkdf::<Sha256>::new(Some(db_half), &link_half.0)
        .expand(&info, &mut okm)
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    let key = UnboundKey::new(&CHACHA20_POLY1305, &okm).expect("a 32-byte ChaCha20 key");
    LessSafeKey::new(key)
}

/// Seals `message` for `link_id` under fresh halves: what to store, and the half for the link.
pub fn seal(link_id: &str, message: &[u8]) -> Result<(Sealed, LinkHalf), SealError> {
    let db_half = crate::random::<HALF_LEN>()?;
    let link_half = LinkHalf(crate::random::<HALF_LEN>()?);
    // The key is fresh for every seal, so a random nonce is belt and braces.
    let nonce = crate::random::<NONCE_LEN>()?;
    let mut ciphertext = message.to_vec();
    key(link_id, &db_half, &link_half)
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(link_id.as_bytes()),
            &mut ciphertext,
        )
        .map_err(|_| SealError::DoesNotOpen)?;
    Ok((
        Sealed {
            nonce,
            ciphertext,
            db_half,
        },
        link_half,
    ))
}

/// The message sealed in `sealed` for `link_id`, with the link's half of the key.
pub fn open(link_id: &str, sealed: &Sealed, link_half: &LinkHalf) -> Result<Vec<u8>, SealError> {
    let mut buf = sealed.ciphertext.clone();
    let plain = key(link_id, &sealed.db_half, link_half)
        .open_in_place(
            Nonce::assume_unique_for_key(sealed.nonce),
            Aad::from(link_id.as_bytes()),
            &mut buf,
        )
        .map_err(|_| SealError::DoesNotOpen)?;
    Ok(plain.to_vec())
}

/// The HKDF info's prefix of the key that wraps a link half for the sender; the link id
/// follows it.
const MANAGE_INFO: &[u8] = b"pepsi secure-link manage v1";
/// The bytes of a wrapped link half: nonce, the sealed half, its tag.
pub const WRAP_LEN: usize = NONCE_LEN + HALF_LEN + 16;

fn manage_key(link_id: &str, manage_token: &[u8; HALF_LEN]) -> LessSafeKey {
    let mut info = Vec::with_capacity(MANAGE_INFO.len() + link_id.len());
    info.extend_from_slice(MANAGE_INFO);
    info.extend_from_slice(link_id.as_bytes());
    let mut okm = [0u8; 32];
    Hkdf::<Sha256>::new(None, manage_token)
        .expand(&info, &mut okm)
        .expect("32 bytes is a valid HKDF-SHA256 output length");
    let key = UnboundKey::new(&CHACHA20_POLY1305, &okm).expect("a 32-byte ChaCha20 key");
    LessSafeKey::new(key)
}

/// `link_half` wrapped for the sender's page: sealed under a key derived (HKDF-SHA256) from
/// the sender's manage token, which the database keeps only as a digest. With the token the
/// sender's page can send a new link; without it the wrapped bytes read nothing.
pub fn wrap_half(
    link_id: &str,
    manage_token: &[u8; HALF_LEN],
    link_half: &LinkHalf,
) -> Result<[u8; WRAP_LEN], SealError> {
    let nonce = crate::random::<NONCE_LEN>()?;
    let mut buf = link_half.0.to_vec();
    manage_key(link_id, manage_token)
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(link_id.as_bytes()),
            &mut buf,
        )
        .map_err(|_| SealError::DoesNotOpen)?;
    let mut out = [0u8; WRAP_LEN];
    out[..NONCE_LEN].copy_from_slice(&nonce);
    out[NONCE_LEN..].copy_from_slice(&buf);
    Ok(out)
}

/// The link half wrapped by [`wrap_half`], with the same token and link id.
pub fn unwrap_half(
    link_id: &str,
    manage_token: &[u8; HALF_LEN],
    wrapped: &[u8],
) -> Result<LinkHalf, SealError> {
    if wrapped.len() != WRAP_LEN {
        return Err(SealError::DoesNotOpen);
    }
    let nonce: [u8; NONCE_LEN] = wrapped[..NONCE_LEN].try_into().expect("checked length");
    let mut buf = wrapped[NONCE_LEN..].to_vec();
    let plain = manage_key(link_id, manage_token)
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(link_id.as_bytes()),
            &mut buf,
        )
        .map_err(|_| SealError::DoesNotOpen)?;
    let half: [u8; HALF_LEN] = plain.try_into().map_err(|_| SealError::DoesNotOpen)?;
    Ok(LinkHalf(half))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKER: &[u8] = b"PLAINTEXT-MARKER-7f3a";
    const LINK: &str = "bGlua2lkZm9ydGVzdHMxMg";

    fn message() -> Vec<u8> {
        let mut m = b"From: a@example.test\r\nTo: b@example.net\r\nSubject: ".to_vec();
        m.extend_from_slice(MARKER);
        m.extend_from_slice(b"\r\n\r\nbody ");
        m.extend_from_slice(MARKER);
        m.extend_from_slice(b"\r\n");
        m
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn a_sealed_message_opens_with_its_link() {
        let (sealed, half) = seal(LINK, &message()).unwrap();
        assert_eq!(open(LINK, &sealed, &half).unwrap(), message());
        let again = LinkHalf::parse(&half.encode()).unwrap();
        assert_eq!(half.encode().len(), 43);
        assert_eq!(open(LINK, &sealed, &again).unwrap(), message());
    }

    #[test]
    fn anything_not_belonging_together_does_not_open() {
        let (sealed, half) = seal(LINK, &message()).unwrap();
        let (other, other_half) = seal(LINK, &message()).unwrap();
        let mut tampered = sealed.clone();
        tampered.ciphertext[3] ^= 1;
        let mut tag_tampered = sealed.clone();
        *tag_tampered.ciphertext.last_mut().unwrap() ^= 0x80;
        let mut swapped_db = sealed.clone();
        swapped_db.db_half = other.db_half;
        let mut other_nonce = sealed.clone();
        other_nonce.nonce = other.nonce;
        let cases: [(&str, &str, &Sealed, &LinkHalf); 7] = [
            ("wrong link half", LINK, &sealed, &other_half),
            ("zero link half", LINK, &sealed, &LinkHalf([0; HALF_LEN])),
            ("other link id", "bGlua2lkZm9ydGVzdHMxMw", &sealed, &half),
            ("tampered ciphertext", LINK, &tampered, &half),
            ("tampered tag", LINK, &tag_tampered, &half),
            ("swapped db half", LINK, &swapped_db, &half),
            ("other nonce", LINK, &other_nonce, &half),
        ];
        for (what, link, sealed, half) in cases {
            assert_eq!(
                open(link, sealed, half),
                Err(SealError::DoesNotOpen),
                "{what}"
            );
        }
    }

    #[test]
    fn the_stored_parts_hold_no_plaintext_and_each_seal_is_fresh() {
        let (a, half_a) = seal(LINK, &message()).unwrap();
        let (b, half_b) = seal(LINK, &message()).unwrap();
        let mut stored = a.nonce.to_vec();
        stored.extend_from_slice(&a.ciphertext);
        stored.extend_from_slice(&a.db_half);
        assert!(!contains(&stored, MARKER));
        assert!(!contains(&stored, b"Subject"));
        assert_ne!(a.db_half, b.db_half);
        assert_ne!(half_a, half_b);
        assert_ne!(a.ciphertext, b.ciphertext);
        assert_eq!(a.ciphertext.len(), message().len() + 16);
    }

    #[test]
    fn a_link_half_is_exactly_43_characters_of_base64url() {
        for bad in [
            "",
            "short",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA+",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/",
        ] {
            assert_eq!(LinkHalf::parse(bad), Err(SealError::BadLinkHalf), "{bad:?}");
        }
        // 42 characters and a last one whose two unused bits are zero: canonical.
        assert!(LinkHalf::parse(&format!("{}w", "-".repeat(42))).is_ok());
    }

    #[test]
    fn debug_output_shows_no_key_material() {
        let (sealed, half) = seal(LINK, &message()).unwrap();
        assert_eq!(format!("{half:?}"), "LinkHalf(..)");
        assert!(!format!("{sealed:?}").contains(&half.encode()));
    }

    #[test]
    fn a_wrapped_half_opens_only_with_its_token_and_link() {
        let (_, half) = seal(LINK, &message()).unwrap();
        let token = [7u8; HALF_LEN];
        let wrapped = wrap_half(LINK, &token, &half).unwrap();
        assert_eq!(wrapped.len(), WRAP_LEN);
        assert!(!contains(&wrapped, &half.0));
        assert_eq!(unwrap_half(LINK, &token, &wrapped).unwrap(), half);
        let mut tampered = wrapped;
        tampered[20] ^= 1;
        for (what, link, token, bytes) in [
            ("other token", LINK, [8u8; HALF_LEN], &wrapped[..]),
            (
                "other link id",
                "bGlua2lkZm9ydGVzdHMxMw",
                token,
                &wrapped[..],
            ),
            ("tampered", LINK, token, &tampered[..]),
            ("short", LINK, token, &wrapped[..40]),
        ] {
            assert_eq!(
                unwrap_half(link, &token, bytes),
                Err(SealError::DoesNotOpen),
                "{what}"
            );
        }
    }
}
