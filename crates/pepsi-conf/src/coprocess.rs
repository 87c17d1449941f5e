//! What a stage and the small helper it keeps as a co-process share, whatever their wire
//! format: the error a request stream can raise, a bounded line reader, and the start of the
//! helper with its stdin and stdout as pipes. Each helper's `protocol` module defines its own
//! messages on top.

use std::io::{self, BufRead, Read};
use std::process::Stdio;

use tokio::io::BufReader;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Why a request could not be read.
#[derive(Debug)]
pub enum ProtocolError {
    Io(io::Error),
    /// The stream does not follow the protocol; the text says where.
    Malformed(String),
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtocolError::Io(e) => write!(f, "reading the request: {e}"),
            ProtocolError::Malformed(s) => write!(f, "{s}"),
        }
    }
}

impl From<io::Error> for ProtocolError {
    fn from(e: io::Error) -> Self {
        ProtocolError::Io(e)
    }
}

/// Reads one line of at most `limit` bytes (LF included), without the LF; `None` at a clean
/// end of input.
pub fn read_line<R: BufRead>(input: &mut R, limit: usize) -> Result<Option<String>, ProtocolError> {
    let mut buf = Vec::new();
    let n = input.take(limit as u64).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        return Err(ProtocolError::Malformed(if n >= limit {
            format!("a line longer than {} bytes", limit - 1)
        } else {
            "the input ended inside a line".into()
        }));
    }
    buf.pop();
    String::from_utf8(buf)
        .map(Some)
        .map_err(|_| ProtocolError::Malformed("a line that is not UTF-8".into()))
}

/// A started helper: the process (killed when dropped), its stdin and its stdout.
pub struct Pipes {
    pub child: Child,
    pub stdin: ChildStdin,
    pub stdout: BufReader<ChildStdout>,
}

/// Starts `cmd` with its stdin and stdout as pipes and its stderr the caller's (the helper
/// logs there); the error names the program.
pub fn spawn(mut cmd: Command) -> Result<Pipes, String> {
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    let stdin = child.stdin.take().ok_or("helper without stdin")?;
    let stdout = BufReader::new(child.stdout.take().ok_or("helper without stdout")?);
    Ok(Pipes {
        child,
        stdin,
        stdout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded_terminated_and_utf8() {
        let e = read_line(&mut "x".repeat(20).as_bytes(), 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("longer than 9 bytes"), "{e}");
        assert_eq!(
            read_line(&mut "123456789\n".as_bytes(), 10)
                .unwrap()
                .as_deref(),
            Some("123456789")
        );
        assert_eq!(read_line(&mut "".as_bytes(), 10).unwrap(), None);
        let e = read_line(&mut "abc".as_bytes(), 10)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ended inside a line"), "{e}");
        let e = read_line(&mut &b"\xff\n"[..], 10).unwrap_err().to_string();
        assert!(e.contains("not UTF-8"), "{e}");
    }
}
