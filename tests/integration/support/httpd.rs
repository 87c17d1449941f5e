//! pepsi-httpd as a process for the tests: a configuration over a test database, the real
//! program started and stopped, its administrators made with its own `admin-add`, and a
//! small client (reqwest) that logs in and calls the API with a session cookie and CSRF
//! token, or with a bearer token.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

pub const HTTPD: &str = env!("CARGO_BIN_EXE_pepsi-httpd");

/// A logged-in browser: the session cookie's secret and the CSRF token login returned.
#[derive(Debug, Clone)]
pub struct Session {
    pub cookie: String,
    pub csrf: String,
}

/// How a request authenticates.
#[derive(Debug, Clone)]
pub enum Auth {
    None,
    /// Cookie and CSRF token.
    Session(Session),
    /// Cookie only (a forged cross-site request).
    CookieOnly(Session),
    /// A raw Cookie header value.
    RawCookie(String),
    Bearer(String),
}

/// An answer: status, JSON body (Null when empty), headers.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub json: Value,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

/// A running pepsi-httpd (killed when dropped).
pub struct Httpd {
    pub config: PathBuf,
    pub port: u16,
    pub log: PathBuf,
    child: Option<Child>,
    client: reqwest::Client,
    scheme: &'static str,
}

impl Drop for Httpd {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// `db_url` connecting as database role `role` instead (the test server trusts local
/// connections, as `scripts/services.sh` sets it up): pepsi-httpd tested with the privileges
/// its role has in production (`pepsi-httpd`), not the superuser's.
pub fn url_as(db_url: &str, role: &str) -> String {
    let (scheme, rest) = db_url.split_once("://").expect("a postgres:// URL");
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let host = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    format!("{scheme}://{role}@{host}")
}

/// Writes `dir/pepsi-httpd.conf`: the database, [pepsi-httpd] on a free port (ALLOW_ROOT:
/// the tests may run as root), then `extra`.
pub fn write_config(dir: &Path, db_url: &str, port: u16, extra: &str) -> PathBuf {
    let config = dir.join("pepsi-httpd.conf");
    std::fs::write(
        &config,
        format!(
            "[database]\nURL = {db_url}\nMAX_CONNECTIONS = 4\n\n\
             [pepsi-httpd]\nADDRESS = 127.0.0.1:{port}\nALLOW_ROOT = yes\n\n{extra}\n"
        ),
    )
    .unwrap();
    config
}

/// A new test database and a pepsi-httpd configuration over it as the pepsi-httpd role (the
/// rights an installation gives the server), on a free port, with `extra`; not started, so
/// that a test may fill the database first.
pub struct AsRole {
    pub db: pepsi_testkit::TestDb,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub port: u16,
}

impl AsRole {
    pub async fn new(extra: &str) -> AsRole {
        let db = pepsi_testkit::TestDb::new().await;
        let dir = tempfile::tempdir().unwrap();
        let port = super::free_port();
        let config = write_config(dir.path(), &url_as(&db.url, "pepsi-httpd"), port, extra);
        AsRole {
            db,
            dir,
            config,
            port,
        }
    }

    /// Starts pepsi-httpd with an administrator `root` logged in: the server and its session.
    pub async fn start(&self) -> (Httpd, Session) {
        let (httpd, _, session) = started_as_root(self.config.clone(), self.port).await;
        (httpd, session)
    }
}

impl Httpd {
    /// pepsi-httpd on `config` (listening on `port`), not started yet.
    pub fn new(config: PathBuf, port: u16) -> Httpd {
        let log = config.with_extension("log");
        Httpd {
            config,
            port,
            log,
            child: None,
            client: client(),
            scheme: "http",
        }
    }

    pub fn with_client(mut self, client: reqwest::Client, scheme: &'static str) -> Httpd {
        self.client = client;
        self.scheme = scheme;
        self
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}://127.0.0.1:{}{path}", self.scheme, self.port)
    }

