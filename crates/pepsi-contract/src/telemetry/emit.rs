//! The sender of spans: one Unix stream connection per process to the host's
//! `pepsi-telemetry-client` at `[pepsi-telemetry-client] SOCKET`, non-blocking, carrying
//! each finished span as a frame (`wire::frame`). The kernel keeps what the client has not
//! read yet in the connection's buffer, counted in octets (`net.core.wmem_default`, some
//! hundreds of spans), not in datagrams as a datagram socket's short queue would.
//!
//! A span the client cannot take at once (no client, a full buffer, a connection gone) is
//! counted and dropped: telemetry never blocks or fails mail. The count rides on the next
//! span that gets through (`SpanRecord::sender_dropped`), and the first drop, then every
//! `WARN_EVERY`th, is logged. A write the kernel takes only in part keeps the frame's rest,
//! which goes before anything else; while it cannot, new spans are dropped, so the stream
//! never carries half a frame followed by another. A connection that fails is made again
//! with the next span, but after a failed connect not before `RECONNECT_AFTER`, so a host
//! without a client costs one failed syscall a second, not one a span. With the section's
//! ADDRESSES off (the default) a span leaves the process without its envelope
//! (`privacy::admit`).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pepsi_conf::config::{Config, ConfigError};
use socket2::{Domain, SockAddr, Socket, Type};

use super::wire::{CountersRecord, SpanRecord, frame};

/// The client's section, whose SOCKET every emitting process reads too.
pub const CLIENT_SECTION: &str = "pepsi-telemetry-client";

/// A drop is logged the first time and then once in this many.
pub const WARN_EVERY: u64 = 10_000;

/// After a failed connect, spans are dropped without trying again for this long.
pub const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// Where a process sends its spans; `Emitter::off()` when telemetry is not configured.
#[derive(Debug)]
pub struct Emitter {
    target: Option<Link>,
    /// `ADDRESSES`: the envelope may go to the client.
    addresses: bool,
    sent: AtomicU64,
    dropped: AtomicU64,
}

/// The connection to the client, made when first needed and again after it fails.
#[derive(Debug)]
struct Link {
    path: PathBuf,
    state: Mutex<LinkState>,
}

#[derive(Debug, Default)]
struct LinkState {
    socket: Option<Socket>,
    /// The end of a frame the kernel took only in part: it goes first.
    rest: Vec<u8>,
    /// When a connect last failed.
    failed_at: Option<Instant>,
}

/// Why a frame did not go.
enum Miss {
    /// No connection, and none could be made (or one failed too recently to try again).
    Unconnected(String),
    /// The client is not reading fast enough: its buffer is full.
    Busy,
    /// The connection failed while writing; it is made again with the next span.
    Broken(std::io::Error),
}

impl LinkState {
    /// A connection, made now unless one failed within `RECONNECT_AFTER`.
    fn connected(&mut self, path: &Path) -> Result<&Socket, Miss> {
        if self.socket.is_none() {
            if self
                .failed_at
                .is_some_and(|at| at.elapsed() < RECONNECT_AFTER)
            {
                return Err(Miss::Unconnected("no connection yet".into()));
            }
            match connect(path) {
                Ok(socket) => {
                    self.socket = Some(socket);
                    self.rest.clear();
                    self.failed_at = None;
                }
                Err(e) => {
                    self.failed_at = Some(Instant::now());
                    return Err(Miss::Unconnected(e.to_string()));
                }
            }
        }
        Ok(self.socket.as_ref().expect("connected above"))
    }

    /// Writes what the kernel takes of `bytes` now: how much, or why nothing.
    fn write(&mut self, path: &Path, bytes: &[u8]) -> Result<usize, Miss> {
        let socket = self.connected(path)?;
        match socket.send_with_flags(bytes, libc::MSG_NOSIGNAL) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Err(Miss::Busy),
            Err(e) if e.kind() == ErrorKind::Interrupted => Err(Miss::Busy),
            Err(e) => {
                self.socket = None;
                self.rest.clear();
                Err(Miss::Broken(e))
            }
        }
    }

    /// Sends `frame` whole or not at all (a part the kernel did not take stays in `rest`,
    /// to go first next time).
    fn send(&mut self, path: &Path, frame: &[u8]) -> Result<(), Miss> {
        if !self.rest.is_empty() {
            let rest = std::mem::take(&mut self.rest);
            let n = self.write(path, &rest).inspect_err(|_| {
                if self.socket.is_some() {
                    self.rest.clone_from(&rest);
                }
            })?;
            if n < rest.len() {
                self.rest = rest[n..].to_vec();
                return Err(Miss::Busy);
            }
        }
        let n = self.write(path, frame)?;
        if n < frame.len() {
            self.rest = frame[n..].to_vec();
        }
        Ok(())
    }
}

