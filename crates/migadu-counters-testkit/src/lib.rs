//! Test support for `migadu_counters`, for its own unit tests and the root package's
//! counters tests: private `redis-server` processes, a raw RESP client, CDB files, a
//! recording HTTP(S) target, a test CA made with `openssl`, a small HTTP client and the
//! daemon as a process. Real processes and sockets only.
//!
//! A dev-dependency only: the service links none of it (nor the TLS server side the HTTPS
//! target needs).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Polls `f` until it holds or `limit` passes; returns whether it held.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU16 = AtomicU16::new(0);
        let p = std::env::temp_dir().join(format!(
            "mc-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a CDB with the `cdb` crate's writer (temp file + rename, as `cdb -m` does).
pub fn write_cdb(path: &Path, rows: &[(&str, &str)]) {
    let tmp = path.with_extension("tmp");
    let mut w =
        cdb::CDBMake::new(std::fs::File::create(&tmp).expect("create cdb")).expect("cdb writer");
    for (k, v) in rows {
        w.add(k.as_bytes(), v.as_bytes()).expect("cdb add");
    }
    w.finish().expect("cdb finish");
    std::fs::rename(&tmp, path).expect("rename cdb");
}

/// A RESP reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Vec<Resp>),
}

impl Resp {
    pub fn int(&self) -> Option<i64> {
        match self {
            Resp::Int(n) => Some(*n),
            Resp::Bulk(Some(s)) | Resp::Simple(s) => s.parse().ok(),
            _ => None,
        }
    }
}

fn read_resp(r: &mut impl BufRead) -> std::io::Result<Resp> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let line = line.trim_end_matches("\r\n");
    let bad = || std::io::Error::other(format!("bad reply line {line:?}"));
    let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
    Ok(match kind {
        "+" => Resp::Simple(rest.into()),
        "-" => Resp::Error(rest.into()),
        ":" => Resp::Int(rest.parse().map_err(|_| bad())?),
        "$" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            if n < 0 {
                Resp::Bulk(None)
            } else {
                let mut buf = vec![0; n as usize + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(n as usize);
                Resp::Bulk(Some(String::from_utf8_lossy(&buf).into_owned()))
            }
        }
        "*" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            let mut v = Vec::new();
            for _ in 0..n.max(0) {
                v.push(read_resp(r)?);
            }
            Resp::Array(v)
        }
        _ => return Err(bad()),
    })
}

/// One command over a fresh connection.
pub fn redis_cmd(addr: &str, args: &[&str]) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(out.as_bytes())?;
    read_resp(&mut BufReader::new(s))
}

