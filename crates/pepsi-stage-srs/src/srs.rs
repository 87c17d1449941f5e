//! The Sender Rewriting Scheme (SRS) engine: pure, no I/O, no clock.
//!
//! The scheme is the classic one of Shevek's Mail::SRS and libsrs2 (and postsrsd), so
//! addresses made by Pepsi verify there and the other way round when they share a secret:
//!
//! - `SRS0=HHHH=TT=orig-domain=orig-local@srs-domain`: a forwarded plain sender. `TT` is
//!   the day number (days since the Unix epoch) modulo 1024 in two base32 characters
//!   (`A`–`Z`, `2`–`7`); `HHHH` is the first four characters of the standard base64 of
//!   HMAC-SHA1(secret, lower-case(`TT` ‖ `orig-domain` ‖ `orig-local`)).
//! - `SRS1=HHHH=first-forwarder==SRS0-rest@srs-domain`: a sender that already is an SRS0
//!   address at another forwarder (`SRS0=rest@first-forwarder`; `=SRS0-rest` is the part after
//!   the `SRS0` tag, separator included, hence the doubled `=`). The hash is over
//!   lower-case(`first-forwarder` ‖ `=SRS0-rest`); there is no timestamp (the SRS0 inside
//!   carries one, checked by the first forwarder). An SRS1 sender from yet another forwarder
//!   gets a new SRS1 with the same first forwarder and rest, rehashed: the chain never grows.
//! - Reverse: SRS0 → `orig-local@orig-domain`; SRS1 → `SRS0-rest@first-forwarder`, which the
//!   first forwarder reverses in turn.
//!
//! HMAC-SHA1 rather than SHA-256: it is what libsrs2 and postsrsd compute, so secrets and
//! addresses interoperate during a migration; SHA-1's collision weakness does not matter for
//! an HMAC, and 24 bits of hash output is the real (deliberate, address-length) limit either
//! way. Hashes compare case-insensitively (some MTAs lower-case local parts), as libsrs2 does
//! when an exact match fails. Several secrets: the first signs, every one verifies (rotation).
//!
//! The tag and the separator after it are read case-insensitively and accept `=`, `+` and
//! `-` (libsrs2's `SRSSEP` set); Pepsi writes `=`. Unlike libsrs2, which checks the
//! timestamp first, SRS0 reversal checks the hash first, so a forged address is reported as
//! forged rather than as expired.

use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;

/// How many day slots the two base32 characters of `TT` hold.
pub const TIME_SLOTS: u64 = 1024;
/// Default validity of an SRS0 address, in days (libsrs2's and postsrsd's).
pub const DEFAULT_MAX_AGE_DAYS: u32 = 21;
/// Characters of the hash (libsrs2's default `hashlength`).
pub const HASH_LENGTH: usize = 4;

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Why an address could not be made or reversed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SrsError {
    /// Not an SRS address at all, or one whose fields are missing.
    #[error("malformed SRS address: {0}")]
    Malformed(String),
    /// The hash matches none of the secrets: forged, or signed with a retired secret.
    #[error("SRS hash does not verify")]
    BadHash,
    /// The timestamp is older than the validity window.
    #[error("SRS timestamp expired")]
    Expired,
    /// The engine was built without a secret, or with a bad validity window.
    #[error("SRS configuration: {0}")]
    Config(String),
}

/// Days since the Unix epoch of `t` (the clock the stage passes in).
pub fn day_number(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0)
}

/// The two base32 characters of day `day`.
pub fn timestamp(day: u64) -> String {
    let t = day % TIME_SLOTS;
    let mut s = String::with_capacity(2);
    s.push(BASE32[((t >> 5) & 31) as usize] as char);
    s.push(BASE32[(t & 31) as usize] as char);
    s
}

fn decode_timestamp(tt: &str) -> Option<u64> {
    let b = tt.as_bytes();
    if b.len() != 2 {
        return None;
    }
    let digit = |c: u8| {
        BASE32
            .iter()
            .position(|&x| x == c.to_ascii_uppercase())
            .map(|p| p as u64)
    };
    Some((digit(b[0])? << 5) | digit(b[1])?)
}

