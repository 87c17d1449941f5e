//! What the integration tests share: programs run as processes (stage workers, operator
//! tools), queue rows, keys made with `openssl`, dkimpy as an independent verifier, the
//! Makefile's program lists, free ports and polling; and, one submodule each, the bigger
//! fixtures several test modules start: `browser` (headless Chromium over WebDriver),
//! `ingress` (a real `pepsi-ingress`, a raw SMTP client, a test CA), `httpd` (a real
//! `pepsi-httpd` and an API client), `lmtp` (an LMTP/SMTP sink), `smtp_peer` (MX hosts of a
//! test domain) and `system` (ingress and dispatcher over the shipped configuration).
//!
//! Nothing here is a test; nothing here keeps process-wide state, since `cargo test` runs
//! every test module in one process (nextest gives each test its own).

pub mod browser;
pub mod httpd;
pub mod ingress;
pub mod lmtp;
pub mod smtp_peer;
pub mod system;
pub mod taler;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use pepsi_testkit::keys::{ED25519, RSA, openssl_key};

/// The root package's directory (the workspace: Makefile, Cargo.toml, docs/, etc/).
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A loopback port nobody listens on right now, and not one this process was given before:
/// the kernel may hand the same free port to two calls in a row, and a test that asks for
/// two (an ingress's mx and submission listeners) must get two.
pub fn free_port() -> u16 {
    new_port(|_| true)
}

/// The same, free for UDP as well (a DNS server's).
pub fn free_udp_tcp_port() -> u16 {
    new_port(|port| std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok())
}

fn new_port(also_free: impl Fn(u16) -> bool) -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        if !given.contains(&port) && also_free(port) {
            given.push(port);
            return port;
        }
    }
}

