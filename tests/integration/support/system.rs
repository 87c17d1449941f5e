//! The whole system for end-to-end tests: a fresh database, the shipped `etc/pepsi.conf`
//! included as it is (a test adds its own options after it), and real `pepsi-ingress` and
//! `pepsi-dispatch` processes whose dispatcher runs the real stage programs found beside
//! them. Mail goes in over SMTP and is looked for in the Maildirs under the test's own
//! `PEPSI_HOME`.
//!
//! With `PEPSI_BIN_DIR` set, every program comes from that directory (a unified layout,
//! `make unibin`: the dispatcher there finds the stage programs beside itself), and with
//! `PEPSI_ALLOW_FUSION` set the configuration gets `[pepsi] ALLOW_FUSION = <that value>`;
//! `scripts/test.sh` runs these tests that way too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_testkit::TestDb;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

use super::free_port;

/// `pepsi-ingress`, from `PEPSI_BIN_DIR` when set.
pub fn ingress() -> PathBuf {
    pepsi_testkit::programs::program("pepsi-ingress", env!("CARGO_BIN_EXE_pepsi-ingress"))
}

/// `pepsi-dispatch`, from `PEPSI_BIN_DIR` when set.
pub fn dispatch() -> PathBuf {
    pepsi_testkit::programs::program("pepsi-dispatch", env!("CARGO_BIN_EXE_pepsi-dispatch"))
}

/// `pepsi-queue`, from `PEPSI_BIN_DIR` when set.
pub fn queue_tool() -> PathBuf {
    pepsi_testkit::programs::program("pepsi-queue", env!("CARGO_BIN_EXE_pepsi-queue"))
}

/// `[pepsi] ALLOW_FUSION = $PEPSI_ALLOW_FUSION` when that is set, else nothing (the
/// configuration's own value holds).
fn fusion_option() -> String {
    match std::env::var("PEPSI_ALLOW_FUSION") {
        Ok(value) if !value.is_empty() => format!("\n[pepsi]\nALLOW_FUSION = {value}\n"),
        _ => String::new(),
    }
}

/// A child process killed when dropped, so a failing test leaves nothing running.
pub struct Proc {
    pub child: Child,
    pub name: &'static str,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct System {
    pub db: TestDb,
    pub dir: tempfile::TempDir,
    pub home: PathBuf,
    pub config: PathBuf,
    pub port: u16,
    pub procs: Vec<Proc>,
}

impl System {
    /// The shipped configuration plus `extra` (sections and options that override it), with
    /// Maildirs for `users` of example.test. Nothing runs until `start`.
    pub async fn new(extra: &str, users: &[&str]) -> System {
        System::with_db(TestDb::new().await, extra, users).await
    }