/// The kind of an address's local part: plain, SRS0 or SRS1 (tag and separator checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Plain,
    Srs0,
    Srs1,
}

/// Which SRS form a local part is in.
pub fn kind(local: &str) -> Kind {
    let b = local.as_bytes();
    if b.len() < 5 || !matches!(b[4], b'=' | b'+' | b'-') {
        return Kind::Plain;
    }
    match &local[..4] {
        t if t.eq_ignore_ascii_case("SRS0") => Kind::Srs0,
        t if t.eq_ignore_ascii_case("SRS1") => Kind::Srs1,
        _ => Kind::Plain,
    }
}

fn split_at_last_at(address: &str) -> Result<(&str, &str), SrsError> {
    match pepsi_conf::address::parts(address) {
        Some((local, domain)) if !local.is_empty() && !domain.is_empty() => Ok((local, domain)),
        _ => Err(SrsError::Malformed(format!(
            "{address:?} is not local@domain"
        ))),
    }
}

/// The SRS engine: secrets and validity window.
#[derive(Clone)]
pub struct Srs {
    secrets: Vec<Vec<u8>>,
    max_age_days: u64,
}

impl std::fmt::Debug for Srs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srs")
            .field("secrets", &self.secrets.len())
            .field("max_age_days", &self.max_age_days)
            .finish()
    }
}

impl Srs {
    /// An engine signing with `secrets[0]` and verifying with all of them; SRS0 addresses
    /// are valid for `max_age_days` (1 to 1023) days after the day they were made.
    pub fn new<S: AsRef<[u8]>>(secrets: &[S], max_age_days: u32) -> Result<Self, SrsError> {
        let secrets: Vec<Vec<u8>> = secrets
            .iter()
            .map(|s| s.as_ref().to_vec())
            .filter(|s| !s.is_empty())
            .collect();
        if secrets.is_empty() {
            return Err(SrsError::Config("at least one non-empty secret".into()));
        }
        if max_age_days == 0 || u64::from(max_age_days) >= TIME_SLOTS {
            return Err(SrsError::Config(format!(
                "the validity window must be 1 to {} days",
                TIME_SLOTS - 1
            )));
        }
        Ok(Self {
            secrets,
            max_age_days: u64::from(max_age_days),
        })
    }

    fn hash_with(secret: &[u8], parts: &[&str]) -> String {
        let mut mac = <Hmac<Sha1> as KeyInit>::new_from_slice(secret).expect("HMAC takes any key");
        for p in parts {
            mac.update(p.to_ascii_lowercase().as_bytes());
        }
        let d = mac.finalize().into_bytes();
        // The first four base64 characters: the first 24 bits.
        let n = (u32::from(d[0]) << 16) | (u32::from(d[1]) << 8) | u32::from(d[2]);
        (0..HASH_LENGTH)
            .map(|i| BASE64[((n >> (18 - 6 * i)) & 63) as usize] as char)
            .collect()
    }

    /// The hash of `parts` under the signing secret.
    pub fn hash(&self, parts: &[&str]) -> String {
        Self::hash_with(&self.secrets[0], parts)
    }

    fn check_hash(&self, given: &str, parts: &[&str]) -> Result<(), SrsError> {
        if given.len() != HASH_LENGTH {
            return Err(SrsError::BadHash);
        }
        if self
            .secrets
            .iter()
            .any(|s| Self::hash_with(s, parts).eq_ignore_ascii_case(given))
        {
            Ok(())
        } else {
            Err(SrsError::BadHash)
        }
    }

    fn check_timestamp(&self, tt: &str, today: u64) -> Result<(), SrsError> {
        let then = decode_timestamp(tt)
            .ok_or_else(|| SrsError::Malformed(format!("timestamp {tt:?} is not base32")))?;
        let mut now = today % TIME_SLOTS;
        // Wrap-around: a stamp "after" today is from the previous 1024-day cycle.
        if now < then {
            now += TIME_SLOTS;
        }
        if now - then <= self.max_age_days {
            Ok(())
        } else {
            Err(SrsError::Expired)
        }
    }

