//! S/MIME (RFC 8551) on OpenSSL's CMS: certificates with their keys (made self-signed here
//! or imported from PKCS#12 or PEM), what a certificate is good for, and whole messages
//! enveloped (`application/pkcs7-mime`), signed (`multipart/signed` with a detached
//! `application/pkcs7-signature`), decrypted and verified against the CAs a caller trusts.
//!
//! A public form is the end-entity certificate's DER followed by its chain's, concatenated;
//! a secret form is the private key as PKCS#8 DER. No CRL or OCSP is consulted.

use std::sync::OnceLock;

use openssl::asn1::{Asn1Time, Asn1TimeRef};
use openssl::bn::{BigNum, MsbOption};
use openssl::cms::{CMSOptions, CmsContentInfo};
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkcs12::{ParsedPkcs12_2, Pkcs12};
use openssl::pkey::{PKey, PKeyRef, Private};
use openssl::provider::Provider;
use openssl::rsa::Rsa;
use openssl::stack::Stack;
use openssl::symm::Cipher;
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName, SubjectKeyIdentifier,
};
use openssl::x509::store::{X509Store, X509StoreBuilder};
use openssl::x509::verify::X509VerifyFlags;
use openssl::x509::{X509, X509ExtendedKeyUsage, X509KeyUsage, X509NameBuilder, X509Ref};
use pepsi_contract::message;
use pepsi_outbound::mime::base64_lines;

use crate::{
    CryptoError, Decrypted, KeyInfo, KeyPair, Protected, Result, Scheme, SigStatus, Verification,
    mime,
};

/// The largest certificate, key or PKCS#12 input read: far above any real chain, far below
/// what could hurt.
const MAX_KEY_INPUT: usize = 1 << 20;

const OID_SIGNED_DATA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x02];
const OID_ENVELOPED_DATA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x03];
const OID_AUTH_ENVELOPED_DATA: &[u8] = &[
    0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x10, 0x01, 0x17,
];

/// A self-signed certificate and key for `address` (RSA 3072, SHA-256, subject CN=address
/// and emailAddress, SAN rfc822Name, keyUsage digitalSignature+keyEncipherment,
/// extendedKeyUsage emailProtection), valid `days`. For small sites and tests; real
/// deployments import CA-issued ones.
pub fn generate_self_signed(address: &str, days: u32) -> Result<KeyPair> {
    let address = address.trim();
    let usable_address = !address.is_empty()
        && address.bytes().all(|b| b.is_ascii_graphic() && b != b',')
        && pepsi_conf::address::parts(address)
            .is_some_and(|(local, domain)| !local.is_empty() && !domain.is_empty());
    // rfc822Name is an IA5String, and the SAN builder reads a comma as a separator.
    if !usable_address {
        return Err(malformed(
            "address",
            format!("{address:?} is not an ASCII mail address"),
        ));
    }
    let err = ossl("generating a self-signed certificate");
    let key = PKey::from_rsa(Rsa::generate(3072).map_err(&err)?).map_err(&err)?;

    let mut name = X509NameBuilder::new().map_err(&err)?;
    // X.520 bounds these attributes (64 and 128 characters) and OpenSSL refuses longer
    // ones; the SAN below still binds a longer address.
    if address.len() <= 64 {
        name.append_entry_by_nid(Nid::COMMONNAME, address)
            .map_err(&err)?;
    }
    if address.len() <= 128 {
        name.append_entry_by_nid(Nid::PKCS9_EMAILADDRESS, address)
            .map_err(&err)?;
    }
    let name = name.build();

    let mut serial = BigNum::new().map_err(&err)?;
    serial
        .rand(127, MsbOption::MAYBE_ZERO, false)
        .map_err(&err)?;
    let mut b = X509::builder().map_err(&err)?;
    b.set_version(2).map_err(&err)?;
    let serial = serial.to_asn1_integer().map_err(&err)?;
    b.set_serial_number(&serial).map_err(&err)?;
    b.set_subject_name(&name).map_err(&err)?;
    b.set_issuer_name(&name).map_err(&err)?;
    b.set_pubkey(&key).map_err(&err)?;
    let (not_before, not_after) = (
        Asn1Time::days_from_now(0).map_err(&err)?,
        Asn1Time::days_from_now(days).map_err(&err)?,
    );
    b.set_not_before(&not_before).map_err(&err)?;
    b.set_not_after(&not_after).map_err(&err)?;
    b.append_extension(BasicConstraints::new().build().map_err(&err)?)
        .map_err(&err)?;
    b.append_extension(
        KeyUsage::new()
            .critical()
            .digital_signature()
            .key_encipherment()
            .build()
            .map_err(&err)?,
    )
    .map_err(&err)?;
    b.append_extension(
        ExtendedKeyUsage::new()
            .email_protection()
            .build()
            .map_err(&err)?,
    )
    .map_err(&err)?;
    let san = SubjectAlternativeName::new()
        .email(address)
        .build(&b.x509v3_context(None, None))
        .map_err(&err)?;
    b.append_extension(san).map_err(&err)?;
    let ski = SubjectKeyIdentifier::new()
        .build(&b.x509v3_context(None, None))
        .map_err(&err)?;
    b.append_extension(ski).map_err(&err)?;
    b.sign(&key, MessageDigest::sha256()).map_err(&err)?;
    key_pair(b.build(), Vec::new(), &key)
}

/// A certificate with its key from PKCS#12 (DER, with `password`, empty when None) or PEM
/// (one or more CERTIFICATE blocks then a PRIVATE KEY / RSA PRIVATE KEY / EC PRIVATE KEY
/// block, any order; the end-entity certificate is the one matching the key, the rest are
/// its chain). Errors when the key matches no certificate.
pub fn import(data: &[u8], password: Option<&str>) -> Result<KeyPair> {
    check_size("certificate and key", data)?;
    let password = password.unwrap_or("");
    if password.contains('\0') {
        return Err(malformed("password", "contains a NUL character"));
    }
    let (certs, key) = if data.first() == Some(&0x30) {
        let parsed = read_pkcs12(data, password)?;
        let key = parsed
            .pkey
            .ok_or_else(|| malformed("PKCS#12", "holds no private key"))?;
        let mut certs: Vec<X509> = parsed.cert.into_iter().collect();
        certs.extend(parsed.ca.into_iter().flatten());
        (certs, key)
    } else {
        let certs = load_certificates(data)?;
        let key = PKey::private_key_from_pem_callback(data, |buf| {
            // An encrypted key with no password given gets an empty one, which fails,
            // rather than OpenSSL's default of asking a terminal.
            let pw = password.as_bytes();
            let n = pw.len().min(buf.len());
            buf[..n].copy_from_slice(&pw[..n]);
            Ok(n)
        })
        .map_err(|e| malformed("private key", why(&e)))?;
        (certs, key)
    };
    let Some(at) = certs.iter().position(|c| key_matches(c, &key)) else {
        return Err(malformed(
            "certificate and key",
            format!(
                "the private key matches none of the {} certificates",
                certs.len()
            ),
        ));
    };
    let mut chain = certs;
    let end_entity = chain.remove(at);
    key_pair(end_entity, chain, &key)
}

