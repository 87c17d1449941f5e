//! The sender of spans: one unbound Unix datagram socket per process, non-blocking, that
//! hands each finished span to the host's `pepsi-telemetry-client` at
//! `[pepsi-telemetry-client] SOCKET`. A span the client cannot take at once (no client, a
//! full socket buffer) is counted and dropped: telemetry never blocks or fails mail. The
//! count rides on the next span that gets through (`SpanRecord::sender_dropped`), and the
//! first drop, then every `WARN_EVERY`th, is logged. With the section's ADDRESSES off (the
//! default) a span leaves the process without its envelope (`privacy::admit`).

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use pepsi_conf::config::{Config, ConfigError};

use super::wire::{CountersRecord, SpanRecord};

/// The client's section, whose SOCKET every emitting process reads too.
pub const CLIENT_SECTION: &str = "pepsi-telemetry-client";

/// A drop is logged the first time and then once in this many.
pub const WARN_EVERY: u64 = 10_000;

/// Where a process sends its spans; `Emitter::off()` when telemetry is not configured.
#[derive(Debug)]
pub struct Emitter {
    target: Option<(UnixDatagram, PathBuf)>,
    /// `ADDRESSES`: the envelope may go to the client.
    addresses: bool,
    sent: AtomicU64,
    dropped: AtomicU64,
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

    /// Sends to `path`. The socket is made now; the client need not be there yet.
    pub fn to(path: &Path) -> std::io::Result<Self> {
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Self {
            target: Some((socket, path.to_owned())),
            ..Self::off()
        })
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
        Ok(Self::to(&path)
            .unwrap_or_else(|e| {
                tracing::warn!(socket = %path.display(), "telemetry off: no datagram socket: {e}");
                Self::off()
            })
            .with_addresses(addresses))
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
        let Some((socket, path)) = &self.target else {
            return;
        };
        match socket.send_to(datagram, path) {
            Ok(_) => {
                self.sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if n == 1 || n.is_multiple_of(WARN_EVERY) {
                    tracing::warn!(
                        socket = %path.display(),
                        dropped = n,
                        "telemetry: a span or counters could not go to pepsi-telemetry-client ({e}); dropped, mail goes on"
                    );
                }
            }
        }
    }

    /// Spans handed over so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Spans that found no client, or a client whose socket buffer was full.
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
    use super::*;
    use crate::telemetry::wire::SpanKind;
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

    #[test]
    fn a_span_reaches_a_listening_socket_and_is_dropped_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("telemetry.sock");
        let emitter = Emitter::to(&path).unwrap();
        emitter.emit(&span());
        assert_eq!((emitter.sent(), emitter.dropped()), (0, 1));
        let listener = UnixDatagram::bind(&path).unwrap();
        let mut sent = span();
        sent.error = Some("550 <b@example.org>: unknown".into());
        emitter.emit(&sent);
        assert_eq!((emitter.sent(), emitter.dropped()), (1, 1));
        let mut buf = vec![0u8; crate::telemetry::wire::MAX_DATAGRAM];
        let n = listener.recv(&mut buf).unwrap();
        let got = SpanRecord::decode(&buf[..n]).unwrap();
        // The drop before it rides along; the envelope stays home.
        assert_eq!(got.sender_dropped, 1);
        assert_eq!((got.mail_from, got.rcpt_to.len()), (None, 0));
        assert_eq!(got.error.as_deref(), Some("550 <[address]>: unknown"));
        assert_eq!(got.span_id, sent.span_id);

        let with = Emitter::to(&path).unwrap().with_addresses(true);
        with.emit(&sent);
        let n = listener.recv(&mut buf).unwrap();
        let got = SpanRecord::decode(&buf[..n]).unwrap();
        assert_eq!(got.mail_from.as_deref(), Some("a@example.org"));
        assert_eq!(got.error, sent.error);
    }

    #[test]
    fn a_full_socket_drops_rather_than_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("telemetry.sock");
        let _listener = UnixDatagram::bind(&path).unwrap();
        let emitter = Emitter::to(&path).unwrap();
        // Nobody reads: the receive queue fills and sends fail at once instead of blocking.
        for _ in 0..100_000 {
            emitter.emit(&span());
            if emitter.dropped() > 0 {
                break;
            }
        }
        assert!(emitter.dropped() > 0 && emitter.sent() > 0);
    }
}
