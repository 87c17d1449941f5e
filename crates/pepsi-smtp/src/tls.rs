//! What a connection asks of its peer before the first transaction: the STARTTLS policy
//! (RFC 3207), the certificate roots a verified session checks against, and the AUTH
//! credentials (RFC 4954). The rustls client configurations are built here and cached per
//! set of roots, so a worker reads the system store or a CA file once, not per connection.
//!
//! This module never opens a socket; `client` drives the handshake with what it builds.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// When the client uses STARTTLS, and what it demands of the certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum TlsPolicy {
    /// Never: the session stays in clear text even when the peer offers STARTTLS.
    #[default]
    None,
    /// Opportunistic: STARTTLS when offered, any certificate accepted; clear text when it is
    /// not offered, and one clear-text retry when the handshake fails.
    May,
    /// Required, but the certificate is not checked: a peer without STARTTLS or a failed
    /// handshake is a transient failure.
    Encrypt,
    /// Required and verified: the chain must lead to a trusted root (the CA file, else the
    /// system store, else the bundled web PKI roots) and name the peer.
    Verify,
}

impl TlsPolicy {
    /// The policy's name in configuration and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsPolicy::None => "none",
            TlsPolicy::May => "may",
            TlsPolicy::Encrypt => "encrypt",
            TlsPolicy::Verify => "verify",
        }
    }

    /// True for `encrypt` and `verify`: no message goes out without TLS.
    pub fn requires_tls(self) -> bool {
        matches!(self, TlsPolicy::Encrypt | TlsPolicy::Verify)
    }
}

impl FromStr for TlsPolicy {
    type Err = String;

    /// `none`, `may`, `encrypt` or `verify`, in any letter case.
    fn from_str(text: &str) -> Result<TlsPolicy, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(TlsPolicy::None),
            "may" => Ok(TlsPolicy::May),
            "encrypt" => Ok(TlsPolicy::Encrypt),
            "verify" => Ok(TlsPolicy::Verify),
            _ => Err(format!(
                "expected a TLS policy (none, may, encrypt or verify), not {text:?}"
            )),
        }
    }
}

impl fmt::Display for TlsPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The TLS settings of a connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    pub policy: TlsPolicy,
    /// PEM file of the CAs a `verify` session trusts instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// The name the certificate must carry (and the SNI sent); default: the target's host.
    pub server_name: Option<String>,
    /// Under `may` and `encrypt`: check the certificate after the handshake as `verify`
    /// would, without refusing it, and say what was found in [`TlsInfo::checked`] (for
    /// MTA-STS `testing` and TLS reports).
    pub audit: bool,
    /// The usable records of the MX host's secure TLSA RRset (RFC 7672): when not empty,
    /// the certificate is checked against them ([`crate::dane`]) instead of the web PKI.
    pub dane: Vec<crate::dane::Tlsa>,
}

/// What AUTH logs in with: a user name and a password (PLAIN, else LOGIN), or a user name
/// and an OAuth 2.0 access token (OAUTHBEARER, else XOAUTH2). `Debug` shows neither secret.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    Password { username: String, password: String },
    Bearer { username: String, token: String },
}

impl Credentials {
    pub fn username(&self) -> &str {
        match self {
            Credentials::Password { username, .. } | Credentials::Bearer { username, .. } => {
                username
            }
        }
    }

    /// The kind of secret, which decides the mechanisms (`auth::choose`).
    pub fn secret(&self) -> crate::auth::Secret {
        match self {
            Credentials::Password { .. } => crate::auth::Secret::Password,
            Credentials::Bearer { .. } => crate::auth::Secret::BearerToken,
        }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, secret) = match self {
            Credentials::Password { .. } => ("Password", "password"),
            Credentials::Bearer { .. } => ("Bearer", "token"),
        };
        f.debug_struct(name)
            .field("username", &self.username())
            .field(secret, &"<hidden>")
            .finish()
    }
}

/// Everything `Connection::open_with` does besides connecting and saying EHLO. The default
/// is what `Connection::open` does: no TLS, no AUTH.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenOptions {
    pub tls: TlsOptions,
    /// Log in after STARTTLS; only over TLS unless the policy is `none`.
    pub auth: Option<Credentials>,
}