/// A private `redis-server` on a loopback port, killed on drop.
pub struct RedisServer {
    pub port: u16,
    extra: Vec<String>,
    dir: TempDir,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Extra arguments, e.g. `["--replicaof", "127.0.0.1", "6379"]`.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let mut s = RedisServer {
            port: free_port(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dir: TempDir::new("redis"),
            child: None,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = Command::new(bin)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        let addr = self.addr();
        assert!(
            wait_until(Duration::from_secs(20), || matches!(
                redis_cmd(&addr, &["PING"]),
                Ok(Resp::Simple(_))
            )),
            "redis-server on {addr} did not come up"
        );
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn cmd(&self, args: &[&str]) -> Resp {
        redis_cmd(&self.addr(), args).unwrap_or_else(|e| panic!("redis {args:?}: {e}"))
    }

    pub fn get(&self, key: &str) -> Option<i64> {
        self.cmd(&["GET", key]).int()
    }

    /// Kills the server (SIGKILL) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A request the target received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path_and_query: String,
    pub authorization: Option<String>,
    /// When its header had arrived.
    pub at: Instant,
}

/// How an [`HttpTarget`] behaves beyond its status code.
#[derive(Clone, Debug, Default)]
pub struct TargetSetup {
    /// Serve HTTPS with this PEM certificate chain and PEM private key.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Hold every answer until [`HttpTarget::release`] (forever if never released).
    pub held: bool,
}

/// An HTTP(S) server on its own thread that records requests and answers with `status`.
pub struct HttpTarget {
    pub port: u16,
    status: Arc<AtomicU16>,
    log: Arc<Mutex<Vec<Received>>>,
    gate: tokio::sync::watch::Sender<bool>,
    tls: bool,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A TLS server configuration from PEM files.
fn tls_acceptor(cert: &Path, key: &Path) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .expect("read certificate")
        .map(|c| c.expect("certificate"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).expect("read private key");
    let cfg = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server certificate");
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

impl HttpTarget {
    pub async fn start(status: u16) -> HttpTarget {
        tokio::task::spawn_blocking(move || Self::start_blocking(status))
            .await
            .expect("target thread")
    }

    pub fn start_blocking(status: u16) -> HttpTarget {
        Self::start_with(status, TargetSetup::default())
    }

    pub fn start_with(status: u16, setup: TargetSetup) -> HttpTarget {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind target");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let status_cell = Arc::new(AtomicU16::new(status));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let (gate, gate_rx) = tokio::sync::watch::channel(!setup.held);
        let acceptor = setup.tls.as_ref().map(|(c, k)| tls_acceptor(c, k));
        let (st, lg) = (status_cell.clone(), log.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let (stream, _) = tokio::select! {
                        r = l.accept() => match r { Ok(x) => x, Err(_) => continue },
                        _ = &mut rx => break,
                    };
                    let (st, lg) = (st.clone(), lg.clone());
                    let gate_rx = gate_rx.clone();
                    let svc = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            lg.lock().expect("log").push(Received {
                                path_and_query: req
                                    .uri()
                                    .path_and_query()
                                    .map(|p| p.to_string())
                                    .unwrap_or_default(),
                                authorization: req
                                    .headers()
                                    .get("authorization")
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_string),
                                at: Instant::now(),
                            });
                            let code = st.load(Ordering::Relaxed);
                            let mut gate_rx = gate_rx.clone();
                            async move {
                                if gate_rx.wait_for(|open| *open).await.is_err() {
                                    // the target is gone: never answer
                                    std::future::pending::<()>().await;
                                }
                                Ok::<_, std::convert::Infallible>(
                                    hyper::Response::builder()
                                        .status(code)
                                        .body(http_body_util::Full::new(bytes::Bytes::from_static(
                                            b"ok",
                                        )))
                                        .expect("response"),
                                )
                            }
                        },
                    );
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let http = hyper::server::conn::http1::Builder::new();
                        match acceptor {
                            // a client refusing the certificate ends here, before any request
                            Some(a) => {
                                if let Ok(tls) = a.accept(stream).await {
                                    let _ = http
                                        .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                                        .await;
                                }
                            }
                            None => {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                                    .await;
                            }
                        }
                    });
                }
            });
        });
        HttpTarget {
            port,
            status: status_cell,
            log,
            gate,
            tls: setup.tls.is_some(),
            stop: Some(tx),
        }
    }

    /// `http://127.0.0.1:<port>`, or `https://localhost:<port>` for a TLS target (the name
    /// its certificate is issued for).
    pub fn base(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.port)
        } else {
            format!("http://127.0.0.1:{}", self.port)
        }
    }

    /// Lets held answers (and every later one) go out.
    pub fn release(&self) {
        let _ = self.gate.send(true);
    }

    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::Relaxed);
    }

    pub fn requests(&self) -> Vec<Received> {
        self.log.lock().expect("log").clone()
    }
}

