//! The process around the sessions: binding the listeners, accepting connections under the
//! global and per-client limits, implicit TLS for `submissions`, SIGHUP certificate
//! reload, and the graceful shutdown (stop accepting; idle sessions get 421; sessions in
//! DATA may finish within SHUTDOWN_GRACE; whatever is left is dropped, which stores
//! nothing because a message is stored by one atomic statement).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use pepsi_common::config::Config;
use sqlx::PgPool;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::config::{ListenerConfig, Role, Settings};
use crate::limits::ClientLimiter;
use crate::session::conn::{Conn, Stream};
use crate::session::{Session, TlsInfo};
use crate::tls::TlsHandle;
use crate::verify::Verifier;
use crate::wake::{self, Waker};
use pepsi_smtp::Reply;

/// What every session shares.
pub struct Shared {
    pub settings: Settings,
    pub pool: PgPool,
    pub waker: Waker,
    pub verifier: Option<Verifier>,
    pub limiter: Arc<ClientLimiter>,
    pub memory: Arc<crate::limits::MemoryBudget>,
    pub domains: crate::limits::DomainCache,
    /// The aliases stages' alias files, for CHECK_RECIPIENTS.
    pub alias_files: pepsi_common::alias_file::AliasFile,
    /// Failed logins per client network and per account (AUTH_FAILURES_PER_*).
    pub auth_client_failures: crate::limits::FailureCounter,
    pub auth_account_failures: crate::limits::FailureCounter,
    /// Password checks running at once (AUTH_CONCURRENCY).
    pub auth_checks: Arc<Semaphore>,
    pub connections: Arc<Semaphore>,
    pub shutdown: watch::Receiver<bool>,
}

/// A listener's configuration and its certificate, if any.
pub struct Listener {
    pub config: ListenerConfig,
    pub tls: Option<Arc<TlsHandle>>,
}

