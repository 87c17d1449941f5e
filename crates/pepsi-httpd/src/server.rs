//! Serving: the listening socket is bound and the TLS key read while the process may still
//! be root, then privileges are dropped (`USER`, `GROUP`) before the database is reached
//! and before the first connection is accepted. Each connection is HTTP/1.1 (over TLS when
//! CERT_FILE and KEY_FILE are set), its request head bounded by HEADER_TIMEOUT, at most
//! MAX_CONNECTIONS at once and at most MAX_CONNECTIONS_PER_CLIENT from one client address
//! (an IPv6 /64), so that one client cannot hold every slot (security review #13).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use pepsi_conf::privilege;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use crate::extract::{ClientAddr, client_ip};
use crate::options::HttpdOptions;
use crate::throttle::address_key;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the answer to a connection over MAX_CONNECTIONS_PER_CLIENT may take, and how
/// long of that it waits for the client's request head.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(3);
const REFUSAL_HEAD_WAIT: Duration = Duration::from_secs(1);

/// Refusals being written at once; past this a refused connection is closed unanswered.
const REFUSALS_AT_ONCE: usize = 64;

/// The connections each client key (`throttle::address_key`) holds open.
#[derive(Default)]
struct PerClient(Mutex<HashMap<String, usize>>);

/// One connection counted for its client; uncounted when dropped.
struct Counted {
    map: Arc<PerClient>,
    key: String,
}

