//! A worker's standard input and output. The dispatcher gives each worker two pipes; they
//! are read and written on the worker's own thread, through the runtime's epoll, like any
//! socket. `tokio::io::stdin()` and `stdout()` hand every read and write to a thread of the
//! blocking pool instead: two thread hand-offs for each id, which under a light load (one id
//! a round) cost the worker more than its own work (docs/perf.md, "a stage worker's standard input and output").
//!
//! Anything that is not a pipe (a terminal, a file, `/dev/null` when a worker is run by
//! hand) keeps tokio's blocking-pool stdin and stdout, which read and write any file.

use std::os::fd::{AsFd, OwnedFd};

use tokio::io::{AsyncRead, AsyncWrite, BufWriter};
use tokio::net::unix::pipe;

/// Standard input: the pipe itself when it is one.
pub(crate) fn input() -> Box<dyn AsyncRead + Unpin + Send> {
    match own(std::io::stdin().as_fd()).and_then(pipe::Receiver::from_owned_fd) {
        Ok(pipe) => Box::new(pipe),
        Err(e) => {
            tracing::debug!("standard input is not a pipe ({e}): read through a blocking thread");
            Box::new(tokio::io::stdin())
        }
    }
}

/// Standard output: the pipe itself when it is one, buffered, so that the status lines of a
/// round go out in one write when the worker flushes after the round.
pub(crate) fn output() -> Box<dyn AsyncWrite + Unpin + Send> {
    match own(std::io::stdout().as_fd()).and_then(pipe::Sender::from_owned_fd) {
        Ok(pipe) => Box::new(BufWriter::new(pipe)),
        Err(e) => {
            tracing::debug!(
                "standard output is not a pipe ({e}): written through a blocking thread"
            );
            Box::new(tokio::io::stdout())
        }
    }
}

/// A descriptor of our own for `fd`, so that std's handle keeps a valid fd 0 or 1. Both
/// share the open file description, and so its non-blocking flag: nothing else in a worker
/// reads its standard input or writes its standard output.
fn own(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}
