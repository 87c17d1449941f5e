//! The listening socket and its connections: HTTP/1.1, over TLS when TLS_CERT and TLS_KEY
//! are set, at most MAX_CONNECTIONS at once (the next waits in the kernel's backlog) and at
//! most MAX_CONNECTIONS_PER_ADDRESS from one IPv4 address or IPv6 /64 (a further one is
//! closed as soon as it is accepted). A connection must finish its TLS handshake and send
//! its first request head within HEADER_TIMEOUT of being accepted, each later head within
//! HEADER_TIMEOUT of its first byte, and is closed once it has been idle, answered and
//! silent, for IDLE_TIMEOUT: a slot is never held by a client that does nothing. Every
//! request carries its client's address (`app::Peer`) for the logs.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::app::Peer;
use crate::options::Options;

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
        let addresses = Arc::new(Addresses::new(options.max_connections_per_address));
        let limits = Timeouts {
            header: options.header_timeout,
            idle: options.idle_timeout,
        };
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
            let accepted = Instant::now();
            let Some(address_slot) = addresses.enter(client.ip()) else {
                tracing::debug!(
                    %client,
                    "connection closed: MAX_CONNECTIONS_PER_ADDRESS ({}) from that address already",
                    addresses.max
                );
                drop(stream);
                continue;
            };
            let connection = Connection {
                router: router.clone(),
                client,
                activity: Arc::new(Activity::new(accepted)),
                limits,
                _slot: slot,
                _address_slot: address_slot,
            };
            match self.tls.clone() {
                None => {
                    tokio::spawn(connection.run(stream));
                }
                Some(acceptor) => {
                    tokio::spawn(async move {
                        let until = accepted + limits.header;
                        match tokio::time::timeout_at(until, acceptor.accept(stream)).await {
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

/// HEADER_TIMEOUT and IDLE_TIMEOUT.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    header: Duration,
    idle: Duration,
}

/// The connections open from each address, at most `max` each.
struct Addresses {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// Who counts as one address: an IPv4 address (one mapped into IPv6 too), or an IPv6 /64,
/// what one host or one site is usually given.
fn address_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let network = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(network))
        }
        v4 => v4,
    }
}

impl Addresses {
    fn new(max: usize) -> Addresses {
        Addresses {
            max,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A place for one more connection from `ip`, or None when its address has `max`.
    fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let address = address_of(ip);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(address).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            addresses: self.clone(),
            address,
        })
    }

    #[cfg(test)]
    fn open_from(&self, ip: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&address_of(ip)).copied().unwrap_or(0)
    }
}

/// One connection's place among its address's; given back when dropped.
struct AddressSlot {
    addresses: Arc<Addresses>,
    address: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self
            .addresses
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.address);
            }
        }
    }
}

/// What a connection is doing, for its deadline: requests being answered, and since when
/// it has been waiting for the next (and for its head's end, once its first byte came).
struct Activity {
    state: Mutex<ActivityState>,
    /// Told when the deadline moves.
    changed: tokio::sync::Notify,
}

#[derive(Debug, Clone, Copy)]
struct ActivityState {
    answering: usize,
    answered_once: bool,
    /// The connection's acceptance, then the end of its last answer.
    waiting_since: Instant,
    /// The first byte of the next request, once it came.
    head_since: Option<Instant>,
}