impl PerClient {
    /// Counts a connection of `key`, unless it holds `max` already.
    fn take(self: &Arc<Self>, key: String, max: usize) -> Option<Counted> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(key.clone()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Counted {
            map: self.clone(),
            key,
        })
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut m = self.map.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// Answers a connection over MAX_CONNECTIONS_PER_CLIENT with 503 and the JSON error, then
/// closes it. The client's request head is read first (what comes within a second), so
/// that an HTTP client takes the 503 as the answer to its request, and what it sends after
/// is read too, so that the close does not reset the connection before the answer is read.
async fn refuse(mut stream: TcpStream, max: usize) {
    let body = serde_json::json!({"error": format!(
        "too many connections from this client address (MAX_CONNECTIONS_PER_CLIENT = {max}): close one and try again"
    )})
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, async {
        let mut head = Vec::new();
        let mut chunk = [0u8; 4096];
        let _ = tokio::time::timeout(REFUSAL_HEAD_WAIT, async {
            while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                head.extend_from_slice(&chunk[..n]);
            }
            Ok::<(), std::io::Error>(())
        })
        .await;
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// The uid and gid of `user` (and of `group`, which overrides the user's primary group).
fn lookup(user: &str, group: Option<&str>) -> anyhow::Result<(libc::uid_t, libc::gid_t)> {
    if user.contains('\0') {
        bail!("USER holds a NUL byte");
    }
    let account = privilege::account(user)
        .with_context(|| format!("[pepsi-httpd] USER = {user}: reading the password database"))?
        .with_context(|| format!("[pepsi-httpd] USER = {user}: there is no such user"))?;
    let mut gid = account.gid;
    if let Some(group) = group {
        if group.contains('\0') {
            bail!("GROUP holds a NUL byte");
        }
        gid = privilege::group_id(group)
            .with_context(|| format!("[pepsi-httpd] GROUP = {group}: reading the group database"))?
            .with_context(|| format!("[pepsi-httpd] GROUP = {group}: there is no such group"))?;
    }
    Ok((account.uid, gid))
}

/// Becomes USER (and GROUP) for good: supplementary groups, gid, then uid; checks that root
/// cannot be regained. Without USER, refuses to go on as root unless ALLOW_ROOT is set.
pub fn drop_privileges(s: &HttpdOptions) -> anyhow::Result<()> {
    // SAFETY: plain getters.
    let euid = unsafe { libc::geteuid() };
    let Some(user) = &s.user else {
        if euid == 0 && !s.allow_root {
            bail!(
                "pepsi-httpd will not serve as root: set [pepsi-httpd] USER (and GROUP) to the account it should run as, or ALLOW_ROOT = yes on a development machine"
            );
        }
        return Ok(());
    };
    let (uid, gid) = lookup(user, s.group.as_deref())?;
    if euid != 0 {
        // SAFETY: plain getter.
        if euid == uid && unsafe { libc::getegid() } == gid {
            return Ok(());
        }
        bail!(
            "[pepsi-httpd] USER = {user}: switching to it needs root, and this process runs as uid {euid}"
        );
    }
    // SAFETY: system calls on values we own; each result is checked.
    unsafe {
        let groups = [gid];
        if libc::setgroups(1, groups.as_ptr()) != 0 {
            bail!("setgroups: {}", std::io::Error::last_os_error());
        }
        if libc::setgid(gid) != 0 {
            bail!("setgid({gid}): {}", std::io::Error::last_os_error());
        }
        if libc::setuid(uid) != 0 {
            bail!("setuid({uid}): {}", std::io::Error::last_os_error());
        }
        if uid != 0 && libc::setuid(0) == 0 {
            bail!("root could be regained after switching to {user}: refusing to serve");
        }
    }
    tracing::info!(user = user.as_str(), uid, gid, "privileges dropped");
    Ok(())
}

/// What `bind` prepared while privileged.
pub struct Bound {
    pub listener: std::net::TcpListener,
    pub tls: Option<TlsAcceptor>,
}

/// Binds ADDRESS and loads the certificate (both may need root).
pub fn bind(s: &HttpdOptions) -> anyhow::Result<Bound> {
    let listener = std::net::TcpListener::bind(s.address)
        .with_context(|| format!("cannot listen on {}", s.address))?;
    listener.set_nonblocking(true)?;
    let tls = match &s.tls {
        Some((cert, key)) => {
            let mut config = pepsi_smtp::server_tls::server_config(cert, key)?;
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Some(TlsAcceptor::from(Arc::new(config)))
        }
        None => None,
    };
    Ok(Bound { listener, tls })
}

/// Accepts connections until `shutdown` resolves.
pub async fn serve(
    bound: Bound,
    app: Router,
    s: &HttpdOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let listener = TcpListener::from_std(bound.listener)?;
    let slots = Arc::new(Semaphore::new(s.max_connections));
    let per_client = Arc::new(PerClient::default());
    let trusted = Arc::new(s.trusted_proxies.clone());
    let refusals = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let header_timeout = s.header_timeout;
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            p = slots.clone().acquire_owned() => p?,
        };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // A trusted proxy carries many clients: its connections are limited by
        // MAX_CONNECTIONS alone.
        let proxied = crate::options::any_contains(&s.trusted_proxies, peer.ip());
        let counted = if proxied {
            None
        } else {
            per_client.take(address_key(peer.ip()), s.max_connections_per_client)
        };
        if counted.is_none() && !proxied {
            drop(permit);
            tracing::info!(client = %peer, "connection refused: MAX_CONNECTIONS_PER_CLIENT");
            // Over TLS the answer would need a handshake: the connection is just closed.
            if bound.tls.is_none()
                && let Ok(turn) = refusals.clone().try_acquire_owned()
            {
                let max = s.max_connections_per_client;
                tokio::spawn(async move {
                    let _turn = turn;
                    refuse(stream, max).await;
                });
            }
            continue;
        }
        let app = app.clone();
        let tls = bound.tls.clone();
        let trusted = trusted.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _counted = counted;
            let service = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    let ip = client_ip(
                        peer.ip(),
                        req.headers()
                            .get_all("x-forwarded-for")
                            .iter()
                            .filter_map(|v| v.to_str().ok()),
                        &trusted,
                    );
                    req.extensions_mut()
                        .insert(ClientAddr(SocketAddr::new(ip, peer.port())));
                    app.clone().oneshot(req.map(axum::body::Body::new))
                },
            );
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            let result = match tls {
                None => builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                    .map_err(|e| e.to_string()),
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => builder
                            .serve_connection(TokioIo::new(tls), service)
                            .await
                            .map_err(|e| e.to_string()),
                        Ok(Err(e)) => Err(format!("TLS handshake: {e}")),
                        Err(_) => Err("TLS handshake timed out".into()),
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(client = %peer, "connection ended: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_and_group_are_read_from_the_system_databases_and_name_what_is_missing() {
        let nobody = privilege::account("nobody").unwrap().expect("nobody");
        assert_eq!(lookup("root", None).unwrap(), (0, 0));
        assert_eq!(lookup("nobody", None).unwrap(), (nobody.uid, nobody.gid));
        assert_eq!(lookup("nobody", Some("root")).unwrap(), (nobody.uid, 0));
        let cases = [
            (
                "no-such-user-x",
                None,
                "[pepsi-httpd] USER = no-such-user-x: there is no such user",
            ),
            (
                "root",
                Some("no-such-group-x"),
                "[pepsi-httpd] GROUP = no-such-group-x: there is no such group",
            ),
            ("ro\0ot", None, "USER holds a NUL byte"),
            ("root", Some("wh\0eel"), "GROUP holds a NUL byte"),
        ];
        for (user, group, want) in cases {
            let e = format!("{:#}", lookup(user, group).unwrap_err());
            assert_eq!(e, want, "{user:?} {group:?}");
        }
    }
}
