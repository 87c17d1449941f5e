//! The chaos acceptance test (issue 34): the whole system on the shipped graph (real
//! `pepsi-ingress`, `pepsi-dispatch`, the stage programs and `pepsi-helper-maildir-writer`)
//! over a private PostgreSQL server of the test's own, fed by concurrent SMTP clients over
//! real TCP while the test kills things: `kill -9` of a stage worker, of the Maildir writer,
//! of the dispatcher (started again as systemd's `Restart=on-failure` would), and an
//! immediate PostgreSQL restart (`pg_ctl stop -m immediate`, then start). Once the queue is
//! empty, every message a client got a 250 for is in its Maildirs exactly once; a second
//! copy is allowed only for a message the client sent again after an attempt whose end of
//! data got no 250 (no reply at all, or a 4xx: the ingress could not tell whether its commit
//! landed, docs/ingress.md `ADMISSION_TIMEOUT`). `pepsi-failure-bouncer` runs beside them as
//! `make run` runs it (with a short GRACE): a row a killed worker held alone ends `failed` by
//! design and the bouncer retries it; no operator acts, and no row fails for any other reason
//! (a PostgreSQL restart fails none by itself).
//!
//! The size comes from `PEPSI_CHAOS_MESSAGES` when set (`bench/chaos/run.sh` runs a larger
//! one), else 5,000 messages.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use pepsi_testkit::TestDb;
use pepsi_testkit::pg_cluster::{PgCluster, Replication};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

use crate::support::system::{Proc, System, children, cmdline};

/// Messages sent when `PEPSI_CHAOS_MESSAGES` does not say.
const MESSAGES: u64 = 5_000;
/// Concurrent SMTP clients.
const CLIENTS: u64 = 4;
/// Every fifth message goes to carol as well as alice: one delivery pass, two Maildirs.
const SECOND_RECIPIENT_EVERY: u64 = 5;
/// The ingress's ADMISSION_TIMEOUT here: a client waits this long at most for a 451 while
/// PostgreSQL is down.
const ADMISSION: Duration = Duration::from_secs(3);
/// What a client waits for any reply before it counts the attempt as lost.
const REPLY_LIMIT: Duration = Duration::from_secs(60);
/// Safety bounds (never asserted as performance): sending, then draining the queue.
const SEND_LIMIT: Duration = Duration::from_secs(40 * 60);
const DRAIN_LIMIT: Duration = Duration::from_secs(20 * 60);
/// systemd's RestartSec in debian/systemd/pepsi-dispatch.service.
const RESTART_SEC: Duration = Duration::from_secs(2);

/// The events, in the order they are injected, spread over the run (sending and draining).
const EVENTS: [Kind; 12] = [
    Kind::DeliveryWorker,
    Kind::Writer,
    Kind::Dispatcher,
    Kind::Postgres,
    Kind::OtherWorker,
    Kind::Writer,
    Kind::DeliveryWorker,
    Kind::Dispatcher,
    Kind::Postgres,
    Kind::Writer,
    Kind::DeliveryWorker,
    Kind::Writer,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// kill -9 of a `pepsi-stage-relay-to-maildir` worker.
    DeliveryWorker,
    /// kill -9 of a worker of another stage.
    OtherWorker,
    /// kill -9 of a `pepsi-helper-maildir-writer`.
    Writer,
    /// kill -9 of the dispatcher, started again after RestartSec.
    Dispatcher,
    /// `pg_ctl stop -m immediate`, then start.
    Postgres,
}

/// How one SMTP attempt for a message ended.
#[derive(Clone, Debug)]
enum End {
    /// 250 at the end of data, with the queue id.
    Accepted(i64),
    /// Refused (with this code) or the connection lost (None) before the end of data:
    /// nothing was stored.
    Before(Option<u16>, String),
    /// A 4xx/5xx reply to the end of data: whether the commit landed is unknown to the
    /// client (ADMISSION_TIMEOUT, a commit whose answer the ingress lost).
    RefusedAtDot(u16, String),
    /// No reply to the end of data (connection lost, or none within REPLY_LIMIT).
    LostAtDot(String),
}

impl End {
    /// The attempt may have stored the message.
    fn may_have_stored(&self) -> bool {
        !matches!(self, End::Before(..))
    }