impl Drop for HttpTarget {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A certificate authority made with the `openssl` command, and server certificates it issues
/// for `localhost` and `127.0.0.1`; all files live in `dir`.
pub struct TestCa {
    pub dir: PathBuf,
    pub name: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

impl TestCa {
    /// `<name>-ca.pem` and `<name>-ca.key` in `dir`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let (key, pem) = (format!("{name}-ca.key"), format!("{name}-ca.pem"));
        let subj = format!("/CN=migadu_counters test CA {name}");
        let args: Vec<&str> = [&["req", "-x509"][..], &EC_KEY]
            .concat()
            .into_iter()
            .chain(["-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subj])
            .collect();
        openssl(dir, &args);
        TestCa {
            dir: dir.to_path_buf(),
            name: name.to_string(),
        }
    }

    pub fn ca_pem(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// Issues `<ca>-<server>.pem` (certificate chain) and `<ca>-<server>.key`; returns both.
    pub fn issue(&self, server: &str) -> (PathBuf, PathBuf) {
        let base = format!("{}-{server}", self.name);
        let (key, csr, pem, ext) = (
            format!("{base}.key"),
            format!("{base}.csr"),
            format!("{base}.pem"),
            format!("{base}.ext"),
        );
        let args: Vec<&str> = [&["req"][..], &EC_KEY]
            .concat()
            .into_iter()
            .chain(["-keyout", &key, "-out", &csr, "-subj", "/CN=localhost"])
            .collect();
        openssl(&self.dir, &args);
        std::fs::write(
            self.dir.join(&ext),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write extensions");
        let (ca, ca_key) = (
            format!("{}-ca.pem", self.name),
            format!("{}-ca.key", self.name),
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
        (self.dir.join(pem), self.dir.join(key))
    }
}

/// A response read by [`http`].
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP/1.1 request with `Connection: close`; the caller's headers are sent verbatim.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method != "GET" || !body.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    // A server may answer and close before reading a large body; the answer still counts.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no HTTP answer: {text:?}")))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A running `migadu_counters` binary with its own config, ports and log files.
pub struct Daemon {
    pub api: String,
    pub admin: String,
    pub dir: TempDir,
    pub config: PathBuf,
    child: Option<Child>,
}

/// What a test daemon needs; the string fields are TOML lines added to the top level, the
/// `[logging]` and `[redis]` sections, and further sections at the end.
#[derive(Default)]
pub struct DaemonSetup<'a> {
    pub redis: &'a str,
    pub rows: &'a [(&'a str, &'a str)],
    pub top: &'a str,
    pub logging: &'a str,
    pub redis_extra: &'a str,
    pub sections: &'a str,
    /// Environment of the process (`SSL_CERT_FILE` and `SSL_CERT_DIR` are removed otherwise).
    pub env: &'a [(&'a str, &'a str)],
}

pub const TEST_TOKEN: &str = "test-token";

impl Daemon {
    /// Writes config + CDB into a temp dir and starts `bin`; waits until the admin port answers.
    ///
    /// The ports are picked free just before the start, so another test can take one in
    /// between; a start that fails with "Address already in use" is retried on new ports.
    pub fn start(bin: &str, s: DaemonSetup<'_>) -> Daemon {
        let mut attempt = 0;
        loop {
            match Self::try_start(bin, &s) {
                Ok(d) => return d,
                Err(logs) if logs.contains("Address already in use") && attempt < 5 => attempt += 1,
                Err(logs) => panic!("daemon did not start: {logs}"),
            }
        }
    }

    fn try_start(bin: &str, s: &DaemonSetup<'_>) -> Result<Daemon, String> {
        let dir = TempDir::new("daemon");
        write_cdb(&dir.path().join("domains.cdb"), s.rows);
        let (api, admin) = (free_port(), free_port());
        let text = format!(
            "addr = \"127.0.0.1:{api}\"\nadmin_addr = \"127.0.0.1:{admin}\"\nauth_token = \"{TEST_TOKEN}\"\n\
             domains_cdb = \"{cdb}\"\n{workers}{top}\n\
             [logging]\noutput = \"{app}\"\ncounting_output = \"{counting}\"\n{logging}\n\n\
             [redis]\n{redis_line}{redis_extra}\n\n{sections}\n",
            cdb = dir.path().join("domains.cdb").display(),
            top = s.top,
            workers = if s.top.contains("workers") {
                ""
            } else {
                "workers = 4\n"
            },
            app = dir.path().join("app.log").display(),
            counting = dir.path().join("counting.log").display(),
            logging = s.logging,
            redis_line = if s.redis.is_empty() {
                String::new()
            } else {
                format!("write_addr = \"{}\"\n", s.redis)
            },
            redis_extra = if s.redis_extra.contains("timeout_ms") {
                s.redis_extra.to_string()
            } else {
                format!("timeout_ms = 1000\n{}", s.redis_extra)
            },
            sections = s.sections,
        );
        let config = dir.path().join("config.toml");
        std::fs::write(&config, text).expect("write config");
        Self::try_start_with_config(bin, dir, config, api, admin, s.env)
    }

    /// Starts `bin -config <config>` whose file the caller wrote into `dir`.
    pub fn start_with_config(
        bin: &str,
        dir: TempDir,
        config: PathBuf,
        api: u16,
        admin: u16,
    ) -> Daemon {
        Self::try_start_with_config(bin, dir, config, api, admin, &[])
            .unwrap_or_else(|logs| panic!("daemon did not start: {logs}"))
    }

    /// As `start_with_config` with extra environment; a daemon that does not come up
    /// gives its logs.
    fn try_start_with_config(
        bin: &str,
        dir: TempDir,
        config: PathBuf,
        api: u16,
        admin: u16,
        env: &[(&str, &str)],
    ) -> Result<Daemon, String> {
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr file");
        let child = Command::new(bin)
            .arg("-config")
            .arg(&config)
            .env_remove("MIGADU_COUNTERS_AUTH_TOKEN")
            .env_remove("SSL_CERT_FILE")
            .env_remove("SSL_CERT_DIR")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start migadu_counters");
        let mut d = Daemon {
            api: format!("127.0.0.1:{api}"),
            admin: format!("127.0.0.1:{admin}"),
            dir,
            config,
            child: Some(child),
        };
        let admin_addr = d.admin.clone();
        let up = wait_until(Duration::from_secs(30), || {
            http(&admin_addr, "GET", "/metrics", &[], b"").is_ok() || d.exited().is_some()
        });
        if up && d.exited().is_none() {
            Ok(d)
        } else {
            Err(d.logs())
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Exit status if the process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} failed");
    }

    /// Waits for the process to end (bounded) and returns its status.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let mut status = None;
        wait_until(limit, || {
            status = self.exited();
            status.is_some()
        });
        status
    }

    /// App log and stderr, for failure messages.
    pub fn logs(&self) -> String {
        let read = |n: &str| std::fs::read_to_string(self.dir.path().join(n)).unwrap_or_default();
        format!(
            "--- app.log\n{}--- stderr\n{}",
            read("app.log"),
            read("stderr.log")
        )
    }

    pub fn counting_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("counting.log")).unwrap_or_default()
    }

