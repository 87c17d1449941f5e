//! OpenPGP on sequoia-openpgp: keys (generate, inspect, split, armor, revoke) and whole
//! messages in the OpenPGP/MIME form of RFC 3156 — `multipart/encrypted` (encrypted, and
//! signed inside the encryption) and `multipart/signed` (a detached signature).
//!
//! Every key check uses sequoia's `StandardPolicy` at the current time. Keys come in as
//! bytes (binary or ASCII-armored) and are bounded: at most [`MAX_KEY_BYTES`] and
//! [`MAX_CERTS`] certificates.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pepsi_contract::message;
use sequoia_openpgp as pgp;

use pgp::armor;
use pgp::cert::prelude::*;
use pgp::crypto::SessionKey;
use pgp::packet::{PKESK, SKESK, Signature, UserID};
use pgp::parse::Parse;
use pgp::parse::stream::{
    DecryptionHelper, DecryptorBuilder, DetachedVerifierBuilder, MessageLayer, MessageStructure,
    VerificationError, VerificationHelper, VerificationResult,
};
use pgp::policy::StandardPolicy;
use pgp::serialize::stream::{Armorer, Encryptor, LiteralWriter, Message, Recipient, Signer};
use pgp::serialize::{Serialize, SerializeInto};
use pgp::types::{
    Features, HashAlgorithm, KeyFlags, ReasonForRevocation, RevocationStatus, SymmetricAlgorithm,
};
use pgp::{Cert, KeyHandle, Packet};

use crate::{
    CryptoError, Decrypted, KeyInfo, KeyPair, Protected, Result, Scheme, SigStatus, Verification,
    mime,
};

/// The largest key input read: a certificate with many signatures is a few tens of
/// kilobytes, so anything near this is not one we want to parse.
pub const MAX_KEY_BYTES: usize = 1 << 20;

/// The most certificates one keyring input may hold.
pub const MAX_CERTS: usize = 1000;

const ENCRYPTED_PROTOCOL: &str = "application/pgp-encrypted";
const SIGNED_PROTOCOL: &str = "application/pgp-signature";

pub(crate) fn policy() -> StandardPolicy<'static> {
    StandardPolicy::new()
}

fn malformed(what: &'static str, why: impl Into<String>) -> CryptoError {
    CryptoError::Malformed {
        what,
        why: why.into(),
    }
}

/// Sequoia's error with its causes (`{:#}` joins the anyhow chain).
fn why(e: &pgp::anyhow::Error) -> String {
    format!("{e:#}")
}

fn failed(e: pgp::anyhow::Error) -> CryptoError {
    CryptoError::Failed(why(&e))
}

fn hex(cert: &Cert) -> String {
    cert.fingerprint().to_hex()
}

/// Every certificate in `data`. Armored input may hold several armor blocks one after
/// another (keys pasted together), which sequoia's dearmoring would stop after the first.
pub(crate) fn read_certs(data: &[u8]) -> Result<Vec<Cert>> {
    if data.len() > MAX_KEY_BYTES {
        return Err(malformed(
            "key",
            format!("{} bytes, more than {MAX_KEY_BYTES}", data.len()),
        ));
    }
    let mut certs = Vec::new();
    for block in armor_blocks(data) {
        let parser = CertParser::from_bytes(block).map_err(|e| malformed("key", why(&e)))?;
        for cert in parser {
            let cert = cert.map_err(|e| malformed("key", why(&e)))?;
            if certs.len() == MAX_CERTS {
                return Err(malformed(
                    "keyring",
                    format!("more than {MAX_CERTS} certificates"),
                ));
            }
            certs.push(cert);
        }
    }
    if certs.is_empty() {
        return Err(malformed("key", "no OpenPGP certificate in the input"));
    }
    Ok(certs)
}

/// The armor blocks of an armored input, each from its `-----BEGIN PGP` line; binary input
/// (or text without such a line) is one block.
fn armor_blocks(data: &[u8]) -> Vec<&[u8]> {
    const BEGIN: &[u8] = b"-----BEGIN PGP";
    let mut starts: Vec<usize> = Vec::new();
    let mut at = 0;
    while at < data.len() {
        if data[at..].starts_with(BEGIN) {
            starts.push(at);
        }
        at = match data[at..].iter().position(|&b| b == b'\n') {
            Some(p) => at + p + 1,
            None => data.len(),
        };
    }
    if starts.len() < 2 || !data[..starts[0]].iter().all(u8::is_ascii_whitespace) {
        return vec![data];
    }
    let mut blocks = Vec::with_capacity(starts.len());
    for (i, &s) in starts.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(data.len());
        blocks.push(&data[s..end]);
    }
    blocks
}

/// The one certificate `data` must hold.
pub(crate) fn read_cert(data: &[u8]) -> Result<Cert> {
    let mut certs = read_certs(data)?;
    if certs.len() != 1 {
        let fprs: Vec<String> = certs.iter().map(hex).collect();
        return Err(malformed(
            "key",
            format!(
                "{} certificates ({}) where one was expected",
                certs.len(),
                fprs.join(", ")
            ),
        ));
    }
    Ok(certs.remove(0))
}

fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// The addresses of the user IDs the certificate binds now, lower-case. Only bound user IDs
/// count: anyone can append an unsigned user ID to a certificate they pass on.
pub(crate) fn addresses(cert: &Cert) -> Vec<String> {
    let p = policy();
    let Ok(vc) = cert.with_policy(&p, None) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for ua in vc.userids() {
        if let Ok(Some(a)) = ua.userid().email_normalized()
            && !out.contains(&a)
        {
            out.push(a);
        }
    }
    out
}

fn is_revoked(cert: &Cert) -> bool {
    matches!(
        cert.revocation_status(&policy(), None),
        RevocationStatus::Revoked(_)
    )
}

fn describe(cert: &Cert) -> KeyInfo {
    let p = policy();
    let revoked = is_revoked(cert);
    let mut info = KeyInfo {
        scheme: Scheme::OpenPgp,
        fingerprint: hex(cert),
        addresses: addresses(cert),
        can_encrypt: false,
        can_sign: false,
        expires_at: None,
        revoked,
        has_secret: cert.is_tsk(),
    };
    if let Ok(vc) = cert.with_policy(&p, None) {
        info.expires_at = vc.primary_key().key_expiration_time().map(unix);
        let usable = !revoked && vc.alive().is_ok();
        info.can_encrypt = usable
            && vc
                .keys()
                .supported()
                .alive()
                .revoked(false)
                .for_transport_encryption()
                .for_storage_encryption()
                .next()
                .is_some();
        info.can_sign = usable
            && vc
                .keys()
                .supported()
                .alive()
                .revoked(false)
                .for_signing()
                .next()
                .is_some();
    }
    info
}

fn key_pair(cert: Cert) -> Result<KeyPair> {
    let public = cert.to_vec().map_err(failed)?;
    let secret = cert.as_tsk().to_vec().map_err(failed)?;
    Ok(KeyPair {
        public,
        secret,
        info: describe(&cert),
    })
}

/// A new key for `address`: Cv25519 (EdDSA primary certifying+signing, ECDH encryption
/// subkey), user ID `Name <address>` or `<address>`, expiring after `validity_secs` when
/// given.
pub fn generate(address: &str, name: Option<&str>, validity_secs: Option<u64>) -> Result<KeyPair> {
    let userid = UserID::from_address(name, None, address)
        .map_err(|e| malformed("address", format!("{address:?}: {}", why(&e))))?;
    // Only SEIPDv1: the secret half may end up in GnuPG or another RFC 4880 implementation,
    // which cannot read the SEIPDv2 messages a sender would pick if we advertised it.
    let mut builder = CertBuilder::new()
        .set_cipher_suite(CipherSuite::Cv25519)
        .set_features(Features::empty().set_seipdv1())
        .map_err(failed)?
        .set_primary_key_flags(KeyFlags::empty().set_certification().set_signing())
        .add_subkey(
            KeyFlags::empty()
                .set_transport_encryption()
                .set_storage_encryption(),
            None,
            None,
        )
        .add_userid(userid);
    if let Some(secs) = validity_secs {
        // A key expiration of zero means "never" in OpenPGP, the opposite of what was asked.
        if secs == 0 {
            return Err(malformed("validity", "0 seconds"));
        }
        builder = builder.set_validity_period(Duration::from_secs(secs));
    }
    let (cert, _revocation) = builder.generate().map_err(failed)?;
    key_pair(cert)
}

/// Every certificate (public or TSK) in `data` (ASCII-armored or binary, one or many),
/// described.
pub fn inspect(data: &[u8]) -> Result<Vec<KeyInfo>> {
    Ok(read_certs(data)?.iter().map(describe).collect())
}

/// Every certificate in `data`, each as binary (TSKs keep their secret parts).
pub fn split_keyring(data: &[u8]) -> Result<Vec<Vec<u8>>> {
    read_certs(data)?
        .iter()
        .map(|c| {
            if c.is_tsk() {
                c.as_tsk().to_vec()
            } else {
                c.to_vec()
            }
            .map_err(failed)
        })
        .collect()
}

/// The public certificate (binary) of a TSK or certificate.
pub fn public_part(data: &[u8]) -> Result<Vec<u8>> {
    read_cert(data)?.to_vec().map_err(failed)
}

/// ASCII armor: a PUBLIC KEY BLOCK for a certificate, a PRIVATE KEY BLOCK when `data`
/// holds secret key material.
pub fn armor(data: &[u8]) -> Result<String> {
    let certs = read_certs(data)?;
    let secret = certs.iter().any(Cert::is_tsk);
    let kind = if secret {
        armor::Kind::SecretKey
    } else {
        armor::Kind::PublicKey
    };
    let mut w =
        armor::Writer::new(Vec::new(), kind).map_err(|e| CryptoError::Failed(e.to_string()))?;
    for cert in &certs {
        if secret {
            cert.as_tsk().serialize(&mut w)
        } else {
            cert.serialize(&mut w)
        }
        .map_err(failed)?;
    }
    let out = w
        .finalize()
        .map_err(|e| CryptoError::Failed(e.to_string()))?;
    String::from_utf8(out).map_err(|e| CryptoError::Failed(e.to_string()))
}