    /// What a refused or lost attempt was told, without its long numbers (ids, times), to
    /// group the refusals in the summary.
    fn reason(&self) -> Option<String> {
        let text = match self {
            End::Accepted(_) => return None,
            End::Before(_, text) => format!("before the end of data: {text}"),
            End::RefusedAtDot(code, text) => format!("at the end of data, {code}: {text}"),
            End::LostAtDot(text) => format!("at the end of data, lost: {text}"),
        };
        // Runs of 4 or more digits (ids, ports, times) become N; reply codes stay.
        let mut out = String::new();
        let mut digits = String::new();
        for c in text.chars().chain(std::iter::once(' ')) {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            out.push_str(if digits.len() >= 4 { "N" } else { &digits });
            digits.clear();
            out.push(c);
        }
        Some(out.trim_end().chars().take(160).collect())
    }

    /// A 5xx: the client gives the message up.
    fn permanent(&self) -> bool {
        matches!(self, End::Before(Some(code), _) | End::RefusedAtDot(code, _) if *code >= 500)
    }
}

/// The messages' numbers, the attempts of each and the events, shared by the tasks.
#[derive(Default)]
struct Ledger {
    attempts: Mutex<BTreeMap<u64, Vec<End>>>,
    accepted: AtomicU64,
    done: AtomicU64,
}

fn message_count() -> u64 {
    std::env::var("PEPSI_CHAOS_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(MESSAGES)
}

fn recipients(n: u64) -> Vec<&'static str> {
    if n.is_multiple_of(SECOND_RECIPIENT_EVERY) {
        vec!["alice@example.test", "carol@example.test"]
    } else {
        vec!["alice@example.test"]
    }
}

fn message(n: u64) -> String {
    let to = recipients(n).join(", ");
    format!(
        "From: bob@example.test\r\nTo: {to}\r\nSubject: chaos {n}\r\nX-Chaos-Id: {n}\r\n\
         Message-ID: <chaos-{n}@example.test>\r\n\r\nchaos message {n}\r\n.. a dot-stuffed line\r\n"
    )
}

/// One reply (code, text); Err when the connection ended or nothing came within the limit.
async fn reply(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Result<(u16, String), String> {
    let mut text = String::new();
    loop {
        let mut line = String::new();
        match tokio::time::timeout(REPLY_LIMIT, r.read_line(&mut line)).await {
            Err(_) => return Err(format!("no reply within {REPLY_LIMIT:?}")),
            Ok(Err(e)) => return Err(format!("reading: {e}")),
            Ok(Ok(0)) => return Err("connection closed".into()),
            Ok(Ok(_)) => {}
        }
        text.push_str(&line);
        let code = line
            .get(..3)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("not a reply line: {line:?}"))?;
        if line.as_bytes().get(3) != Some(&b'-') {
            return Ok((code, text.trim_end().to_owned()));
        }
    }
}

/// One transaction for message `n`.
async fn attempt(port: u16, n: u64) -> End {
    let stream = match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(s) => s,
        Err(e) => return End::Before(None, format!("connect: {e}")),
    };
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    match reply(&mut r).await {
        Ok((220, _)) => {}
        Ok((code, text)) => return End::Before(Some(code), format!("greeting: {text}")),
        Err(e) => return End::Before(None, format!("greeting: {e}")),
    }
    let mut commands = vec![
        ("EHLO client.example.test".to_owned(), 250),
        ("MAIL FROM:<bob@example.test>".to_owned(), 250),
    ];
    for rcpt in recipients(n) {
        commands.push((format!("RCPT TO:<{rcpt}>"), 250));
    }
    commands.push(("DATA".to_owned(), 354));
    for (cmd, want) in commands {
        if let Err(e) = w.write_all(format!("{cmd}\r\n").as_bytes()).await {
            return End::Before(None, format!("{cmd}: {e}"));
        }
        match reply(&mut r).await {
            Ok((code, _)) if code == want => {}
            Ok((code, text)) => return End::Before(Some(code), format!("{cmd}: {text}")),
            Err(e) => return End::Before(None, format!("{cmd}: {e}")),
        }
    }
    // The message (already dot-stuffed) and its end in one write.
    let data = format!("{}.\r\n", message(n));
    if let Err(e) = w.write_all(data.as_bytes()).await {
        return End::LostAtDot(format!("writing the data: {e}"));
    }
    let end = match reply(&mut r).await {
        Ok((250, text)) => {
            let id = text
                .rsplit(' ')
                .next()
                .and_then(|id| id.parse().ok())
                .unwrap_or_else(|| panic!("no queue id in {text:?}"));
            End::Accepted(id)
        }
        Ok((code, text)) => End::RefusedAtDot(code, text),
        Err(e) => End::LostAtDot(e),
    };
    let _ = w.write_all(b"QUIT\r\n").await;
    end
}