    pub fn app_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("app.log")).unwrap_or_default()
    }

    /// POST a JSON body with the right token and content type.
    pub fn post(&self, route: &str, body: &str) -> HttpResponse {
        http(
            &self.api,
            "POST",
            route,
            &[
                ("Authorization", &format!("Bearer {TEST_TOKEN}")),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
        .expect("POST")
    }

    pub fn get_counters(&self, query: &str) -> HttpResponse {
        http(
            &self.api,
            "GET",
            &format!("/counters?{query}"),
            &[("Authorization", &format!("Bearer {TEST_TOKEN}"))],
            b"",
        )
        .expect("GET /counters")
    }

    /// The value of one metric sample, e.g. `migadu_counters_requests_total{route="in",status="202"}`.
    pub fn metric(&self, sample: &str) -> f64 {
        let body = http(&self.admin, "GET", "/metrics", &[], b"")
            .expect("metrics")
            .body;
        metric_value(&body, sample)
    }
}

/// Finds a sample in the text exposition format; labels may be listed in any order.
pub fn metric_value(text: &str, sample: &str) -> f64 {
    let (name, labels) = sample.split_once('{').unwrap_or((sample, ""));
    let want: Vec<&str> = labels
        .trim_end_matches('}')
        .split(',')
        .filter(|s| !s.is_empty())
        .collect();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (n, l) = series.split_once('{').unwrap_or((series, ""));
        if n != name {
            continue;
        }
        let have: Vec<&str> = l
            .trim_end_matches('}')
            .split(',')
            .filter(|s| !s.is_empty())
            .collect();
        if want.len() == have.len() && want.iter().all(|w| have.contains(w)) {
            return value.parse().unwrap_or(f64::NAN);
        }
    }
    0.0
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
