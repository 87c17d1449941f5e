//! The spans' way through the client: the socket task accepts each sending process's
//! connection (at most MAX_CONNECTIONS at once) and reads its frames, each a datagram
//! (`Datagram::decode`, a malformed one counted and dropped; a frame announcing more than a
//! datagram may hold closes its connection). A span gets the privacy rule,
//! its metrics, the drops its sender reports (`senders`) and a place in the queue; a
//! program's counters go to their instruments. The export task sends the queue in batches
//! of BATCH_SIZE, every EXPORT_INTERVAL or as soon as a batch is full.
//!
//! What becomes of a batch the receiver did not take depends on why (`verdict`). When
//! trying again may help (no answer, 401, 403, 408, 429, 5xx) it goes back to the front of
//! the queue and the next try waits longer, doubling up to 30 seconds; the queue stays
//! within MAX_QUEUE all along, dropping (and counting) its oldest spans. When it cannot (400,
//! 413 and the other 4xx: a batch the receiver will never take) it is dropped and counted,
//! so one bad span cannot stop the export; a 413 first has the batch sent once more in two
//! halves, each taken or dropped on its own. Nothing waits on the client: a process hands
//! its span to its connection and goes on, whatever becomes of it here.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::StatusCode;
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::trace::SpanExporter as _;
use pepsi_contract::telemetry::wire::{FRAME_HEADER, frame_len};
use pepsi_contract::telemetry::{Datagram, SpanRecord};
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;

use crate::convert::{admit, span_data};
use crate::health::{Change, Health};
use crate::metrics::{DropReason, Instruments};
use crate::queue::Bounded;
use crate::senders::{MAX_SENDERS, SenderDrops};
use crate::transport::{Failure, Transport};

/// The longest wait between two tries while the receiver does not take the spans.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The shortest time between two warnings that the queue overflows.
const OVERFLOW_WARNING: Duration = Duration::from_secs(60);

/// The spans waiting for export, shared by the two tasks.
pub struct SpanQueue {
    queue: Mutex<Bounded<SpanRecord>>,
    batch_size: usize,
    /// Woken when a whole batch is waiting.
    batch_ready: Notify,
    /// Spans dropped for want of room since the last export that got through.
    dropped_meanwhile: AtomicU64,
    /// When the log last said the queue overflows.
    warned: Mutex<Option<Instant>>,
}