/// Revokes the key with a hard/unspecified reason and `reason` text; returns the updated
/// KeyPair (public cert with the revocation signature, secret too).
pub fn revoke(secret: &[u8], reason: &str) -> Result<KeyPair> {
    let cert = read_cert(secret)?;
    let mut signer = cert
        .primary_key()
        .key()
        .clone()
        .parts_into_secret()
        .and_then(|k| k.into_keypair())
        .map_err(|e| {
            CryptoError::NoKey(format!(
                "certificate {} has no usable secret primary key: {}",
                hex(&cert),
                why(&e)
            ))
        })?;
    let sig = cert
        .revoke(
            &mut signer,
            ReasonForRevocation::Unspecified,
            reason.as_bytes(),
        )
        .map_err(failed)?;
    let (cert, _) = cert.insert_packets(sig).map_err(failed)?;
    key_pair(cert)
}

/// Whether a header block is an RFC 3156 encrypted message (multipart/encrypted;
/// protocol="application/pgp-encrypted").
pub fn is_encrypted(headers: &[u8]) -> bool {
    mime::content_type(headers).is_some_and(|ct| {
        ct.mime == "multipart/encrypted"
            && ct
                .param("protocol")
                .is_some_and(|p| p.eq_ignore_ascii_case(ENCRYPTED_PROTOCOL))
    })
}

fn is_signed(headers: &[u8]) -> bool {
    mime::content_type(headers).is_some_and(|ct| {
        ct.mime == "multipart/signed"
            && ct
                .param("protocol")
                .is_some_and(|p| p.eq_ignore_ascii_case(SIGNED_PROTOCOL))
    })
}

/// The signing key of a TSK, ready to sign.
fn signing_key(tsk: &Cert) -> Result<pgp::crypto::KeyPair> {
    let p = policy();
    let no_key = |why: String| CryptoError::NoKey(format!("key {} cannot sign: {why}", hex(tsk)));
    if is_revoked(tsk) {
        return Err(no_key("it is revoked".into()));
    }
    let vc = tsk.with_policy(&p, None).map_err(|e| no_key(why(&e)))?;
    vc.alive().map_err(|e| no_key(why(&e)))?;
    vc.keys()
        .unencrypted_secret()
        .supported()
        .alive()
        .revoked(false)
        .for_signing()
        .find_map(|ka| ka.key().clone().into_keypair().ok())
        .ok_or_else(|| no_key("no unencrypted, valid signing key with its secret".into()))
}

/// RFC 3156 §4 encryption of the whole content to every recipient certificate, signed
/// inside the encryption (§6.2) when `signer` (a TSK) is given.
pub fn encrypt(
    headers: &[u8],
    body: &[u8],
    recipients: &[&[u8]],
    signer: Option<&[u8]>,
) -> Result<Protected> {
    if recipients.is_empty() {
        return Err(CryptoError::NoKey("no recipient certificate given".into()));
    }
    let p = policy();
    let certs = recipients
        .iter()
        .map(|r| read_cert(r))
        .collect::<Result<Vec<Cert>>>()?;
    let mut targets: Vec<Recipient> = Vec::new();
    for cert in &certs {
        let no_key = |why: String| {
            CryptoError::NoKey(format!(
                "certificate {} cannot be encrypted to: {why}",
                hex(cert)
            ))
        };
        if is_revoked(cert) {
            return Err(no_key("it is revoked".into()));
        }
        let vc = cert.with_policy(&p, None).map_err(|e| no_key(why(&e)))?;
        vc.alive().map_err(|e| no_key(why(&e)))?;
        let before = targets.len();
        targets.extend(
            vc.keys()
                .supported()
                .alive()
                .revoked(false)
                .for_transport_encryption()
                .for_storage_encryption()
                .map(Recipient::from),
        );
        if targets.len() == before {
            return Err(no_key("it has no valid encryption key".into()));
        }
    }
    let signing = match signer {
        Some(s) => Some(signing_key(&read_cert(s)?)?),
        None => None,
    };

    let entity = mime::inner_entity(headers, body);
    let mut armored = Vec::new();
    let message = Message::new(&mut armored);
    let message = Armorer::new(message).build().map_err(failed)?;
    let mut message = Encryptor::for_recipients(message, targets)
        .build()
        .map_err(failed)?;
    if let Some(key) = signing {
        message = Signer::new(message, key)
            .map_err(failed)?
            .build()
            .map_err(failed)?;
    }
    let mut literal = LiteralWriter::new(message).build().map_err(failed)?;
    literal
        .write_all(&entity)
        .map_err(|e| CryptoError::Failed(e.to_string()))?;
    literal.finalize().map_err(failed)?;

    let version: &[u8] = b"Content-Type: application/pgp-encrypted\r\n\
        Content-Description: PGP/MIME version identification\r\n\r\nVersion: 1\r\n";
    let mut payload = b"Content-Type: application/octet-stream; name=\"encrypted.asc\"\r\n\
        Content-Description: OpenPGP encrypted message\r\n\
        Content-Disposition: inline; filename=\"encrypted.asc\"\r\n\r\n"
        .to_vec();
    payload.extend_from_slice(&mime::to_crlf(&armored));
    Ok(mime::protected_multipart(
        headers,
        "encrypted",
        &[("protocol", ENCRYPTED_PROTOCOL)],
        "This is an OpenPGP/MIME encrypted message (RFC 4880 and 3156)\r\n",
        &[version, &payload],
    ))
}

