//! Whether the services answer: each ingress listener (its SMTP greeting) and pepsi-httpd
//! (`GET /healthz`), found in the configuration (`targets`, pure). The database and the
//! dispatcher's lock are asked through the pool in `lib.rs`. Every probe runs under one
//! deadline and ends in a [`Service`] saying what it saw; a probe never fails the program.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use pepsi_admin::status::LockHolder;
use pepsi_conf::config::Config;
use pepsi_conf::text::clip;
use pepsi_smtp::reply::{MAX_LINE, MAX_REPLY_LINES, Reply, parse_line, parse_reply};
use pepsi_smtp::{TlsOptions, TlsPolicy};
use serde::Serialize;
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, BufReader,
};
use tokio::net::TcpStream;
use tokio::time::timeout_at;

/// The prefix of the ingress's listener sections (`[listener-mx]`).
const LISTENER_PREFIX: &str = "listener-";
/// pepsi-httpd's section, and where it listens when ADDRESS is not set.
const HTTPD_SECTION: &str = "pepsi-httpd";
const HTTPD_DEFAULT: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);
/// The route asked of pepsi-httpd: it needs no credential and touches no database.
pub const HEALTH_PATH: &str = "/healthz";
/// The most of an HTTP answer read (the health route's is a few dozen bytes).
const MAX_HTTP_ANSWER: u64 = 64 * 1024;

/// What a service is, which decides how it is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The database of `[database] URL`: connected to.
    Database,
    /// pepsi-dispatch: the holder of its advisory lock.
    Dispatcher,
    /// An ingress listener: its 220 greeting, then QUIT.
    Smtp,
    /// pepsi-httpd: `GET /healthz` answered 200.
    Http,
}

/// Groups of services `--skip` leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Group {
    /// pepsi-dispatch
    Dispatcher,
    /// every [listener-NAME] of pepsi-ingress
    Ingress,
    /// pepsi-httpd
    Httpd,
}

/// One service to probe over the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `listener-mx`, `pepsi-httpd`.
    pub name: String,
    pub kind: Kind,
    /// Where to connect: the configured address, a wildcard one replaced by the loopback
    /// address of its family.
    pub connect: SocketAddr,
    /// Implicit TLS (a `submissions` listener, pepsi-httpd with CERT_FILE).
    pub tls: bool,
}

impl Target {
    /// The address as the screen shows it: `127.0.0.1:2525`, `https://127.0.0.1:8443`.
    pub fn shown(&self) -> String {
        match (self.kind, self.tls) {
            (Kind::Http, false) => format!("http://{}", self.connect),
            (Kind::Http, true) => format!("https://{}", self.connect),
            (_, true) => format!("{} (TLS)", self.connect),
            _ => self.connect.to_string(),
        }
    }
}

/// What a probe saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Service {
    /// `database`, `dispatcher`, `listener-NAME`, `pepsi-httpd`.
    pub name: String,
    pub kind: Kind,
    /// Where it was asked (none for the database and the dispatcher).
    pub address: Option<String>,
    /// True when it answered as a running service does.
    pub ok: bool,
    /// What it answered (the greeting, the HTTP status, the lock holder) or why it did not.
    pub detail: String,
    /// How long the probe took; none when it was not made.
    pub elapsed_ms: Option<u64>,
    /// The dispatcher's session (dispatcher only).
    pub holder: Option<LockHolder>,
}

impl Service {
    pub fn new(name: &str, kind: Kind, ok: bool, detail: impl Into<String>) -> Service {
        Service {
            name: name.to_owned(),
            kind,
            address: None,
            ok,
            detail: detail.into(),
            elapsed_ms: None,
            holder: None,
        }
    }
}