impl SpanQueue {
    pub fn new(max: usize, batch_size: usize) -> SpanQueue {
        SpanQueue {
            queue: Mutex::new(Bounded::new(max)),
            batch_size,
            batch_ready: Notify::new(),
            dropped_meanwhile: AtomicU64::new(0),
            warned: Mutex::new(None),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bounded<SpanRecord>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Queues `rec`; returns how many of the oldest spans went for it.
    fn push(&self, rec: SpanRecord) -> usize {
        let (dropped, full_batch) = {
            let mut q = self.lock();
            let dropped = q.push(rec);
            (dropped, q.len() >= self.batch_size)
        };
        if full_batch {
            self.batch_ready.notify_one();
        }
        dropped
    }

    fn take(&self) -> Vec<SpanRecord> {
        self.lock().take(self.batch_size)
    }

    fn requeue(&self, batch: Vec<SpanRecord>) -> usize {
        self.lock().requeue_front(batch)
    }

    /// Counts `n` spans dropped for want of room, saying so in the log when the queue
    /// starts overflowing (and at most once a minute while it goes on).
    fn overflowed(&self, n: usize, instruments: &Instruments, max: usize) {
        if n == 0 {
            return;
        }
        instruments.dropped(DropReason::QueueFull, n as u64);
        self.dropped_meanwhile
            .fetch_add(n as u64, Ordering::Relaxed);
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        if warned.is_none_or(|at| at.elapsed() >= OVERFLOW_WARNING) {
            *warned = Some(Instant::now());
            tracing::warn!(
                "the span queue is full (MAX_QUEUE = {max}): dropping its oldest spans (pepsi.telemetry.dropped_spans, reason queue_full)"
            );
        }
    }
}

/// What both tasks need.
pub struct Spans {
    pub queue: Arc<SpanQueue>,
    pub instruments: Arc<Instruments>,
    pub addresses: bool,
    pub max_queue: usize,
}

/// What the connections' readers share: where a datagram goes, and what the log was told.
struct Intake {
    spans: Arc<Spans>,
    senders: Mutex<SenderDrops>,
    malformed_seen: AtomicBool,
    refused_seen: AtomicBool,
}

impl Intake {
    /// One datagram read off a connection: a span is queued, counters go to their
    /// instruments, anything else is counted malformed.
    fn take(&self, datagram: &[u8]) {
        match Datagram::decode(datagram) {
            Ok(Datagram::Span(rec)) => {
                let rec = admit(*rec, self.spans.addresses);
                let lost = self
                    .senders
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .report(rec.pid, &rec.program, rec.sender_dropped);
                let spans = &self.spans;
                spans.instruments.dropped(DropReason::Sender, lost);
                spans.instruments.record(&rec);
                let dropped = spans.queue.push(rec);
                spans
                    .queue
                    .overflowed(dropped, &spans.instruments, spans.max_queue);
            }
            Ok(Datagram::Counters(rec)) => self.spans.instruments.add_counters(&rec),
            Err(e) => self.malformed(&e),
        }
    }

    /// Counts one malformed datagram, saying so in the log the first time.
    fn malformed(&self, e: &dyn std::fmt::Display) {
        self.spans.instruments.dropped(DropReason::Malformed, 1);
        if self.malformed_seen.swap(true, Ordering::Relaxed) {
            tracing::debug!("dropped a datagram: {e}");
        } else {
            tracing::warn!(
                "dropped a datagram: {e} (further ones are counted in pepsi.telemetry.dropped_spans, reason malformed)"
            );
        }
    }
}

/// The read buffer of one sender's connection: a few dozen spans a read.
const READ_BUFFER: usize = 16 * 1024;

/// Takes the senders' connections on `listener` until the task is aborted (its
/// connections' readers with it): at most `max_connections` at once, each read by a task of
/// its own, frame by frame.
pub async fn receive(listener: UnixListener, spans: Arc<Spans>, max_connections: usize) {
    let intake = Arc::new(Intake {
        spans,
        senders: Mutex::new(SenderDrops::new(MAX_SENDERS)),
        malformed_seen: AtomicBool::new(false),
        refused_seen: AtomicBool::new(false),
    });
    let room = Arc::new(Semaphore::new(max_connections));
    let mut readers = JoinSet::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("cannot accept on the span socket: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            Some(_) = readers.join_next() => continue,
        };
        let Ok(seat) = room.clone().try_acquire_owned() else {
            if intake.refused_seen.swap(true, Ordering::Relaxed) {
                tracing::debug!(
                    "closed a sender's connection: MAX_CONNECTIONS = {max_connections} are open"
                );
            } else {
                tracing::warn!(
                    "closed a sender's connection: MAX_CONNECTIONS = {max_connections} are open; its spans are dropped at the sender (said once)"
                );
            }
            continue;
        };
        let intake = intake.clone();
        readers.spawn(async move {
            let mut stream = BufReader::with_capacity(READ_BUFFER, stream);
            read_frames(&mut stream, &intake).await;
            // The seat is free before the sender sees its connection close.
            drop(seat);
            drop(stream);
        });
    }
}

/// Reads one sender's frames until it closes, cuts a frame short or announces one over the
/// limit (after which nothing more of it can be read).
async fn read_frames(stream: &mut BufReader<UnixStream>, intake: &Intake) {
    let mut header = [0u8; FRAME_HEADER];
    let mut datagram = Vec::new();
    loop {
        if let Err(e) = stream.read_exact(&mut header).await {
            if e.kind() != std::io::ErrorKind::UnexpectedEof {
                tracing::debug!("a sender's connection failed: {e}");
            }
            return;
        }
        let len = match frame_len(header) {
            Ok(len) => len,
            Err(e) => {
                intake.malformed(&format_args!("{e}; closed the sender's connection"));
                return;
            }
        };
        datagram.resize(len, 0);
        if let Err(e) = stream.read_exact(&mut datagram).await {
            tracing::debug!("a sender's connection ended inside a frame: {e}");
            return;
        }
        intake.take(&datagram);
    }
}

/// What to do with a batch the receiver did not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep it and try again later: the receiver may take it then (it was not reached, did
    /// not accept the token yet, was busy or broken).
    Retry,
    /// Drop it: the receiver will never take it as it is.
    Drop,
    /// Too large for the receiver: send it once more in two halves.
    Split,
}