/// The TLS session of a connection, for logs and `state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsInfo {
    /// `TLSv1.3` or `TLSv1.2`.
    pub version: String,
    /// The cipher suite, as rustls names it (`TLS13_AES_256_GCM_SHA384`).
    pub cipher: String,
    /// True when the certificate was verified (policy `verify`).
    pub verified: bool,
    /// What a check of the certificate found: `Valid` under `verify`, the audit's finding
    /// when [`TlsOptions::audit`] asked for one, else `None`.
    pub checked: Option<CertCheck>,
}

/// What is wrong with a certificate, in the classes TLS reports tell apart (RFC 8460 §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CertProblem {
    /// It does not name the host (`certificate-host-mismatch`).
    HostMismatch,
    /// It has expired or is not valid yet (`certificate-expired`).
    Expired,
    /// Its chain leads to no trusted root (`certificate-not-trusted`).
    NotTrusted,
    /// It matches none of the MX host's TLSA records (`tlsa-invalid`).
    DaneMismatch,
    /// Anything else about it (`validation-failure`).
    Invalid,
}

impl CertProblem {
    /// The class of a rustls certificate error.
    pub fn of(e: &rustls::CertificateError) -> CertProblem {
        use rustls::CertificateError as E;
        match e {
            E::NotValidForName | E::NotValidForNameContext { .. } => CertProblem::HostMismatch,
            E::Expired
            | E::ExpiredContext { .. }
            | E::NotValidYet
            | E::NotValidYetContext { .. } => CertProblem::Expired,
            E::UnknownIssuer | E::BadSignature => CertProblem::NotTrusted,
            _ if crate::dane::is_mismatch(e) => CertProblem::DaneMismatch,
            _ => CertProblem::Invalid,
        }
    }

    /// The RFC 8460 result type.
    pub fn result_type(self) -> &'static str {
        match self {
            CertProblem::HostMismatch => "certificate-host-mismatch",
            CertProblem::Expired => "certificate-expired",
            CertProblem::NotTrusted => "certificate-not-trusted",
            CertProblem::DaneMismatch => "tlsa-invalid",
            CertProblem::Invalid => "validation-failure",
        }
    }
}

/// The result of checking a peer's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertCheck {
    Valid,
    Invalid {
        problem: CertProblem,
        detail: String,
    },
}

impl CertCheck {
    fn of(result: Result<(), rustls::Error>) -> CertCheck {
        match result {
            Ok(()) => CertCheck::Valid,
            Err(rustls::Error::InvalidCertificate(why)) => CertCheck::Invalid {
                problem: CertProblem::of(&why),
                detail: format!("{why:?}"),
            },
            Err(other) => CertCheck::Invalid {
                problem: CertProblem::Invalid,
                detail: other.to_string(),
            },
        }
    }
}

/// Checks the certificate `conn`'s peer presented for `name` against the roots `options`
/// names (its CA file, else the system's), as a `verify` session would have.
pub(crate) fn audit(
    options: &TlsOptions,
    name: &ServerName<'_>,
    conn: &rustls::ClientConnection,
) -> CertCheck {
    let Some((end_entity, intermediates)) = conn.peer_certificates().and_then(|c| c.split_first())
    else {
        return CertCheck::Invalid {
            problem: CertProblem::Invalid,
            detail: "the peer presented no certificate".into(),
        };
    };
    match verifier(options.ca_file.as_deref()) {
        Ok(v) => CertCheck::of(
            v.verify_server_cert(end_entity, intermediates, name, &[], UnixTime::now())
                .map(|_| ()),
        ),
        Err(detail) => CertCheck::Invalid {
            problem: CertProblem::NotTrusted,
            detail,
        },
    }
}

/// The web-PKI verifier over a CA file or the system's roots, built once per file.
fn verifier(ca_file: Option<&Path>) -> Result<Arc<dyn ServerCertVerifier>, String> {
    type Cache = Mutex<HashMap<Option<PathBuf>, Arc<dyn ServerCertVerifier>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = ca_file.map(Path::to_path_buf);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().expect("verifier cache").get(&key) {
        return Ok(v.clone());
    }
    let roots = match &key {
        Some(path) => roots_from_file(path)?,
        None => system_roots(),
    };
    let v: Arc<dyn ServerCertVerifier> =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| format!("TLS setup: {e}"))?;
    cache.lock().expect("verifier cache").insert(key, v.clone());
    Ok(v)
}

