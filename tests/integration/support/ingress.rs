//! Support for the ingress tests: a real `pepsi-ingress` process on free loopback ports
//! over a fresh database, a raw SMTP client (plain or TLS) that sends exactly the bytes a
//! test gives it, and a test CA made with the `openssl` command.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use pepsi_testkit::TestDb;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

use super::free_port;

pub const INGRESS: &str = env!("CARGO_BIN_EXE_pepsi-ingress");

/// A test CA and a server certificate for `localhost` / 127.0.0.1 signed by it.
pub struct TestCa {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The first certificate of a PEM file, as DER.
pub fn pem_certificate(path: &Path) -> Vec<u8> {
    let pem = std::fs::read(path).unwrap();
    let cert = rustls_pemfile::certs(&mut pem.as_slice())
        .next()
        .expect("a certificate in the file")
        .unwrap();
    cert.as_ref().to_vec()
}

impl TestCa {
    pub fn new(dir: &Path) -> TestCa {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            dir,
            &[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=Pepsi Test CA",
                ],
            ]
            .concat(),
        );
        TestCa::issue(dir, "server")
    }

    /// Issues (or re-issues) `<name>.pem` / `<name>.key` from the CA in `dir`.
    pub fn issue(dir: &Path, name: &str) -> TestCa {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        openssl(
            dir,
            &[
                &["req"][..],
                &ec,
                &["-keyout", &key, "-out", &csr, "-subj", "/CN=localhost"],
            ]
            .concat(),
        );
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
        TestCa {
            ca: dir.join("ca.pem"),
            cert: dir.join(pem),
            key: dir.join(key),
        }
    }

    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(&self.ca).unwrap();
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }
}

/// A running ingress with its database.
pub struct Ingress {
    pub db: TestDb,
    pub dir: tempfile::TempDir,
    pub child: Child,
    /// Listener name → port.
    pub ports: Vec<(String, u16)>,
    pub config: PathBuf,
}

impl Ingress {
    /// Starts the ingress with `options` appended to `[pepsi-ingress]` (with
    /// `CHECK_RECIPIENTS = no` unless `options` sets it) and one
    /// `[listener-<name>]` per `(name, body)`, where `body` may use `{port}`, `{cert}` and
    /// `{key}`; certificates come from a test CA in the temp dir when a body names them.
    pub async fn start(options: &str, listeners: &[(&str, &str)]) -> Ingress {
        let db = TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        Ingress::start_with(db, dir, options, listeners).await
    }

    pub async fn start_with(
        db: TestDb,
        dir: tempfile::TempDir,
        options: &str,
        listeners: &[(&str, &str)],
    ) -> Ingress {
        if listeners.iter().any(|(_, body)| body.contains("{cert}"))
            && !dir.path().join("server.pem").exists()
        {
            TestCa::new(dir.path());
        }
        // These tests deliver to local addresses no account backs; the recipient check
        // (on by default for MX listeners) is tested where a test names it.
        let check = if options.contains("CHECK_RECIPIENTS") {
            ""
        } else {
            "CHECK_RECIPIENTS = no\n"
        };
        let mut text = format!(
            "[database]\nURL = {}\nMAX_CONNECTIONS = 8\n\n[pepsi-ingress]\nHOSTNAME = mx.example.test\nLOCAL_DOMAINS = example.test\nSHUTDOWN_GRACE = 60s\n{check}{options}\n",
            db.url
        );
        let mut ports = Vec::new();
        for (name, body) in listeners {
            let port = free_port();
            ports.push((name.to_string(), port));
            let body = body
                .replace("{port}", &port.to_string())
                .replace(
                    "{cert}",
                    &dir.path().join("server.pem").display().to_string(),
                )
                .replace(
                    "{key}",
                    &dir.path().join("server.key").display().to_string(),
                );
            text.push_str(&format!(
                "\n[listener-{name}]\nADDRESS = 127.0.0.1:{port}\n{body}\n"
            ));
        }
        let config = dir.path().join("pepsi.conf");
        std::fs::write(&config, text).unwrap();
        let log = std::fs::File::create(dir.path().join("ingress.log")).unwrap();
        let child = Command::new(INGRESS)
            .arg("-c")
            .arg(&config)
            .args(["-L", "debug"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start pepsi-ingress");
        let mut ingress = Ingress {
            db,
            dir,
            child,
            ports,
            config,
        };
        ingress.wait_ready().await;
        ingress
    }

    async fn wait_ready(&mut self) {
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("pepsi-ingress exited with {status}: {}", self.log());
            }
            let mut all = true;
            for (_, port) in &self.ports {
                if TcpStream::connect(("127.0.0.1", *port)).await.is_err() {
                    all = false;
                }
            }
            if all {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("pepsi-ingress did not start listening: {}", self.log());
    }

    pub fn port(&self, name: &str) -> u16 {
        self.ports
            .iter()
            .find(|(n, _)| n == name)
            .expect("listener")
            .1
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ingress.log")).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub async fn rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM pepsi.workqueue")
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    /// Adds a mailbox with a password to the account store.
    pub async fn add_account(&self, address: &str, password: &str) {
        sqlx::query("INSERT INTO pepsi.mailbox_account (address) VALUES ($1)")
            .bind(address)
            .execute(&self.db.pool)
            .await
            .unwrap();
        let hash = pepsi_ingress::accounts::hash_password(password.as_bytes()).unwrap();
        sqlx::query("INSERT INTO pepsi.mailbox_password (address, password_hash) VALUES ($1, $2)")
            .bind(address)
            .bind(hash)
            .execute(&self.db.pool)
            .await
            .unwrap();
    }
}

impl Drop for Ingress {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- pepsi-ingress log ---\n{}", self.log());
        }
    }
}