/// Every certificate in `data` (PEM with several blocks, a single DER, or this module's
/// concatenated-DER public form), described: fingerprint = upper-case hex SHA-256 of DER;
/// addresses = lower-cased rfc822Name SANs plus subject emailAddress; can_encrypt = now
/// within validity and keyUsage (if present) allows keyEncipherment or keyAgreement and
/// extendedKeyUsage (if present) includes emailProtection; can_sign likewise with
/// digitalSignature/nonRepudiation; expires_at = notAfter unix seconds; revoked false (no
/// CRL checking); has_secret false.
pub fn inspect(data: &[u8]) -> Result<Vec<KeyInfo>> {
    load_certificates(data)?
        .iter()
        .map(|c| describe(c, false))
        .collect()
}

/// The DER certificates of a public form (concatenated DER as KeyPair.public holds), or PEM
/// input, in order.
pub fn certificates(data: &[u8]) -> Result<Vec<Vec<u8>>> {
    load_certificates(data)?
        .iter()
        .map(|c| c.to_der().map_err(ossl("encoding a certificate")))
        .collect()
}

/// The subject of the first certificate in `data`, one line (`CN=Example CA, O=Example`),
/// for listings.
pub fn subject(data: &[u8]) -> Result<String> {
    let certs = load_certificates(data)?;
    let cert = certs.first().ok_or_else(|| CryptoError::Malformed {
        what: "certificate",
        why: "none in the input".into(),
    })?;
    let parts: Vec<String> = cert
        .subject_name()
        .entries()
        .map(|e| {
            let key = e.object().nid().short_name().unwrap_or("?");
            let value = e.data().to_string().unwrap_or_default();
            format!("{key}={value}")
        })
        .collect();
    Ok(parts.join(", "))
}

/// PEM of every certificate in a public form.
pub fn certificates_pem(public: &[u8]) -> Result<String> {
    let mut pem = Vec::new();
    for cert in load_certificates(public)? {
        pem.extend(cert.to_pem().map_err(ossl("encoding a certificate"))?);
    }
    String::from_utf8(pem).map_err(|e| CryptoError::Failed(format!("PEM output: {e}")))
}

/// PEM (PKCS#8 "PRIVATE KEY") of a secret form.
pub fn key_pem(secret: &[u8]) -> Result<String> {
    let key = read_key(secret)?;
    let pem = key
        .private_key_to_pem_pkcs8()
        .map_err(ossl("encoding a private key"))?;
    String::from_utf8(pem).map_err(|e| CryptoError::Failed(format!("PEM output: {e}")))
}

/// Whether a header block is S/MIME encrypted: application/pkcs7-mime (or
/// application/x-pkcs7-mime) with smime-type=enveloped-data or authEnveloped-data, or a
/// name ending in .p7m with no smime-type.
pub fn is_encrypted(headers: &[u8]) -> bool {
    let Some(ct) = mime::content_type(headers) else {
        return false;
    };
    match ct.param("smime-type") {
        Some(t) => {
            is_pkcs7_mime(&ct.mime)
                && (t.eq_ignore_ascii_case("enveloped-data")
                    || t.eq_ignore_ascii_case("authEnveloped-data"))
        }
        // RFC 8551 §3.2.2: agents that do not know the type send application/octet-stream
        // and let the .p7m name say it.
        None => {
            (is_pkcs7_mime(&ct.mime) || ct.mime == "application/octet-stream")
                && p7m_named(headers, &ct)
        }
    }
}

/// RFC 8551 §3.3: the inner entity enveloped for every recipient certificate (the first
/// certificate of each public form) with AES-256-CBC, which every S/MIME client reads, as
/// a base64 `application/pkcs7-mime` body. With `signer` = (public, secret) the entity is
/// first signed as `sign` does and that is enveloped.
pub fn encrypt(
    headers: &[u8],
    body: &[u8],
    recipients: &[&[u8]],
    signer: Option<(&[u8], &[u8])>,
) -> Result<Protected> {
    if recipients.is_empty() {
        return Err(CryptoError::NoKey("no recipient certificate given".into()));
    }
    let err = ossl("encrypting");
    let mut certs = Stack::new().map_err(&err)?;
    for public in recipients {
        let cert = load_certificates(public)?.swap_remove(0);
        if let Some(why) = unusable(&cert, Use::Encrypt) {
            return Err(CryptoError::NoKey(format!(
                "certificate {} cannot encrypt: {why}",
                label(&cert)
            )));
        }
        certs.push(cert).map_err(&err)?;
    }
    let entity = match signer {
        Some((public, secret)) => {
            let signed = sign(headers, body, public, secret)?;
            mime::inner_entity(&signed.headers, &signed.body)
        }
        None => mime::inner_entity(headers, body),
    };
    // BINARY: the entity is already canonical CRLF; OpenSSL must not touch line ends.
    let cms = CmsContentInfo::encrypt(&certs, &entity, Cipher::aes_256_cbc(), CMSOptions::BINARY)
        .map_err(&err)?;
    let der = cms.to_der().map_err(&err)?;
    let mut out = base64_lines(&der);
    out.extend_from_slice(b"\r\n");
    Ok(Protected {
        headers: mime::outer_headers(
            headers,
            &[
                "Content-Type: application/pkcs7-mime; smime-type=enveloped-data;\r\n name=smime.p7m"
                    .into(),
                "Content-Transfer-Encoding: base64".into(),
                "Content-Disposition: attachment; filename=smime.p7m".into(),
            ],
        ),
        body: out,
    })
}

/// RFC 8551 §3.5.3 `multipart/signed; protocol="application/pkcs7-signature";
/// micalg=sha-256`: the inner entity as it is (CRLF), then a detached SignedData (DER,
/// base64) carrying the signer certificate and its chain, as part 2
/// `application/pkcs7-signature; name=smime.p7s`.
pub fn sign(headers: &[u8], body: &[u8], public: &[u8], secret: &[u8]) -> Result<Protected> {
    let (cert, chain, key) = identity(public, secret)?;
    if !key_matches(&cert, &key) {
        return Err(CryptoError::NoKey(format!(
            "the private key does not belong to certificate {}",
            label(&cert)
        )));
    }
    if let Some(why) = unusable(&cert, Use::Sign) {
        return Err(CryptoError::NoKey(format!(
            "certificate {} cannot sign: {why}",
            label(&cert)
        )));
    }
    let err = ossl("signing");
    let entity = mime::inner_entity(headers, body);
    let mut extra = Stack::new().map_err(&err)?;
    for c in chain {
        extra.push(c).map_err(&err)?;
    }
    let cms = CmsContentInfo::sign(
        Some(&cert),
        Some(&key),
        Some(&extra),
        Some(&entity),
        CMSOptions::DETACHED | CMSOptions::BINARY,
    )
    .map_err(&err)?;
    let der = cms.to_der().map_err(&err)?;

    // The CRLF before the next delimiter belongs to the delimiter, so the signed bytes
    // are the entity exactly, whether or not it ends with a line end.
    let mut signed_part = entity;
    signed_part.extend_from_slice(b"\r\n");
    let mut signature_part = b"Content-Type: application/pkcs7-signature; name=smime.p7s\r\n\
        Content-Transfer-Encoding: base64\r\n\
        Content-Disposition: attachment; filename=smime.p7s\r\n\r\n"
        .to_vec();
    signature_part.extend_from_slice(&base64_lines(&der));
    signature_part.extend_from_slice(b"\r\n");
    Ok(mime::protected_multipart(
        headers,
        "signed",
        &[
            ("protocol", "application/pkcs7-signature"),
            ("micalg", "sha-256"),
        ],
        "This is an S/MIME signed message (RFC 8551)\r\n",
        &[&signed_part, &signature_part],
    ))
}

