//! The handshake signature checks every outbound session makes, whatever its certificate
//! policy: the opportunistic verifier of `tls` (any certificate, but the key must sign the
//! handshake) and DANE's verifier of `dane` both use these, so neither module needs the other
//! for them.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The signature algorithms of one crypto provider.
#[derive(Debug, Clone)]
pub(crate) struct Signatures(pub(crate) Arc<CryptoProvider>);

impl Signatures {
    pub(crate) fn tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    pub(crate) fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    pub(crate) fn schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
