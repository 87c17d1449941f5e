//! A server's certificate: a PEM chain and its private key loaded into a rustls
//! configuration (aws-lc-rs, the one crypto provider of the workspace). The SMTP ingress and
//! pepsi-httpd both serve TLS from it; errors name the file that was wrong.

use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;

/// Why a certificate and key could not be served: the text names the file that was wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ServerTlsError(String);

fn fail(text: String) -> ServerTlsError {
    ServerTlsError(text)
}

/// The configuration for serving the chain in `cert` with the key in `key`, safe default
/// protocol versions, no client certificates.
pub fn server_config(cert: &Path, key: &Path) -> Result<ServerConfig, ServerTlsError> {
    let (cert_name, key_name) = (cert.display(), key.display());
    let cert_file = std::fs::File::open(cert)
        .map_err(|e| fail(format!("cannot open certificate {cert_name}: {e}")))?;
    let certs = rustls_pemfile::certs(&mut BufReader::new(cert_file))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(format!("cannot read certificate {cert_name}: {e}")))?;
    if certs.is_empty() {
        return Err(fail(format!("{cert_name} holds no PEM certificate")));
    }
    let key_file =
        std::fs::File::open(key).map_err(|e| fail(format!("cannot open key {key_name}: {e}")))?;
    let private = rustls_pemfile::private_key(&mut BufReader::new(key_file))
        .map_err(|e| fail(format!("cannot read key {key_name}: {e}")))?
        .ok_or_else(|| fail(format!("{key_name} holds no PEM private key")))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(format!("TLS protocol versions: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .map_err(|e| {
            fail(format!(
                "certificate {cert_name} and key {key_name} do not go together: {e}"
            ))
        })
}
