//! The stage's end (`pepsi-stage-auto-pay`): runs the helper for one payment, writes the
//! request, reads the one outcome line (bounded) and enforces a deadline. The helper's own
//! code never runs this.
//!
//! The helper becomes the paying user before it runs the wallet, and from then on its
//! caller may no longer signal it; it stops the wallet itself after its TIMEOUT and answers
//! `failed`. The caller's deadline should therefore be longer than that TIMEOUT (ten seconds
//! more is plenty); on expiry the helper is killed where that is still allowed and left
//! otherwise, and the error is temporary either way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Command;

use crate::protocol::{MAX_OUTCOME_LINE, Outcome, Request};

/// Why no outcome was had. Only [`ClientError::Invalid`] is permanent: the same request
/// would be refused again. The others may pass on a later try.
#[derive(Debug)]
pub enum ClientError {
    /// The request does not pass [`Request::check`]; the helper was not started.
    Invalid(String),
    /// The helper could not be started.
    Spawn {
        program: PathBuf,
        error: std::io::Error,
    },
    /// No answer within the deadline; the helper was stopped (where still allowed).
    Timeout(Duration),
    /// The helper ended without an answer (a start-up error, a crash); its stderr is the
    /// caller's.
    Crashed(String),
    /// An answer that is not an outcome, or talking to the helper failed.
    Unreadable(String),
}

impl ClientError {
    /// True for a failure that may pass on a later try.
    pub fn is_temporary(&self) -> bool {
        !matches!(self, ClientError::Invalid(_))
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Invalid(e) => write!(f, "invalid payment request: {e}"),
            ClientError::Spawn { program, error } => {
                write!(f, "cannot start {}: {error}", program.display())
            }
            ClientError::Timeout(t) => {
                write!(f, "the payer gave no answer within {}s", t.as_secs())
            }
            ClientError::Crashed(e) => write!(f, "the payer ended without an answer: {e}"),
            ClientError::Unreadable(e) => write!(f, "the payer's answer: {e}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// Runs `helper` for `request` and returns its outcome; `timeout` bounds the whole run.
pub async fn pay(
    helper: &Path,
    request: &Request,
    timeout: Duration,
) -> Result<Outcome, ClientError> {
    request.check().map_err(ClientError::Invalid)?;
    let mut child = Command::new(helper)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|error| ClientError::Spawn {
            program: helper.to_owned(),
            error,
        })?;
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(ClientError::Unreadable("no pipes to the payer".into()));
    };
    let exchange = async {
        // A helper that refuses at start closes its input: its status says more than EPIPE.
        let wrote = stdin.write_all(request.to_line().as_bytes()).await;
        drop(stdin);
        let mut line = Vec::new();
        let mut stdout = tokio::io::BufReader::new(stdout);
        (&mut stdout)
            .take(MAX_OUTCOME_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|e| ClientError::Unreadable(format!("reading: {e}")))?;
        let status = child
            .wait()
            .await
            .map_err(|e| ClientError::Unreadable(format!("waiting: {e}")))?;
        if line.is_empty() {
            let why = match wrote {
                Err(e) => format!("{status}; writing the request: {e}"),
                Ok(()) => status.to_string(),
            };
            return Err(ClientError::Crashed(why));
        }
        if line.last() != Some(&b'\n') {
            return Err(ClientError::Unreadable(if line.len() > MAX_OUTCOME_LINE {
                format!("a line longer than {} bytes", MAX_OUTCOME_LINE - 1)
            } else {
                format!("the line ended unterminated ({status})")
            }));
        }
        let text = String::from_utf8(line)
            .map_err(|_| ClientError::Unreadable("a line that is not UTF-8".into()))?;
        Outcome::parse(&text).map_err(ClientError::Unreadable)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => {
            // Refused (EPERM) once the helper is the user's: it is then left to its TIMEOUT.
            let _ = child.start_kill();
            Err(ClientError::Timeout(timeout))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn request() -> Request {
        Request {
            login: "alice@example.org".into(),
            uri: "taler://pay/h/o-1/".into(),
            amount: "KUDOS:1".into(),
        }
    }

    /// A script standing in for the helper, to drive the client's cases.
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[tokio::test]
    async fn the_client_tells_outcomes_from_temporary_and_permanent_errors() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let t = Duration::from_secs(10);
        let echo = script(
            d,
            "echo",
            "read line; [ \"$line\" = 'pay alice@example.org KUDOS:1 taler://pay/h/o-1/' ] && echo paid || echo \"refused got $line\"",
        );
        assert_eq!(pay(&echo, &request(), t).await.unwrap(), Outcome::Paid);
        let failed = script(
            d,
            "failed",
            "read line; echo 'failed wallet exited 1: no money'",
        );
        assert_eq!(
            pay(&failed, &request(), t).await.unwrap(),
            Outcome::Failed("wallet exited 1: no money".into())
        );
        let cases: Vec<(PathBuf, Duration, &str, bool)> = vec![
            (d.join("missing"), t, "cannot start", true),
            (script(d, "exit", "exit 1"), t, "without an answer", true),
            (
                script(d, "garbage", "read line; echo ok"),
                t,
                "unexpected outcome",
                true,
            ),
            (
                script(
                    d,
                    "long",
                    "read line; head -c 5000 /dev/zero | tr '\\0' x; echo",
                ),
                t,
                "longer than",
                true,
            ),
            (
                script(d, "partial", "read line; printf paid"),
                t,
                "unterminated",
                true,
            ),
            (
                script(d, "hang", "read line; exec sleep 30"),
                Duration::from_millis(300),
                "no answer within",
                true,
            ),
        ];
        for (program, timeout, want, temporary) in cases {
            let started = std::time::Instant::now();
            let e = pay(&program, &request(), timeout).await.unwrap_err();
            assert!(started.elapsed() < Duration::from_secs(5), "{program:?}");
            assert!(e.to_string().contains(want), "{program:?}: {e}");
            assert_eq!(e.is_temporary(), temporary, "{program:?}: {e}");
        }
        let mut bad = request();
        bad.uri = "https://elsewhere/".into();
        let e = pay(&echo, &bad, t).await.unwrap_err();
        assert!(
            matches!(e, ClientError::Invalid(_)) && !e.is_temporary(),
            "{e}"
        );
    }
}
