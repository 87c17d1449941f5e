//! A browser for the tests of the pages: Debian's headless Chromium driven through its
//! chromedriver over the W3C WebDriver protocol (HTTP and JSON, with the tests' reqwest
//! client). Missing chromium or chromedriver is a failure that names the package, never a
//! skip: scripts/apt-packages.txt lists both.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support;
use crate::support::free_port;

/// The browser: Debian's chromium. Missing is a failure, not a skip: scripts/test.sh
/// installs it (scripts/apt-packages.txt).
pub fn chromium() -> PathBuf {
    for p in ["/usr/lib/chromium/chromium", "/usr/bin/chromium"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!(
        "chromium is not installed: the page tests need Debian's chromium and \
         chromium-driver (apt-get install chromium chromium-driver; scripts/apt-packages.txt)"
    );
}

pub fn chromedriver() -> PathBuf {
    let p = Path::new("/usr/bin/chromedriver");
    assert!(
        p.exists(),
        "chromedriver is not installed: apt-get install chromium-driver (scripts/apt-packages.txt)"
    );
    p.to_path_buf()
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A WebDriver session on a chromedriver of its own (both ended when dropped).
pub struct Browser {
    driver: Child,
    base: String,
    client: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    /// Ends the session first, so that chromedriver closes Chromium (killed with its
    /// driver, the browser would linger until it noticed); a drop cannot await, so the
    /// DELETE is written by hand.
    fn drop(&mut self) {
        use std::io::{Read as _, Write as _};
        if let Some(rest) = self.base.strip_prefix("http://")
            && let Some((host, path)) = rest.split_once('/')
            && let Ok(mut s) = std::net::TcpStream::connect(host)
        {
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = write!(
                s,
                "DELETE /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\
                 Connection: close\r\n\r\n"
            );
            let _ = s.read_to_end(&mut Vec::new());
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    pub async fn start() -> Browser {
        let browser = chromium();
        let port = free_port();
        let driver = Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let client = support::httpd::client();
        let root = format!("http://127.0.0.1:{port}");
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = client.get(format!("{root}/status")).send().await
                && let Ok(text) = r.text().await
                && let Ok(v) = serde_json::from_str::<Value>(&text)
                && v["value"]["ready"] == true
            {
                break;
            }
            assert!(Instant::now() < until, "chromedriver did not become ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": browser,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--hide-scrollbars", "--window-size=2000,1250",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let text = client
            .post(format!("{root}/session"))
            .header("Content-Type", "application/json")
            .body(caps.to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let r: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let id = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver made no session: {r}"))
            .to_owned();
        Browser {
            driver,
            base: format!("{root}/session/{id}"),
            client,
            _profile: profile,
        }
    }

    /// One WebDriver command: its value, or the error WebDriver answered.
    pub async fn try_cmd(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> Result<Value, Value> {
        let mut req = self
            .client
            .request(method.clone(), format!("{}{path}", self.base));
        if method != reqwest::Method::GET {
            req = req
                .header("Content-Type", "application/json")
                .body(body.to_string());
        }
        let text = req.send().await.unwrap().text().await.unwrap();
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path} answered {text:?}: {e}"));
        if v["value"].get("error").is_some() {
            Err(v["value"].clone())
        } else {
            Ok(v["value"].clone())
        }
    }

    pub async fn cmd(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        self.try_cmd(method.clone(), path, body)
            .await
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"))
    }

    pub async fn go(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", json!({"url": url}))
            .await;
    }

    pub async fn try_find(&self, css: &str) -> Result<String, Value> {
        let v = self
            .try_cmd(
                reqwest::Method::POST,
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await?;
        Ok(v[ELEMENT].as_str().unwrap().to_owned())
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let el = self
            .try_find(css)
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/value"),
            json!({"text": text}),
        )
        .await;
    }

    /// Clicks the element `css` selects; again when the page replaced it in between (the
    /// row list is redrawn on every poll).
    pub async fn click(&self, css: &str) {
        let mut last = Value::Null;
        for _ in 0..5 {
            let result = match self.try_find(css).await {
                Ok(el) => {
                    self.try_cmd(
                        reqwest::Method::POST,
                        &format!("/element/{el}/click"),
                        json!({}),
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(_) => return,
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("cannot click {css}: {last}");
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub async fn js(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// Waits up to 20 s for `script` to return something other than null or false (an
    /// error, as while a page loads, counts as not yet).
    pub async fn until(&self, what: &str, script: &str) -> Value {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let v = self
                .try_cmd(
                    reqwest::Method::POST,
                    "/execute/sync",
                    json!({"script": script, "args": []}),
                )
                .await
                .unwrap_or(Value::Null);
            if !v.is_null() && v != json!(false) {
                return v;
            }
            if Instant::now() > end {
                let dom = self
                    .js("return document.body ? document.body.innerText : ''")
                    .await;
                panic!("the page never showed {what}; it reads:\n{dom}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn screenshot(&self) -> Vec<u8> {
        let v = self
            .cmd(reqwest::Method::GET, "/screenshot", Value::Null)
            .await;
        let dir = tempfile::tempdir().unwrap();
        let b64 = dir.path().join("shot.b64");
        std::fs::write(&b64, v.as_str().unwrap()).unwrap();
        let out = Command::new("base64").arg("-d").arg(&b64).output().unwrap();
        assert!(out.status.success(), "base64 -d failed");
        out.stdout
    }
}