/// The verdict on an export the receiver answered with `status`, or did not answer (none).
/// Only a 4xx the client cannot cure by waiting drops a batch: 401 and 403 (the token, an
/// operator's fix away), 408 and 429 (a slow or busy moment) are tried again, like every
/// 5xx, a missing answer and anything else unexpected.
pub fn verdict(status: Option<StatusCode>) -> Verdict {
    match status {
        Some(StatusCode::PAYLOAD_TOO_LARGE) => Verdict::Split,
        Some(
            StatusCode::UNAUTHORIZED
            | StatusCode::FORBIDDEN
            | StatusCode::REQUEST_TIMEOUT
            | StatusCode::TOO_MANY_REQUESTS,
        ) => Verdict::Retry,
        Some(s) if s.is_client_error() => Verdict::Drop,
        _ => Verdict::Retry,
    }
}

/// How long to wait after `failures` failed exports in a row: EXPORT_INTERVAL, doubled
/// for each further failure, at most [`MAX_BACKOFF`] (or EXPORT_INTERVAL when that is
/// longer).
pub fn backoff(interval: Duration, failures: u32) -> Duration {
    let cap = MAX_BACKOFF.max(interval);
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    interval.saturating_mul(factor).min(cap)
}

/// The span exporter and what its results are told to.
pub struct Export {
    pub exporter: opentelemetry_otlp::SpanExporter,
    pub transport: Transport,
    pub endpoint: String,
    pub interval: Duration,
    pub scope: InstrumentationScope,
    health: Health,
    /// The statuses a dropped batch was logged for already (none: no answer).
    rejections_logged: Mutex<BTreeSet<Option<u16>>>,
}

/// What became of one request the receiver did not take: what to do with it, the status
/// (none without an answer) and the story for the log.
type Refusal = (Verdict, Option<StatusCode>, String);

impl Export {
    pub fn new(
        exporter: opentelemetry_otlp::SpanExporter,
        transport: Transport,
        endpoint: String,
        interval: Duration,
        scope: InstrumentationScope,
    ) -> Export {
        Export {
            exporter,
            transport,
            endpoint,
            interval,
            scope,
            health: Health::default(),
            rejections_logged: Mutex::new(BTreeSet::new()),
        }
    }

    /// One request with `batch`: taken, or why not. A batch the exporter refused to send
    /// itself (it could not encode it, or it is over the exporter's own size limit) never
    /// reached the transport, and no retry changes it: it is judged as too large.
    async fn attempt(&self, batch: &[SpanRecord]) -> Result<(), Refusal> {
        let data = batch.iter().map(|r| span_data(r, &self.scope)).collect();
        // A failure left from a request whose result was not looked at is no news of this one.
        let _ = self.transport.take_failure();
        match self.exporter.export(data).await {
            Ok(()) => Ok(()),
            Err(e) => Err(match self.transport.take_failure() {
                Some(Failure { status, text }) => (verdict(status), status, text),
                None => (Verdict::Split, None, e.to_string()),
            }),
        }
    }

    /// Counts `n` spans taken, and says so when exports work again.
    fn taken(&self, spans: &Spans, n: usize) {
        spans.instruments.exported(n as u64);
        if let Change::Recovered { failures } = self.health.succeeded() {
            let dropped = spans.queue.dropped_meanwhile.swap(0, Ordering::Relaxed);
            tracing::info!(
                "spans reach {} again, after {failures} failed export(s); {dropped} span(s) dropped meanwhile",
                self.endpoint
            );
        }
    }

    /// Drops a batch the receiver will not take, counted; logged once per status.
    fn reject(&self, spans: &Spans, n: usize, status: Option<StatusCode>, why: &str) {
        spans.instruments.dropped(DropReason::Rejected, n as u64);
        let first = self
            .rejections_logged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(status.map(|s| s.as_u16()));
        if first {
            tracing::warn!(
                "span export to {}: {why}; dropped {n} span(s) that sending again would not help (pepsi.telemetry.dropped_spans, reason rejected; said once for this answer)",
                self.endpoint
            );
        } else {
            tracing::debug!(
                "span export to {}: {why}; dropped {n} span(s)",
                self.endpoint
            );
        }
    }

    /// Puts a batch that may get through later back at the front of the queue.
    fn keep(&self, spans: &Spans, batch: Vec<SpanRecord>, why: &str) {
        let dropped = spans.queue.requeue(batch);
        spans
            .queue
            .overflowed(dropped, &spans.instruments, spans.max_queue);
        if self.health.failed() == Change::Failing {
            tracing::warn!(
                "span export to {} failed: {why}; keeping at most MAX_QUEUE = {} spans and trying again, backing off up to {}s, quietly until it works",
                self.endpoint,
                spans.max_queue,
                MAX_BACKOFF.as_secs()
            );
        } else {
            tracing::debug!("span export to {} failed again: {why}", self.endpoint);
        }
    }