/// A client: sends every CLIENTS-th message, each again until it gets a 250 (a 5xx ends it).
async fn client(port: u16, first: u64, total: u64, ledger: Arc<Ledger>) {
    let until = Instant::now() + SEND_LIMIT;
    for n in (first..total).step_by(CLIENTS as usize) {
        loop {
            let end = attempt(port, n).await;
            let again = !matches!(end, End::Accepted(_)) && !end.permanent();
            if let End::Accepted(_) = end {
                ledger.accepted.fetch_add(1, Ordering::Relaxed);
            }
            ledger
                .attempts
                .lock()
                .unwrap()
                .entry(n)
                .or_default()
                .push(end);
            if !again {
                break;
            }
            assert!(
                Instant::now() < until,
                "message {n} still not accepted after {SEND_LIMIT:?}"
            );
            // A refused client waits a little before its retry, as MTAs do.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    ledger.done.fetch_add(1, Ordering::Release);
}

/// Files in `dir` (none when it does not exist).
fn files(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(d) => d.filter_map(|e| e.ok()).map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    }
}

/// The X-Chaos-Id of a stored message.
fn marker(message: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(message);
    text.lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("X-Chaos-Id: "))
        .and_then(|n| n.trim().parse().ok())
}

/// Every delivered copy in `user`'s Maildir (new/ and cur/): marker → the copies' (file,
/// modification time). Files without a marker are listed under u64::MAX.
fn delivered(sys: &System, user: &str) -> BTreeMap<u64, Vec<(PathBuf, SystemTime)>> {
    let md = sys.maildir(user);
    let mut seen: BTreeMap<u64, Vec<(PathBuf, SystemTime)>> = BTreeMap::new();
    for path in files(&md.join("new"))
        .into_iter()
        .chain(files(&md.join("cur")))
    {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let mtime = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        seen.entry(marker(&bytes).unwrap_or(u64::MAX))
            .or_default()
            .push((path, mtime));
    }
    seen
}

/// The pids below `pid` (children, grandchildren, ...).
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut next = children(pid);
    while let Some(p) = next.pop() {
        next.extend(children(p));
        all.push(p);
    }
    all
}