/// Decrypts an `is_encrypted` message with whichever identity (public, secret) is a
/// recipient, and when the decrypted entity is signed (multipart/signed or opaque
/// signed-data) verifies it against `trusted_cas` and unwraps it to the signed content.
/// The headers are the outer ones with the inner entity's content fields.
pub fn decrypt(
    headers: &[u8],
    body: &[u8],
    identities: &[(&[u8], &[u8])],
    trusted_cas: &[&[u8]],
) -> Result<Decrypted> {
    let not_encrypted = CryptoError::NotProtected("S/MIME-encrypted");
    if !is_encrypted(headers) {
        return Err(not_encrypted);
    }
    let der = mime::decode_body(headers, body)?;
    if !matches!(
        content_type_oid(&der),
        Some(OID_ENVELOPED_DATA | OID_AUTH_ENVELOPED_DATA)
    ) {
        return Err(not_encrypted);
    }
    let cms =
        CmsContentInfo::from_der(&der).map_err(|e| malformed("S/MIME enveloped data", why(&e)))?;
    let mut opened = None;
    for (public, secret) in identities {
        let (cert, _, key) = identity(public, secret)?;
        // Given the certificate, OpenSSL tries only the recipient info issued to it, so a
        // failure here means "not for this identity" (or a corrupt message).
        if let Ok(plain) = cms.decrypt(&key, &cert) {
            opened = Some((plain, fingerprint(&cert)?));
            break;
        }
    }
    let Some((plain, decrypted_with)) = opened else {
        return Err(CryptoError::NoKey(format!(
            "none of the {} identities given is a recipient of the message",
            identities.len()
        )));
    };
    // Agents canonicalise the entity to CRLF before enveloping; one that did not still
    // yields a CRLF message here, as stored messages are.
    let entity = mime::to_crlf(&plain);
    let (entity_headers, entity_body) = message::split(&entity);
    let (verification, inner) = match signed_form(entity_headers, entity_body)? {
        Some(signed) => {
            let (carried, content) = signed_data_parts(&signed.der)?;
            let verification = check(&signed, &carried, trusted_cas)?;
            let inner =
                match signed.detached {
                    Some(part) => part,
                    None => mime::to_crlf(&content.ok_or_else(|| {
                        malformed("S/MIME signed data", "no encapsulated content")
                    })?),
                };
            (verification, inner)
        }
        None => (Verification::unsigned(), entity.clone()),
    };
    let (inner_headers, inner_body) = message::split(&inner);
    Ok(Decrypted {
        headers: mime::restore_headers(headers, inner_headers),
        body: inner_body.to_vec(),
        verification,
        decrypted_with,
    })
}

/// Verifies a multipart/signed (pkcs7-signature) or opaque signed-data message: Good when
/// the signer certificate chains to one of `trusted_cas` (DER; intermediates the signature
/// carries are used) and the signature verifies, Unverified when it verifies but does not
/// chain, Bad when the content was altered.
pub fn verify(headers: &[u8], body: &[u8], trusted_cas: &[&[u8]]) -> Result<Verification> {
    let signed = signed_form(headers, body)?.ok_or(CryptoError::NotProtected("S/MIME-signed"))?;
    let (carried, _) = signed_data_parts(&signed.der)?;
    check(&signed, &carried, trusted_cas)
}

/// The certificates (DER) a signed message carries, the signer's first and then the rest
/// (its chain) as the signature lists them: a correspondent's public form, learnt from a
/// signed message.
pub fn signer_certificates(headers: &[u8], body: &[u8]) -> Result<Vec<Vec<u8>>> {
    let signed = signed_form(headers, body)?.ok_or(CryptoError::NotProtected("S/MIME-signed"))?;
    let (mut carried, _) = signed_data_parts(&signed.der)?;
    if let Some(at) = signer_index(&signed, &carried) {
        let signer = carried.remove(at);
        carried.insert(0, signer);
    }
    carried
        .iter()
        .map(|c| c.to_der().map_err(ossl("encoding a certificate")))
        .collect()
}

/// A signature found in a message: the CMS SignedData and, when detached, the bytes it
/// signs (the first part of the multipart/signed, as transmitted).
struct Signed {
    der: Vec<u8>,
    detached: Option<Vec<u8>>,
}

/// The signature of a multipart/signed (pkcs7-signature) or application/pkcs7-mime
/// signed-data entity; None for any other entity.
fn signed_form(headers: &[u8], body: &[u8]) -> Result<Option<Signed>> {
    let Some(ct) = mime::content_type(headers) else {
        return Ok(None);
    };
    if ct.mime == "multipart/signed" {
        let protocol = ct.param("protocol").unwrap_or_default();
        if !protocol.eq_ignore_ascii_case("application/pkcs7-signature")
            && !protocol.eq_ignore_ascii_case("application/x-pkcs7-signature")
        {
            return Ok(None);
        }
        let (first, der) = mime::two_parts(&ct, body, "multipart/signed")?;
        return Ok(Some(Signed {
            der,
            detached: Some(first.to_vec()),
        }));
    }
    if !is_pkcs7_mime(&ct.mime) {
        return Ok(None);
    }
    let smime_type = ct.param("smime-type");
    if smime_type.is_some_and(|t| !t.eq_ignore_ascii_case("signed-data")) {
        return Ok(None);
    }
    let der = mime::decode_body(headers, body)?;
    // Without smime-type a .p7m may be either kind; the content type inside tells.
    if smime_type.is_none() && content_type_oid(&der) != Some(OID_SIGNED_DATA) {
        return Ok(None);
    }
    Ok(Some(Signed {
        der,
        detached: None,
    }))
}

/// The signature's verdict: Bad when it does not verify over the content, else Good when
/// the signer's certificate chains to a trusted CA and Unverified when not.
fn check(signed: &Signed, carried: &[X509], trusted_cas: &[&[u8]]) -> Result<Verification> {
    let Some(at) = signer_index(signed, carried) else {
        return Ok(Verification {
            status: SigStatus::Unverified(
                "the signature does not carry its signer's certificate".into(),
            ),
            signer: None,
            signer_addresses: Vec::new(),
        });
    };
    let signer = &carried[at];
    let content = signed.detached.as_deref();
    let status = match verify_cms(
        &signed.der,
        content,
        None,
        CMSOptions::NO_SIGNER_CERT_VERIFY,
    ) {
        Err(e) => SigStatus::Bad(format!("the signature does not verify: {}", why(&e))),
        Ok(()) => {
            let store = trust_store(trusted_cas)?;
            match verify_cms(&signed.der, content, Some(&store), CMSOptions::empty()) {
                Ok(()) => SigStatus::Good,
                Err(e) => SigStatus::Unverified(format!(
                    "certificate {} does not chain to a trusted CA: {}",
                    label(signer),
                    why(&e)
                )),
            }
        }
    };
    Ok(Verification {
        status,
        signer: Some(fingerprint(signer)?),
        signer_addresses: addresses(signer),
    })
}