    /// Starts it and waits until /healthz answers.
    pub async fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(HTTPD)
            .arg("-c")
            .arg(&self.config)
            .args(["-L", "debug"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = self.client.get(self.url("/healthz")).send().await
                && r.status() == 200
            {
                return;
            }
            if let Some(Some(status)) = self.child.as_mut().map(|c| c.try_wait().unwrap()) {
                panic!("pepsi-httpd exited {status}: {}", self.logs());
            }
            assert!(
                Instant::now() < until,
                "pepsi-httpd did not answer: {}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Stops it with SIGTERM and waits.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let until = Instant::now() + Duration::from_secs(10);
            while c.try_wait().unwrap().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `pepsi-httpd -c config ARGS`: (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(HTTPD)
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `admin-add NAME`; returns the password it printed.
    pub fn admin_add(&self, name: &str) -> String {
        let (code, out, err) = self.cli(&["admin-add", name]);
        assert_eq!(code, 0, "admin-add: {out} {err}");
        out.trim()
            .rsplit(' ')
            .next()
            .expect("the password is the last word")
            .to_owned()
    }

    /// `token-add ADMIN`; returns the token it printed.
    pub fn token_add(&self, admin: &str, extra: &[&str]) -> String {
        let mut args = vec!["token-add", admin];
        args.extend_from_slice(extra);
        let (code, out, err) = self.cli(&args);
        assert_eq!(code, 0, "token-add: {out} {err}");
        out.trim().to_owned()
    }

    /// One request.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        auth: &Auth,
        body: Option<&Value>,
    ) -> Answer {
        let mut req = self.client.request(method, self.url(path));
        req = match auth {
            Auth::None => req,
            Auth::Session(s) => req
                .header("Cookie", format!("pepsi_session={}", s.cookie))
                .header("X-CSRF-Token", &s.csrf),
            Auth::CookieOnly(s) => req.header("Cookie", format!("pepsi_session={}", s.cookie)),
            Auth::RawCookie(c) => req.header("Cookie", c),
            Auth::Bearer(t) => req.header("Authorization", format!("Bearer {t}")),
        };
        if let Some(b) = body {
            req = req
                .header("Content-Type", "application/json")
                .body(serde_json::to_vec(b).unwrap());
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap();
        let json = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text.clone()))
        };
        Answer {
            status,
            json,
            headers,
            text,
        }
    }

    pub async fn get(&self, path: &str, auth: &Auth) -> Answer {
        self.call(Method::GET, path, auth, None).await
    }

    pub async fn post(&self, path: &str, auth: &Auth, body: &Value) -> Answer {
        self.call(Method::POST, path, auth, Some(body)).await
    }

    /// Logs in; panics unless it succeeds.
    pub async fn login(&self, name: &str, password: &str) -> Session {
        let a = self
            .post(
                "/api/login",
                &Auth::None,
                &serde_json::json!({"name": name, "password": password}),
            )
            .await;
        assert_eq!(a.status, 200, "login: {a:?}");
        let set = a.headers["set-cookie"].to_str().unwrap().to_owned();
        let cookie = set
            .strip_prefix("pepsi_session=")
            .and_then(|s| s.split(';').next())
            .expect("a pepsi_session cookie")
            .to_owned();
        Session {
            cookie,
            csrf: a.json["csrf_token"].as_str().unwrap().to_owned(),
        }
    }
}

/// `text` parsed by the Prometheus Python client's own parser (Debian's
/// python3-prometheus-client): {family: {"type": ..., "samples": [[name, labels, value]]}}.
pub fn prometheus_parse(text: &str) -> Value {
    use std::io::Write as _;
    let script = "import sys, json\n\
                  from prometheus_client.parser import text_string_to_metric_families\n\
                  out = {}\n\
                  for f in text_string_to_metric_families(sys.stdin.read()):\n\
                  \x20   out[f.name] = {'type': f.type, 'samples': [[s.name, s.labels, s.value] for s in f.samples]}\n\
                  print(json.dumps(out))\n";
    let mut child = std::process::Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (scripts/apt-packages.txt: python3-prometheus-client)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The value of sample `name` with exactly `labels` in a parsed document.
pub fn sample(doc: &Value, family: &str, name: &str, labels: Value) -> Option<f64> {
    doc[family]["samples"]
        .as_array()?
        .iter()
        .find(|s| s[0] == name && s[1] == labels)
        .and_then(|s| s[2].as_f64())
}

/// pepsi-httpd started on `config` and `port` with administrator `root` added and logged in:
/// the server, root's password and its session.
pub async fn started_as_root(config: PathBuf, port: u16) -> (Httpd, String, Session) {
    let mut httpd = Httpd::new(config, port);
    let password = httpd.admin_add("root");
    httpd.start().await;
    let session = httpd.login("root", &password).await;
    (httpd, password, session)
}
