//! DANE for SMTP (RFC 7672): whether the certificate an MX host presents matches its
//! DNSSEC-validated TLSA records. Finding the records securely is the DNS edge's business
//! (`pepsi_outbound::dns::Dns::secure`); this module only compares, and builds the rustls
//! verifier a DANE session uses.
//!
//! - DANE-EE (usage 3): the end-entity certificate, or its public key, matches; its names
//!   and dates are not checked (§3.1.1).
//! - DANE-TA (usage 2): a certificate the server sent matches, and the chain from the
//!   end-entity certificate to it verifies for the MX host name (§3.1.2).
//! - PKIX-TA and PKIX-EE (usages 0 and 1) are unusable for SMTP (§3.1.3) and ignored.
//!
//! Pure but for the clock rustls passes in.

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, RootCertStore, SignatureScheme};

/// One TLSA record (RFC 6698 §2.1).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tlsa {
    /// 2 (DANE-TA) or 3 (DANE-EE); the others are unusable for SMTP.
    pub usage: u8,
    /// 0: the whole certificate; 1: its SubjectPublicKeyInfo.
    pub selector: u8,
    /// 0: the data itself; 1: SHA-256; 2: SHA-512.
    pub matching: u8,
    pub data: Vec<u8>,
}

impl Tlsa {
    /// Whether SMTP can use the record (RFC 7672 §3.1): DANE-TA or DANE-EE, a known selector
    /// and matching type, data of the right length for its digest.
    pub fn usable(&self) -> bool {
        matches!(self.usage, 2 | 3)
            && self.selector <= 1
            && match self.matching {
                0 => !self.data.is_empty(),
                1 => self.data.len() == 32,
                2 => self.data.len() == 64,
                _ => false,
            }
    }

    /// Whether `cert` (DER) is what the record names.
    pub fn matches(&self, cert: &[u8]) -> bool {
        let selected = match self.selector {
            0 => cert,
            1 => match spki(cert) {
                Ok(k) => k,
                Err(_) => return false,
            },
            _ => return false,
        };
        match self.matching {
            0 => selected == self.data.as_slice(),
            1 => digest(&aws_lc_rs::digest::SHA256, selected) == self.data,
            2 => digest(&aws_lc_rs::digest::SHA512, selected) == self.data,
            _ => false,
        }
    }

    /// `usage selector matching hex`, as in a zone file and a TLS report's policy-string.
    pub fn to_text(&self) -> String {
        let hex: String = self.data.iter().map(|b| format!("{b:02x}")).collect();
        format!("{} {} {} {hex}", self.usage, self.selector, self.matching)
    }
}

fn digest(alg: &'static aws_lc_rs::digest::Algorithm, data: &[u8]) -> Vec<u8> {
    aws_lc_rs::digest::digest(alg, data).as_ref().to_vec()
}

/// The SubjectPublicKeyInfo of an X.509 certificate (DER), as DER: the seventh field of its
/// tbsCertificate, counting the optional version. What a selector-1 record hashes.
pub fn spki(cert: &[u8]) -> Result<&[u8], String> {
    let bad = |why: &str| format!("not an X.509 certificate: {why}");
    let (_, tbs_seq, _) = tlv(cert).map_err(|e| bad(&e))?;
    let (_, mut tbs, _) = tlv(tbs_seq).map_err(|e| bad(&e))?;
    let mut fields = Vec::new();
    while !tbs.is_empty() && fields.len() < 8 {
        let (tag, _, whole) = tlv(tbs).map_err(|e| bad(&e))?;
        fields.push((tag, whole));
        tbs = &tbs[whole.len()..];
    }
    // [0] version is optional (a v1 certificate has none).
    let skip = usize::from(fields.first().is_some_and(|f| f.0 == 0xa0));
    match fields.get(skip + 5) {
        Some((0x30, whole)) => Ok(whole),
        _ => Err(bad("no subjectPublicKeyInfo where X.509 puts it")),
    }
}

/// One DER element at the start of `der`: its tag, its contents, and the whole element.
fn tlv(der: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
    let (&tag, rest) = der.split_first().ok_or("truncated")?;
    let (&first, rest) = rest.split_first().ok_or("truncated")?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 3 || rest.len() < n {
            return Err("bad length".into());
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &b| (a << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err("truncated".into());
    }
    let header = der.len() - rest.len();
    Ok((tag, &rest[..len], &der[..header + len]))
}

/// Why a certificate did not satisfy the TLSA records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch(pub String);

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DANE: {}", self.0)
    }
}

impl std::error::Error for Mismatch {}