fn verify_cms(
    der: &[u8],
    content: Option<&[u8]>,
    store: Option<&X509Store>,
    flags: CMSOptions,
) -> std::result::Result<(), ErrorStack> {
    // A fresh parse each time: a verification records the signer certificates it found.
    let mut cms = CmsContentInfo::from_der(der)?;
    cms.verify(
        None,
        store.map(|s| &**s),
        content,
        None,
        flags | CMSOptions::BINARY,
    )
}

/// Which carried certificate is the signer's: the one OpenSSL accepts as signer when it
/// is offered alone and the message's own certificates are not searched. That matches
/// issuer-and-serial and subject-key-identifier signer ids alike without reading them.
fn signer_index(signed: &Signed, carried: &[X509]) -> Option<usize> {
    let flags = CMSOptions::NOINTERN
        | CMSOptions::NO_SIGNER_CERT_VERIFY
        | CMSOptions::NO_ATTR_VERIFY
        | CMSOptions::NO_CONTENT_VERIFY
        | CMSOptions::BINARY;
    carried.iter().position(|cert| {
        let Ok(mut cms) = CmsContentInfo::from_der(&signed.der) else {
            return false;
        };
        let Ok(mut offered) = Stack::new() else {
            return false;
        };
        offered.push(cert.clone()).is_ok()
            && cms
                .verify(
                    Some(&offered),
                    None,
                    signed.detached.as_deref(),
                    None,
                    flags,
                )
                .is_ok()
    })
}

/// A store of the trusted CAs. PARTIAL_CHAIN makes each of them an anchor on its own, so a
/// correspondent's self-signed certificate (which may not sign certificates) can be
/// trusted directly.
fn trust_store(trusted_cas: &[&[u8]]) -> Result<X509Store> {
    let err = ossl("building the trust store");
    let mut store = X509StoreBuilder::new().map_err(&err)?;
    for ca in trusted_cas {
        for cert in load_certificates(ca)? {
            store.add_cert(cert).map_err(&err)?;
        }
    }
    store
        .set_flags(X509VerifyFlags::PARTIAL_CHAIN)
        .map_err(&err)?;
    Ok(store.build())
}

/// The certificates a SignedData carries and its encapsulated content (opaque signing),
/// read from OpenSSL's DER re-encoding (what arrives may be BER with indefinite lengths).
fn signed_data_parts(ber: &[u8]) -> Result<(Vec<X509>, Option<Vec<u8>>)> {
    let bad = |why: &str| malformed("S/MIME signature", why.to_owned());
    let cms = CmsContentInfo::from_der(ber).map_err(|e| malformed("S/MIME signature", why(&e)))?;
    let der = cms.to_der().map_err(ossl("encoding a signature"))?;
    // ContentInfo ::= SEQUENCE { contentType OID, content [0] EXPLICIT SignedData }
    let (tag, info, _) = der_element(&der).ok_or_else(|| bad("not DER"))?;
    let info = der_sequence(info).filter(|_| tag == 0x30);
    let signed_data = match info.as_deref() {
        Some([(0x06, OID_SIGNED_DATA), (0xa0, explicit), ..]) => {
            der_element(explicit).filter(|e| e.0 == 0x30).map(|e| e.1)
        }
        _ => None,
    }
    .ok_or_else(|| bad("not a CMS SignedData"))?;
    // SignedData ::= SEQUENCE { version, digestAlgorithms SET, encapContentInfo,
    //   certificates [0] IMPLICIT OPTIONAL, crls [1] IMPLICIT OPTIONAL, signerInfos SET }
    let fields = der_sequence(signed_data).ok_or_else(|| bad("SignedData is not DER"))?;
    let mut content = None;
    if let Some((0x30, encap)) = fields.get(2) {
        let encap = der_sequence(encap).ok_or_else(|| bad("encapContentInfo is not DER"))?;
        if let Some((0xa0, explicit)) = encap.get(1) {
            match der_element(explicit) {
                Some((0x04, octets, _)) => content = Some(octets.to_vec()),
                _ => return Err(bad("eContent is not an OCTET STRING")),
            }
        }
    }
    let mut certs = Vec::new();
    if let Some((0xa0, set)) = fields.get(3) {
        let mut rest: &[u8] = set;
        while let Some((tag, _, len)) = der_element(rest) {
            // Attribute and other certificate formats ([1]..[3]) are not X.509 certificates.
            if tag == 0x30 {
                let cert = X509::from_der(&rest[..len])
                    .map_err(|e| malformed("certificate in signature", why(&e)))?;
                certs.push(cert);
            }
            rest = &rest[len..];
        }
    }
    Ok((certs, content))
}

/// The content type of a ContentInfo, read from its first element alone (the rest may be
/// BER with indefinite lengths).
fn content_type_oid(ber: &[u8]) -> Option<&[u8]> {
    if ber.first() != Some(&0x30) {
        return None;
    }
    let header = match *ber.get(1)? {
        l if l <= 0x80 => 2,
        l => 2 + usize::from(l & 0x7f),
    };
    match der_element(ber.get(header..)?)? {
        (0x06, oid, _) => Some(oid),
        _ => None,
    }
}

/// One DER element at the start of `data`: its tag, its content and the length of the
/// whole element. High tag numbers and indefinite lengths (neither DER of the structures
/// read here) give None.
fn der_element(data: &[u8]) -> Option<(u8, &[u8], usize)> {
    let tag = *data.first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let first = *data.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let bytes = data.get(2..2 + n)?;
        (
            bytes
                .iter()
                .fold(0usize, |acc, &b| acc << 8 | usize::from(b)),
            2 + n,
        )
    };
    let end = header.checked_add(len)?;
    Some((tag, data.get(header..end)?, end))
}

/// The elements (tag, content) of a constructed DER value's content; None when they do not
/// fill it exactly.
fn der_sequence(mut content: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let mut out = Vec::new();
    while !content.is_empty() {
        let (tag, inner, len) = der_element(content)?;
        out.push((tag, inner));
        content = &content[len..];
    }
    Some(out)
}

/// The certificates of PEM (CERTIFICATE blocks, other blocks skipped) or concatenated DER.
fn load_certificates(data: &[u8]) -> Result<Vec<X509>> {
    check_size("certificate", data)?;
    let certs = if data.first() == Some(&0x30) {
        let mut certs = Vec::new();
        let mut rest = data;
        while !rest.is_empty() {
            let at = data.len() - rest.len();
            let len = der_element(rest)
                .filter(|e| e.0 == 0x30)
                .map(|e| e.2)
                .ok_or_else(|| {
                    malformed(
                        "certificate",
                        format!("the bytes at offset {at} are not a DER certificate"),
                    )
                })?;
            let cert = X509::from_der(&rest[..len])
                .map_err(|e| malformed("certificate", format!("at offset {at}: {}", why(&e))))?;
            certs.push(cert);
            rest = &rest[len..];
        }
        certs
    } else {
        X509::stack_from_pem(data).map_err(|e| malformed("certificate", why(&e)))?
    };
    if certs.is_empty() {
        return Err(malformed("certificate", "no certificate in the input"));
    }
    Ok(certs)
}