/// A stored row.
#[derive(Debug)]
pub struct Row {
    pub stage: String,
    pub status: String,
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub headers: Vec<u8>,
    pub body: Vec<u8>,
    pub state: serde_json::Value,
    pub auth_user: Option<String>,
    pub client_addr: Option<String>,
}

pub async fn row(db: &TestDb, id: i64) -> Row {
    use sqlx::Row as _;
    let r = sqlx::query(
        "SELECT w.stage, w.status::text, w.mail_from, w.rcpt_to, w.headers, b.body, w.state, w.auth_user, host(w.client_addr) \
         FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) WHERE w.workqueue_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    Row {
        stage: r.get(0),
        status: r.get(1),
        mail_from: r.get(2),
        rcpt_to: r.get(3),
        headers: r.get(4),
        body: r.get(5),
        state: r.get(6),
        auth_user: r.get(7),
        client_addr: r.get(8),
    }
}

pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A raw SMTP client.
pub struct Client {
    io: BufReader<Box<dyn Io>>,
}

/// A reply: the code and all its text lines joined by newlines.
pub type Answer = (u16, String);

impl Client {
    /// Connects and reads the greeting.
    pub async fn connect(port: u16) -> Client {
        let (client, greeting) = Client::connect_raw(port).await;
        assert_eq!(greeting.0, 220, "greeting: {greeting:?}");
        client
    }

    /// Connects from the local address `bind` (any 127/8 address is the loopback) and
    /// reads the greeting.
    pub async fn connect_from(port: u16, bind: &str) -> (Client, Answer) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{bind}:0").parse().unwrap()).unwrap();
        let tcp = socket
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
        let mut client = Client {
            io: BufReader::new(Box::new(tcp)),
        };
        let greeting = client.read().await;
        (client, greeting)
    }

    pub async fn connect_raw(port: u16) -> (Client, Answer) {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut client = Client {
            io: BufReader::new(Box::new(tcp)),
        };
        let greeting = client.read().await;
        (client, greeting)
    }

    /// Connects with implicit TLS.
    pub async fn connect_tls(port: u16, ca: &TestCa) -> Client {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let tls = ca
            .connector()
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .expect("TLS handshake");
        let mut client = Client {
            io: BufReader::new(Box::new(tls)),
        };
        assert_eq!(client.read().await.0, 220);
        client
    }

    /// The leaf certificate (DER) a fresh implicit-TLS connection to `port` is shown.
    pub async fn server_certificate(port: u16, ca: &TestCa) -> Vec<u8> {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let tls = ca
            .connector()
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .expect("TLS handshake");
        let certs = tls.get_ref().1.peer_certificates().expect("a certificate");
        certs[0].as_ref().to_vec()
    }

    /// Upgrades after the server's 220 to STARTTLS.
    pub async fn tls(self, ca: &TestCa) -> Client {
        let inner = self.io.into_inner();
        let tls = ca
            .connector()
            .connect("localhost".try_into().unwrap(), inner)
            .await
            .expect("TLS handshake after STARTTLS");
        Client {
            io: BufReader::new(Box::new(tls)),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.io.get_mut().write_all(bytes).await.unwrap();
        self.io.get_mut().flush().await.unwrap();
    }

    /// Reads one reply; code 0 when the server closed the connection.
    pub async fn read(&mut self) -> Answer {
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            let n = tokio::time::timeout(Duration::from_secs(60), self.io.read_line(&mut line))
                .await
                .expect("the server answers within a minute")
                .unwrap_or(0);
            if n == 0 {
                return (0, lines.join("\n"));
            }
            let line = line.trim_end_matches(['\r', '\n']).to_owned();
            let code: u16 = line
                .get(..3)
                .and_then(|c| c.parse().ok())
                .unwrap_or_else(|| panic!("not a reply line: {line:?}"));
            let last = line.as_bytes().get(3) != Some(&b'-');
            lines.push(line.get(4..).unwrap_or("").to_owned());
            if last {
                return (code, lines.join("\n"));
            }
        }
    }

    /// Sends a command line (CRLF added) and reads its reply.
    pub async fn cmd(&mut self, line: &str) -> Answer {
        self.send(format!("{line}\r\n").as_bytes()).await;
        self.read().await
    }

    /// Sends a command and asserts the reply code.
    pub async fn ok(&mut self, line: &str, code: u16) -> String {
        let (got, text) = self.cmd(line).await;
        assert_eq!(got, code, "{line:?} answered {got} {text}");
        text
    }

    /// MAIL, RCPT…, DATA, the message and its end; returns the queue id.
    pub async fn deliver(&mut self, from: &str, rcpts: &[&str], message: &[u8]) -> i64 {
        self.ok(&format!("MAIL FROM:<{from}>"), 250).await;
        for r in rcpts {
            self.ok(&format!("RCPT TO:<{r}>"), 250).await;
        }
        self.ok("DATA", 354).await;
        self.send(message).await;
        self.send(b".\r\n").await;
        let (code, text) = self.read().await;
        assert_eq!(code, 250, "end of data answered {code} {text}");
        queued_id(&text)
    }
}