/// The names the logs, `Received:` lines and `state` give a TLS session, either side of
/// it: the negotiated version (`TLSv1.3`) and cipher suite (`TLS13_AES_256_GCM_SHA384`).
pub fn describe(conn: &rustls::CommonState) -> (String, String) {
    (
        version_name(conn.protocol_version()),
        cipher_name(conn.negotiated_cipher_suite().map(|s| s.suite())),
    )
}

/// `TLSv1.3`, `TLSv1.2`; any other version as rustls names it; `unknown` before a handshake.
fn version_name(version: Option<rustls::ProtocolVersion>) -> String {
    match version {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_owned(),
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_owned(),
        Some(other) => format!("{other:?}"),
        None => "unknown".to_owned(),
    }
}

/// The IANA-style name rustls gives the suite; `unknown` before a handshake.
fn cipher_name(suite: Option<rustls::CipherSuite>) -> String {
    suite.map_or_else(
        || "unknown".to_owned(),
        |s| s.as_str().map_or_else(|| format!("{s:?}"), str::to_owned),
    )
}

impl TlsInfo {
    pub(crate) fn of(
        conn: &rustls::ClientConnection,
        verified: bool,
        checked: Option<CertCheck>,
    ) -> TlsInfo {
        let (version, cipher) = describe(conn);
        TlsInfo {
            version,
            cipher,
            verified,
            checked: if verified {
                Some(CertCheck::Valid)
            } else {
                checked
            },
        }
    }
}

impl fmt::Display for TlsInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({})",
            self.version,
            self.cipher,
            if self.verified {
                "verified"
            } else {
                "not verified"
            }
        )
    }
}

/// The name the certificate is checked against and sent as SNI: `server_name`, else the
/// host (an address stays an address), without a trailing dot.
pub(crate) fn server_name(
    options: &TlsOptions,
    host: Option<&str>,
) -> Result<ServerName<'static>, String> {
    let name = options
        .server_name
        .as_deref()
        .or(host)
        .unwrap_or("localhost");
    let name = name.strip_suffix('.').unwrap_or(name);
    ServerName::try_from(name.to_owned()).map_err(|_| {
        format!("{name:?} is neither a host name nor an address a certificate can name")
    })
}

fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

/// The client configuration for `options`: one per policy class and CA file, built on first
/// use. Errors name the CA file and what was wrong with it. Public for pepsi-status, whose
/// probes of TLS listeners take the `encrypt` configuration (any certificate).
pub fn client_config(options: &TlsOptions) -> Result<Arc<ClientConfig>, String> {
    if !options.dane.is_empty() {
        // One MX host's records: a configuration of its own, not cached.
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(crate::dane::DaneVerifier {
                records: options.dane.clone(),
                provider: provider(),
            }))
            .with_no_client_auth();
        return Ok(Arc::new(config));
    }
    type Cache = Mutex<HashMap<(bool, Option<PathBuf>), Arc<ClientConfig>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let verify = options.policy == TlsPolicy::Verify;
    let key = (verify, options.ca_file.clone().filter(|_| verify));
    let cache = CACHE.get_or_init(Default::default);
    if let Some(config) = cache.lock().expect("tls cache").get(&key) {
        return Ok(config.clone());
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?;
    let config = if verify {
        let roots = match &key.1 {
            Some(path) => roots_from_file(path)?,
            None => system_roots(),
        };
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider())))
            .with_no_client_auth()
    };
    let config = Arc::new(config);
    cache.lock().expect("tls cache").insert(key, config.clone());
    Ok(config)
}

fn roots_from_file(path: &Path) -> Result<RootCertStore, String> {
    let pem = std::fs::read(path).map_err(|e| format!("CA file {}: {e}", path.display()))?;
    let mut roots = RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| format!("CA file {}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("CA file {}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "CA file {} holds no PEM certificate",
            path.display()
        ));
    }
    Ok(roots)
}

/// The system's trusted roots (`/etc/ssl/certs`, `SSL_CERT_FILE`), else the web PKI roots
/// compiled in, so a host without a CA bundle still verifies public certificates.
fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let _ = roots.add_parsable_certificates(native.certs);
    if roots.is_empty() {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    roots
}