/// The `micalg` name of a hash (RFC 3156 §5, RFC 4880 §9.4 names).
fn micalg(algo: HashAlgorithm) -> Result<&'static str> {
    Ok(match algo {
        HashAlgorithm::SHA256 => "pgp-sha256",
        HashAlgorithm::SHA384 => "pgp-sha384",
        HashAlgorithm::SHA512 => "pgp-sha512",
        HashAlgorithm::SHA224 => "pgp-sha224",
        HashAlgorithm::SHA1 => "pgp-sha1",
        other => {
            return Err(CryptoError::Failed(format!(
                "signature made with hash {other}, which has no micalg name"
            )));
        }
    })
}

/// RFC 3156 §5 multipart/signed: a detached armored signature over the inner entity as
/// sent (CRLF).
pub fn sign(headers: &[u8], body: &[u8], signer: &[u8]) -> Result<Protected> {
    let key = signing_key(&read_cert(signer)?)?;
    let entity = mime::inner_entity(headers, body);

    let mut binary = Vec::new();
    let message = Message::new(&mut binary);
    let mut signing = Signer::new(message, key)
        .map_err(failed)?
        .detached()
        .hash_algo(HashAlgorithm::SHA256)
        .map_err(failed)?
        .build()
        .map_err(failed)?;
    signing
        .write_all(&entity)
        .map_err(|e| CryptoError::Failed(e.to_string()))?;
    signing.finalize().map_err(failed)?;
    // The hash named in micalg must be the one the signature used, which sequoia may
    // choose differently from the one asked for.
    let hash = match Packet::from_bytes(&binary).map_err(failed)? {
        Packet::Signature(sig) => sig.hash_algo(),
        other => {
            return Err(CryptoError::Failed(format!(
                "signing produced a {} packet, not a signature",
                other.tag()
            )));
        }
    };
    let micalg = micalg(hash)?;

    let mut w = armor::Writer::new(Vec::new(), armor::Kind::Signature)
        .map_err(|e| CryptoError::Failed(e.to_string()))?;
    w.write_all(&binary)
        .map_err(|e| CryptoError::Failed(e.to_string()))?;
    let armored = w
        .finalize()
        .map_err(|e| CryptoError::Failed(e.to_string()))?;

    // The CRLF before the next delimiter belongs to the delimiter (RFC 2046 §5.1.1), so the
    // entity gets one of its own after it: what is signed is the entity byte for byte.
    let mut signed_part = entity;
    signed_part.extend_from_slice(b"\r\n");
    let mut sig_part = b"Content-Type: application/pgp-signature; name=\"signature.asc\"\r\n\
        Content-Description: OpenPGP digital signature\r\n\
        Content-Disposition: attachment; filename=\"signature.asc\"\r\n\r\n"
        .to_vec();
    sig_part.extend_from_slice(&mime::to_crlf(&armored));
    Ok(mime::protected_multipart(
        headers,
        "signed",
        &[("micalg", micalg), ("protocol", SIGNED_PROTOCOL)],
        "This is an OpenPGP/MIME signed message (RFC 4880 and 3156)\r\n",
        &[&signed_part, &sig_part],
    ))
}

/// The issuer a signature names: its issuer fingerprint, else its issuer key ID.
fn issuer(sig: &Signature) -> Option<String> {
    sig.get_issuers().first().map(KeyHandle::to_hex)
}

/// One verdict for a group of signature results: any good one makes it Good, else any
/// failing one Bad, else (keys missing) Unverified.
fn verdict(results: &[VerificationResult]) -> Verification {
    let mut bad: Option<Verification> = None;
    let mut unverified: Option<Verification> = None;
    for r in results {
        match r {
            Ok(good) => {
                let cert = good.ka.cert();
                return Verification {
                    status: SigStatus::Good,
                    signer: Some(hex(cert)),
                    signer_addresses: addresses(cert),
                };
            }
            Err(VerificationError::MissingKey { sig }) => {
                let who = issuer(sig).unwrap_or_default();
                unverified.get_or_insert(Verification {
                    status: SigStatus::Unverified(who.clone()),
                    signer: (!who.is_empty()).then_some(who),
                    signer_addresses: Vec::new(),
                });
            }
            Err(e) => {
                let (signer, signer_addresses) = match e {
                    VerificationError::BadKey { ka, .. }
                    | VerificationError::BadSignature { ka, .. } => {
                        (Some(hex(ka.cert())), addresses(ka.cert()))
                    }
                    VerificationError::UnboundKey { cert, .. } => {
                        (Some(hex(cert)), addresses(cert))
                    }
                    VerificationError::MalformedSignature { sig, .. } => (issuer(sig), Vec::new()),
                    _ => (None, Vec::new()),
                };
                bad.get_or_insert(Verification {
                    status: SigStatus::Bad(format!("{e:#}")),
                    signer,
                    signer_addresses,
                });
            }
        }
    }
    bad.or(unverified).unwrap_or_else(Verification::unsigned)
}

/// What the streaming decryptor and verifier found, kept outside the helper so it
/// survives a failed parse.
#[derive(Default)]
struct Outcome {
    verification: Option<Verification>,
    decrypted_with: Option<String>,
    /// The PKESK recipients seen, when no given key opened any of them.
    no_key: Option<Vec<String>>,
}

