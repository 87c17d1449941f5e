//! A server's certificate: a PEM chain and its private key loaded into a rustls
//! configuration (aws-lc-rs, the one crypto provider of the workspace). The SMTP ingress and
//! pepsi-httpd both serve TLS from it; errors name the file that was wrong.

use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use rustls::ServerConfig;

/// The configuration for serving the chain in `cert` with the key in `key`, safe default
/// protocol versions, no client certificates.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<ServerConfig> {
    let cert_file = std::fs::File::open(cert)
        .with_context(|| format!("cannot open certificate {}", cert.display()))?;
    let certs = rustls_pemfile::certs(&mut BufReader::new(cert_file))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("cannot read certificate {}", cert.display()))?;
    if certs.is_empty() {
        bail!("{} holds no PEM certificate", cert.display());
    }
    let key_file =
        std::fs::File::open(key).with_context(|| format!("cannot open key {}", key.display()))?;
    let private = rustls_pemfile::private_key(&mut BufReader::new(key_file))
        .with_context(|| format!("cannot read key {}", key.display()))?
        .with_context(|| format!("{} holds no PEM private key", key.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .with_context(|| {
            format!(
                "certificate {} and key {} do not go together",
                cert.display(),
                key.display()
            )
        })
}
