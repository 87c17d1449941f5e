//! One worker process of a stage pool: spawning it, writing ids to its stdin, and the task
//! that turns its stdout into events for the dispatcher loop.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc::UnboundedSender;

use crate::Event;

/// A message handed to a worker and not yet answered.
#[derive(Debug, Clone)]
pub struct Assigned {
    pub id: i64,
    pub sender: String,
}

#[derive(Debug)]
pub struct Worker {
    pub key: u64,
    pub stage: String,
    pub pid: u32,
    pub child: Child,
    stdin: Option<ChildStdin>,
    /// Ids written and not answered yet, in order; the front one is being processed.
    pub inflight: VecDeque<Assigned>,
    /// When the front message started processing.
    pub head_started: Option<Instant>,
    /// Ids written over the worker's life.
    pub handed: u64,
    /// Status lines read over the worker's life.
    pub answered: u64,
    pub idle_since: Instant,
    /// No more ids: stdin is closed and the worker ends after its last answer.
    pub retiring: bool,
    /// Killed by the dispatcher (a hung message); what it still held never started.
    pub killed: bool,
}

/// What a worker is told through its environment.
#[derive(Debug, Clone, Copy)]
pub struct Inherit {
    /// `PEPSI_HAND_FORWARD=1`.
    pub hand_forward: bool,
    /// The dispatcher's epoch, which the worker's sessions name (fencing).
    pub epoch: i64,
    /// The stage's MAX_RUNTIME, which the worker enforces on itself when no dispatcher does.
    pub pass_limit: std::time::Duration,
}

impl Worker {
    /// Starts `program worker -c <config>`; its stdout feeds `events`, its stderr is ours.
    pub fn spawn(
        key: u64,
        stage: &str,
        program: &Path,
        config: &Path,
        log_level: &str,
        inherit: Inherit,
        events: UnboundedSender<Event>,
    ) -> std::io::Result<Worker> {
        let mut cmd = Command::new(program);
        cmd.env(pepsi_contract::epoch::EPOCH_ENV, inherit.epoch.to_string())
            .env(
                pepsi_contract::epoch::PARENT_ENV,
                std::process::id().to_string(),
            )
            .env(
                pepsi_contract::epoch::PASS_LIMIT_ENV,
                inherit.pass_limit.as_millis().to_string(),
            );
        if inherit.hand_forward {
            cmd.env(pepsi_contract::stage::HAND_FORWARD_ENV, "1");
        } else {
            cmd.env_remove(pepsi_contract::stage::HAND_FORWARD_ENV);
        }
        cmd.arg("worker")
            .arg("-c")
            .arg(config)
            .arg("-L")
            .arg(log_level)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        // A worker must not outlive its dispatcher: a successor would reset the rows it still
        // holds and hand them to another worker while this one could still commit.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let pid = child.id().unwrap_or(0);
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if events.send(Event::Line { worker: key, line }).is_err() {
                    return;
                }
            }
            let _ = events.send(Event::Eof { worker: key });
        });
        Ok(Worker {
            key,
            stage: stage.to_owned(),
            pid,
            child,
            stdin,
            inflight: VecDeque::new(),
            head_started: None,
            handed: 0,
            answered: 0,
            idle_since: Instant::now(),
            retiring: false,
            killed: false,
        })
    }

    /// Writes one id; the worker processes its ids strictly in order.
    pub async fn hand(&mut self, row: Assigned, now: Instant) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "worker is retiring")
        })?;
        stdin.write_all(format!("{}\n", row.id).as_bytes()).await?;
        stdin.flush().await?;
        if self.inflight.is_empty() {
            self.head_started = Some(now);
        }
        self.inflight.push_back(row);
        self.handed += 1;
        Ok(())
    }

    /// Closes stdin: the worker finishes what it holds, then exits.
    pub fn retire(&mut self) {
        self.retiring = true;
        self.stdin = None;
    }
}