/// The `may` and `encrypt` verifier: any certificate is taken (RFC 7435, opportunistic
/// security), but the handshake signatures are still checked, so the session key belongs to
/// whoever presented the certificate.
#[derive(Debug)]
pub(crate) struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crate::signatures::Signatures(self.0.clone()).tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crate::signatures::Signatures(self.0.clone()).tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        crate::signatures::Signatures(self.0.clone()).schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_version_and_cipher_names() {
        use rustls::{CipherSuite, ProtocolVersion};
        let versions = [
            (Some(ProtocolVersion::TLSv1_3), "TLSv1.3"),
            (Some(ProtocolVersion::TLSv1_2), "TLSv1.2"),
            (Some(ProtocolVersion::TLSv1_1), "TLSv1_1"),
            (None, "unknown"),
        ];
        for (version, want) in versions {
            assert_eq!(version_name(version), want, "{version:?}");
        }
        let suites = [
            (
                Some(CipherSuite::TLS13_AES_256_GCM_SHA384),
                "TLS13_AES_256_GCM_SHA384",
            ),
            (
                Some(CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
                "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            ),
            (Some(CipherSuite::Unknown(0xfefe)), "CipherSuite(0xfefe)"),
            (None, "unknown"),
        ];
        for (suite, want) in suites {
            assert_eq!(cipher_name(suite), want, "{suite:?}");
        }
    }

    #[test]
    fn policy_table() {
        for (text, policy) in [
            ("none", TlsPolicy::None),
            ("may", TlsPolicy::May),
            ("Encrypt", TlsPolicy::Encrypt),
            (" VERIFY ", TlsPolicy::Verify),
        ] {
            assert_eq!(text.parse::<TlsPolicy>(), Ok(policy), "{text}");
            assert_eq!(policy.as_str().parse::<TlsPolicy>(), Ok(policy));
        }
        for bad in ["", "yes", "dane", "secure"] {
            let err = bad.parse::<TlsPolicy>().unwrap_err();
            assert!(err.contains("none, may, encrypt or verify"), "{err}");
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        assert!(TlsPolicy::Verify.requires_tls() && TlsPolicy::Encrypt.requires_tls());
        assert!(!TlsPolicy::May.requires_tls() && !TlsPolicy::None.requires_tls());
        assert_eq!(TlsPolicy::default(), TlsPolicy::None);
    }

    #[test]
    fn server_name_prefers_the_option_and_keeps_addresses() {
        let opts = |name: Option<&str>| TlsOptions {
            server_name: name.map(str::to_owned),
            ..TlsOptions::default()
        };
        let name = |o: &TlsOptions, host| server_name(o, host).map(|n| n.to_str().into_owned());
        assert_eq!(
            name(&opts(None), Some("mx.example.")).unwrap(),
            "mx.example"
        );
        assert_eq!(
            name(&opts(Some("smtp.example")), Some("127.0.0.1")).unwrap(),
            "smtp.example"
        );
        assert!(matches!(
            server_name(&opts(None), Some("127.0.0.1")),
            Ok(ServerName::IpAddress(_))
        ));
        assert_eq!(name(&opts(None), None).unwrap(), "localhost");
        assert!(
            name(&opts(Some("bad name")), None)
                .unwrap_err()
                .contains("bad name")
        );
    }

    #[test]
    fn credentials_debug_hides_the_secret() {
        for c in [
            Credentials::Password {
                username: "relay".into(),
                password: "s3cret".into(),
            },
            Credentials::Bearer {
                username: "relay".into(),
                token: "s3cret".into(),
            },
        ] {
            let shown = format!("{c:?}");
            assert!(
                shown.contains("relay") && !shown.contains("s3cret"),
                "{shown}"
            );
            assert_eq!(c.username(), "relay");
        }
    }

    #[test]
    fn ca_file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = roots_from_file(&empty).unwrap_err();
        assert!(err.contains("empty.pem") && err.contains("no PEM"), "{err}");
        let missing = dir.path().join("missing.pem");
        let err = roots_from_file(&missing).unwrap_err();
        assert!(err.contains("missing.pem"), "{err}");
    }
}