    /// Sends one batch: taken, dropped for good, or back to the queue (`verdict`); a batch
    /// too large goes once more in two halves, each taken, dropped or kept on its own.
    /// Returns whether to go on sending: false when some of it went back to the queue.
    async fn send(&self, spans: &Spans, batch: Vec<SpanRecord>) -> bool {
        let Err((verdict, status, why)) = self.attempt(&batch).await else {
            self.taken(spans, batch.len());
            return true;
        };
        match verdict {
            Verdict::Retry => {
                self.keep(spans, batch, &why);
                false
            }
            Verdict::Split if batch.len() > 1 => {
                tracing::debug!(
                    "span export to {}: {why}; sending the {} spans again in two halves",
                    self.endpoint,
                    batch.len()
                );
                let mut first = batch;
                let second = first.split_off(first.len() / 2);
                let mut halves = [first, second].into_iter();
                while let Some(half) = halves.next() {
                    match self.attempt(&half).await {
                        Ok(()) => self.taken(spans, half.len()),
                        Err((Verdict::Retry, _, why)) => {
                            let rest = half.into_iter().chain(halves.flatten()).collect();
                            self.keep(spans, rest, &why);
                            return false;
                        }
                        Err((_, status, why)) => self.reject(spans, half.len(), status, &why),
                    }
                }
                true
            }
            Verdict::Split | Verdict::Drop => {
                self.reject(spans, batch.len(), status, &why);
                true
            }
        }
    }

    /// Sends what is queued: whole batches while there are, then what is left. Stops at
    /// the first failure; returns whether everything got through.
    async fn drain(&self, spans: &Spans) -> bool {
        loop {
            let batch = spans.queue.take();
            if batch.is_empty() {
                return true;
            }
            let whole = batch.len() >= spans.queue.batch_size;
            if !self.send(spans, batch).await {
                return false;
            }
            if !whole {
                return true;
            }
        }
    }

    /// Exports until `stop` turns true, then once more what is queued (within `last`).
    pub async fn run(&self, spans: Arc<Spans>, mut stop: watch::Receiver<bool>, last: Duration) {
        let mut wait = self.interval;
        loop {
            let failing = self.health.failures() > 0;
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = tokio::time::sleep(wait) => {}
                // A full batch goes at once, but not while backing off.
                _ = spans.queue.batch_ready.notified(), if !failing => {}
            }
            wait = if self.drain(&spans).await {
                self.interval
            } else {
                let failures = u32::try_from(self.health.failures()).unwrap_or(u32::MAX);
                backoff(self.interval, failures)
            };
        }
        if !spans.queue.is_empty()
            && tokio::time::timeout(last, self.drain(&spans))
                .await
                .is_err()
        {
            tracing::warn!(
                "stopping with {} span(s) not exported: the receiver did not take them in time",
                spans.queue.len()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_to_its_cap() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let cases = [
            (s(2), 1, s(2)),
            (s(2), 2, s(4)),
            (s(2), 4, s(16)),
            (s(2), 5, s(30)),
            (s(2), 500, s(30)),
            (ms(200), 1, ms(200)),
            (ms(200), 3, ms(800)),
            (ms(200), 9, s(30)),
            (s(60), 1, s(60)),
            (s(60), 3, s(60)),
            (s(2), 0, s(2)),
        ];
        for (interval, failures, want) in cases {
            assert_eq!(backoff(interval, failures), want, "{interval:?} {failures}");
        }
    }

    #[test]
    fn only_what_waiting_cannot_cure_drops_a_batch() {
        use Verdict::*;
        let cases = [
            (None, Retry),
            (Some(400), Drop),
            (Some(401), Retry),
            (Some(403), Retry),
            (Some(404), Drop),
            (Some(405), Drop),
            (Some(408), Retry),
            (Some(413), Split),
            (Some(415), Drop),
            (Some(422), Drop),
            (Some(429), Retry),
            (Some(500), Retry),
            (Some(502), Retry),
            (Some(503), Retry),
            (Some(302), Retry),
        ];
        for (status, want) in cases {
            let status = status.map(|s| StatusCode::from_u16(s).unwrap());
            assert_eq!(verdict(status), want, "{status:?}");
        }
    }
}