    /// The SRS address for envelope sender `sender` forwarded through `srs_domain` on day
    /// `today`: SRS0 for a plain sender, SRS1 for an SRS0 or SRS1 sender.
    pub fn forward(&self, sender: &str, srs_domain: &str, today: u64) -> Result<String, SrsError> {
        let (local, domain) = split_at_last_at(sender)?;
        match kind(local) {
            Kind::Plain => {
                let tt = timestamp(today);
                let hash = self.hash(&[&tt, domain, local]);
                Ok(format!("SRS0={hash}={tt}={domain}={local}@{srs_domain}"))
            }
            Kind::Srs0 => {
                // `=HHHH=TT=orig-domain=orig-local` after the tag, at first forwarder `domain`.
                let rest = &local[4..];
                let hash = self.hash(&[domain, rest]);
                Ok(format!("SRS1={hash}={domain}={rest}@{srs_domain}"))
            }
            Kind::Srs1 => {
                let (_, first, rest) = split_srs1(local)?;
                let hash = self.hash(&[first, rest]);
                Ok(format!("SRS1={hash}={first}={rest}@{srs_domain}"))
            }
        }
    }

    /// The address an SRS address at our domain stands for, checked against the secrets and
    /// (SRS0) the validity window on day `today`. SRS0 gives the original sender; SRS1 gives
    /// the SRS0 address at the first forwarder. The domain part of `address` is not looked at:
    /// the caller decides which domains are its SRS domains.
    pub fn reverse(&self, address: &str, today: u64) -> Result<String, SrsError> {
        let (local, _) = split_at_last_at(address)?;
        match kind(local) {
            Kind::Plain => Err(SrsError::Malformed(format!(
                "{address:?} is not an SRS address"
            ))),
            Kind::Srs0 => {
                let mut f = local[5..].splitn(4, '=');
                let (Some(hash), Some(tt), Some(domain), Some(orig)) =
                    (f.next(), f.next(), f.next(), f.next())
                else {
                    return Err(SrsError::Malformed(format!(
                        "{address:?}: SRS0 needs four fields"
                    )));
                };
                if domain.is_empty() || orig.is_empty() {
                    return Err(SrsError::Malformed(format!(
                        "{address:?}: empty domain or local part"
                    )));
                }
                self.check_hash(hash, &[tt, domain, orig])?;
                self.check_timestamp(tt, today)?;
                Ok(format!("{orig}@{domain}"))
            }
            Kind::Srs1 => {
                let (hash, first, rest) = split_srs1(local)?;
                self.check_hash(hash, &[first, rest])?;
                Ok(format!("SRS0{rest}@{first}"))
            }
        }
    }
}