/// Checks a presented chain against `records` (the usable ones of a secure TLSA RRset):
/// a DANE-EE record matching the end-entity certificate passes at once; else a DANE-TA
/// record matching a certificate of the chain passes when the chain verifies to it for
/// `name`.
pub fn verify(
    records: &[Tlsa],
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    name: &ServerName<'_>,
    now: UnixTime,
    provider: &Arc<CryptoProvider>,
) -> Result<(), Mismatch> {
    let usable: Vec<&Tlsa> = records.iter().filter(|r| r.usable()).collect();
    if usable
        .iter()
        .any(|r| r.usage == 3 && r.matches(end_entity.as_ref()))
    {
        return Ok(());
    }
    let mut why = format!(
        "the certificate of {} matches none of its {} TLSA record(s)",
        name.to_str(),
        usable.len()
    );
    for ta in intermediates.iter().chain(std::iter::once(end_entity)) {
        if !usable
            .iter()
            .any(|r| r.usage == 2 && r.matches(ta.as_ref()))
        {
            continue;
        }
        let mut roots = RootCertStore::empty();
        if roots.add(ta.clone()).is_err() {
            continue;
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| Mismatch(format!("cannot check the chain: {e}")))?;
        match verifier.verify_server_cert(end_entity, intermediates, name, &[], now) {
            Ok(_) => return Ok(()),
            Err(e) => {
                why = format!(
                    "the chain of {} does not verify to its DANE-TA certificate: {e}",
                    name.to_str()
                );
            }
        }
    }
    Err(Mismatch(why))
}

/// The rustls verifier of a DANE session: [`verify`] against one MX host's records,
/// handshake signatures checked as always.
#[derive(Debug)]
pub struct DaneVerifier {
    pub records: Vec<Tlsa>,
    pub provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for DaneVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        verify(
            &self.records,
            end_entity,
            intermediates,
            server_name,
            now,
            &self.provider,
        )
        .map(|()| ServerCertVerified::assertion())
        .map_err(|m| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(m))))
        })
    }

    // The handshake signatures are checked as in every session: delegated.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crate::signatures::Signatures(self.provider.clone()).tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crate::signatures::Signatures(self.provider.clone()).tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        crate::signatures::Signatures(self.provider.clone()).schemes()
    }
}

/// Whether a rustls certificate error is a DANE mismatch.
pub fn is_mismatch(e: &CertificateError) -> bool {
    matches!(e, CertificateError::Other(OtherError(inner)) if inner.downcast_ref::<Mismatch>().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(tag: u8, body: &[u8]) -> Vec<u8> {
        [&[tag, body.len() as u8][..], body].concat()
    }

    fn skeleton() -> (Vec<u8>, Vec<u8>) {
        // SEQUENCE { SEQUENCE { [0] v3, serial, alg, issuer, validity, subject, spki, ... },
        // alg, sig }
        let spki_der = field(0x30, &field(0x03, b"key"));
        let tbs = [
            field(0xa0, &field(0x02, &[2])),
            field(0x02, &[7]),
            field(0x30, b""),
            field(0x30, b"i"),
            field(0x30, b"v"),
            field(0x30, b"s"),
            spki_der.clone(),
            field(0xa3, b"ext"),
        ]
        .concat();
        let cert = field(
            0x30,
            &[field(0x30, &tbs), field(0x30, b""), field(0x03, b"x")].concat(),
        );
        (cert, spki_der)
    }

    #[test]
    fn the_public_key_of_a_certificate() {
        let (cert, spki_der) = skeleton();
        assert_eq!(spki(&cert).unwrap(), spki_der.as_slice());
        assert!(spki(b"\x30\x05ab").unwrap_err().contains("not an X.509"));
        assert!(spki(&cert[..cert.len() / 2]).is_err());
    }

    #[test]
    fn records_match_as_their_selector_and_matching_type_say() {
        let (cert, key) = skeleton();
        let sha256 = |d: &[u8]| digest(&aws_lc_rs::digest::SHA256, d);
        let sha512 = |d: &[u8]| digest(&aws_lc_rs::digest::SHA512, d);
        let rec = |usage, selector, matching, data: Vec<u8>| Tlsa {
            usage,
            selector,
            matching,
            data,
        };
        let table = [
            (rec(3, 0, 0, cert.clone()), true, true),
            (rec(3, 1, 1, sha256(&key)), true, true),
            (rec(3, 1, 2, sha512(&key)), true, true),
            (rec(3, 0, 1, sha256(&cert)), true, true),
            (rec(3, 1, 1, sha256(b"other key")), true, false),
            (rec(2, 0, 1, sha256(&cert)), true, true),
            // PKIX usages are unusable for SMTP; bad lengths and types too
            (rec(1, 1, 1, sha256(&key)), false, true),
            (rec(0, 1, 1, sha256(&key)), false, true),
            (rec(3, 1, 1, vec![1, 2, 3]), false, false),
            (rec(3, 2, 1, sha256(&key)), false, false),
            (rec(3, 1, 3, sha256(&key)), false, false),
        ];
        for (r, usable, matches) in table {
            assert_eq!(r.usable(), usable, "{r:?}");
            assert_eq!(r.matches(&cert), matches, "{r:?}");
        }
        assert_eq!(rec(3, 1, 1, vec![0xab, 0x01]).to_text(), "3 1 1 ab01");
    }
}