    /// The same on the database `db` (e.g. one behind a proxy in front of a replicated
    /// pair, `pepsi_testkit::pg_cluster`).
    pub async fn with_db(db: TestDb, extra: &str, users: &[&str]) -> System {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("var");
        for user in users {
            make_maildir(&home.join("mail").join(user).join("Maildir"));
        }
        // The shipped graph's signing key and SRS secret, as scripts/run.sh makes them.
        let keys = dir.path().join("keys");
        std::fs::create_dir_all(&keys).unwrap();
        pepsi_testkit::keys::openssl_key(&keys, "example.test.pepsi.pem", pepsi_testkit::keys::RSA);
        let secrets = dir.path().join("secrets.d");
        std::fs::create_dir_all(&secrets).unwrap();
        let fragment = secrets.join("20-srs.conf");
        std::fs::write(
            &fragment,
            "[srs]\nSECRETS = 0123456789abcdef0123456789abcdef\n",
        )
        .unwrap();
        std::fs::set_permissions(
            &fragment,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let port = free_port();
        let shipped = super::root().join("etc/pepsi.conf");
        let config = dir.path().join("pepsi.conf");
        std::fs::write(
            &config,
            format!(
                "@inline@ {shipped}\n\n[listener-mx]\nADDRESS = 127.0.0.1:{port}\n\n\
                 [pepsi-dispatch]\nPOLL_INTERVAL = 200ms\n\n{extra}\n{fusion}",
                shipped = shipped.display(),
                fusion = fusion_option(),
            ),
        )
        .unwrap();
        // Each user is a mailbox of the account store too, as an installation has it (the
        // MX listener's recipient check knows them by it).
        for user in users {
            sqlx::query("INSERT INTO pepsi.mailbox_account (address) VALUES ($1)")
                .bind(format!("{user}@example.test"))
                .execute(&db.pool)
                .await
                .unwrap();
        }
        System {
            db,
            dir,
            home,
            config,
            port,
            procs: Vec::new(),
        }
    }

    /// `program -c <config> -L debug` with the system's environment (database, home, keys).
    pub fn command(&self, program: &Path) -> Command {
        let dispatch = dispatch();
        let bin = dispatch.parent().unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new(program);
        cmd.arg("-c")
            .arg(&self.config)
            .args(["-L", "debug"])
            .env("PATH", path)
            .env("PEPSI_HOME", &self.home)
            .env("PEPSI_KEY_DIR", self.dir.path().join("keys"))
            .env("PEPSI_SECRETS_DIR", self.dir.path().join("secrets.d"))
            .env("DATABASE_URL", &self.db.url)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        cmd
    }

    /// Starts pepsi-httpd on the system's configuration (its `[pepsi-httpd] ADDRESS` must be
    /// 127.0.0.1:`port`) and waits until it answers; its log is `httpd.log`.
    pub async fn start_httpd(&mut self, port: u16) {
        let log = std::fs::File::create(self.dir.path().join("httpd.log")).unwrap();
        let child = self
            .command(Path::new(super::httpd::HTTPD))
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs.push(Proc {
            child,
            name: "pepsi-httpd",
        });
        let client = super::httpd::client();
        let until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = client
                .get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await
                && r.status() == 200
            {
                return;
            }
            assert!(
                std::time::Instant::now() < until,
                "pepsi-httpd did not answer: {}",
                self.log("httpd.log")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits up to 60 s until a message in `user`'s Maildir holds `needle`; returns it.
    pub async fn mail_with(&self, user: &str, needle: &str) -> String {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let found = self
                .messages(user)
                .into_iter()
                .map(|m| String::from_utf8_lossy(&m).into_owned())
                .find(|m| m.contains(needle));
            if let Some(m) = found {
                return m;
            }
            assert!(
                Instant::now() < until,
                "no mail holding {needle:?} reached {user}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits up to 60 s until `peer` (a remote MX) has received `n` messages; returns them
    /// all.
    pub async fn received(
        &self,
        peer: &super::smtp_peer::Peer,
        n: usize,
    ) -> Vec<super::smtp_peer::Received> {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let got = peer.messages();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < until,
                "{} received {} messages, wanted {n}: {got:#?}\nqueue: {:#?}\n{}",
                peer.addr,
                got.len(),
                self.queue().await,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts the dispatcher and the ingress and waits until the ingress answers.
    pub async fn start(&mut self) {
        self.start_dispatcher();
        self.start_ingress().await;
    }

    /// Starts the ingress alone and waits until it answers.
    pub async fn start_ingress(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("ingress.log")).unwrap();
        let child = self.command(&ingress()).stderr(log).spawn().unwrap();
        self.procs.push(Proc {
            child,
            name: "ingress",
        });
        let until = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).await.is_err() {
            assert!(
                Instant::now() < until,
                "the ingress did not listen: {}",
                self.log("ingress.log")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn start_dispatcher(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("dispatch.log"))
            .unwrap();
        let child = self.command(&dispatch()).stderr(log).spawn().unwrap();
        self.procs.push(Proc {
            child,
            name: "dispatch",
        });
    }

    /// Stops the dispatcher with SIGTERM (its workers go with it) and waits for it.
    pub fn stop_dispatcher(&mut self) {
        if let Some(at) = self.procs.iter().position(|p| p.name == "dispatch") {
            let mut p = self.procs.remove(at);
            signal(p.child.id(), "TERM");
            let _ = p.child.wait();
        }
    }

    pub fn dispatcher_pid(&self) -> u32 {
        self.procs
            .iter()
            .find(|p| p.name == "dispatch")
            .expect("the dispatcher runs")
            .child
            .id()
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    pub fn logs(&self) -> String {
        format!(
            "--- dispatch.log\n{}\n--- ingress.log\n{}",
            self.log("dispatch.log"),
            self.log("ingress.log")
        )
    }

    pub fn maildir(&self, user: &str) -> PathBuf {
        self.home.join("mail").join(user).join("Maildir")
    }

    /// The messages in `user`'s Maildir new/, oldest name first.
    pub fn messages(&self, user: &str) -> Vec<Vec<u8>> {
        let mut names: Vec<PathBuf> = match std::fs::read_dir(self.maildir(user).join("new")) {
            Ok(dir) => dir.map(|e| e.unwrap().path()).collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        names.iter().map(|p| std::fs::read(p).unwrap()).collect()
    }

    /// Waits until `user` has at least `n` messages; returns them.
    pub async fn wait_messages(&self, user: &str, n: usize, limit: Duration) -> Vec<Vec<u8>> {
        let until = Instant::now() + limit;
        loop {
            let got = self.messages(user);
            if got.len() >= n {
                return got;
            }
            if Instant::now() > until {
                let queue = self.queue().await;
                panic!(
                    "{user} has {} messages after {limit:?}, wanted {n}\nqueue: {queue:#?}\n{}",
                    got.len(),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// (id, stage, status, rcpt_to, state) of every queued row.
    pub async fn queue(&self) -> Vec<(i64, String, String, Vec<String>, serde_json::Value)> {
        sqlx::query_as(
            "SELECT workqueue_id, stage, status::text, rcpt_to, state FROM pepsi.workqueue \
             ORDER BY workqueue_id",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    /// Waits until the queue is empty.
    pub async fn wait_empty(&self, limit: Duration) {
        let until = Instant::now() + limit;
        loop {
            let q = self.queue().await;
            if q.is_empty() {
                return;
            }
            assert!(
                Instant::now() < until,
                "queue not empty after {limit:?}: {q:#?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One SMTP transaction; `message` is the raw message with CRLF line ends. Returns the
    /// final reply to DATA.
    pub async fn send(&self, from: &str, rcpts: &[&str], message: &[u8]) -> String {
        send_smtp(self.port, from, rcpts, message, "").await
    }
}

/// Creates a Maildir (new, cur, tmp).
pub fn make_maildir(path: &Path) {
    for sub in ["new", "cur", "tmp"] {
        std::fs::create_dir_all(path.join(sub)).unwrap();
    }
}

pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// The child pids of `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    let text =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    text.split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The command line of `pid`, arguments joined by spaces.
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

async fn reply(r: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> String {
    let mut all = String::new();
    loop {
        let mut line = String::new();
        assert!(
            r.read_line(&mut line).await.unwrap() > 0,
            "connection closed"
        );
        all.push_str(&line);
        if line.as_bytes().get(3) != Some(&b'-') {
            return all;
        }
    }
}

/// One SMTP transaction on `port`; `mail_params` is appended to MAIL FROM (e.g.
/// ` RET=HDRS`), a recipient may carry parameters after a space (`a@x NOTIFY=NEVER`).
/// Returns the reply to the end of data.
pub async fn send_smtp(
    port: u16,
    from: &str,
    rcpts: &[&str],
    message: &[u8],
    mail_params: &str,
) -> String {
    transaction(port, None, from, rcpts, message, mail_params).await
}

/// As `send_smtp`, after `AUTH PLAIN` as `user` with `password` (a listener that allows it
/// without TLS: ALLOW_PLAINTEXT_AUTH).
pub async fn send_smtp_auth(
    port: u16,
    (user, password): (&str, &str),
    from: &str,
    rcpts: &[&str],
    message: &[u8],
) -> String {
    transaction(port, Some((user, password)), from, rcpts, message, "").await
}

async fn transaction(
    port: u16,
    auth: Option<(&str, &str)>,
    from: &str,
    rcpts: &[&str],
    message: &[u8],
    mail_params: &str,
) -> String {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let greeting = reply(&mut r).await;
    assert!(greeting.starts_with("220"), "{greeting}");
    let mut commands = vec![("EHLO client.example.test".to_string(), "250")];
    if let Some((user, password)) = auth {
        let plain = pepsi_smtp::encoding::base64_encode(format!("\0{user}\0{password}").as_bytes());
        commands.push((format!("AUTH PLAIN {plain}"), "235"));
    }
    commands.push((format!("MAIL FROM:<{from}>{mail_params}"), "250"));
    for (cmd, want) in commands {
        w.write_all(format!("{cmd}\r\n").as_bytes()).await.unwrap();
        let got = reply(&mut r).await;
        assert!(got.starts_with(want), "{cmd}: {got}");
    }
    for rcpt in rcpts {
        let (addr, params) = rcpt.split_once(' ').unwrap_or((rcpt, ""));
        let sep = if params.is_empty() { "" } else { " " };
        w.write_all(format!("RCPT TO:<{addr}>{sep}{params}\r\n").as_bytes())
            .await
            .unwrap();
        let got = reply(&mut r).await;
        assert!(got.starts_with("250"), "RCPT {rcpt}: {got}");
    }
    w.write_all(b"DATA\r\n").await.unwrap();
    let got = reply(&mut r).await;
    assert!(got.starts_with("354"), "DATA: {got}");
    let mut data = Vec::with_capacity(message.len() + 8);
    for line in message.split_inclusive(|&b| b == b'\n') {
        if line.starts_with(b".") {
            data.push(b'.');
        }
        data.extend_from_slice(line);
    }
    if !data.ends_with(b"\r\n") {
        data.extend_from_slice(b"\r\n");
    }
    data.extend_from_slice(b".\r\n");
    w.write_all(&data).await.unwrap();
    let end = reply(&mut r).await;
    w.write_all(b"QUIT\r\n").await.unwrap();
    let _ = reply(&mut r).await;
    end
}

/// Splits a stored message at the first empty line: (headers with their final CRLF, body).
pub fn split(message: &[u8]) -> (&[u8], &[u8]) {
    let at = message
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a message with a header/body separator");
    (&message[..at + 2], &message[at + 4..])
}