/// An identity's end-entity certificate, chain and private key.
fn identity(public: &[u8], secret: &[u8]) -> Result<(X509, Vec<X509>, PKey<Private>)> {
    let mut certs = load_certificates(public)?;
    let end_entity = certs.remove(0);
    Ok((end_entity, certs, read_key(secret)?))
}

fn read_key(secret: &[u8]) -> Result<PKey<Private>> {
    check_size("private key", secret)?;
    PKey::private_key_from_der(secret).map_err(|e| malformed("private key", why(&e)))
}

fn read_pkcs12(data: &[u8], password: &str) -> Result<ParsedPkcs12_2> {
    let p12 = Pkcs12::from_der(data).map_err(|e| malformed("PKCS#12", why(&e)))?;
    let first = match p12.parse2(password) {
        Ok(parsed) => return Ok(parsed),
        Err(e) => e,
    };
    // Archives from older Windows and macOS protect certificates with RC2-40, which
    // OpenSSL 3 only has in its legacy provider; load it once and try again.
    static LEGACY: OnceLock<Option<Provider>> = OnceLock::new();
    let legacy = LEGACY.get_or_init(|| Provider::try_load(None, "legacy", true).ok());
    match legacy {
        Some(_) => p12.parse2(password),
        None => Err(first),
    }
    .map_err(|e| {
        malformed(
            "PKCS#12",
            format!("wrong password or unreadable archive: {}", why(&e)),
        )
    })
}

fn key_pair(end_entity: X509, chain: Vec<X509>, key: &PKeyRef<Private>) -> Result<KeyPair> {
    let err = ossl("encoding a key pair");
    let mut public = end_entity.to_der().map_err(&err)?;
    for c in &chain {
        public.extend(c.to_der().map_err(&err)?);
    }
    Ok(KeyPair {
        public,
        secret: key.private_key_to_pkcs8().map_err(&err)?,
        info: describe(&end_entity, true)?,
    })
}

fn key_matches(cert: &X509Ref, key: &PKeyRef<Private>) -> bool {
    cert.public_key().is_ok_and(|p| p.public_eq(key))
}

fn describe(cert: &X509Ref, has_secret: bool) -> Result<KeyInfo> {
    Ok(KeyInfo {
        scheme: Scheme::Smime,
        fingerprint: fingerprint(cert)?,
        addresses: addresses(cert),
        can_encrypt: unusable(cert, Use::Encrypt).is_none(),
        can_sign: unusable(cert, Use::Sign).is_none(),
        expires_at: Some(unix_seconds(cert.not_after())?),
        revoked: false,
        has_secret,
    })
}

fn fingerprint(cert: &X509Ref) -> Result<String> {
    let digest = cert
        .digest(MessageDigest::sha256())
        .map_err(ossl("hashing a certificate"))?;
    Ok(digest.iter().map(|b| format!("{b:02X}")).collect())
}