/// A non-blocking connection to `path`: one the client's backlog has no room for fails at
/// once instead of waiting.
fn connect(path: &Path) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    socket.connect(&SockAddr::unix(path)?)?;
    Ok(socket)
}

impl Emitter {
    /// Sends nothing.
    pub fn off() -> Self {
        Self {
            target: None,
            addresses: false,
            sent: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Sends to `path`. The connection is made with the first span; the client need not be
    /// there yet.
    pub fn to(path: &Path) -> Self {
        Self {
            target: Some(Link {
                path: path.to_owned(),
                state: Mutex::default(),
            }),
            ..Self::off()
        }
    }

    /// The envelope goes with each span (`ADDRESSES = yes`).
    pub fn with_addresses(mut self, addresses: bool) -> Self {
        self.addresses = addresses;
        self
    }

    /// `[pepsi-telemetry-client] SOCKET` and `ADDRESSES` of `cfg`: off when SOCKET is not
    /// set.
    pub fn from_config(cfg: &Config) -> Result<Self, ConfigError> {
        let Some(path) = socket_path(cfg)? else {
            return Ok(Self::off());
        };
        let addresses = cfg
            .section(CLIENT_SECTION)
            .bool_opt("ADDRESSES")?
            .unwrap_or(false);
        Ok(Self::to(&path).with_addresses(addresses))
    }

    pub fn is_on(&self) -> bool {
        self.target.is_some()
    }

    /// Hands `span` over (without its envelope unless ADDRESSES is on), or counts it
    /// dropped; never waits.
    pub fn emit(&self, span: &SpanRecord) {
        if self.target.is_none() {
            return;
        }
        let mut span = super::privacy::admit(span.clone(), self.addresses);
        span.sender_dropped = self.dropped();
        self.send(&span.encode());
    }

    /// Hands a program's counters over, or counts them dropped; never waits.
    pub fn emit_counters(&self, counters: &CountersRecord) {
        if self.target.is_some() && !counters.counters.is_empty() {
            self.send(&counters.encode());
        }
    }

    fn send(&self, datagram: &[u8]) {
        let Some(link) = &self.target else {
            return;
        };
        let result = link
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(&link.path, &frame(datagram));
        let why = match result {
            Ok(()) => {
                self.sent.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(Miss::Unconnected(e)) => format!("no connection: {e}"),
            Err(Miss::Busy) => "it is not reading fast enough".to_owned(),
            Err(Miss::Broken(e)) => format!("the connection failed: {e}"),
        };
        let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        if n == 1 || n.is_multiple_of(WARN_EVERY) {
            tracing::warn!(
                socket = %link.path.display(),
                dropped = n,
                "telemetry: a span or counters could not go to pepsi-telemetry-client ({why}); dropped, mail goes on"
            );
        }
    }

    /// Spans handed over so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Spans that found no client, or a client too slow to take them.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// `[pepsi-telemetry-client] SOCKET`: where the client listens and every process sends.
pub fn socket_path(cfg: &Config) -> Result<Option<PathBuf>, ConfigError> {
    Ok(cfg
        .section(CLIENT_SECTION)
        .string_opt("SOCKET")?
        .filter(|s| !s.trim().is_empty())
        .map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::{UnixListener, UnixStream};

    use super::*;
    use crate::telemetry::wire::{SpanKind, read_frame};
    use crate::telemetry::{SpanId, SpanOutcome, TraceId};

    fn span() -> SpanRecord {
        SpanRecord {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            parent: None,
            kind: SpanKind::Pass,
            program: "pepsi-stage-route".into(),
            pid: std::process::id(),
            stage: Some("route".into()),
            queue_id: Some(1),
            message_id: None,
            start_ns: 1,
            end_ns: 2,
            outcome: SpanOutcome::Advanced,
            next_stage: None,
            fused_into: None,
            dispatch_wait_ms: None,
            error: None,
            rcpt_count: None,
            size: None,
            mail_from: Some("a@example.org".into()),
            rcpt_to: vec!["b@example.org".into()],
            sender_dropped: 0,
        }
    }

    /// Reads every whole frame `stream` holds now, as records.
    fn frames(stream: &mut UnixStream) -> Vec<SpanRecord> {
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut got = Vec::new();
        while let Ok(Some(datagram)) = read_frame(stream) {
            got.push(SpanRecord::decode(&datagram).unwrap());
        }
        got
    }

    #[test]
    fn a_span_reaches_a_listening_socket_and_is_dropped_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("telemetry.sock");
        let emitter = Emitter::to(&path);
        emitter.emit(&span());
        assert_eq!((emitter.sent(), emitter.dropped()), (0, 1));
        let listener = UnixListener::bind(&path).unwrap();
        // Within RECONNECT_AFTER of the failed connect nothing is tried.
        emitter.emit(&span());
        assert_eq!((emitter.sent(), emitter.dropped()), (0, 2));
        std::thread::sleep(RECONNECT_AFTER);
        let mut sent = span();
        sent.error = Some("550 <b@example.org>: unknown".into());
        emitter.emit(&sent);
        assert_eq!((emitter.sent(), emitter.dropped()), (1, 2));
        let (mut stream, _) = listener.accept().unwrap();
        let got = frames(&mut stream);
        assert_eq!(got.len(), 1);
        // The drops before it ride along; the envelope stays home.
        assert_eq!(got[0].sender_dropped, 2);
        assert_eq!((got[0].mail_from.as_ref(), got[0].rcpt_to.len()), (None, 0));
        assert_eq!(got[0].error.as_deref(), Some("550 <[address]>: unknown"));
        assert_eq!(got[0].span_id, sent.span_id);

        let with = Emitter::to(&path).with_addresses(true);
        with.emit(&sent);
        let (mut stream, _) = listener.accept().unwrap();
        let got = frames(&mut stream);
        assert_eq!(got[0].mail_from.as_deref(), Some("a@example.org"));
        assert_eq!(got[0].error, sent.error);
    }

    #[test]
    fn a_full_buffer_drops_rather_than_waits_and_no_frame_is_torn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("telemetry.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let emitter = Emitter::to(&path);
        // Nobody reads: the connection's buffer fills and sends fail at once instead of
        // blocking.
        let mut big = span();
        big.error = Some("x".repeat(900));
        for _ in 0..100_000 {
            emitter.emit(&big);
            if emitter.dropped() > 0 {
                break;
            }
        }
        assert!(emitter.dropped() > 0 && emitter.sent() > 10, "{emitter:?}");
        // Once the client reads, every span handed over arrives whole, in order.
        let (mut stream, _) = listener.accept().unwrap();
        let mut got = frames(&mut stream);
        let last = span();
        emitter.emit(&last);
        got.extend(frames(&mut stream));
        assert_eq!(got.len() as u64, emitter.sent(), "{emitter:?}");
        assert_eq!(got.last().unwrap().span_id, last.span_id);
        assert_eq!(got.last().unwrap().sender_dropped, emitter.dropped());
    }

    #[test]
    fn a_restarted_client_is_reconnected_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("telemetry.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let emitter = Emitter::to(&path);
        emitter.emit(&span());
        let (mut stream, _) = listener.accept().unwrap();
        assert_eq!(frames(&mut stream).len(), 1);
        drop((stream, listener));
        std::fs::remove_file(&path).unwrap();
        let listener = UnixListener::bind(&path).unwrap();
        // The old connection fails on its next write; the span after it connects anew.
        emitter.emit(&span());
        assert_eq!((emitter.sent(), emitter.dropped()), (1, 1));
        let after = span();
        emitter.emit(&after);
        assert_eq!((emitter.sent(), emitter.dropped()), (2, 1));
        let (mut stream, _) = listener.accept().unwrap();
        let got = frames(&mut stream);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].span_id, got[0].sender_dropped), (after.span_id, 1));
    }

    #[test]
    fn a_frame_the_kernel_takes_in_part_is_finished_before_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("telemetry.sock");
        let listener = UnixListener::bind(&path).unwrap();
        // Larger than the connection's buffer, which the kernel then takes only in part.
        let huge = vec![b'x'; 4 << 20];
        let mut link = LinkState::default();
        assert!(link.send(&path, &huge).is_ok());
        let taken = huge.len() - link.rest.len();
        assert!(!link.rest.is_empty() && taken > 0, "{taken}");
        // While the rest cannot go, nothing else goes either.
        assert!(matches!(link.send(&path, b"next"), Err(Miss::Busy)));
        let (mut stream, _) = listener.accept().unwrap();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            std::io::Read::read_to_end(&mut stream, &mut all).unwrap();
            all
        });
        let until = Instant::now() + Duration::from_secs(30);
        while link.send(&path, b"next").is_err() {
            assert!(Instant::now() < until, "the rest never went");
            std::thread::sleep(Duration::from_millis(1));
        }
        while !link.rest.is_empty() {
            let _ = link.send(&path, b"");
            assert!(Instant::now() < until, "the rest never went");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(link);
        let all = reader.join().unwrap();
        assert_eq!(all.len(), huge.len() + 4);
        assert!(all[..huge.len()].iter().all(|&b| b == b'x'));
        assert_eq!(&all[huge.len()..], b"next");
    }
}
