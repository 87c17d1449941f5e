//! Server certificates: loading a listener's PEM chain and key into a rustls configuration
//! (aws-lc-rs, the one crypto provider of the workspace), and swapping it on SIGHUP so a
//! renewed certificate takes effect without dropping a session. A reload that fails keeps
//! the previous certificate and says why.

use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;

/// A listener's current TLS configuration.
#[derive(Debug)]
pub struct TlsHandle {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
}

impl TlsHandle {
    pub fn load(files: &TlsFiles) -> anyhow::Result<TlsHandle> {
        Ok(TlsHandle {
            files: files.clone(),
            current: RwLock::new(Arc::new(build(files)?)),
        })
    }

    /// Re-reads the files; on failure the old configuration stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let fresh = Arc::new(build(&self.files)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    /// An acceptor with the configuration current at this moment.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

fn build(files: &TlsFiles) -> anyhow::Result<ServerConfig> {
    Ok(pepsi_smtp::server_tls::server_config(
        &files.cert,
        &files.key,
    )?)
}
