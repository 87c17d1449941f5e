//! The callers' end of the co-process (`pepsi-stage-relay-to-maildir`, `pepsi-quota
//! recalc`): starts the writer once, sends it one request per recipient and reads the reply
//! line, and asks it to sync the directories written since the last sync before the stage's
//! worker commits. A writer that dies, answers garbage or does not answer within the timeout
//! is killed and forgotten; the next request starts a new one. Both ends of the protocol live
//! in this crate; the writer's own code never runs this.

use std::time::Duration;

pub use pepsi_conf::mailbox::WriterArgs;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::protocol::{DirSync, Reply, Request, SYNC_LINE, UsageRequest};

/// A running writer.
pub struct CoProcess {
    pub args: WriterArgs,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// A `dir-sync later` delivery was answered `ok` since the last sync.
    pub unsynced: bool,
}

impl CoProcess {
    pub fn start(args: WriterArgs) -> Result<CoProcess, String> {
        let mut cmd = Command::new(&args.program);
        cmd.arg("--root")
            .arg(&args.root)
            .args(["-L", &args.log_level]);
        if args.create {
            cmd.arg("--create");
        }
        if args.allow_root_owner {
            cmd.arg("--allow-root-owner");
        }
        if let Some(n) = args.key_index_dirs {
            cmd.arg("--key-index-dirs").arg(n.to_string());
        }
        let pipes = pepsi_conf::coprocess::spawn(cmd)?;
        Ok(CoProcess {
            args,
            child: pipes.child,
            stdin: pipes.stdin,
            stdout: pipes.stdout,
            unsynced: false,
        })
    }

    /// One request, one reply. `Err` means the helper is no longer usable.
    pub async fn deliver(&mut self, req: &Request, timeout: Duration) -> Result<Reply, String> {
        let head = req.encode_head()?;
        let reply = self.exchange(&[&head, &req.message], timeout).await?;
        if req.dir_sync == DirSync::Later && matches!(reply, Reply::Ok(_) | Reply::Stored { .. }) {
            self.unsynced = true;
        }
        Ok(reply)
    }

    /// Asks for a mailbox's usage (`usage`). `Err` means the helper is no longer usable.
    pub async fn usage(&mut self, req: &UsageRequest, timeout: Duration) -> Result<Reply, String> {
        let line = req.encode()?;
        self.exchange(&[&line], timeout).await
    }

    /// Syncs the directories of the `dir-sync later` deliveries since the last sync. `Err`
    /// means the helper is no longer usable; a `temp` reply names the directory that failed.
    pub async fn sync(&mut self, timeout: Duration) -> Result<Reply, String> {
        let reply = self.exchange(&[SYNC_LINE], timeout).await?;
        self.unsynced = false;
        Ok(reply)
    }

    async fn exchange(&mut self, parts: &[&[u8]], timeout: Duration) -> Result<Reply, String> {
        let exchange = async {
            for part in parts {
                self.stdin.write_all(part).await?;
            }
            self.stdin.flush().await?;
            let mut line = String::new();
            self.stdout.read_line(&mut line).await?;
            Ok::<String, std::io::Error>(line)
        };
        let line = match tokio::time::timeout(timeout, exchange).await {
            Err(_) => return Err(format!("no answer within {}s", timeout.as_secs())),
            Ok(Err(e)) => return Err(format!("talking to it: {e}")),
            Ok(Ok(line)) if line.is_empty() => return Err("it exited".into()),
            Ok(Ok(line)) => line,
        };
        Reply::parse(&line)
    }

    /// Stops the helper now (it may be stuck in a write).
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}
