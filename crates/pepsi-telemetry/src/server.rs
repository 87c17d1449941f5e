//! The listening socket and its connections: HTTP/1.1, over TLS when TLS_CERT and TLS_KEY
//! are set, at most MAX_CONNECTIONS at once (the next waits in the kernel's backlog), each
//! request head within HEADER_TIMEOUT, each TLS handshake within a fixed bound. Every
//! request carries its client's address (`app::Peer`) for the logs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::app::Peer;
use crate::options::Options;

/// How long a client may take over its TLS handshake.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// The socket and the TLS configuration, ready before anything is served.
pub struct Listening {
    socket: std::net::TcpListener,
    tls: Option<TlsAcceptor>,
}

impl Listening {
    /// Binds LISTEN and loads the certificate chain and key.
    pub fn open(options: &Options) -> anyhow::Result<Listening> {
        let tls = match &options.tls {
            None => None,
            Some((cert, key)) => {
                let mut config = pepsi_smtp::server_tls::server_config(cert, key)
                    .context("[pepsi-telemetry] TLS_CERT / TLS_KEY")?;
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                Some(TlsAcceptor::from(Arc::new(config)))
            }
        };
        let socket = std::net::TcpListener::bind(options.listen).with_context(|| {
            format!(
                "[pepsi-telemetry] LISTEN = {}: cannot listen",
                options.listen
            )
        })?;
        socket.set_nonblocking(true)?;
        Ok(Listening { socket, tls })
    }

    /// The address bound (LISTEN with its port when that was 0), and its scheme.
    pub fn url(&self) -> anyhow::Result<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        Ok(format!("{scheme}://{}", self.socket.local_addr()?))
    }

    /// Serves `router` until `stop` resolves; connections still open then are dropped (an
    /// export cut short was stored whole or not at all, and its client sends it again).
    pub async fn serve(
        self,
        router: Router,
        options: &Options,
        stop: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let listener = TcpListener::from_std(self.socket)?;
        let slots = Arc::new(Semaphore::new(options.max_connections));
        let header_timeout = options.header_timeout;
        tokio::pin!(stop);
        loop {
            let slot = tokio::select! {
                () = &mut stop => return Ok(()),
                slot = slots.clone().acquire_owned() => slot?,
            };
            let (stream, client) = tokio::select! {
                () = &mut stop => return Ok(()),
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors, most likely: wait rather than spin.
                        tracing::warn!("cannot accept a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let connection = Connection {
                router: router.clone(),
                client,
                header_timeout,
                _slot: slot,
            };
            match self.tls.clone() {
                None => {
                    tokio::spawn(connection.run(stream));
                }
                Some(acceptor) => {
                    tokio::spawn(async move {
                        match tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(stream)).await {
                            Ok(Ok(tls)) => connection.run(tls).await,
                            Ok(Err(e)) => tracing::debug!(%client, "TLS handshake failed: {e}"),
                            Err(_) => tracing::debug!(%client, "TLS handshake timed out"),
                        }
                    });
                }
            }
        }
    }
}

/// One accepted connection, holding its MAX_CONNECTIONS slot until it ends.
struct Connection {
    router: Router,
    client: SocketAddr,
    header_timeout: Duration,
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    async fn run(self, io: impl AsyncRead + AsyncWrite + Unpin + Send + 'static) {
        let client = self.client;
        let tagged = tower::ServiceExt::map_request(
            self.router,
            move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(Peer(client));
                req
            },
        );
        let served = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(tagged))
            .await;
        if let Err(e) = served {
            tracing::debug!(%client, "connection ended: {e}");
        }
    }
}