impl Activity {
    fn new(accepted: Instant) -> Activity {
        Activity {
            state: Mutex::new(ActivityState {
                answering: 0,
                answered_once: false,
                waiting_since: accepted,
                head_since: None,
            }),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut ActivityState) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Bytes came from the client.
    fn read(&self, now: Instant) {
        let started = self.with(|s| {
            let started = s.answering == 0 && s.head_since.is_none();
            if started {
                s.head_since = Some(now);
            }
            started
        });
        if started {
            self.changed.notify_one();
        }
    }

    /// A request is being answered until the guard is dropped.
    fn answering(self: &Arc<Self>) -> Answering {
        self.with(|s| {
            s.answering += 1;
            s.head_since = None;
        });
        self.changed.notify_one();
        Answering(self.clone())
    }

    /// When the connection is to be closed; None while a request is being answered.
    fn deadline(&self, limits: Timeouts) -> Option<Instant> {
        let s = self.with(|s| *s);
        if s.answering > 0 {
            return None;
        }
        let (since, limit) = match (s.answered_once, s.head_since) {
            (false, _) => (s.waiting_since, limits.header),
            (true, Some(head)) => (head, limits.header),
            (true, None) => (s.waiting_since, limits.idle),
        };
        // Options bounds the timeouts to an hour; were it to pass what an Instant holds,
        // the connection would only be looked at again later.
        since.checked_add(limit)
    }
}

/// A request being answered; its end starts the wait for the next.
struct Answering(Arc<Activity>);

impl Drop for Answering {
    fn drop(&mut self) {
        let now = Instant::now();
        self.0.with(|s| {
            s.answering -= 1;
            s.answered_once = true;
            s.waiting_since = now;
            s.head_since = None;
        });
        self.0.changed.notify_one();
    }
}

/// A connection's stream, telling its `Activity` when bytes come.
struct Watched<T> {
    io: T,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read(Instant::now());
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// One accepted connection, holding its MAX_CONNECTIONS slot and its address's until it
/// ends.
struct Connection {
    router: Router,
    client: SocketAddr,
    activity: Arc<Activity>,
    limits: Timeouts,
    _slot: OwnedSemaphorePermit,
    _address_slot: AddressSlot,
}

impl Connection {
    async fn run(self, io: impl AsyncRead + AsyncWrite + Unpin + Send + 'static) {
        let client = self.client;
        let activity = self.activity.clone();
        let tagged = tower::ServiceExt::map_request(
            self.router,
            move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(Peer(client));
                req
            },
        );
        let watched = activity.clone();
        let service = tower::ServiceExt::map_future(tagged, move |answer| {
            let answering = watched.answering();
            async move {
                let answered = answer.await;
                drop(answering);
                answered
            }
        });
        let io = Watched {
            io,
            activity: activity.clone(),
        };
        // The timeouts are this loop's, not hyper's: hyper's header timeout also runs
        // while a connection waits for its next request, which is IDLE_TIMEOUT's to bound.
        let connection = hyper::server::conn::http1::Builder::new()
            .header_read_timeout(None)
            .keep_alive(true)
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
        tokio::pin!(connection);
        let served = loop {
            // While a request is answered there is no deadline (REQUEST_TIMEOUT and the
            // database's bound it): wait for the answer.
            let deadline = activity.deadline(self.limits);
            let expired = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                served = connection.as_mut() => break served,
                () = activity.changed.notified() => {}
                () = expired => {
                    tracing::debug!(%client, "connection closed: no request within its time");
                    return;
                }
            }
        };
        if let Err(e) = served {
            tracing::debug!(%client, "connection ended: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_is_an_ipv4_address_or_an_ipv6_64() {
        for (ip, want) in [
            ("192.0.2.7", "192.0.2.7"),
            ("::ffff:192.0.2.7", "192.0.2.7"),
            ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::"),
            ("2001:db8:1:2:ffff::1", "2001:db8:1:2::"),
            ("::1", "::"),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(address_of(ip), want.parse::<IpAddr>().unwrap(), "{ip}");
        }
    }

    #[test]
    fn an_address_gets_at_most_its_share_and_gets_it_back() {
        let addresses = Arc::new(Addresses::new(2));
        let a: IpAddr = "192.0.2.7".parse().unwrap();
        let b: IpAddr = "2001:db8::1".parse().unwrap();
        let first = addresses.enter(a).unwrap();
        let second = addresses.enter(a).unwrap();
        assert!(addresses.enter(a).is_none(), "a third from one address");
        assert!(
            addresses
                .enter("::ffff:192.0.2.7".parse().unwrap())
                .is_none(),
            "the same address, mapped"
        );
        let other = addresses.enter(b).unwrap();
        let same_64 = addresses.enter("2001:db8::2".parse().unwrap()).unwrap();
        assert!(addresses.enter("2001:db8::3".parse().unwrap()).is_none());
        drop(first);
        assert_eq!(addresses.open_from(a), 1);
        let again = addresses.enter(a).unwrap();
        drop((second, again, other, same_64));
        assert_eq!((addresses.open_from(a), addresses.open_from(b)), (0, 0));
        assert!(addresses.open.lock().unwrap().is_empty(), "nothing kept");
    }

    #[test]
    fn the_deadline_is_the_header_timeout_until_an_answer_then_the_idle_timeout() {
        let limits = Timeouts {
            header: Duration::from_secs(10),
            idle: Duration::from_secs(30),
        };
        let t0 = Instant::now();
        let activity = Arc::new(Activity::new(t0));
        // The first head: within HEADER_TIMEOUT of acceptance, bytes or not.
        assert_eq!(activity.deadline(limits), Some(t0 + limits.header));
        activity.read(t0 + Duration::from_secs(4));
        assert_eq!(activity.deadline(limits), Some(t0 + limits.header));
        // While answering: none.
        let answering = activity.answering();
        assert_eq!(activity.deadline(limits), None);
        activity.read(t0 + Duration::from_secs(5));
        assert_eq!(activity.deadline(limits), None, "the body's bytes");
        drop(answering);
        // Answered: IDLE_TIMEOUT from the answer's end...
        let answered = activity.with(|s| s.waiting_since);
        assert_eq!(activity.deadline(limits), Some(answered + limits.idle));
        // ...until the next request's first byte, from which its head has HEADER_TIMEOUT.
        let byte = answered + Duration::from_secs(20);
        activity.read(byte);
        activity.read(byte + Duration::from_secs(3));
        assert_eq!(activity.deadline(limits), Some(byte + limits.header));
        drop(activity.answering());
        let answered = activity.with(|s| s.waiting_since);
        assert_eq!(activity.deadline(limits), Some(answered + limits.idle));
    }
}