/// A child process (a dispatcher, a daemon) killed and reaped when dropped, so a failing
/// test leaves nothing running.
pub struct Running(pub Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `sql` (a count) on `pool` until it reaches `want`. Fails when `child` (the
/// dispatcher the test waits on) exits first, or after `limit`; `log` gives what the
/// failure shows besides the count (the dispatcher's log, or nothing).
pub async fn wait_for_count(
    pool: &sqlx::PgPool,
    sql: &str,
    want: i64,
    limit: Duration,
    child: &mut Child,
    log: impl Fn() -> String,
) {
    let until = Instant::now() + limit;
    loop {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(pool)
            .await
            .unwrap();
        if n >= want {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the dispatcher exited ({status}) while waiting for {sql} = {want} (at {n})\n{}",
                log()
            );
        }
        assert!(
            Instant::now() < until,
            "{sql}: {n} after {limit:?}, wanted {want}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What an operator tool's run printed and how it ended (pepsi-queue, pepsi-settings,
/// pepsi-config, pepsi-status as processes).
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The finished process's exit code (-1 for a signal) and its output as text.
    pub fn of(out: std::process::Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Standard output as JSON; the panic shows the run when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
}

/// Runs `program worker -c config`, feeds it `input` and returns its stdout lines; the
/// worker must exit 0 at end of input.
pub fn stage_worker(program: &str, config: &Path, input: &str) -> Vec<String> {
    stage_worker_logged(program, config, input).0
}

/// `stage_worker`, returning the worker's log (stderr) as well.
pub fn stage_worker_logged(program: &str, config: &Path, input: &str) -> (Vec<String>, String) {
    let mut child = Command::new(program)
        .args(["worker", "-c"])
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "worker exited {:?}: {log}",
        out.status
    );
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    (lines, log)
}

/// The test stage example, built by `cargo test` beside the test binaries.
pub fn test_stage() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("examples").join("pepsi-test-stage");
    assert!(
        path.is_file(),
        "{} is missing: cargo test builds the examples",
        path.display()
    );
    path
}

/// Feeds `ids` to `program worker -c config` (off the async runtime) and returns its status
/// lines.
pub async fn run_ids(program: &str, config: &Path, ids: &[i64]) -> Vec<String> {
    let input: String = ids.iter().map(|i| format!("{i}\n")).collect();
    let (program, config) = (program.to_owned(), config.to_owned());
    tokio::task::spawn_blocking(move || stage_worker(&program, &config, &input))
        .await
        .unwrap()
}

/// Starts `program` as a worker on `config` that must refuse to start; returns what it
/// wrote to stderr (the reason).
pub fn worker_start_error(program: &str, config: &Path) -> String {
    let out = Command::new(program)
        .args(["worker", "-c"])
        .arg(config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "{program} started on {}",
        config.display()
    );
    assert!(
        out.stdout.is_empty(),
        "a worker that did not start answered nothing"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Marks row `id` running at `stage`, as the dispatcher's claim would.
pub async fn claim(pool: &sqlx::PgPool, id: i64, stage: &str) {
    sqlx::query(
        "UPDATE pepsi.workqueue SET status = 'running', stage = $2 WHERE workqueue_id = $1",
    )
    .bind(id)
    .bind(stage)
    .execute(pool)
    .await
    .unwrap();
}

/// A queue row as the tests compare it: (id, stage, status, rcpt_to, state).
pub type QueueRow = (i64, String, String, Vec<String>, serde_json::Value);

/// Every queued row, oldest first.
pub async fn rows(pool: &sqlx::PgPool) -> Vec<QueueRow> {
    sqlx::query_as(
        "SELECT workqueue_id, stage, status::text, rcpt_to, state FROM pepsi.workqueue \
         ORDER BY workqueue_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A private key (PEM, `pepsi_testkit::keys::openssl_key`) and its public key (DER
/// SubjectPublicKeyInfo) made by `openssl genpkey <genpkey>`.
pub fn keypair(dir: &Path, name: &str, genpkey: &[&str]) -> (PathBuf, PathBuf) {
    let private = openssl_key(dir, &format!("{name}.pem"), genpkey);
    let public = dir.join(format!("{name}.pub.der"));
    let status = Command::new("openssl")
        .args(["pkey", "-pubout", "-outform", "DER", "-in"])
        .arg(&private)
        .arg("-out")
        .arg(&public)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "openssl pkey -pubout {}",
        private.display()
    );
    (private, public)
}

/// dkimpy from Debian's python3-dkim (scripts/apt-packages.txt): the system interpreter.
const PYTHON: &str = "/usr/bin/python3";

/// Prepended to every dkimpy script: `msg` is the message on stdin, `dnsfunc` answers key
/// lookups from argv[1], a JSON object mapping `selector._domainkey.domain` to
/// `[k, public key DER file]`, so no DNS is involved.
const DKIMPY_PRELUDE: &str = r#"
import sys, json, base64, dkim
msg = sys.stdin.buffer.read()
keys = json.loads(sys.argv[1])
def dnsfunc(name, timeout=5):
    n = name.decode() if isinstance(name, bytes) else name
    k = keys.get(n.rstrip('.').lower())
    if k is None:
        return None
    der = open(k[1], 'rb').read()
    p = der[-32:] if k[0] == 'ed25519' else der
    return ('v=DKIM1; k=%s; p=%s' % (k[0], base64.b64encode(p).decode())).encode()
"#;

/// Runs the dkimpy `script` (after the prelude) on `message` with `keys`; the script prints
/// one JSON value, returned parsed.
pub fn dkimpy(script: &str, keys: &serde_json::Value, message: &[u8]) -> serde_json::Value {
    let mut child = Command::new(PYTHON)
        .args([
            "-c",
            &format!("{DKIMPY_PRELUDE}{script}"),
            &keys.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(message).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "dkimpy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "dkimpy printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The folded programs, from the table of programs (`pepsi::programs::FOLDED`).
pub fn folded_programs() -> Vec<String> {
    pepsi::programs::FOLDED
        .iter()
        .map(|p| p.name.to_owned())
        .collect()
}

/// The standalone programs, from the table of programs (`pepsi::programs::STANDALONE`).
pub fn standalone_programs() -> Vec<String> {
    pepsi::programs::STANDALONE
        .iter()
        .map(|&n| n.to_owned())
        .collect()
}
