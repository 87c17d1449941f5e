//! The counting path's own Redis connection: a TCP stream one counting worker holds for a
//! batch, writing the batch's transactions in one write and reading their replies itself
//! (`resp`), with no task or channel between the worker and the socket. Lookups, `/counters`
//! reads and Sentinel stay on the `redis` crate's connections (`store`).
//!
//! A connection whose replies fall out of step (an I/O error, a timeout, bytes that are no
//! reply) is never used again: the caller drops it.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::resp::{self, ProtocolError, Reply, TxOutcome, TxReplies};

#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("redis closed the connection")]
    Closed,
    #[error("{0}")]
    Refused(String),
}

/// How much a connection reads at a time.
const READ_CHUNK: usize = 16 * 1024;

pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// `buf[start..]` is read and not yet parsed.
    start: usize,
    out: Vec<u8>,
}

impl Conn {
    /// Connects, authenticates when `password` is set, and checks the node is a master when
    /// `want_master`, all within `timeout`.
    pub async fn open(
        addr: &str,
        password: &str,
        want_master: bool,
        timeout: Duration,
    ) -> Result<Conn, ConnError> {
        let setup = async {
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let mut conn = Conn {
                stream,
                buf: Vec::with_capacity(READ_CHUNK),
                start: 0,
                out: Vec::with_capacity(READ_CHUNK),
            };
            if !password.is_empty() {
                conn.call(&[b"AUTH", password.as_bytes()], |r| match r {
                    Reply::Status(_) => Ok(()),
                    Reply::Error(e) => Err(format!("AUTH: {}", String::from_utf8_lossy(e))),
                    other => Err(format!("AUTH: unexpected reply {other:?}")),
                })
                .await?;
            }
            if want_master {
                conn.call(&[b"ROLE"], |r| match r {
                    Reply::Array(Some(items))
                        if matches!(items.first(), Some(Reply::Bulk(Some(b"master")))) =>
                    {
                        Ok(())
                    }
                    _ => Err(format!("{addr}: sentinel master is not master")),
                })
                .await?;
            }
            Ok::<Conn, ConnError>(conn)
        };
        match tokio::time::timeout(timeout, setup).await {
            Ok(r) => r,
            Err(_) => Err(ConnError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "connecting to {addr}: timeout after {}s",
                    timeout.as_secs_f64()
                ),
            ))),
        }
    }

    /// One command and its reply, judged by `check`.
    async fn call(
        &mut self,
        args: &[&[u8]],
        check: impl FnOnce(&Reply<'_>) -> Result<(), String>,
    ) -> Result<(), ConnError> {
        self.out.clear();
        resp::encode_command(&mut self.out, args);
        self.stream.write_all(&self.out).await?;
        self.next_reply(check).await?.map_err(ConnError::Refused)
    }

    /// Waits for the next whole reply and hands it to `f`.
    async fn next_reply<T>(&mut self, f: impl FnOnce(&Reply<'_>) -> T) -> Result<T, ConnError> {
        loop {
            if let Some((reply, used)) = resp::parse(&self.buf[self.start..])? {
                let t = f(&reply);
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                return Ok(t);
            }
            self.fill().await?;
        }
    }

    async fn fill(&mut self) -> Result<(), ConnError> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        // No reply the connection waits for is this large (`resp::MAX_REPLY` bounds each
        // string; this bounds an array of them).
        if self.buf.len() > 2 * resp::MAX_REPLY {
            return Err(ProtocolError::TooLarge(2 * resp::MAX_REPLY).into());
        }
        // Read into the spare capacity: nothing is zeroed first.
        self.buf.reserve(READ_CHUNK);
        let n = self.stream.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(ConnError::Closed);
        }
        Ok(())
    }

    /// Sends the counting transactions of `batch` (each a request's keys) in one write and
    /// reads their outcomes in order into `got`. On an error `got` holds the outcomes read
    /// before it: the transactions after those were sent and may or may not have run.
    pub async fn count(
        &mut self,
        batch: &[&[&str]],
        ttl_seconds: i64,
        got: &mut Vec<TxOutcome>,
    ) -> Result<(), ConnError> {
        self.out.clear();
        for keys in batch {
            resp::encode_counting_tx(&mut self.out, keys, ttl_seconds);
        }
        self.stream.write_all(&self.out).await?;
        for keys in batch {
            let mut tx = TxReplies::new(keys.len());
            loop {
                if let Some(outcome) = self.next_reply(|r| tx.feed(r)).await? {
                    got.push(outcome);
                    break;
                }
            }
        }
        Ok(())
    }
}