/// The rfc822Name SANs and subject emailAddress values, lower-case, each once.
fn addresses(cert: &X509Ref) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let from_san = cert
        .subject_alt_names()
        .into_iter()
        .flatten()
        .filter_map(|n| n.email().map(str::to_owned));
    let from_subject = cert
        .subject_name()
        .entries_by_nid(Nid::PKCS9_EMAILADDRESS)
        .filter_map(|e| e.data().to_string().ok());
    for a in from_san.chain(from_subject) {
        let a = a.trim().to_lowercase();
        if !a.is_empty() && !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

/// A certificate as error messages name it: its fingerprint and addresses.
fn label(cert: &X509Ref) -> String {
    let fp = fingerprint(cert).unwrap_or_else(|_| "(unhashable)".into());
    let addrs = addresses(cert);
    if addrs.is_empty() {
        fp
    } else {
        format!("{fp} ({})", addrs.join(", "))
    }
}

#[derive(Clone, Copy)]
enum Use {
    Encrypt,
    Sign,
}

/// Why the certificate cannot serve `want` now; None when it can.
fn unusable(cert: &X509Ref, want: Use) -> Option<String> {
    let now = match Asn1Time::days_from_now(0) {
        Ok(now) => now,
        Err(e) => return Some(format!("the current time is unavailable: {}", why(&e))),
    };
    if cert.not_after() < now {
        return Some(format!("it expired on {}", cert.not_after()));
    }
    if cert.not_before() > now {
        return Some(format!("it is not valid before {}", cert.not_before()));
    }
    let (needed, name) = match want {
        Use::Encrypt => (
            X509KeyUsage::KEY_ENCIPHERMENT | X509KeyUsage::KEY_AGREEMENT,
            "key encipherment or key agreement",
        ),
        Use::Sign => (
            X509KeyUsage::DIGITAL_SIGNATURE | X509KeyUsage::NON_REPUDIATION,
            "digital signature or non-repudiation",
        ),
    };
    if cert.key_usage().is_some_and(|ku| !ku.intersects(needed)) {
        return Some(format!("its key usage allows no {name}"));
    }
    let email = X509ExtendedKeyUsage::SMIME | X509ExtendedKeyUsage::ANYEKU;
    if cert
        .extended_key_usage()
        .is_some_and(|eku| !eku.intersects(email))
    {
        return Some("its extended key usage lacks emailProtection".into());
    }
    None
}

fn unix_seconds(t: &Asn1TimeRef) -> Result<i64> {
    let err = ossl("reading a certificate's validity");
    let diff = Asn1Time::from_unix(0)
        .map_err(&err)?
        .diff(t)
        .map_err(&err)?;
    Ok(i64::from(diff.days) * 86_400 + i64::from(diff.secs))
}

fn is_pkcs7_mime(mime: &str) -> bool {
    mime == "application/pkcs7-mime" || mime == "application/x-pkcs7-mime"
}

/// Whether the Content-Type name or the Content-Disposition filename ends in .p7m.
fn p7m_named(headers: &[u8], ct: &mime::ContentType) -> bool {
    let p7m = |name: &str| name.trim().to_ascii_lowercase().ends_with(".p7m");
    if ct.param("name").is_some_and(p7m) {
        return true;
    }
    // A Content-Disposition value has a Content-Type's parameter syntax; a placeholder
    // type lets the one parser read both.
    message::field_values(headers, "Content-Disposition")
        .first()
        .and_then(|v| mime::parse_content_type(&format!("x/{v}")))
        .is_some_and(|d| d.param("filename").is_some_and(p7m))
}

fn check_size(what: &'static str, data: &[u8]) -> Result<()> {
    if data.len() > MAX_KEY_INPUT {
        return Err(malformed(
            what,
            format!(
                "{} bytes is over the {MAX_KEY_INPUT}-byte limit",
                data.len()
            ),
        ));
    }
    Ok(())
}

fn malformed(what: &'static str, why: impl Into<String>) -> CryptoError {
    CryptoError::Malformed {
        what,
        why: why.into(),
    }
}

/// An OpenSSL failure while doing `doing`, as a Failed error.
fn ossl(doing: &'static str) -> impl Fn(ErrorStack) -> CryptoError {
    move |e| CryptoError::Failed(format!("{doing}: {}", why(&e)))
}

/// OpenSSL's errors in a line: each reason with its detail (a verification error names
/// the certificate problem there).
fn why(e: &ErrorStack) -> String {
    let parts: Vec<String> = e
        .errors()
        .iter()
        .map(|e| match (e.reason(), e.data()) {
            (Some(r), Some(d)) => format!("{r} ({d})"),
            (Some(r), None) => r.to_owned(),
            (None, Some(d)) => d.to_owned(),
            (None, None) => format!("error {:#x}", e.code()),
        })
        .collect();
    if parts.is_empty() {
        "unknown OpenSSL error".into()
    } else {
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use openssl::ec::{EcGroup, EcKey};

    use super::*;

    const HEADERS: &[u8] =
        b"From: alice@example.test\r\nTo: bob@example.test\r\nSubject: plans\r\n\
        MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\
        Content-Transfer-Encoding: 8bit\r\n";
    const BODY: &[u8] = b"Meet at noon.\r\nBring the keys.\r\n";
    /// HEADERS as a decrypted or unwrapped message has them: outer fields, then
    /// MIME-Version and the content fields.
    const RESTORED: &[u8] =
        b"From: alice@example.test\r\nTo: bob@example.test\r\nSubject: plans\r\n\
        MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\
        Content-Transfer-Encoding: 8bit\r\n";

    fn now() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    fn rsa_key() -> PKey<Private> {
        PKey::from_rsa(Rsa::generate(2048).unwrap()).unwrap()
    }

    fn ec_key() -> PKey<Private> {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
    }

    /// A certificate for `cn` (an address gets a SAN), issued by `issuer` or self-signed,
    /// valid from `from` to `to` seconds around now.
    fn issue(
        cn: &str,
        key: &PKey<Private>,
        issuer: Option<(&X509, &PKey<Private>)>,
        usage: Option<&mut KeyUsage>,
        (from, to): (i64, i64),
    ) -> X509 {
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_nid(Nid::COMMONNAME, cn).unwrap();
        let name = name.build();
        let mut b = X509::builder().unwrap();
        b.set_version(2).unwrap();
        let mut serial = BigNum::new().unwrap();
        serial.rand(64, MsbOption::MAYBE_ZERO, false).unwrap();
        b.set_serial_number(&serial.to_asn1_integer().unwrap())
            .unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(issuer.map_or(&*name, |(c, _)| c.subject_name()))
            .unwrap();
        b.set_pubkey(key).unwrap();
        b.set_not_before(&Asn1Time::from_unix(now() + from).unwrap())
            .unwrap();
        b.set_not_after(&Asn1Time::from_unix(now() + to).unwrap())
            .unwrap();
        if cn.contains('@') {
            let san = SubjectAlternativeName::new()
                .email(cn)
                .build(&b.x509v3_context(issuer.map(|(c, _)| &**c), None))
                .unwrap();
            b.append_extension(san).unwrap();
        } else {
            let ca = BasicConstraints::new().critical().ca().build().unwrap();
            b.append_extension(ca).unwrap();
        }
        if let Some(usage) = usage {
            b.append_extension(usage.build().unwrap()).unwrap();
        }
        b.sign(issuer.map_or(key, |(_, k)| k), MessageDigest::sha256())
            .unwrap();
        b.build()
    }

    /// A CA and a user certificate it issued, with the user's key.
    fn ca_and_user(address: &str) -> (X509, X509, PKey<Private>) {
        let ca_key = ec_key();
        let ca = issue(
            "Pepsi Test CA",
            &ca_key,
            None,
            Some(KeyUsage::new().key_cert_sign()),
            (-60, 86_400),
        );
        let key = rsa_key();
        let user = issue(
            address,
            &key,
            Some((&ca, &ca_key)),
            Some(KeyUsage::new().digital_signature().key_encipherment()),
            (-60, 86_400),
        );
        (ca, user, key)
    }

    fn pem(cert: &X509) -> Vec<u8> {
        cert.to_pem().unwrap()
    }

    #[test]
    fn generated_certificates_describe_themselves() {
        let kp = generate_self_signed("Alice@Example.test", 30).unwrap();
        let info = &kp.info;
        assert_eq!(info.scheme, Scheme::Smime);
        assert_eq!(info.addresses, ["alice@example.test"]);
        assert!(info.can_encrypt && info.can_sign && info.has_secret && !info.revoked);
        assert_eq!(info.fingerprint.len(), 64);
        assert!(
            info.fingerprint
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
        );
        let expires = info.expires_at.unwrap();
        assert!((expires - (now() + 30 * 86_400)).abs() < 120, "{expires}");

        let inspected = inspect(&kp.public).unwrap();
        assert_eq!(
            inspected,
            [KeyInfo {
                has_secret: false,
                ..info.clone()
            }]
        );
        let cert = X509::from_der(&kp.public).unwrap();
        assert_eq!(
            fingerprint(&cert).unwrap(),
            hex_upper(&openssl::sha::sha256(&kp.public))
        );
        let ku = cert.key_usage().unwrap();
        assert_eq!(
            ku,
            X509KeyUsage::DIGITAL_SIGNATURE | X509KeyUsage::KEY_ENCIPHERMENT
        );
        assert_eq!(cert.extended_key_usage(), Some(X509ExtendedKeyUsage::SMIME));
        assert_eq!(cert.public_key().unwrap().bits(), 3072);

        let pem = certificates_pem(&kp.public).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\n"), "{pem}");
        assert_eq!(
            certificates(pem.as_bytes()).unwrap(),
            std::slice::from_ref(&kp.public)
        );
        assert_eq!(inspect(pem.as_bytes()).unwrap(), inspected);
        let key = key_pem(&kp.secret).unwrap();
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{key}");
        assert_eq!(
            PKey::private_key_from_pem(key.as_bytes())
                .unwrap()
                .private_key_to_pkcs8()
                .unwrap(),
            kp.secret
        );

        for bad in [
            "",
            "no-at-sign",
            "a,b@example.test",
            "a b@example.test",
            "ü@example.test",
        ] {
            assert!(
                matches!(
                    generate_self_signed(bad, 1),
                    Err(CryptoError::Malformed {
                        what: "address",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    fn hex_upper(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02X}")).collect()
    }

    #[test]
    fn encrypted_messages_decrypt_and_signatures_inside_are_checked() {
        let alice = generate_self_signed("alice@example.test", 30).unwrap();
        let bob = generate_self_signed("bob@example.test", 30).unwrap();
        let bob_id: (&[u8], &[u8]) = (&bob.public, &bob.secret);

        let p = encrypt(HEADERS, BODY, &[&bob.public, &alice.public], None).unwrap();
        assert!(is_encrypted(&p.headers));
        let text = String::from_utf8(p.headers.clone()).unwrap();
        assert!(text.starts_with(
            "From: alice@example.test\r\nTo: bob@example.test\r\nSubject: plans\r\nMIME-Version: 1.0\r\n\
             Content-Type: application/pkcs7-mime; smime-type=enveloped-data;\r\n name=smime.p7m\r\n"
        ), "{text}");
        assert!(text.ends_with(
            "Content-Transfer-Encoding: base64\r\nContent-Disposition: attachment; filename=smime.p7m\r\n"
        ), "{text}");
        assert!(p.body.split(|&b| b == b'\n').all(|l| l.len() <= 77));
        assert!(!p.body.windows(4).any(|w| w == b"noon"));

        for (kp, id) in [
            (&bob, bob_id),
            (&alice, (&alice.public[..], &alice.secret[..])),
        ] {
            let d = decrypt(&p.headers, &p.body, &[id], &[]).unwrap();
            assert_eq!(d.headers, RESTORED);
            assert_eq!(d.body, BODY);
            assert_eq!(d.verification, Verification::unsigned());
            assert_eq!(d.decrypted_with, kp.info.fingerprint);
        }

        let signed = encrypt(
            HEADERS,
            BODY,
            &[&bob.public],
            Some((&alice.public, &alice.secret)),
        )
        .unwrap();
        let d = decrypt(&signed.headers, &signed.body, &[bob_id], &[&alice.public]).unwrap();
        assert_eq!(d.verification.status, SigStatus::Good);
        assert_eq!(
            d.verification.signer.as_deref(),
            Some(&*alice.info.fingerprint)
        );
        assert_eq!(d.verification.signer_addresses, ["alice@example.test"]);
        assert_eq!(d.headers, RESTORED);
        assert_eq!(d.body, BODY);

        for trusted in [&[][..], &[&bob.public[..]][..]] {
            let d = decrypt(&signed.headers, &signed.body, &[bob_id], trusted).unwrap();
            let SigStatus::Unverified(why) = &d.verification.status else {
                panic!("{:?}", d.verification);
            };
            assert!(why.contains("alice@example.test"), "{why}");
            assert_eq!(
                d.verification.signer.as_deref(),
                Some(&*alice.info.fingerprint)
            );
            assert_eq!(d.body, BODY);
        }
    }

    #[test]
    fn altered_signed_content_is_bad() {
        let alice = generate_self_signed("alice@example.test", 30).unwrap();
        let s = sign(HEADERS, BODY, &alice.public, &alice.secret).unwrap();
        let ct = mime::content_type(&s.headers).unwrap();
        assert_eq!(ct.mime, "multipart/signed");
        assert_eq!(ct.param("protocol"), Some("application/pkcs7-signature"));
        assert_eq!(ct.param("micalg"), Some("sha-256"));
        let parts = mime::multipart_parts(&s.body, ct.param("boundary").unwrap()).unwrap();
        assert_eq!(parts[0], mime::inner_entity(HEADERS, BODY));
        assert!(
            parts[1].starts_with(b"Content-Type: application/pkcs7-signature; name=smime.p7s\r\n")
        );

        let v = verify(&s.headers, &s.body, &[&alice.public]).unwrap();
        assert_eq!(v.status, SigStatus::Good);
        assert_eq!(v.signer.as_deref(), Some(&*alice.info.fingerprint));
        assert_eq!(
            signer_certificates(&s.headers, &s.body).unwrap(),
            std::slice::from_ref(&alice.public)
        );

        let text = String::from_utf8(s.body.clone()).unwrap();
        let altered = text.replacen("Meet at noon", "Meet at nine", 1);
        assert_ne!(altered, text);
        let v = verify(&s.headers, altered.as_bytes(), &[&alice.public]).unwrap();
        assert!(matches!(v.status, SigStatus::Bad(_)), "{v:?}");
        assert_eq!(v.signer.as_deref(), Some(&*alice.info.fingerprint));

        // Altered inside an encryption: the outer layer is intact, the signature not.
        let bob = generate_self_signed("bob@example.test", 30).unwrap();
        let mut entity = mime::inner_entity(&s.headers, altered.as_bytes());
        entity = mime::to_crlf(&entity);
        let (eh, eb) = message::split(&entity);
        let p = encrypt(
            &[&mime::split_content(HEADERS).0, eh].concat(),
            eb,
            &[&bob.public],
            None,
        )
        .unwrap();
        let d = decrypt(
            &p.headers,
            &p.body,
            &[(&bob.public, &bob.secret)],
            &[&alice.public],
        )
        .unwrap();
        assert!(
            matches!(d.verification.status, SigStatus::Bad(_)),
            "{:?}",
            d.verification
        );
        assert!(d.body.starts_with(b"Meet at nine"));
    }

    #[test]
    fn only_recipients_decrypt_and_unusable_certificates_are_refused() {
        let bob = generate_self_signed("bob@example.test", 30).unwrap();
        let carol = generate_self_signed("carol@example.test", 30).unwrap();
        let p = encrypt(HEADERS, BODY, &[&bob.public], None).unwrap();
        let err = decrypt(&p.headers, &p.body, &[(&carol.public, &carol.secret)], &[]).unwrap_err();
        assert!(matches!(err, CryptoError::NoKey(_)), "{err:?}");
        let d = decrypt(
            &p.headers,
            &p.body,
            &[(&carol.public, &carol.secret), (&bob.public, &bob.secret)],
            &[],
        )
        .unwrap();
        assert_eq!(d.decrypted_with, bob.info.fingerprint);

        assert_eq!(
            decrypt(HEADERS, BODY, &[(&bob.public, &bob.secret)], &[]).unwrap_err(),
            CryptoError::NotProtected("S/MIME-encrypted")
        );
        assert_eq!(
            verify(HEADERS, BODY, &[]).unwrap_err(),
            CryptoError::NotProtected("S/MIME-signed")
        );
        assert_eq!(
            verify(&p.headers, &p.body, &[]).unwrap_err(),
            CryptoError::NotProtected("S/MIME-signed")
        );
        assert!(encrypt(HEADERS, BODY, &[], None).is_err());

        let key = rsa_key();
        let expired = issue(
            "old@example.test",
            &key,
            None,
            None,
            (-10 * 86_400, -86_400),
        );
        let sign_only = issue(
            "signer@example.test",
            &key,
            None,
            Some(KeyUsage::new().digital_signature()),
            (-60, 86_400),
        );
        for (cert, why) in [(&expired, "expired"), (&sign_only, "key usage")] {
            let der = cert.to_der().unwrap();
            let info = &inspect(&der).unwrap()[0];
            assert!(!info.can_encrypt);
            assert_eq!(info.can_sign, cert == &sign_only);
            let Err(CryptoError::NoKey(msg)) = encrypt(HEADERS, BODY, &[&der], None) else {
                panic!("{why}: encrypting must fail");
            };
            assert!(
                msg.contains(&info.fingerprint) && msg.contains(why),
                "{msg}"
            );
        }
        let secret = key.private_key_to_pkcs8().unwrap();
        let Err(CryptoError::NoKey(msg)) = sign(HEADERS, BODY, &expired.to_der().unwrap(), &secret)
        else {
            panic!("an expired certificate must not sign");
        };
        assert!(msg.contains("expired"), "{msg}");
        let Err(CryptoError::NoKey(msg)) = sign(HEADERS, BODY, &bob.public, &secret) else {
            panic!("a key that is not the certificate's must not sign");
        };
        assert!(msg.contains("does not belong"), "{msg}");
    }

    #[test]
    fn pkcs12_and_pem_identities_import() {
        let (ca, user, key) = ca_and_user("dave@example.test");
        let mut chain = Stack::new().unwrap();
        chain.push(ca.clone()).unwrap();
        let p12 = Pkcs12::builder()
            .name("dave")
            .pkey(&key)
            .cert(&user)
            .ca(chain)
            .build2("s3cret")
            .unwrap()
            .to_der()
            .unwrap();
        let kp = import(&p12, Some("s3cret")).unwrap();
        let (user_der, ca_der) = (user.to_der().unwrap(), ca.to_der().unwrap());
        assert_eq!(kp.public, [user_der.clone(), ca_der.clone()].concat());
        assert_eq!(
            certificates(&kp.public).unwrap(),
            [user_der.clone(), ca_der.clone()]
        );
        assert_eq!(kp.secret, key.private_key_to_pkcs8().unwrap());
        assert_eq!(kp.info.addresses, ["dave@example.test"]);
        assert!(kp.info.has_secret && kp.info.can_encrypt && kp.info.can_sign);
        assert_eq!(inspect(&kp.public).unwrap().len(), 2);
        assert!(matches!(
            import(&p12, Some("wrong")),
            Err(CryptoError::Malformed {
                what: "PKCS#12",
                ..
            })
        ));

        // The chain travels in the signature: trusting the CA is enough.
        let s = sign(HEADERS, BODY, &kp.public, &kp.secret).unwrap();
        assert_eq!(
            verify(&s.headers, &s.body, &[&ca_der]).unwrap().status,
            SigStatus::Good
        );
        assert!(matches!(
            verify(&s.headers, &s.body, &[]).unwrap().status,
            SigStatus::Unverified(_)
        ));
        assert_eq!(
            signer_certificates(&s.headers, &s.body).unwrap(),
            [user_der.clone(), ca_der.clone()]
        );

        let key_pem = key.private_key_to_pem_pkcs8().unwrap();
        let rsa_pem = key.rsa().unwrap().private_key_to_pem().unwrap();
        for input in [
            [pem(&ca), pem(&user), key_pem.clone()].concat(),
            [key_pem.clone(), pem(&user), pem(&ca)].concat(),
            [pem(&ca), rsa_pem.clone(), pem(&user)].concat(),
        ] {
            let from_pem = import(&input, None).unwrap();
            assert_eq!(from_pem.public, kp.public);
            assert_eq!(from_pem.secret, kp.secret);
        }
        let ec = ec_key();
        let ec_pem = ec.private_key_to_pem_pkcs8().unwrap();
        let err = import(
            &[
                pem(&ca),
                pem(&user),
                rsa_key().private_key_to_pem_pkcs8().unwrap(),
            ]
            .concat(),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(&err, CryptoError::Malformed { why, .. } if why.contains("matches none of the 2")),
            "{err:?}"
        );
        assert!(import(&[pem(&user), ec_pem].concat(), None).is_err());
        assert!(import(&pem(&user), None).is_err());
    }

    #[test]
    fn certificate_input_is_checked() {
        let kp = generate_self_signed("erin@example.test", 1).unwrap();
        assert!(certificates(b"").is_err());
        assert!(certificates(b"not a certificate").is_err());
        let mut trailing = kp.public.clone();
        trailing.extend_from_slice(&[0x30, 0x03, 1, 2]);
        assert!(matches!(
            certificates(&trailing),
            Err(CryptoError::Malformed {
                what: "certificate",
                ..
            })
        ));
        let huge = vec![b'a'; MAX_KEY_INPUT + 1];
        let Err(CryptoError::Malformed { why, .. }) = inspect(&huge) else {
            panic!("over-long input must be refused");
        };
        assert!(why.contains("limit"), "{why}");
        assert!(import(&huge, None).is_err());
        assert!(key_pem(b"junk").is_err());
    }

    #[test]
    fn encrypted_header_blocks_are_recognised() {
        let table: &[(&str, bool)] = &[
            (
                "Content-Type: application/pkcs7-mime; smime-type=enveloped-data; name=smime.p7m\r\n",
                true,
            ),
            (
                "Content-Type: application/x-pkcs7-mime; smime-type=enveloped-data\r\n",
                true,
            ),
            (
                "Content-Type: Application/PKCS7-MIME;\r\n smime-type=\"authEnveloped-data\"\r\n",
                true,
            ),
            (
                "Content-Type: application/pkcs7-mime; name=\"smime.p7m\"\r\n",
                true,
            ),
            (
                "Content-Type: application/pkcs7-mime\r\nContent-Disposition: attachment; filename=SMIME.P7M\r\n",
                true,
            ),
            (
                "Content-Type: application/octet-stream; name=smime.p7m\r\n",
                true,
            ),
            (
                "Content-Type: application/pkcs7-mime; smime-type=signed-data; name=smime.p7m\r\n",
                false,
            ),
            (
                "Content-Type: application/pkcs7-mime; smime-type=certs-only; name=smime.p7c\r\n",
                false,
            ),
            ("Content-Type: application/pkcs7-mime\r\n", false),
            (
                "Content-Type: application/octet-stream; name=report.pdf\r\n",
                false,
            ),
            ("Content-Type: text/plain; name=smime.p7m.txt\r\n", false),
            (
                "Content-Type: multipart/signed; protocol=\"application/pkcs7-signature\"\r\n",
                false,
            ),
            ("Subject: smime.p7m\r\n", false),
            ("", false),
        ];
        for (headers, want) in table {
            assert_eq!(is_encrypted(headers.as_bytes()), *want, "{headers:?}");
        }
    }

    #[test]
    fn der_reading_is_strict() {
        assert_eq!(
            der_element(&[0x04, 0x02, 1, 2, 9]),
            Some((0x04, &[1u8, 2][..], 4))
        );
        assert_eq!(
            der_element(&[0x04, 0x81, 0x01, 7]),
            Some((0x04, &[7u8][..], 4))
        );
        assert_eq!(der_element(&[0x04, 0x03, 1]), None);
        assert_eq!(der_element(&[0x30, 0x80, 0, 0]), None);
        assert_eq!(der_element(&[0x1f, 0x01, 0]), None);
        assert_eq!(
            der_sequence(&[0x02, 0x01, 5, 0x05, 0x00]),
            Some(vec![(0x02, &[5u8][..]), (0x05, &[][..])])
        );
        assert_eq!(der_sequence(&[0x02, 0x05, 5]), None);
        let indefinite = [0x30, 0x80, 0x06, 0x03, 1, 2, 3, 0xa0, 0x80];
        assert_eq!(content_type_oid(&indefinite), Some(&[1u8, 2, 3][..]));
        assert_eq!(content_type_oid(b"junk"), None);
    }
}