/// Runs the ingress until SIGTERM or SIGINT.
pub async fn serve(file_config: Config) -> anyhow::Result<()> {
    // Validate the file before touching the network, so a typo fails fast.
    Settings::from_config(&file_config)?;
    let pool = pepsi_common::db::connect(&file_config).await?;
    // The global overlay may tune [pepsi-ingress]; listener sections are never taken from
    // the database (the configuration layer refuses them).
    let config = file_config
        .with_db_overlay(&pool, &pepsi_common::config::Scope::Global)
        .await
        .context("cannot read the configuration overrides")?;
    let settings = Settings::from_config(&config)?;
    let alias_files = crate::recipients::alias_files(&config)?;

    let mut listeners = Vec::new();
    for l in &settings.listeners {
        let tls = match &l.tls {
            Some(files) => Some(Arc::new(
                TlsHandle::load(files).with_context(|| format!("[listener-{}]", l.name))?,
            )),
            None => None,
        };
        let socket = TcpListener::bind(l.address)
            .await
            .with_context(|| format!("[listener-{}] cannot listen on {}", l.name, l.address))?;
        tracing::info!(listener = %l.name, role = l.role.as_str(), address = %l.address, "listening");
        listeners.push((
            Arc::new(Listener {
                config: l.clone(),
                tls,
            }),
            socket,
        ));
    }
    let verifier = if settings.listeners.iter().any(|l| l.verify) {
        Some(Verifier::new(
            &settings.dns,
            &settings.authserv_id,
            &settings.hostname,
        )?)
    } else {
        None
    };

    let (stop, stopped) = watch::channel(false);
    // The wake-up task outlives the sessions: a message that finishes its DATA during the
    // shutdown grace still wakes the dispatcher.
    let (wake_stop, wake_stopped) = watch::channel(false);
    let (waker, wake_task) =
        wake::spawn(pool.clone(), settings.dispatch_wake_interval, wake_stopped);
    let shared = Arc::new(Shared {
        connections: Arc::new(Semaphore::new(settings.max_connections)),
        memory: crate::limits::MemoryBudget::new(settings.message_memory),
        domains: crate::limits::DomainCache::new(settings.domain_cache_ttl),
        alias_files,
        auth_client_failures: crate::limits::FailureCounter::new(
            settings.auth_failures_per_client,
            settings.auth_failure_window,
        ),
        auth_account_failures: crate::limits::FailureCounter::new(
            settings.auth_failures_per_account,
            settings.auth_failure_window,
        ),
        auth_checks: Arc::new(Semaphore::new(settings.auth_concurrency)),
        settings,
        pool,
        waker,
        verifier,
        limiter: Arc::new(ClientLimiter::default()),
        shutdown: stopped,
    });
    let tls_handles: Vec<Arc<TlsHandle>> = listeners
        .iter()
        .filter_map(|(l, _)| l.tls.clone())
        .collect();
    let mut loops = JoinSet::new();
    for (listener, socket) in listeners {
        loops.spawn(accept_loop(shared.clone(), listener, socket));
    }

    let mut hup = signal(SignalKind::hangup()).context("cannot install the SIGHUP handler")?;
    let mut term = signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot install the SIGINT handler")?;
    loop {
        tokio::select! {
            _ = hup.recv() => {
                for handle in &tls_handles {
                    match handle.reload() {
                        Ok(()) => tracing::info!(cert = %handle.files().cert.display(), "certificate reloaded"),
                        Err(e) => tracing::error!("certificate reload failed, keeping the old one: {e:#}"),
                    }
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    tracing::info!("shutting down: no new connections");
    let _ = stop.send(true);
    while loops.join_next().await.is_some() {}
    let _ = wake_stop.send(true);
    let _ = wake_task.await;
    shared.pool.close().await;
    tracing::info!("stopped");
    Ok(())
}

async fn accept_loop(shared: Arc<Shared>, listener: Arc<Listener>, socket: TcpListener) {
    let mut sessions = JoinSet::new();
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            accepted = socket.accept() => match accepted {
                Ok((tcp, peer)) => {
                    sessions.spawn(handle(shared.clone(), listener.clone(), tcp, peer));
                }
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!(listener = %listener.config.name, "accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            _ = wake::stopped(&mut shutdown) => break,
            Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
        }
    }
    drop(socket);
    let grace = shared.settings.shutdown_grace;
    let drained = tokio::time::timeout(grace, async {
        while sessions.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(listener = %listener.config.name, left = sessions.len(), "shutdown grace over, dropping sessions");
        sessions.abort_all();
        while sessions.join_next().await.is_some() {}
    }
}

/// Answers a connection that is not served; a client that does not read gets 10 s.
async fn refuse(mut tcp: TcpStream, reply: Reply) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let _ = tcp.write_all(reply.render().as_bytes()).await;
        let _ = tcp.shutdown().await;
    })
    .await;
}

async fn handle(shared: Arc<Shared>, listener: Arc<Listener>, tcp: TcpStream, peer: SocketAddr) {
    let _ = tcp.set_nodelay(true);
    let Ok(_permit) = shared.connections.clone().try_acquire_owned() else {
        return refuse(
            tcp,
            Reply::new(421, "4.7.0", "too many connections, try again later"),
        )
        .await;
    };
    let s = &shared.settings;
    let network = crate::limits::client_network(peer.ip(), s.client_prefix_v4, s.client_prefix_v6);
    let Some(_slot) = shared
        .limiter
        .acquire(network, s.max_connections_per_client)
    else {
        let prefix = if network.is_ipv4() {
            s.client_prefix_v4
        } else {
            s.client_prefix_v6
        };
        let client = if u32::from(prefix) == if network.is_ipv4() { 32 } else { 128 } {
            network.to_string()
        } else {
            format!("{network}/{prefix}")
        };
        tracing::info!(%peer, %client, "too many connections from this client");
        return refuse(
            tcp,
            Reply::new(421, "4.7.0", format!("too many connections from {client}")),
        )
        .await;
    };
    let (stream, tls) = match (listener.config.role, &listener.tls) {
        (Role::Submissions, Some(handle)) => {
            let timeout = shared.settings.tls_handshake_timeout;
            match tokio::time::timeout(timeout, handle.acceptor().accept(tcp)).await {
                Ok(Ok(s)) => {
                    let (version, cipher) = crate::tls::describe(s.get_ref().1);
                    (Stream::Tls(Box::new(s)), Some(TlsInfo { version, cipher }))
                }
                Ok(Err(e)) => {
                    tracing::info!(%peer, "TLS handshake failed: {e}");
                    return;
                }
                Err(_) => return,
            }
        }
        _ => (Stream::Plain(tcp), None),
    };
    let conn = Conn::new(
        stream,
        shared.settings.write_timeout,
        shared.settings.max_session_time,
    );
    Session::new(shared, listener, conn, peer, tls).run().await;
}