struct Helper<'a> {
    secrets: &'a [Cert],
    peers: &'a [Cert],
    outcome: &'a mut Outcome,
}

impl VerificationHelper for Helper<'_> {
    fn get_certs(&mut self, ids: &[KeyHandle]) -> pgp::Result<Vec<Cert>> {
        Ok(self
            .peers
            .iter()
            .filter(|c| {
                c.keys()
                    .any(|k| ids.iter().any(|id| id.aliases(k.key().key_handle())))
            })
            .cloned()
            .collect())
    }

    fn check(&mut self, structure: MessageStructure) -> pgp::Result<()> {
        // Signature verdicts are reported, not raised: an unverifiable signature does not
        // make the content unreadable.
        let mut results = Vec::new();
        for layer in structure {
            if let MessageLayer::SignatureGroup { results: r } = layer {
                results.extend(r);
            }
        }
        self.outcome.verification = Some(verdict(&results));
        Ok(())
    }
}

impl DecryptionHelper for Helper<'_> {
    fn decrypt(
        &mut self,
        pkesks: &[PKESK],
        _skesks: &[SKESK],
        sym_algo: Option<SymmetricAlgorithm>,
        decrypt: &mut dyn FnMut(Option<SymmetricAlgorithm>, &SessionKey) -> bool,
    ) -> pgp::Result<Option<Cert>> {
        // Any secret key that fits is tried, expired or revoked: old mail stays readable.
        for pkesk in pkesks {
            let recipient = pkesk.recipient();
            for cert in self.secrets {
                for ka in cert.keys().unencrypted_secret() {
                    if let Some(r) = &recipient
                        && !r.aliases(ka.key().key_handle())
                    {
                        continue;
                    }
                    let Ok(mut pair) = ka.key().clone().into_keypair() else {
                        continue;
                    };
                    if let Some((algo, sk)) = pkesk.decrypt(&mut pair, sym_algo)
                        && decrypt(algo, &sk)
                    {
                        self.outcome.decrypted_with = Some(hex(cert));
                        return Ok(Some(cert.clone()));
                    }
                }
            }
        }
        self.outcome.no_key = Some(
            pkesks
                .iter()
                .map(|p| p.recipient().map_or("anonymous".into(), |r| r.to_hex()))
                .collect(),
        );
        Err(pgp::Error::InvalidOperation("no key given decrypts the message".into()).into())
    }
}

/// Verifies a multipart/signed message's detached signature; returns the verdict and the
/// signed entity (its bytes as signed).
fn verify_signed<'b>(
    headers: &[u8],
    body: &'b [u8],
    peers: &[Cert],
) -> Result<(Verification, &'b [u8])> {
    let ct = mime::content_type(headers).ok_or(CryptoError::NotProtected("OpenPGP-signed"))?;
    let (first, signature) = mime::two_parts(&ct, body, "multipart/signed")?;
    // The signature covers the entity in its canonical form, CRLF line ends.
    let signed = mime::to_crlf(first);

    let p = policy();
    let mut outcome = Outcome::default();
    let result = DetachedVerifierBuilder::from_bytes(&signature)
        .and_then(|b| {
            b.with_policy(
                &p,
                None,
                Helper {
                    secrets: &[],
                    peers,
                    outcome: &mut outcome,
                },
            )
        })
        .and_then(|mut v| v.verify_bytes(&signed));
    let verification = match (result, outcome.verification) {
        (Ok(()), Some(v)) if v.status != SigStatus::Unsigned => v,
        (Ok(()), _) => Verification {
            status: SigStatus::Bad("the signature part holds no signature".into()),
            signer: None,
            signer_addresses: Vec::new(),
        },
        (Err(e), _) => Verification {
            status: SigStatus::Bad(format!("the signature does not parse: {}", why(&e))),
            signer: None,
            signer_addresses: Vec::new(),
        },
    };
    Ok((verification, first))
}

fn read_all(data: &[&[u8]]) -> Result<Vec<Cert>> {
    let mut out = Vec::new();
    for d in data {
        out.extend(read_certs(d)?);
    }
    Ok(out)
}

/// The most plaintext an encrypted payload of `len` bytes may decrypt to: sixteen times its
/// size and a mebibyte, room for honest compression of text and not for a bomb.
pub fn max_plaintext(len: usize) -> u64 {
    (len as u64).saturating_mul(16).saturating_add(1 << 20)
}

