//! The process around the sessions: binding the listeners, accepting connections under the
//! global and per-client limits, implicit TLS for `submissions`, SIGHUP certificate
//! reload, and the graceful shutdown (stop accepting; idle sessions get 421; sessions in
//! DATA may finish within SHUTDOWN_GRACE; whatever is left is dropped, which stores
//! nothing because a message is stored by one atomic statement), and the configuration
//! overrides applied live: on `config_changed` the settings are built again from the file
//! and the overlay, and the sessions that start afterwards use them.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use pepsi_conf::config::Config;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::config::{Options, Role};
use crate::limits::ClientLimiter;
use crate::session::conn::{Conn, Stream};
use crate::session::{Session, TlsInfo};
use crate::shared::{Listener, Shared};
use crate::tls::TlsHandle;
use crate::verify::Verifier;
use crate::wake;
use pepsi_contract::overlay::DbOverlay;
use pepsi_smtp::Reply;

/// The options sized once at start (semaphores, budgets, caches, the resolver, the wake-up
/// task, the listeners): a changed override of one of these takes effect at the next start.
pub fn restart_only_changes(old: &Options, new: &Options) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |differs: bool, option: &'static str| {
        if differs {
            changed.push(option);
        }
    };
    check(
        old.max_connections != new.max_connections,
        "MAX_CONNECTIONS",
    );
    check(old.message_memory != new.message_memory, "MESSAGE_MEMORY");
    check(
        old.admission.batch != new.admission.batch,
        "ADMISSION_BATCH",
    );
    check(
        old.admission.batch_size != new.admission.batch_size,
        "ADMISSION_BATCH_SIZE",
    );
    check(
        old.admission.lanes != new.admission.lanes,
        "ADMISSION_LANES",
    );
    check(
        old.domain_cache_ttl != new.domain_cache_ttl,
        "DOMAIN_CACHE_TTL",
    );
    check(
        old.recipient_cache_ttl != new.recipient_cache_ttl,
        "RECIPIENT_CACHE_TTL",
    );
    check(old.stats_interval != new.stats_interval, "STATS_INTERVAL");
    check(
        old.quota_cache_ttl != new.quota_cache_ttl,
        "QUOTA_CACHE_TTL",
    );
    check(
        old.auth_failures_per_client != new.auth_failures_per_client,
        "AUTH_FAILURES_PER_CLIENT",
    );
    check(
        old.auth_failures_per_account != new.auth_failures_per_account,
        "AUTH_FAILURES_PER_ACCOUNT",
    );
    check(
        old.auth_failure_window != new.auth_failure_window,
        "AUTH_FAILURE_WINDOW",
    );
    check(
        old.auth_concurrency != new.auth_concurrency,
        "AUTH_CONCURRENCY",
    );
    check(
        old.dispatch_wake_interval != new.dispatch_wake_interval,
        "DISPATCH_WAKE_INTERVAL",
    );
    check(old.dns != new.dns, "DNS_*");
    check(old.authserv_id != new.authserv_id, "AUTHSERV_ID");
    check(old.hostname != new.hostname, "HOSTNAME");
    changed
}

/// Applies the overrides again whenever `config_changed` says they changed (and after the
/// notification connection was lost, since a change may have been missed meanwhile). A
/// set of overrides the settings cannot be built from is refused with an error in the log,
/// and the settings in force stay.
async fn follow_overrides(shared: Arc<Shared>, file_config: Config) {
    let mut listener = loop {
        match pepsi_contract::overlay::listen_config_changed(&shared.pool).await {
            Ok(l) => break l,
            Err(e) => {
                tracing::warn!("cannot listen for config_changed, trying again in 5s: {e}");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        }
    };
    loop {
        match listener.try_recv().await {
            // A notification, or None: the connection was lost and is back (a change may
            // have been missed); either way, read the overrides again.
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("config_changed listener failed, trying again in 5s: {e}");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                continue;
            }
        }
        let rebuilt = async {
            let config = file_config
                .with_db_overlay(&shared.pool, &pepsi_conf::config::Scope::Global)
                .await?;
            Options::from_config(&config)
        }
        .await;
        match rebuilt {
            Ok(new) => {
                let old = shared.options();
                let later = restart_only_changes(&old, &new);
                if !later.is_empty() {
                    tracing::warn!(
                        options = %later.join(", "),
                        "configuration overrides changed options read only at start: they take effect when pepsi-ingress restarts"
                    );
                }
                shared.replace_settings(new);
                tracing::info!("configuration overrides applied to new sessions");
            }
            Err(e) => tracing::error!(
                "configuration overrides not applied, the settings in force stay: {e:#}"
            ),
        }
    }
}