/// The id in "2.0.0 queued as <id>".
pub fn queued_id(text: &str) -> i64 {
    text.rsplit(' ')
        .next()
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no queue id in {text:?}"))
}

/// A dnsmasq on a free loopback port answering only from the records it is given
/// (`--txt-record=name,text`, `--host-record=…`, …): authoritative for `*.test`.
pub struct Dns {
    child: Child,
    pub port: u16,
    /// Where dnsmasq logs each query it answers ([`Dns::start_logged`]).
    log: Option<tempfile::NamedTempFile>,
}

impl Dns {
    /// Starts dnsmasq on a free port; a port taken between the probe and dnsmasq's bind
    /// (by another test's server) is retried on another.
    pub fn start(records: &[String]) -> Dns {
        Dns::start_with(records, false)
    }

    /// As [`Dns::start`], logging every query; [`Dns::queries`] reads them.
    pub fn start_logged(records: &[String]) -> Dns {
        Dns::start_with(records, true)
    }

    fn start_with(records: &[String], logged: bool) -> Dns {
        for _ in 0..5 {
            if let Some(dns) = Dns::try_start(records, logged) {
                return dns;
            }
        }
        panic!("dnsmasq did not start on any of five ports");
    }

    /// How many queries for `name` dnsmasq has received so far.
    pub fn queries(&self, name: &str) -> usize {
        let log = self.log.as_ref().expect("started with start_logged");
        std::fs::read_to_string(log.path())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("query[") && l.contains(&format!(" {name} from ")))
            .count()
    }

    fn try_start(records: &[String], logged: bool) -> Option<Dns> {
        let port = free_port();
        let log = logged.then(|| tempfile::NamedTempFile::new().unwrap());
        let log_facility = match &log {
            Some(f) => format!("--log-facility={}", f.path().display()),
            None => "--log-facility=-".to_owned(),
        };
        let child = Command::new("dnsmasq")
            .args([
                "-k",
                "-C",
                "/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
            ])
            .args(["--listen-address=127.0.0.1", "--pid-file=", "--user=root"])
            .arg(log_facility)
            .args(logged.then_some("--log-queries"))
            .arg(format!("--port={port}"))
            // Authoritative for the test names: unknown ones are NXDOMAIN, not an error.
            .args(["--local=/test/", "--local=/127.in-addr.arpa/"])
            .args(records)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq is installed (dnsmasq-base in scripts/apt-packages.txt)");
        let mut dns = Dns { child, port, log };
        for _ in 0..200 {
            // dnsmasq exits when it cannot bind; a listener that answers while it is gone
            // is someone else's.
            if dns.child.try_wait().unwrap().is_some() {
                return None;
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                std::thread::sleep(std::time::Duration::from_millis(25));
                if dns.child.try_wait().unwrap().is_some() {
                    return None;
                }
                return Some(dns);
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("dnsmasq did not start on port {port}");
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