/// The listeners (`[listener-NAME] ADDRESS`, `ROLE`) and pepsi-httpd (`[pepsi-httpd]
/// ADDRESS`, `CERT_FILE`; only when the section exists) of `cfg`, less the skipped groups,
/// in the order the screen shows them. Errors name the section and the value.
pub fn targets(cfg: &Config, skip: &[Group]) -> anyhow::Result<Vec<Target>> {
    let mut out = Vec::new();
    if !skip.contains(&Group::Ingress) {
        for name in cfg.sections() {
            let lower = name.to_ascii_lowercase();
            let Some(short) = lower.strip_prefix(LISTENER_PREFIX) else {
                continue;
            };
            if short.is_empty() {
                continue;
            }
            let s = cfg.section(name);
            let text = s.string("ADDRESS")?;
            let address: SocketAddr = text.parse().with_context(|| {
                format!("[{name}] ADDRESS = {text:?}: expected IP:port, such as 127.0.0.1:25")
            })?;
            let role = s.string_opt("ROLE")?.unwrap_or_default();
            out.push(Target {
                name: lower.clone(),
                kind: Kind::Smtp,
                connect: reachable(address),
                tls: role.eq_ignore_ascii_case("submissions"),
            });
        }
    }
    if !skip.contains(&Group::Httpd) && cfg.has_section(HTTPD_SECTION) {
        let s = cfg.section(HTTPD_SECTION);
        let address = match s.string_opt("ADDRESS")? {
            None => HTTPD_DEFAULT,
            Some(text) => match text.parse() {
                Ok(a) => a,
                Err(_) => bail!(
                    "[{HTTPD_SECTION}] ADDRESS = {text:?}: expected IP:port, such as 127.0.0.1:8080"
                ),
            },
        };
        out.push(Target {
            name: HTTPD_SECTION.to_owned(),
            kind: Kind::Http,
            connect: reachable(address),
            tls: s.has("CERT_FILE"),
        });
    }
    Ok(out)
}

/// A wildcard address (`0.0.0.0`, `::`) is asked on the loopback address of its family.
fn reachable(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), a.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), a.port())
        }
        _ => a,
    }
}

/// Probes `target`, all of it (connect, handshake, answer) within `limit`.
pub async fn probe(target: &Target, limit: Duration) -> Service {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + limit;
    let result = match target.kind {
        Kind::Smtp => smtp(target, deadline, limit).await,
        Kind::Http => http(target, deadline, limit).await,
        Kind::Database | Kind::Dispatcher => Err("not a network service".to_owned()),
    };
    let (ok, detail) = match result {
        Ok(d) => (true, d),
        Err(d) => (false, d),
    };
    Service {
        address: Some(target.shown()),
        elapsed_ms: Some(started.elapsed().as_millis() as u64),
        ..Service::new(&target.name, target.kind, ok, detail)
    }
}