/// Decrypts an is_encrypted message with whichever of `secrets` (TSKs) fits and checks a
/// signature inside against `peers` (RFC 3156 §6.2), or a multipart/signed entity inside
/// (§6.1), which is unwrapped to its signed content.
pub fn decrypt(
    headers: &[u8],
    body: &[u8],
    secrets: &[&[u8]],
    peers: &[&[u8]],
) -> Result<Decrypted> {
    if !is_encrypted(headers) {
        return Err(CryptoError::NotProtected("OpenPGP-encrypted"));
    }
    let ct = mime::content_type(headers).ok_or(CryptoError::NotProtected("OpenPGP-encrypted"))?;
    let (_, payload) = mime::two_parts(&ct, body, "multipart/encrypted")?;
    let secrets = read_all(secrets)?;
    let peers = read_all(peers)?;

    let p = policy();
    let mut outcome = Outcome::default();
    let plaintext = {
        let helper = Helper {
            secrets: &secrets,
            peers: &peers,
            outcome: &mut outcome,
        };
        let mut plaintext = Vec::new();
        // A message may be compressed: a small one must not decompress without bound.
        let limit = max_plaintext(payload.len());
        let result = DecryptorBuilder::from_bytes(&payload)
            .and_then(|b| b.with_policy(&p, None, helper))
            .and_then(|d| {
                std::io::copy(&mut std::io::Read::take(d, limit + 1), &mut plaintext)?;
                if plaintext.len() as u64 > limit {
                    return Err(pgp::Error::InvalidOperation(format!(
                        "the message decompresses to more than {limit} bytes"
                    ))
                    .into());
                }
                Ok(())
            });
        result.map(|()| plaintext)
    };
    let plaintext = match plaintext {
        Ok(p) => p,
        Err(e) => {
            return Err(match outcome.no_key {
                Some(recipients) if recipients.is_empty() => CryptoError::NoKey(
                    "the message is encrypted to no public key (a password only)".into(),
                ),
                Some(recipients) => CryptoError::NoKey(format!(
                    "none of the {} secret keys given decrypts a message for {}",
                    secrets.len(),
                    recipients.join(", ")
                )),
                None => malformed("OpenPGP message", why(&e)),
            });
        }
    };
    let Some(decrypted_with) = outcome.decrypted_with else {
        return Err(malformed("OpenPGP message", "it is not encrypted"));
    };
    let mut verification = outcome.verification.unwrap_or_else(Verification::unsigned);

    let entity = mime::to_crlf(&plaintext);
    let (mut inner_headers, mut inner_body) = message::split(&entity);
    if is_signed(inner_headers) {
        let (inner, signed) = verify_signed(inner_headers, inner_body, &peers)?;
        // A failing inner signature is news even under a good outer one; otherwise the
        // signature inside the encryption, when there is one, speaks for the content.
        if verification.status == SigStatus::Unsigned || matches!(inner.status, SigStatus::Bad(_)) {
            verification = inner;
        }
        (inner_headers, inner_body) = message::split(signed);
    }
    Ok(Decrypted {
        headers: mime::restore_headers(headers, inner_headers),
        body: inner_body.to_vec(),
        verification,
        decrypted_with,
    })
}