/// A live pid below the dispatcher whose command line `pick` accepts.
fn find(dispatcher: u32, pick: impl Fn(&str) -> bool) -> Option<(u32, String)> {
    descendants(dispatcher)
        .into_iter()
        .filter(|p| {
            // not a zombie: one that died already and waits to be reaped
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
        .map(|p| (p, cmdline(p)))
        .find(|(_, c)| pick(c))
}

/// What one injected event did, for the summary.
struct Event {
    kind: Kind,
    at: SystemTime,
    since_start: Duration,
    what: String,
}

/// The dispatcher process `sys` started last, taken out of its processes.
fn started_dispatcher(sys: &mut System) -> Proc {
    let at = sys
        .procs
        .iter()
        .rposition(|p| p.name == "dispatch")
        .expect("the dispatcher runs");
    sys.procs.remove(at)
}

/// The dispatcher, as its unit runs it: started again RESTART_SEC after it died.
struct Supervisor {
    current: Option<Proc>,
    died_at: Option<Instant>,
    restarts: Vec<String>,
}

impl Supervisor {
    /// Takes the dispatcher `sys` started (out of its processes) into the supervisor's care.
    fn take(sys: &mut System) -> Supervisor {
        Supervisor {
            current: Some(started_dispatcher(sys)),
            died_at: None,
            restarts: Vec::new(),
        }
    }

    fn pid(&self) -> Option<u32> {
        self.current.as_ref().map(|p| p.child.id())
    }

    /// Notices an exit, and starts the dispatcher again once RESTART_SEC has passed.
    fn tend(&mut self, sys: &mut System) {
        if let Some(p) = &mut self.current
            && let Ok(Some(status)) = p.child.try_wait()
        {
            self.restarts.push(format!("exited ({status})"));
            self.current = None;
            self.died_at = Some(Instant::now());
        }
        if self.current.is_none() && self.died_at.is_some_and(|t| t.elapsed() >= RESTART_SEC) {
            sys.start_dispatcher();
            self.current = Some(started_dispatcher(sys));
            self.died_at = None;
        }
    }
}

/// `kill -9 pid`; false when the process was gone already (a writer or worker that ended
/// between being found and the signal: the event is tried again).
fn kill9(pid: u32) -> bool {
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Injects `kind`; returns what it did, or None when there was nothing to kill just now.
async fn inject(kind: Kind, cluster: &PgCluster, supervisor: &mut Supervisor) -> Option<String> {
    let dispatcher = supervisor.pid()?;
    let program = |c: &str, name: &str| c.split(' ').next().is_some_and(|p| p.ends_with(name));
    match kind {
        Kind::DeliveryWorker | Kind::OtherWorker | Kind::Writer => {
            let (pid, cmd) = find(dispatcher, |c| match kind {
                Kind::DeliveryWorker => program(c, "pepsi-stage-relay-to-maildir"),
                Kind::Writer => program(c, "pepsi-helper-maildir-writer"),
                _ => {
                    let name = c.split(' ').next().unwrap_or_default();
                    name.contains("pepsi-stage-") && !name.ends_with("pepsi-stage-relay-to-maildir")
                }
            })?;
            kill9(pid).then(|| format!("kill -9 {pid} ({cmd})"))
        }
        Kind::Dispatcher => {
            let p = supervisor.current.as_mut()?;
            if !kill9(dispatcher) {
                return None;
            }
            let _ = p.child.wait();
            supervisor.current = None;
            supervisor.died_at = Some(Instant::now());
            supervisor.restarts.push("killed (-9)".into());
            Some(format!("kill -9 {dispatcher} (pepsi-dispatch)"))
        }
        Kind::Postgres => {
            let began = Instant::now();
            cluster.stop_immediately(&cluster.primary).await;
            cluster.start_node(&cluster.primary).await;
            Some(format!(
                "pg_ctl stop -m immediate and start again: down {:?}",
                began.elapsed()
            ))
        }
    }
}

/// (all rows, rows failed or timed out with their reasons), or None while the database
/// does not answer.
async fn queue_state(sys: &System) -> Option<(i64, Vec<(i64, String, String)>)> {
    let all: i64 = sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue")
        .fetch_one(&sys.db.pool)
        .await
        .ok()?;
    let stuck: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT workqueue_id, stage, COALESCE(state->>'dispatch_error', status::text) \
         FROM pepsi.workqueue WHERE status IN ('failed', 'timeout') ORDER BY workqueue_id",
    )
    .fetch_all(&sys.db.pool)
    .await
    .ok()?;
    Some((all, stuck))
}

/// `pepsi-failure-bouncer`, from `PEPSI_BIN_DIR` when set.
fn failure_bouncer() -> PathBuf {
    pepsi_testkit::programs::program(
        "pepsi-failure-bouncer",
        env!("CARGO_BIN_EXE_pepsi-failure-bouncer"),
    )
}

/// `pepsi-failure-bouncer` as `make run` supervises it (scripts/run.sh): started again
/// when it exits.
struct Bouncer {
    child: std::process::Child,
    restarts: usize,
}

impl Bouncer {
    fn start(sys: &System) -> std::process::Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(sys.dir.path().join("failure-bouncer.log"))
            .unwrap();
        sys.command(&failure_bouncer()).stderr(log).spawn().unwrap()
    }

    fn tend(&mut self, sys: &System) {
        if let Ok(Some(_)) = self.child.try_wait() {
            self.child = Bouncer::start(sys);
            self.restarts += 1;
        }
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the failure bouncer did (`pepsi.event_log`): (action, queue id, stage, the
/// dispatcher's reason for the failure).
async fn bouncer_steps(sys: &System) -> Vec<(String, i64, String, String)> {
    sqlx::query_as(
        "SELECT action, COALESCE(workqueue_id, 0), COALESCE(detail->>'stage', ''), \
         COALESCE(detail->>'dispatch_error', '') \
         FROM pepsi.event_log WHERE action LIKE 'failure.%' ORDER BY event_id",
    )
    .fetch_all(&sys.db.pool)
    .await
    .unwrap()
}

/// Issue 34's acceptance: 5,000 messages from concurrent clients while stage workers, the
/// Maildir writer and the dispatcher are killed with SIGKILL and PostgreSQL restarts
/// immediately (12 events over sending and draining): every accepted message is delivered
/// exactly once to each recipient, a second copy only for one the client resent after its
/// end of data got no 250, and nothing the clients did not send; with no operator action,
/// the failure bouncer retrying the rows killed workers held, and no row failed otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_accepted_message_is_delivered_exactly_once_through_kills_and_a_postgres_restart() {
    let total = message_count();
    let started = Instant::now();
    let cluster = PgCluster::start(Replication::Asynchronous).await;
    // The standby has no part here: the restarts are of the one server the system uses.
    cluster.stop_immediately(&cluster.standby).await;
    let db = TestDb::on(&cluster.url(cluster.primary.port, "postgres")).await;
    // Short retries, so a delivery a kill made fail temporarily comes back within the run; a
    // short ORPHAN_GRACE, so a row whose hand-back a restart lost runs again soon; the
    // failure bouncer retries a failed row a second after its failure (GRACE).
    let mut sys = System::with_db(
        db,
        &format!(
            "[pepsi]\nRETRY_INITIAL = 1s\nRETRY_MAX_INTERVAL = 5s\n\n\
             [pepsi-ingress]\nADMISSION_TIMEOUT = {}s\n\n\
             [pepsi-dispatch]\nORPHAN_GRACE = 3s\n\n\
             [pepsi-failure-bouncer]\nGRACE = 1s\nINTERVAL = 1s\n",
            ADMISSION.as_secs()
        ),
        &["alice", "bob", "carol"],
    )
    .await;
    sys.start().await;
    let mut supervisor = Supervisor::take(&mut sys);
    let mut bouncer = Bouncer {
        child: Bouncer::start(&sys),
        restarts: 0,
    };

    let ledger = Arc::new(Ledger::default());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|first| tokio::spawn(client(sys.port, first, total, ledger.clone())))
        .collect();

    // Progress = messages accepted + copies in alice's Maildir, 2 × total at the end; event
    // k fires at k / (EVENTS + 1) of it, so they spread over sending and draining.
    let mut events: Vec<Event> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut next = 0usize;
    let mut pending_since: Option<Instant> = None;
    let mut drain_until: Option<Instant> = None;
    let send_until = Instant::now() + SEND_LIMIT;
    loop {
        supervisor.tend(&mut sys);
        bouncer.tend(&sys);
        let accepted = ledger.accepted.load(Ordering::Relaxed);
        let md = sys.maildir("alice");
        let in_alice = (files(&md.join("new")).len() + files(&md.join("cur")).len()) as u64;
        let progress = accepted + in_alice.min(total);
        let due = next < EVENTS.len()
            && progress * (EVENTS.len() as u64 + 1) >= (next as u64 + 1) * 2 * total;
        if due {
            let kind = EVENTS[next];
            // A kill needs its victim present: look again for a while, then let it go.
            let since = pending_since.get_or_insert_with(Instant::now);
            match inject(kind, &cluster, &mut supervisor).await {
                Some(what) => {
                    eprintln!(
                        "chaos: event {} at {:?}: {what}",
                        next + 1,
                        started.elapsed()
                    );
                    events.push(Event {
                        kind,
                        at: SystemTime::now(),
                        since_start: started.elapsed(),
                        what,
                    });
                    next += 1;
                    pending_since = None;
                }
                None if since.elapsed() > Duration::from_secs(30) => {
                    skipped.push(format!(
                        "{kind:?} at {:?}: nothing to kill",
                        started.elapsed()
                    ));
                    next += 1;
                    pending_since = None;
                }
                None => {}
            }
        }
        let clients_done = ledger.done.load(Ordering::Acquire) == CLIENTS;
        if !clients_done {
            assert!(
                Instant::now() < send_until,
                "the clients are not done after {SEND_LIMIT:?}\n{}",
                sys.logs()
            );
        } else {
            let until = *drain_until.get_or_insert_with(|| Instant::now() + DRAIN_LIMIT);
            // Done once the queue is empty and no event is due (an event not yet due then
            // never will be: what is missing from the Maildirs is reported below). Rows a
            // killed worker held end failed: the failure bouncer retries them.
            if let Some((0, _)) = queue_state(&sys).await
                && !due
            {
                break;
            }
            assert!(
                Instant::now() < until,
                "the queue is not empty {DRAIN_LIMIT:?} after the clients finished: {:?}\n\
                 events: {:?}\n{}",
                queue_state(&sys).await,
                events.iter().map(|e| &e.what).collect::<Vec<_>>(),
                sys.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for c in clients {
        c.await.expect("a client failed");
    }
    let elapsed = started.elapsed();
    let steps = bouncer_steps(&sys).await;
    let bouncer_log = sys.log("failure-bouncer.log");
    let bouncer_started = bouncer_log.contains("started");
    let bouncer_failed_passes = bouncer_log.matches("pass failed").count();
    // Answers the dispatcher no longer fails a row for (docs/dispatch.md, "Recovery").
    let dispatch_log = sys.log("dispatch.log");
    let left_to_holder = dispatch_log
        .matches("another worker holds the message: left to it")
        .count();
    let misplaced_returned = dispatch_log
        .matches("the message was not where its worker was handed it")
        .count();
    let mut retried: BTreeMap<String, usize> = BTreeMap::new();
    for (action, _, stage, reason) in &steps {
        // a kill of the worker that held it alone fails a row by design (docs/dispatch.md,
        // "Recovery"); anything else is a failure the system should not have made
        let kind = if reason.contains("killed by signal") {
            "held by a killed worker"
        } else {
            "other"
        };
        *retried
            .entry(format!("{action} at {stage}, {kind}"))
            .or_default() += 1;
    }

    // What the clients saw.
    let attempts = std::mem::take(&mut *ledger.attempts.lock().unwrap());
    let accepted: BTreeMap<u64, i64> = attempts
        .iter()
        .filter_map(|(n, a)| {
            a.iter().find_map(|e| match e {
                End::Accepted(id) => Some((*n, *id)),
                _ => None,
            })
        })
        .collect();
    let count = |f: &dyn Fn(&End) -> bool| attempts.values().flatten().filter(|e| f(e)).count();
    let before = count(&|e| matches!(e, End::Before(..)));
    let at_dot_refused = count(&|e| matches!(e, End::RefusedAtDot(..)));
    let at_dot_lost = count(&|e| matches!(e, End::LostAtDot(_)));
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for reason in attempts.values().flatten().filter_map(End::reason) {
        *reasons.entry(reason).or_default() += 1;
    }
    let permanent: Vec<(u64, &End)> = attempts
        .iter()
        .flat_map(|(n, a)| a.iter().map(move |e| (*n, e)))
        .filter(|(_, e)| e.permanent())
        .collect();

    // What the Maildirs hold.
    let mut missing = Vec::new();
    let mut explained = Vec::new();
    let mut unexplained = Vec::new();
    let mut copies = 0usize;
    // Extra copies by the event that preceded them (see `cause` below).
    let mut causes: BTreeMap<String, usize> = BTreeMap::new();
    let mut strangers = Vec::new();
    for user in ["alice", "carol"] {
        let got = delivered(&sys, user);
        copies += got.values().map(Vec::len).sum::<usize>();
        for (n, found) in &got {
            if !attempts.contains_key(n)
                || (user == "carol" && !n.is_multiple_of(SECOND_RECIPIENT_EVERY))
            {
                strangers.push((user, *n, found.clone()));
                continue;
            }
            if found.len() < 2 {
                continue;
            }
            let stored_attempts = attempts[n].iter().filter(|e| e.may_have_stored()).count();
            let mut times: Vec<SystemTime> = found.iter().map(|(_, t)| *t).collect();
            times.sort();
            // The first event after the first copy was written: the one that cut its
            // delivery short before the queue recorded it, so that it ran again.
            let cause = events
                .iter()
                .find(|e| e.at >= times[0])
                .map(|e| format!("{:?}", e.kind))
                .unwrap_or_else(|| "none".into());
            let line = format!(
                "{user} #{n} x{} (queue id {:?}, attempts {:?}; first copy before {cause}): {:?}",
                found.len(),
                accepted.get(n),
                attempts[n],
                found
                    .iter()
                    .map(|(p, _)| p.file_name().unwrap())
                    .collect::<Vec<_>>()
            );
            *causes.entry(cause).or_default() += found.len() - 1;
            if found.len() <= stored_attempts {
                explained.push(line);
            } else {
                unexplained.push(line);
            }
        }
        for (n, _) in accepted.iter() {
            if user == "carol" && !n.is_multiple_of(SECOND_RECIPIENT_EVERY) {
                continue;
            }
            if !got.contains_key(n) {
                missing.push(format!("{user} #{n} (queue id {})", accepted[n]));
            }
        }
    }
    let tmp_left: usize = ["alice", "carol"]
        .iter()
        .map(|u| files(&sys.maildir(u).join("tmp")).len())
        .sum();
    let dsns = sys.messages("bob");
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for e in &events {
        *by_kind.entry(format!("{:?}", e.kind)).or_default() += 1;
    }
    eprintln!(
        "chaos summary: {total} messages, {} accepted, in {elapsed:?}\n\
         attempts: {} in all; {before} refused or cut before the end of data, \
         {at_dot_refused} refused at the end of data, {at_dot_lost} without a reply to it\n\
         events: {} ({by_kind:?}); skipped: {skipped:?}\n\
         dispatcher: {:?}\nfailure bouncer: {} steps ({retried:?}), restarted {} times, passes failed (database \
         down) {bouncer_failed_passes}\n\
         rows not failed for an answer not theirs: {left_to_holder} left to the worker holding \
         them, {misplaced_returned} misplaced ones returned to pending\n\
         delivered copies: {copies}; missing: {}; duplicates explained by a resend: {}; \
         duplicates NOT explained: {} (extra copies by the event that cut their delivery \
         short: {causes:?}); copies of unknown messages: {}; tmp/ leftovers: \
         {tmp_left}; DSNs to the sender: {}",
        accepted.len(),
        attempts.values().map(Vec::len).sum::<usize>(),
        events.len(),
        supervisor.restarts,
        steps.len(),
        bouncer.restarts,
        missing.len(),
        explained.len(),
        unexplained.len(),
        strangers.len(),
        dsns.len(),
    );
    for e in &events {
        eprintln!("  event at {:?}: {}", e.since_start, e.what);
    }
    for (reason, n) in &reasons {
        eprintln!("  refused x{n}: {reason}");
    }
    for (action, id, stage, reason) in &steps {
        eprintln!("  failure bouncer: {action} #{id} at {stage}: {reason}");
    }
    for line in explained.iter().chain(&unexplained) {
        eprintln!("  duplicate: {line}");
    }

    assert!(
        events.len() >= 10,
        "only {} events could be injected: {skipped:?}",
        events.len()
    );
    assert!(
        permanent.is_empty(),
        "a client was refused permanently: {permanent:?}\n{}",
        sys.log("ingress.log")
    );
    assert_eq!(
        accepted.len() as u64,
        total,
        "every message was accepted in the end"
    );
    assert!(
        missing.is_empty(),
        "accepted but not delivered: {missing:?}"
    );
    assert!(
        unexplained.is_empty(),
        "delivered more than once without a resend by the client: {unexplained:#?}"
    );
    assert!(
        strangers.is_empty(),
        "copies nobody sent there: {strangers:?}"
    );
    assert!(
        bouncer_started,
        "the failure bouncer did not start: {bouncer_log}"
    );
    let unexpected: Vec<_> = steps
        .iter()
        .filter(|(action, _, _, reason)| {
            action != "failure.retry" || !reason.contains("killed by signal")
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "rows failed other than by a killed worker, or not simply retried: {unexpected:?}\n{}",
        sys.log("failure-bouncer.log")
    );
    assert!(
        dsns.is_empty(),
        "the sender got notifications: {:?}",
        dsns.iter()
            .map(|d| String::from_utf8_lossy(d).into_owned())
            .collect::<Vec<_>>()
    );
}