/// Connects (and shakes hands for TLS) before `deadline`; the error says which step failed.
async fn connect(
    target: &Target,
    deadline: tokio::time::Instant,
    limit: Duration,
) -> Result<Box<dyn Stream>, String> {
    let tcp = match timeout_at(deadline, TcpStream::connect(target.connect)).await {
        Err(_) => return Err(format!("no connection within {}", secs(limit))),
        Ok(Err(e)) => return Err(format!("cannot connect: {e}")),
        Ok(Ok(s)) => s,
    };
    if !target.tls {
        return Ok(Box::new(tcp));
    }
    let config = pepsi_smtp::tls::client_config(&TlsOptions {
        policy: TlsPolicy::Encrypt,
        ..TlsOptions::default()
    })?;
    let name = tokio_rustls::rustls::pki_types::ServerName::from(target.connect.ip());
    match timeout_at(
        deadline,
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    {
        Err(_) => Err(format!(
            "connected, but no TLS handshake within {}",
            secs(limit)
        )),
        Ok(Err(e)) => Err(format!("connected, but the TLS handshake failed: {e}")),
        Ok(Ok(s)) => Ok(Box::new(s)),
    }
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// The greeting must be a 220; then QUIT (its answer is waited for only until the deadline
/// and not judged: the greeting is what says the ingress serves).
async fn smtp(
    target: &Target,
    deadline: tokio::time::Instant,
    limit: Duration,
) -> Result<String, String> {
    let stream = connect(target, deadline, limit).await?;
    let mut r = BufReader::new(stream);
    let greeting = match timeout_at(deadline, read_reply(&mut r)).await {
        Err(_) => return Err(format!("connected, but no greeting within {}", secs(limit))),
        Ok(Err(e)) => return Err(format!("connected, but {e}")),
        Ok(Ok(reply)) => reply,
    };
    let text = clip(&greeting.lines.join(" "), 120);
    if greeting.code != 220 {
        return Err(format!("greets with {} {text}", greeting.code));
    }
    let _ = timeout_at(deadline, async {
        r.get_mut().write_all(b"QUIT\r\n").await.ok()?;
        read_reply(&mut r).await.ok()
    })
    .await;
    Ok(format!("220 {text}"))
}

/// One SMTP reply, its lines bounded as the client's are.
async fn read_reply<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Result<Reply, String> {
    let mut lines = Vec::new();
    loop {
        let mut raw = Vec::new();
        let n = (&mut *r)
            .take(MAX_LINE as u64 + 2)
            .read_until(b'\n', &mut raw)
            .await
            .map_err(|e| format!("reading failed: {e}"))?;
        if n == 0 {
            return Err("the connection closed before a complete reply".into());
        }
        if !raw.ends_with(b"\n") {
            return Err(format!("a reply line is longer than {MAX_LINE} octets"));
        }
        let line = String::from_utf8_lossy(&raw)
            .trim_end_matches(['\r', '\n'])
            .to_owned();
        let last = parse_line(&line)?.last;
        lines.push(line);
        if last {
            return parse_reply(&lines);
        }
        if lines.len() >= MAX_REPLY_LINES {
            return Err(format!("a reply has more than {MAX_REPLY_LINES} lines"));
        }
    }
}

/// `GET /healthz` must be answered 200.
async fn http(
    target: &Target,
    deadline: tokio::time::Instant,
    limit: Duration,
) -> Result<String, String> {
    let mut stream = connect(target, deadline, limit).await?;
    let request = format!(
        "GET {HEALTH_PATH} HTTP/1.1\r\nHost: {}\r\nUser-Agent: pepsi-status\r\n\
         Accept: application/json\r\nConnection: close\r\n\r\n",
        target.connect
    );
    let answer = timeout_at(deadline, async {
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        (&mut stream)
            .take(MAX_HTTP_ANSWER)
            .read_to_end(&mut answer)
            .await?;
        Ok::<_, std::io::Error>(answer)
    })
    .await;
    let answer = match answer {
        Err(_) => return Err(format!("connected, but no answer within {}", secs(limit))),
        Ok(Err(e)) => return Err(format!("connected, but {e}")),
        Ok(Ok(a)) => a,
    };
    match http_status(&answer) {
        Some(200) => Ok(format!("HTTP 200 to GET {HEALTH_PATH}")),
        Some(code) => Err(format!("answers HTTP {code} to GET {HEALTH_PATH}")),
        None if answer.is_empty() => {
            Err("connected, but the server closed without an answer".into())
        }
        None => Err(format!(
            "connected, but the answer is not HTTP: {:?}",
            clip(
                &String::from_utf8_lossy(&answer[..answer.len().min(60)]),
                60
            )
        )),
    }
}

/// The status code of an HTTP/1.x answer's status line.
fn http_status(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut words = line.split(' ');
    let version = words.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let code = words.next()?;
    (code.len() == 3).then(|| code.parse().ok()).flatten()
}

/// `3s`, `500ms`: a limit as the messages say it.
pub fn secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_str_named(text, "t.conf").unwrap()
    }

    #[test]
    fn targets_come_from_listener_sections_and_the_httpd_section() {
        let c = cfg("[listener-mx]\nROLE = mx\nADDRESS = 0.0.0.0:25\n\
                     [listener-subs]\nROLE = submissions\nADDRESS = [::]:465\n\
                     [listener-sub]\nROLE = submission\nADDRESS = 192.0.2.1:587\n\
                     [pepsi-httpd]\nCERT_FILE = c.pem\nKEY_FILE = k.pem\n");
        let got: Vec<(String, Kind, String, bool)> = targets(&c, &[])
            .unwrap()
            .into_iter()
            .map(|t| (t.name.clone(), t.kind, t.shown(), t.tls))
            .collect();
        let want = [
            ("listener-mx", Kind::Smtp, "127.0.0.1:25", false),
            ("listener-sub", Kind::Smtp, "192.0.2.1:587", false),
            ("listener-subs", Kind::Smtp, "[::1]:465 (TLS)", true),
            ("pepsi-httpd", Kind::Http, "https://127.0.0.1:8080", true),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!((g.0.as_str(), g.1, g.2.as_str(), g.3), w);
        }
    }

    #[test]
    fn skipped_groups_and_missing_sections_are_not_probed() {
        let c =
            cfg("[listener-mx]\nADDRESS = 127.0.0.1:2525\n[pepsi-httpd]\nADDRESS = 127.0.0.1:1\n");
        let names = |skip: &[Group]| -> Vec<String> {
            targets(&c, skip)
                .unwrap()
                .into_iter()
                .map(|t| t.name)
                .collect()
        };
        assert_eq!(names(&[]), ["listener-mx", "pepsi-httpd"]);
        assert_eq!(names(&[Group::Ingress]), ["pepsi-httpd"]);
        assert_eq!(names(&[Group::Httpd]), ["listener-mx"]);
        assert!(
            targets(&cfg("[database]\nURL = x\n"), &[])
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_bad_address_names_its_section_and_value() {
        for (text, want) in [
            (
                "[listener-mx]\nADDRESS = localhost:25\n",
                "[listener-mx] ADDRESS = \"localhost:25\"",
            ),
            ("[listener-mx]\nROLE = mx\n", "ADDRESS"),
            (
                "[pepsi-httpd]\nADDRESS = :8080\n",
                "[pepsi-httpd] ADDRESS = \":8080\"",
            ),
        ] {
            let e = format!("{:#}", targets(&cfg(text), &[]).unwrap_err());
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn http_status_lines() {
        for (answer, want) in [
            (
                &b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"[..],
                Some(200),
            ),
            (b"HTTP/1.0 503 Service Unavailable\r\n\r\n", Some(503)),
            (b"HTTP/2 200\r\n", None),
            (b"220 mx.example.test ESMTP\r\n", None),
            (b"HTTP/1.1 20 OK\r\n", None),
            (b"", None),
        ] {
            assert_eq!(
                http_status(answer),
                want,
                "{:?}",
                String::from_utf8_lossy(answer)
            );
        }
    }

    #[tokio::test]
    async fn replies_are_read_whole_and_bounded() {
        let read = |bytes: &'static [u8]| async move {
            let mut r = BufReader::new(bytes);
            read_reply(&mut r).await
        };
        let r = read(b"220-mx.example.test ESMTP\r\n220 ready\r\n")
            .await
            .unwrap();
        assert_eq!((r.code, r.lines.len()), (220, 2));
        assert!(
            read(b"220-only a first line\r\n")
                .await
                .unwrap_err()
                .contains("closed")
        );
        assert!(read(b"hello\r\n").await.unwrap_err().contains("reply code"));
        let long: &'static [u8] = Box::leak(
            format!("220 {}\r\n", "x".repeat(MAX_LINE + 10))
                .into_bytes()
                .into_boxed_slice(),
        );
        assert!(read(long).await.unwrap_err().contains("longer than"));
    }
}