/// Verifies a multipart/signed (application/pgp-signature) message against `peers`.
pub fn verify(headers: &[u8], body: &[u8], peers: &[&[u8]]) -> Result<Verification> {
    if !is_signed(headers) {
        return Err(CryptoError::NotProtected("OpenPGP-signed"));
    }
    let peers = read_all(peers)?;
    Ok(verify_signed(headers, body, &peers)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADERS: &[u8] = b"From: Alice <alice@example.test>\r\nTo: bob@example.test\r\n\
        Subject: hello\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\
        Content-Transfer-Encoding: 8bit\r\n";
    const BODY: &[u8] = "Hi Bob,\r\n\r\nsee you at the caf\u{e9}.\r\n".as_bytes();

    fn pair(address: &str) -> KeyPair {
        generate(address, Some("Test"), None).unwrap()
    }

    #[test]
    fn generated_keys_inspect_as_made() {
        let k = generate("Alice@Example.test", Some("Alice"), Some(86400)).unwrap();
        assert_eq!(k.info.scheme, Scheme::OpenPgp);
        assert_eq!(k.info.addresses, ["alice@example.test"]);
        assert!(k.info.can_encrypt && k.info.can_sign && k.info.has_secret);
        assert!(!k.info.revoked);
        let now = unix(SystemTime::now());
        let exp = k.info.expires_at.expect("an expiry");
        assert!(
            (now + 86400 - 120..=now + 86400).contains(&exp),
            "{exp} vs {now}"
        );

        let public = inspect(&k.public).unwrap();
        assert_eq!(public.len(), 1);
        assert_eq!(public[0].fingerprint, k.info.fingerprint);
        assert!(!public[0].has_secret);
        assert!(public[0].can_encrypt);
        assert_eq!(
            inspect(&k.secret).unwrap()[0],
            KeyInfo {
                has_secret: true,
                ..public[0].clone()
            }
        );
        assert_eq!(k.info.fingerprint.len(), 40);
        assert_eq!(k.info.fingerprint, k.info.fingerprint.to_uppercase());

        let bare = generate("carol@example.test", None, None).unwrap();
        assert_eq!(bare.info.expires_at, None);
        let cert = Cert::from_bytes(&bare.public).unwrap();
        assert_eq!(
            cert.userids().next().unwrap().userid().value(),
            b"<carol@example.test>"
        );
        assert!(generate("not an address", None, None).is_err());
        assert!(generate("a@example.test", None, Some(0)).is_err());
    }

    #[test]
    fn keyrings_split_armor_and_public_parts() {
        let a = pair("a@example.test");
        let b = pair("b@example.test");
        let mut ring = a.secret.clone();
        ring.extend_from_slice(&b.public);
        let split = split_keyring(&ring).unwrap();
        assert_eq!(split.len(), 2);
        assert!(inspect(&split[0]).unwrap()[0].has_secret);
        assert!(!inspect(&split[1]).unwrap()[0].has_secret);

        let public_armor = armor(&a.public).unwrap();
        assert!(public_armor.starts_with("-----BEGIN PGP PUBLIC KEY BLOCK-----"));
        let secret_armor = armor(&a.secret).unwrap();
        assert!(secret_armor.starts_with("-----BEGIN PGP PRIVATE KEY BLOCK-----"));
        assert_eq!(public_part(secret_armor.as_bytes()).unwrap(), a.public);
        assert_eq!(public_part(&a.secret).unwrap(), a.public);

        // Two armor blocks pasted together are both read.
        let two = format!("{public_armor}\n{}", armor(&b.public).unwrap());
        let infos = inspect(two.as_bytes()).unwrap();
        assert_eq!(
            infos
                .iter()
                .map(|i| i.fingerprint.clone())
                .collect::<Vec<_>>(),
            [a.info.fingerprint.clone(), b.info.fingerprint.clone()]
        );
        assert!(public_part(two.as_bytes()).is_err());

        assert!(matches!(inspect(b""), Err(CryptoError::Malformed { .. })));
        assert!(matches!(
            inspect(b"garbage"),
            Err(CryptoError::Malformed { .. })
        ));
        let huge = vec![0u8; MAX_KEY_BYTES + 1];
        assert!(matches!(inspect(&huge), Err(CryptoError::Malformed { .. })));
    }

    #[test]
    fn encrypt_then_decrypt_with_a_signature_inside() {
        let alice = pair("alice@example.test");
        let bob = pair("bob@example.test");
        let sealed = encrypt(HEADERS, BODY, &[&bob.public], Some(&alice.secret)).unwrap();
        assert!(is_encrypted(&sealed.headers));
        let h = String::from_utf8(sealed.headers.clone()).unwrap();
        assert!(h.starts_with(
            "From: Alice <alice@example.test>\r\nTo: bob@example.test\r\nSubject: hello\r\n"
        ));
        assert!(!h.contains("text/plain"), "{h}");
        assert!(h.ends_with("\"\r\n"), "{h}");
        let b = String::from_utf8(sealed.body.clone()).unwrap();
        assert!(b.contains("Version: 1\r\n"));
        assert!(b.contains("-----BEGIN PGP MESSAGE-----\r\n"));
        assert!(!b.contains("caf"), "the body is in the clear");

        let opened = decrypt(
            &sealed.headers,
            &sealed.body,
            &[&bob.secret],
            &[&alice.public],
        )
        .unwrap();
        assert_eq!(opened.body, BODY);
        assert_eq!(opened.headers, mime::restore_headers(HEADERS, HEADERS));
        assert_eq!(opened.decrypted_with, bob.info.fingerprint);
        assert_eq!(opened.verification.status, SigStatus::Good);
        assert_eq!(
            opened.verification.signer.as_deref(),
            Some(alice.info.fingerprint.as_str())
        );
        assert_eq!(opened.verification.signer_addresses, ["alice@example.test"]);

        let unknown = decrypt(&sealed.headers, &sealed.body, &[&bob.secret], &[]).unwrap();
        assert_eq!(
            unknown.verification.status,
            SigStatus::Unverified(alice.info.fingerprint.clone())
        );

        let unsigned = encrypt(HEADERS, BODY, &[&bob.public], None).unwrap();
        let opened = decrypt(
            &unsigned.headers,
            &unsigned.body,
            &[&bob.secret],
            &[&alice.public],
        )
        .unwrap();
        assert_eq!(opened.verification.status, SigStatus::Unsigned);
        assert_eq!(opened.body, BODY);

        // Someone else's key does not open it, nor does a public certificate.
        let carol = pair("carol@example.test");
        assert!(matches!(
            decrypt(
                &sealed.headers,
                &sealed.body,
                &[&carol.secret, &bob.public],
                &[]
            ),
            Err(CryptoError::NoKey(_))
        ));
        assert!(matches!(
            decrypt(HEADERS, BODY, &[&bob.secret], &[]),
            Err(CryptoError::NotProtected("OpenPGP-encrypted"))
        ));
    }

    #[test]
    fn every_recipient_can_decrypt_and_the_signer_is_not_added() {
        let alice = pair("alice@example.test");
        let bob = pair("bob@example.test");
        let carol = pair("carol@example.test");
        let sealed = encrypt(
            HEADERS,
            BODY,
            &[&bob.public, &carol.public],
            Some(&alice.secret),
        )
        .unwrap();
        for k in [&bob, &carol] {
            let opened = decrypt(&sealed.headers, &sealed.body, &[&k.secret], &[]).unwrap();
            assert_eq!(opened.body, BODY);
            assert_eq!(opened.decrypted_with, k.info.fingerprint);
        }
        assert!(matches!(
            decrypt(&sealed.headers, &sealed.body, &[&alice.secret], &[]),
            Err(CryptoError::NoKey(_))
        ));
    }

    #[test]
    fn a_tampered_ciphertext_does_not_decrypt() {
        let bob = pair("bob@example.test");
        let sealed = encrypt(HEADERS, BODY, &[&bob.public], None).unwrap();
        let (h, b) = (&sealed.headers, &sealed.body);
        // Flip one bit of the symmetrically encrypted data: decode the armored payload,
        // alter a byte near its end (inside the SEIPD packet), armor it again.
        let text = String::from_utf8(b.clone()).unwrap();
        let start = text.find("-----BEGIN PGP MESSAGE-----").unwrap();
        let end =
            text.find("-----END PGP MESSAGE-----").unwrap() + "-----END PGP MESSAGE-----".len();
        let mut reader = armor::Reader::from_bytes(
            &text.as_bytes()[start..end],
            armor::ReaderMode::Tolerant(Some(armor::Kind::Message)),
        );
        let mut binary = Vec::new();
        std::io::copy(&mut reader, &mut binary).unwrap();
        let at = binary.len() - 30;
        binary[at] ^= 0x01;
        let mut w = armor::Writer::new(Vec::new(), armor::Kind::Message).unwrap();
        w.write_all(&binary).unwrap();
        let rearmored = String::from_utf8(mime::to_crlf(&w.finalize().unwrap())).unwrap();
        let tampered = format!("{}{}{}", &text[..start], rearmored.trim_end(), &text[end..]);
        let result = decrypt(h, tampered.as_bytes(), &[&bob.secret], &[]);
        assert!(
            matches!(result, Err(CryptoError::Malformed { .. })),
            "{result:?}"
        );
        // The untouched message does decrypt, so it is the change that is caught.
        assert!(decrypt(h, b, &[&bob.secret], &[]).is_ok());
    }

    #[test]
    fn no_key_for_certificates_that_cannot_receive() {
        let (sign_only, _) = CertBuilder::new()
            .set_cipher_suite(CipherSuite::Cv25519)
            .add_userid("<s@example.test>")
            .add_signing_subkey()
            .generate()
            .unwrap();
        let sign_only = sign_only.to_vec().unwrap();
        assert!(!inspect(&sign_only).unwrap()[0].can_encrypt);
        let err = encrypt(HEADERS, BODY, &[&sign_only], None).unwrap_err();
        let fpr = inspect(&sign_only).unwrap()[0].fingerprint.clone();
        assert!(
            matches!(&err, CryptoError::NoKey(m) if m.contains(&fpr)),
            "{err:?}"
        );

        let bob = pair("bob@example.test");
        let revoked = revoke(&bob.secret, "retired").unwrap();
        assert!(revoked.info.revoked);
        assert!(!revoked.info.can_encrypt && !revoked.info.can_sign);
        assert!(inspect(&revoked.public).unwrap()[0].revoked);
        let err = encrypt(HEADERS, BODY, &[&revoked.public], None).unwrap_err();
        assert!(
            matches!(&err, CryptoError::NoKey(m) if m.contains(&bob.info.fingerprint)),
            "{err:?}"
        );
        assert!(matches!(
            sign(HEADERS, BODY, &revoked.secret),
            Err(CryptoError::NoKey(_))
        ));
        assert!(matches!(
            revoke(&bob.public, "x"),
            Err(CryptoError::NoKey(_))
        ));
    }

    #[test]
    fn sign_then_verify_and_a_changed_byte_is_bad() {
        let alice = pair("alice@example.test");
        let signed = sign(HEADERS, BODY, &alice.secret).unwrap();
        let h = String::from_utf8(signed.headers.clone()).unwrap();
        let outer = mime::content_type(&signed.headers).unwrap();
        assert_eq!(outer.mime, "multipart/signed", "{h}");
        assert_eq!(outer.param("micalg"), Some("pgp-sha256"), "{h}");
        assert_eq!(
            outer.param("protocol"),
            Some("application/pgp-signature"),
            "{h}"
        );
        assert!(
            String::from_utf8_lossy(&signed.body).contains("-----BEGIN PGP SIGNATURE-----\r\n")
        );

        let v = verify(&signed.headers, &signed.body, &[&alice.public]).unwrap();
        assert_eq!(v.status, SigStatus::Good);
        assert_eq!(v.signer.as_deref(), Some(alice.info.fingerprint.as_str()));
        assert_eq!(v.signer_addresses, ["alice@example.test"]);

        let v = verify(&signed.headers, &signed.body, &[]).unwrap();
        assert_eq!(
            v.status,
            SigStatus::Unverified(alice.info.fingerprint.clone())
        );

        let mut altered = signed.body.clone();
        let at = altered.windows(3).position(|w| w == b"Bob").unwrap();
        altered[at] = b'R';
        let v = verify(&signed.headers, &altered, &[&alice.public]).unwrap();
        assert!(matches!(v.status, SigStatus::Bad(_)), "{v:?}");

        assert!(matches!(
            verify(HEADERS, BODY, &[]),
            Err(CryptoError::NotProtected("OpenPGP-signed"))
        ));
    }

    #[test]
    fn signed_then_encrypted_is_unwrapped() {
        let alice = pair("alice@example.test");
        let bob = pair("bob@example.test");
        let signed = sign(HEADERS, BODY, &alice.secret).unwrap();
        let sealed = encrypt(&signed.headers, &signed.body, &[&bob.public], None).unwrap();
        let opened = decrypt(
            &sealed.headers,
            &sealed.body,
            &[&bob.secret],
            &[&alice.public],
        )
        .unwrap();
        assert_eq!(opened.verification.status, SigStatus::Good);
        assert_eq!(opened.body, BODY);
        assert_eq!(opened.headers, mime::restore_headers(HEADERS, HEADERS));
    }
}
