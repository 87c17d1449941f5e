//! The stage's end of the co-process: starts `pepsi-helper-dot-forward` once and asks it
//! for one account's `.forward` at a time. A reader that dies, answers garbage or does not
//! answer within the timeout is killed and forgotten; the next request starts a new one.

use std::path::PathBuf;
use std::time::Duration;

use pepsi_helper_dot_forward::protocol::{self, Reply};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How the reader is started; a running one is reused while these stay the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperArgs {
    pub program: PathBuf,
    pub min_uid: u32,
}

/// A running reader.
pub struct CoProcess {
    pub args: HelperArgs,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl CoProcess {
    pub fn start(args: HelperArgs) -> Result<CoProcess, String> {
        let mut cmd = Command::new(&args.program);
        cmd.arg("--min-uid")
            .arg(args.min_uid.to_string())
            .args(["-L", "info"]);
        let pipes = pepsi_conf::coprocess::spawn(cmd)?;
        Ok(CoProcess {
            args,
            child: pipes.child,
            stdin: pipes.stdin,
            stdout: pipes.stdout,
        })
    }

    /// One request, one answer. `Err` means the reader is no longer usable.
    pub async fn forward(&mut self, account: &str, timeout: Duration) -> Result<Reply, String> {
        let request = protocol::encode_request(account)?;
        let exchange = async {
            self.stdin.write_all(&request).await?;
            self.stdin.flush().await?;
            // The answer's line, then for `file` its bytes: read them whole, bounded, and
            // let the protocol module parse the lot.
            let mut wire = Vec::new();
            (&mut self.stdout)
                .take(protocol::MAX_ANSWER_LINE as u64)
                .read_until(b'\n', &mut wire)
                .await?;
            if let Some(len) = wire
                .strip_prefix(b"file ")
                .and_then(|r| std::str::from_utf8(r).ok())
                .and_then(|r| r.trim_end().parse::<u64>().ok())
                .filter(|&n| n <= protocol::MAX_FILE)
            {
                let start = wire.len();
                wire.resize(start + len as usize, 0);
                self.stdout.read_exact(&mut wire[start..]).await?;
            }
            Ok::<Vec<u8>, std::io::Error>(wire)
        };
        let wire = match tokio::time::timeout(timeout, exchange).await {
            Err(_) => return Err(format!("no answer within {}s", timeout.as_secs())),
            Ok(Err(e)) => return Err(format!("talking to it: {e}")),
            Ok(Ok(wire)) => wire,
        };
        Reply::read(&mut &wire[..])
    }

    /// Stops the reader now.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}