/// Adds the counters to `pepsi.ingress_stats` every STATS_INTERVAL; a failed flush keeps
/// them for the next.
async fn flush_stats(shared: Arc<Shared>) {
    let every = shared.options().stats_interval;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = shared.stats.flush(&shared.pool, &shared.telemetry).await {
            tracing::warn!("cannot write pepsi.ingress_stats, keeping the counts: {e}");
        }
    }
}

/// Runs the ingress until SIGTERM or SIGINT.
pub async fn serve(file_config: Config) -> anyhow::Result<()> {
    // Validate the file before touching the network, so a typo fails fast.
    Options::from_config(&file_config)?;
    let pool = pepsi_contract::db::connect(&file_config).await?;
    // The global overlay may tune [pepsi-ingress]; listener sections are never taken from
    // the database (the configuration layer refuses them).
    let config = file_config
        .with_db_overlay(&pool, &pepsi_conf::config::Scope::Global)
        .await
        .context("cannot read the configuration overrides")?;
    let settings = Options::from_config(&config)?;
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
    let admitter = crate::admission::spawn(
        pool.clone(),
        settings.admission,
        settings.max_connections,
        waker,
    );
    let inflow = crate::inflow::Inflow::spawn(pool.clone(), settings.inflow, stopped.clone());
    let telemetry = pepsi_contract::telemetry::Emitter::from_config(&config)?;
    let shared = Arc::new(Shared {
        admitter,
        inflow,
        telemetry,
        connections: Arc::new(Semaphore::new(settings.max_connections)),
        memory: crate::limits::MemoryBudget::new(settings.message_memory),
        domains: crate::limits::DomainCache::new(settings.domain_cache_ttl),
        recipients: crate::limits::RecipientCache::new(settings.recipient_cache_ttl),
        quota_full: crate::limits::DomainCache::new(settings.quota_cache_ttl),
        stats: crate::stats::Stats::default(),
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
        live: std::sync::RwLock::new(Arc::new(settings)),
        pool,
        verifier,
        limiter: Arc::new(ClientLimiter::default()),
        shutdown: stopped,
    });
    let tls_handles: Vec<Arc<TlsHandle>> = listeners
        .iter()
        .filter_map(|(l, _)| l.tls.clone())
        .collect();
    let follower = tokio::spawn(follow_overrides(shared.clone(), file_config));
    let counting = tokio::spawn(flush_stats(shared.clone()));
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
    follower.abort();
    let _ = stop.send(true);
    while loops.join_next().await.is_some() {}
    counting.abort();
    if let Err(e) = shared.stats.flush(&shared.pool, &shared.telemetry).await {
        tracing::warn!("the last counters could not be written to pepsi.ingress_stats: {e}");
    }
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
    let grace = shared.options().shutdown_grace;
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
        shared.stats.connection_refused("too_many_connections");
        return refuse(
            tcp,
            Reply::new(421, "4.7.0", "too many connections, try again later"),
        )
        .await;
    };
    let settings = shared.options();
    let s = &settings;
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
        shared.stats.connection_refused("too_many_from_client");
        return refuse(
            tcp,
            Reply::new(421, "4.7.0", format!("too many connections from {client}")),
        )
        .await;
    };
    let (stream, tls) = match (listener.config.role, &listener.tls) {
        (Role::Submissions, Some(handle)) => {
            let timeout = settings.tls_handshake_timeout;
            match tokio::time::timeout(timeout, handle.acceptor().accept(tcp)).await {
                Ok(Ok(s)) => {
                    let (version, cipher) = pepsi_smtp::tls::describe(s.get_ref().1);
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
    let conn = Conn::new(stream, settings.write_timeout, settings.max_session_time);
    shared.stats.session();
    Session::new(shared, settings, listener, conn, peer, tls)
        .run()
        .await;
}
