//! The session's byte stream: plain TCP or TLS, an input buffer the session can inspect
//! (STARTTLS must see what was pipelined behind it), and an output buffer flushed only
//! when the client's pipelined commands are used up, which is what makes PIPELINING cheap.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use pepsi_smtp::Reply;

/// The transport under a session.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    /// Only while STARTTLS swaps one for the other.
    Gone,
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Gone => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Gone => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Gone => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::Gone => Poll::Ready(Ok(())),
        }
    }
}

/// Why a session cannot go on reading.
#[derive(Debug)]
pub enum End {
    Closed,
    Timeout,
    /// The session reached MAX_SESSION_TIME.
    Expired,
    Shutdown,
    Io(io::Error),
}

/// A line read from the client.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Text(Vec<u8>),
    /// Longer than allowed; everything up to its CRLF was discarded.
    TooLong,
}

/// Buffered transport.
pub struct Conn {
    pub stream: Stream,
    buf: Vec<u8>,
    pos: usize,
    out: Vec<u8>,
    /// A flush the client does not take within this fails (it never reads).
    write_timeout: Duration,
    /// No read waits past this instant: the session's lifetime.
    deadline: Instant,
}

const READ_CHUNK: usize = 16 * 1024;

impl Conn {
    /// A connection whose writes each get `write_timeout` and whose reads all end by
    /// `lifetime` from now.
    pub fn new(stream: Stream, write_timeout: Duration, lifetime: Duration) -> Conn {
        Conn {
            stream,
            buf: Vec::with_capacity(READ_CHUNK),
            pos: 0,
            out: Vec::with_capacity(1024),
            write_timeout,
            deadline: Instant::now() + lifetime,
        }
    }

    /// True once the session's lifetime is over.
    pub fn expired(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Queues a reply; it goes out at the next flush.
    pub fn reply(&mut self, reply: &Reply) {
        self.out.extend_from_slice(reply.render().as_bytes());
    }

    /// Sends the queued replies; a client that does not take them within the write timeout
    /// gets an error (`TimedOut`), and the session ends.
    pub async fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            let write = async {
                self.stream.write_all(&self.out).await?;
                self.stream.flush().await
            };
            match tokio::time::timeout(self.write_timeout, write).await {
                Ok(r) => r?,
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client did not read a reply within WRITE_TIMEOUT",
                    ));
                }
            }
            self.out.clear();
        }
        Ok(())
    }

    /// Input received but not consumed yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    pub fn consume(&mut self, n: usize) {
        self.pos += n;
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
    }

    /// Drops all buffered input (after STARTTLS, CVE-2011-0411).
    pub fn discard_buffered(&mut self) -> usize {
        let n = self.buf.len() - self.pos;
        self.buf.clear();
        self.pos = 0;
        n
    }

    /// Sends pending replies, then waits for more input.
    pub async fn fill(&mut self, timeout: Duration) -> Result<(), End> {
        self.flush().await.map_err(End::Io)?;
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let start = self.buf.len();
        self.buf.resize(start + READ_CHUNK, 0);
        let now = Instant::now();
        let (until, end) = if now + timeout >= self.deadline {
            (self.deadline, End::Expired)
        } else {
            (now + timeout, End::Timeout)
        };
        let read = tokio::time::timeout_at(until, self.stream.read(&mut self.buf[start..])).await;
        let n = match read {
            Err(_) => {
                self.buf.truncate(start);
                return Err(end);
            }
            Ok(Err(e)) => {
                self.buf.truncate(start);
                return Err(End::Io(e));
            }
            Ok(Ok(n)) => n,
        };
        self.buf.truncate(start + n);
        if n == 0 { Err(End::Closed) } else { Ok(()) }
    }

    /// Reads one CRLF-terminated line of at most `max` octets (CRLF included).
    pub async fn line(&mut self, max: usize, timeout: Duration) -> Result<Line, End> {
        let mut too_long = false;
        loop {
            let pending = self.buffered();
            if let Some(at) = pending.windows(2).position(|w| w == b"\r\n") {
                let line = pending[..at].to_vec();
                self.consume(at + 2);
                return Ok(if too_long || at + 2 > max {
                    Line::TooLong
                } else {
                    Line::Text(line)
                });
            }
            if pending.len() >= max {
                // Keep the last octet: it may be the CR of the CRLF still to come.
                too_long = true;
                let drop = pending.len() - 1;
                self.consume(drop);
            }
            self.fill(timeout).await?;
        }
    }
}