/// `SRS1=HHHH=first=rest` → (`HHHH`, `first`, `rest`), where `rest` keeps its leading
/// separator (`=HHHH=TT=d=l` of the SRS0 it came from).
fn split_srs1(local: &str) -> Result<(&str, &str, &str), SrsError> {
    let bad = || SrsError::Malformed(format!("{local:?}: SRS1 needs hash, host and rest"));
    let (hash, after) = local[5..].split_once('=').ok_or_else(bad)?;
    let (first, rest_body) = after.split_once('=').ok_or_else(bad)?;
    if hash.is_empty() || first.is_empty() || rest_body.is_empty() {
        return Err(bad());
    }
    Ok((hash, first, rest_body))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 20_000; // 2024-10-04

    fn srs() -> Srs {
        Srs::new(&["s3cret"], DEFAULT_MAX_AGE_DAYS).unwrap()
    }

    #[test]
    fn timestamps_are_two_base32_chars_of_the_day_mod_1024() {
        for (day, tt) in [
            (0, "AA"),
            (1, "AB"),
            (31, "A7"),
            (32, "BA"),
            (1023, "77"),
            (1024, "AA"),
        ] {
            assert_eq!(timestamp(day), tt, "{day}");
            assert_eq!(decode_timestamp(tt), Some(day % 1024));
            assert_eq!(decode_timestamp(&tt.to_lowercase()), Some(day % 1024));
        }
        assert_eq!(decode_timestamp("A1"), None);
        assert_eq!(decode_timestamp("AAA"), None);
    }

    #[test]
    fn hash_is_hmac_sha1_base64_prefix_of_lowercase_data() {
        // Python: base64(hmac.new(b"key", b"the quick brown fox jumps over the lazy dog",
        // sha1).digest())[:4] == "xoge" (digest c6881e94…). Data is lower-cased and
        // concatenated first, so case and the split between parts do not matter.
        let s = Srs::new(&["key"], 21).unwrap();
        assert_eq!(
            s.hash(&["the quick brown fox ", "jumps over the lazy dog"]),
            "xoge"
        );
        assert_eq!(
            s.hash(&["The Quick Brown Fox Jumps Over The Lazy Dog"]),
            "xoge"
        );
        // The SRS0 of alice@example.com on day 0 with secret "s3cret", as libsrs2 makes it.
        assert_eq!(
            srs().forward("alice@example.com", "fwd.test", 0).unwrap(),
            "SRS0=eS/j=AA=example.com=alice@fwd.test"
        );
    }

    #[test]
    fn srs0_round_trip() {
        let s = srs();
        for sender in [
            "alice@example.com",
            "Bob.Smith+tag@Sub.Example.org",
            "a=b@x.y",
        ] {
            let fwd = s.forward(sender, "fwd.test", DAY).unwrap();
            assert!(fwd.starts_with("SRS0="), "{fwd}");
            assert!(fwd.ends_with("@fwd.test"), "{fwd}");
            assert_eq!(s.reverse(&fwd, DAY).unwrap(), sender);
            assert_eq!(s.reverse(&fwd, DAY + 21).unwrap(), sender);
        }
        let fwd = s.forward("alice@example.com", "fwd.test", DAY).unwrap();
        let tt = timestamp(DAY);
        assert!(fwd.contains(&format!("={tt}=example.com=alice@")), "{fwd}");
    }

    #[test]
    fn srs1_of_srs0_and_back() {
        let first = Srs::new(&["first-secret"], 21).unwrap();
        let ours = srs();
        let srs0 = first.forward("alice@example.com", "one.test", DAY).unwrap();
        let srs1 = ours.forward(&srs0, "two.test", DAY).unwrap();
        let rest = &srs0[4..srs0.rfind('@').unwrap()];
        assert!(srs1.starts_with("SRS1="), "{srs1}");
        assert!(
            srs1.ends_with(&format!("=one.test={rest}@two.test")),
            "{srs1}"
        );
        assert!(srs1.contains("=one.test=="), "{srs1}");
        // Ours reverses SRS1 to the first forwarder's SRS0, which that one reverses.
        assert_eq!(ours.reverse(&srs1, DAY).unwrap(), srs0);
        assert_eq!(first.reverse(&srs0, DAY).unwrap(), "alice@example.com");
        // SRS1 re-forwarded by a third keeps the first forwarder and rest.
        let third = Srs::new(&["third"], 21).unwrap();
        let again = third.forward(&srs1, "three.test", DAY).unwrap();
        assert!(
            again.ends_with(&format!("=one.test={rest}@three.test")),
            "{again}"
        );
        assert_eq!(third.reverse(&again, DAY).unwrap(), srs0);
        assert_eq!(ours.reverse(&again, DAY), Err(SrsError::BadHash));
    }

    #[test]
    fn bad_hash_is_refused() {
        let s = srs();
        let fwd = s.forward("alice@example.com", "fwd.test", DAY).unwrap();
        let forged = fwd.replacen("example.com", "evil.example", 1);
        assert_eq!(s.reverse(&forged, DAY), Err(SrsError::BadHash));
        let other = Srs::new(&["other"], 21).unwrap();
        assert_eq!(other.reverse(&fwd, DAY), Err(SrsError::BadHash));
        let tt = timestamp(DAY);
        assert_eq!(
            s.reverse(&format!("SRS0=xx={tt}=example.com=alice@fwd.test"), DAY),
            Err(SrsError::BadHash)
        );
    }

    #[test]
    fn expired_timestamps_are_refused() {
        let s = Srs::new(&["s3cret"], 5).unwrap();
        let fwd = s.forward("alice@example.com", "fwd.test", DAY).unwrap();
        assert!(s.reverse(&fwd, DAY + 5).is_ok());
        assert_eq!(s.reverse(&fwd, DAY + 6), Err(SrsError::Expired));
        // One day in the future counts as a whole cycle old (libsrs2 does the same).
        assert_eq!(s.reverse(&fwd, DAY - 1), Err(SrsError::Expired));
        // A full cycle later the stamp looks fresh again: the scheme's inherent limit.
        assert!(s.reverse(&fwd, DAY + TIME_SLOTS).is_ok());
    }

    #[test]
    fn validity_window_wraps_around_the_1024_day_cycle() {
        let s = srs();
        let made = 3 * TIME_SLOTS - 3; // stamp "75" (1021)
        let fwd = s.forward("alice@example.com", "fwd.test", made).unwrap();
        assert!(fwd.contains("=75="), "{fwd}");
        for later in [made, made + 3, made + 10, made + 21] {
            assert_eq!(
                s.reverse(&fwd, later).unwrap(),
                "alice@example.com",
                "{later}"
            );
        }
        assert_eq!(s.reverse(&fwd, made + 22), Err(SrsError::Expired));
    }

    #[test]
    fn rotation_first_secret_signs_all_verify() {
        let old = Srs::new(&["old"], 21).unwrap();
        let rotated = Srs::new(&["new", "old"], 21).unwrap();
        let new_only = Srs::new(&["new"], 21).unwrap();
        let by_old = old.forward("alice@example.com", "fwd.test", DAY).unwrap();
        let by_rotated = rotated
            .forward("alice@example.com", "fwd.test", DAY)
            .unwrap();
        assert_eq!(rotated.reverse(&by_old, DAY).unwrap(), "alice@example.com");
        assert_eq!(
            new_only.reverse(&by_rotated, DAY).unwrap(),
            "alice@example.com"
        );
        assert_eq!(old.reverse(&by_rotated, DAY), Err(SrsError::BadHash));
        assert_eq!(new_only.reverse(&by_old, DAY), Err(SrsError::BadHash));
    }

    #[test]
    fn hash_and_tags_compare_case_insensitively() {
        let s = srs();
        let fwd = s.forward("Alice@Example.com", "fwd.test", DAY).unwrap();
        assert_eq!(
            s.reverse(&fwd.to_lowercase(), DAY).unwrap(),
            "alice@example.com"
        );
        assert_eq!(
            s.reverse(&fwd.to_uppercase(), DAY).unwrap(),
            "ALICE@EXAMPLE.COM"
        );
        let plus = fwd.replacen("SRS0=", "srs0+", 1);
        assert_eq!(s.reverse(&plus, DAY).unwrap(), "Alice@Example.com");
    }

    #[test]
    fn malformed_addresses() {
        let s = srs();
        for bad in [
            "alice@example.com",
            "SRS0=abcd@fwd.test",
            "SRS0=abcd=AA=example.com@fwd.test",
            "SRS0=abcd=AA==alice@fwd.test",
            "SRS1=abcd@fwd.test",
            "SRS1=abcd=one.test@fwd.test",
            "no-at-sign",
            "@fwd.test",
        ] {
            assert!(
                matches!(s.reverse(bad, DAY), Err(SrsError::Malformed(_))),
                "{bad}"
            );
        }
        let sig = s.hash(&["A1", "example.com", "alice"]);
        assert!(matches!(
            s.reverse(&format!("SRS0={sig}=A1=example.com=alice@fwd.test"), DAY),
            Err(SrsError::Malformed(_))
        ));
        assert!(matches!(
            s.forward("nobody", "fwd.test", DAY),
            Err(SrsError::Malformed(_))
        ));
    }

    #[test]
    fn kinds_and_config() {
        assert_eq!(kind("SRS0=x"), Kind::Srs0);
        assert_eq!(kind("srs1-x"), Kind::Srs1);
        assert_eq!(kind("SRS0"), Kind::Plain);
        assert_eq!(kind("SRS0x"), Kind::Plain);
        assert_eq!(kind("alice"), Kind::Plain);
        assert!(Srs::new::<&str>(&[], 21).is_err());
        assert!(Srs::new(&[""], 21).is_err());
        assert!(Srs::new(&["x"], 0).is_err());
        assert!(Srs::new(&["x"], 1024).is_err());
    }
}
