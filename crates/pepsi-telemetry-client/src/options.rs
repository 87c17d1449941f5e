//! `[pepsi-telemetry-client]`: the socket the client binds, the receiver it exports to and
//! how, what it may export, and the bounds it keeps. Read once at start and validated; no
//! I/O here (the token and the CA file are read by `Credentials::load` when the client
//! starts, so `pepsi-config check` can judge the section as any user).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use pepsi_conf::config::Config;
use pepsi_contract::telemetry::emit::{CLIENT_SECTION, socket_path};

/// The section the client reads (the one whose SOCKET every Pepsi process sends to).
pub const SECTION: &str = CLIENT_SECTION;

/// The most spans one export request carries (`BATCH_SIZE`). A batch is held besides the
/// queue while it is sent, so the memory bound is MAX_QUEUE + BATCH_SIZE spans; at 16 KiB
/// a span at most, one request stays within 32 MiB before gzip, under the exporter's own
/// limit of 64 MiB.
pub const MAX_BATCH_SIZE: usize = 2048;

/// The shortest token sent: the receiver accepts none shorter.
const MIN_TOKEN_LEN: usize = 16;
/// The longest token sent (it travels in an HTTP header).
const MAX_TOKEN_LEN: usize = 512;

/// Where the spans go: the receiver's base URL, without a trailing slash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    base: String,
    https: bool,
}

impl Endpoint {
    /// `ENDPOINT`: an `https://` URL with a host and nothing after the path (no query, no
    /// fragment, no user), or `http://` to a loopback host only, since the bearer token
    /// would otherwise cross the network in the clear.
    pub fn parse(text: &str) -> Result<Endpoint, String> {
        let text = text.trim();
        let url = reqwest::Url::parse(text)
            .map_err(|e| format!("ENDPOINT = {text:?} is not a URL ({e})"))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "ENDPOINT = {text:?} holds credentials; the token goes in TOKEN_FILE"
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "ENDPOINT = {text:?}: expected a base URL without a query or fragment (https://telemetry.example.org:4318)"
            ));
        }
        if !["https", "http"].contains(&url.scheme()) {
            return Err(format!(
                "ENDPOINT = {text:?}: scheme {}:// is not https:// (OTLP over HTTP)",
                url.scheme()
            ));
        }
        let Some(host) = url.host_str() else {
            return Err(format!("ENDPOINT = {text:?} names no host"));
        };
        let https = match url.scheme() {
            "https" => true,
            "http" if is_loopback(host) => false,
            _ => {
                return Err(format!(
                    "ENDPOINT = {text:?}: http:// only to a loopback host (127.0.0.1, [::1], localhost); the bearer token would cross the network in the clear, so use https://"
                ));
            }
        };
        Ok(Endpoint {
            base: url.as_str().trim_end_matches('/').to_owned(),
            https,
        })
    }

    /// The URL the spans are posted to.
    pub fn traces(&self) -> String {
        format!("{}/v1/traces", self.base)
    }

    /// The URL the metric points are posted to.
    pub fn metrics(&self) -> String {
        format!("{}/v1/metrics", self.base)
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn is_https(&self) -> bool {
        self.https
    }
}

/// A host name or address that can only be this host.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => bare.eq_ignore_ascii_case("localhost"),
    }
}

/// Everything the client needs to know before it starts.
#[derive(Debug, Clone)]
pub struct Options {
    /// `SOCKET`: the Unix stream socket it listens on and every Pepsi process sends to.
    pub socket: PathBuf,
    /// `ENDPOINT`: the receiver.
    pub endpoint: Endpoint,
    /// `TOKEN_FILE`: the bearer token the receiver knows this host by.
    pub token_file: PathBuf,
    /// `CA_FILE`: a trust anchor for the receiver's certificate, besides the usual roots.
    pub ca_file: Option<PathBuf>,
    /// `HOSTNAME` (the system's): the resource's `host.name`.
    pub hostname: String,
    /// `ADDRESSES` (no): export the envelope's addresses. Off, they are dropped as each span
    /// arrives and never leave the host.
    pub addresses: bool,
    /// `MAX_QUEUE` (10000): spans queued at most; beyond, the oldest go. With the batch in
    /// flight, the memory bound is MAX_QUEUE + BATCH_SIZE spans.
    pub max_queue: usize,
    /// `MAX_CONNECTIONS` (1024): sending processes connected at once at most (each Pepsi
    /// process keeps one connection); one more is closed at once and its spans dropped.
    pub max_connections: usize,
    /// `BATCH_SIZE` (512, at most [`MAX_BATCH_SIZE`]): spans per export request.
    pub batch_size: usize,
    /// `EXPORT_INTERVAL` (2s): the longest a span waits for its batch to fill.
    pub export_interval: Duration,
    /// `EXPORT_TIMEOUT` (10s): one export request's deadline.
    pub export_timeout: Duration,
    /// `METRICS_INTERVAL` (15s): how often the metric points are exported.
    pub metrics_interval: Duration,
}

impl Options {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Options> {
        let s = cfg.section(SECTION);
        let Some(socket) = socket_path(cfg)? else {
            bail!(
                "[{SECTION}] SOCKET is not set: name the Unix socket the client listens on and every Pepsi process sends its spans to (/run/pepsi/telemetry.sock)"
            );
        };
        if !socket.is_absolute() {
            bail!(
                "[{SECTION}] SOCKET = {}: expected an absolute path",
                socket.display()
            );
        }
        let Some(endpoint) = s.string_opt("ENDPOINT")? else {
            bail!(
                "[{SECTION}] ENDPOINT is not set: name the receiver, pepsi-telemetry (https://telemetry.example.org:4318)"
            );
        };
        let endpoint =
            Endpoint::parse(&endpoint).map_err(|e| anyhow::anyhow!("[{SECTION}] {e}"))?;
        let Some(token_file) = s.path_opt("TOKEN_FILE")? else {
            bail!(
                "[{SECTION}] TOKEN_FILE is not set: name the file holding the bearer token the receiver accepts from this host"
            );
        };
        let hostname = match s.string_opt("HOSTNAME")? {
            Some(h) if !h.trim().is_empty() => h.trim().to_owned(),
            Some(_) => bail!(
                "[{SECTION}] HOSTNAME is empty: name this host, or leave it unset for the system's name"
            ),
            None => pepsi_conf::config::system_hostname(),
        };
        let count = |opt: &str, default: usize, max: usize| -> anyhow::Result<usize> {
            let n = s.number_opt::<usize>(opt)?.unwrap_or(default);
            if !(1..=max).contains(&n) {
                bail!("[{SECTION}] {opt} = {n}: expected 1 to {max}");
            }
            Ok(n)
        };
        let max_queue = count("MAX_QUEUE", 10_000, 10_000_000)?;
        let batch_size = s.number_opt::<usize>("BATCH_SIZE")?.unwrap_or(512);
        if !(1..=MAX_BATCH_SIZE).contains(&batch_size) {
            bail!(
                "[{SECTION}] BATCH_SIZE = {batch_size}: expected 1 to {MAX_BATCH_SIZE} (the spans of one export request, held besides MAX_QUEUE while it is sent)"
            );
        }
        if batch_size > max_queue {
            bail!(
                "[{SECTION}] BATCH_SIZE = {batch_size} is above MAX_QUEUE = {max_queue}: a batch is taken from the queue"
            );
        }
        let duration = |opt: &str, default: Duration, min: Duration| -> anyhow::Result<Duration> {
            let d = s.duration_opt(opt)?.unwrap_or(default);
            if d < min {
                bail!("[{SECTION}] {opt} = {d:?}: expected at least {min:?}");
            }
            Ok(d)
        };
        let ms = Duration::from_millis;
        Ok(Options {
            socket,
            endpoint,
            token_file,
            ca_file: s.path_opt("CA_FILE")?,
            hostname,
            addresses: s.bool_opt("ADDRESSES")?.unwrap_or(false),
            max_queue,
            max_connections: count("MAX_CONNECTIONS", 1024, 65_536)?,
            batch_size,
            export_interval: duration("EXPORT_INTERVAL", Duration::from_secs(2), ms(10))?,
            export_timeout: duration("EXPORT_TIMEOUT", Duration::from_secs(10), ms(100))?,
            metrics_interval: duration("METRICS_INTERVAL", Duration::from_secs(15), ms(100))?,
        })
    }
}

/// What the client reads from files at start: the token and the extra trust anchors.
pub struct Credentials {
    pub token: String,
    pub roots: Vec<reqwest::Certificate>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Credentials {{ token: <{} characters>, roots: {} }}",
            self.token.len(),
            self.roots.len()
        )
    }
}

impl Credentials {
    /// Reads `TOKEN_FILE` (its first line that is neither blank nor a `#` comment) and
    /// `CA_FILE`; refuses a file it cannot read, a token that is not 16 to 512 visible ASCII
    /// characters, and a CA file without a certificate. Errors name the file, never the token.
    pub fn load(options: &Options) -> anyhow::Result<Credentials> {
        let token = read_token(&options.token_file)?;
        let roots = match &options.ca_file {
            Some(path) => read_roots(path)?,
            None => Vec::new(),
        };
        Ok(Credentials { token, roots })
    }
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("[{SECTION}] TOKEN_FILE {}: cannot read it", path.display()))?;
    let Some(token) = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
    else {
        bail!(
            "[{SECTION}] TOKEN_FILE {}: holds no token (the bearer token the receiver accepts, on a line of its own)",
            path.display()
        );
    };
    if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&token.len())
        || !token.bytes().all(|b| b.is_ascii_graphic())
    {
        bail!(
            "[{SECTION}] TOKEN_FILE {}: the token is not {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} visible ASCII characters",
            path.display()
        );
    }
    Ok(token.to_owned())
}

fn read_roots(path: &Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem = std::fs::read(path)
        .with_context(|| format!("[{SECTION}] CA_FILE {}: cannot read it", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).with_context(|| {
        format!(
            "[{SECTION}] CA_FILE {}: not PEM certificates",
            path.display()
        )
    })?;
    if certs.is_empty() {
        bail!(
            "[{SECTION}] CA_FILE {}: holds no PEM certificate",
            path.display()
        );
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[pepsi-telemetry-client]\nSOCKET = /run/pepsi/telemetry.sock\nENDPOINT = https://telemetry.example.org:4318\nTOKEN_FILE = /etc/pepsi/telemetry.token\n";

    fn options(text: &str) -> anyhow::Result<Options> {
        Options::from_config(&Config::from_str_named(text, "t.conf").unwrap())
    }

    #[test]
    fn defaults() {
        let o = options(&format!("{BASE}HOSTNAME = mx1.example.org\n")).unwrap();
        assert_eq!(o.socket, Path::new("/run/pepsi/telemetry.sock"));
        assert_eq!(
            o.endpoint.traces(),
            "https://telemetry.example.org:4318/v1/traces"
        );
        assert_eq!(
            o.endpoint.metrics(),
            "https://telemetry.example.org:4318/v1/metrics"
        );
        assert_eq!(o.hostname, "mx1.example.org");
        assert!(!o.addresses);
        assert_eq!((o.max_queue, o.batch_size), (10_000, 512));
        assert_eq!(o.max_connections, 1024);
        assert_eq!(o.export_interval, Duration::from_secs(2));
        assert_eq!(o.export_timeout, Duration::from_secs(10));
        assert_eq!(o.metrics_interval, Duration::from_secs(15));
        assert_eq!(o.ca_file, None);
        assert!(!options(BASE).unwrap().hostname.is_empty());
    }

    #[test]
    fn endpoints() {
        let cases = [
            (
                "https://t.example.org:4318",
                Ok("https://t.example.org:4318/v1/traces"),
            ),
            (
                "https://t.example.org:4318/",
                Ok("https://t.example.org:4318/v1/traces"),
            ),
            (
                "https://t.example.org/otel/",
                Ok("https://t.example.org/otel/v1/traces"),
            ),
            (
                "http://127.0.0.1:4318",
                Ok("http://127.0.0.1:4318/v1/traces"),
            ),
            (
                "http://127.3.0.1:4318",
                Ok("http://127.3.0.1:4318/v1/traces"),
            ),
            ("http://[::1]:4318", Ok("http://[::1]:4318/v1/traces")),
            (
                "http://LocalHost:4318",
                Ok("http://localhost:4318/v1/traces"),
            ),
            (
                "http://t.example.org:4318",
                Err("http:// only to a loopback host"),
            ),
            (
                "http://10.0.0.1:4318",
                Err("http:// only to a loopback host"),
            ),
            (
                "http://localhost.example.org",
                Err("http:// only to a loopback host"),
            ),
            ("ftp://t.example.org", Err("scheme ftp:// is not https://")),
            (
                "t.example.org:4318",
                Err("scheme t.example.org:// is not https://"),
            ),
            ("https://", Err("is not a URL")),
            ("https://u:p@t.example.org", Err("holds credentials")),
            (
                "https://t.example.org/?a=b",
                Err("without a query or fragment"),
            ),
            ("not a url", Err("is not a URL")),
        ];
        for (text, want) in cases {
            let got = Endpoint::parse(text).map(|e| e.traces());
            match (got, want) {
                (Ok(url), Ok(want)) => assert_eq!(url, want, "{text}"),
                (Err(e), Err(want)) => assert!(e.contains(want), "{text}: {e}"),
                (got, want) => panic!("{text}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn each_bad_value_is_named() {
        let cases = [
            (
                "[pepsi-telemetry-client]\nENDPOINT = https://t\nTOKEN_FILE = /t\n",
                "[pepsi-telemetry-client] SOCKET is not set",
            ),
            (
                "[pepsi-telemetry-client]\nSOCKET = /s\nTOKEN_FILE = /t\n",
                "[pepsi-telemetry-client] ENDPOINT is not set",
            ),
            (
                "[pepsi-telemetry-client]\nSOCKET = /s\nENDPOINT = https://t\n",
                "[pepsi-telemetry-client] TOKEN_FILE is not set",
            ),
            (
                "[pepsi-telemetry-client]\nSOCKET = spans.sock\nENDPOINT = https://t\nTOKEN_FILE = /t\n",
                "[pepsi-telemetry-client] SOCKET = spans.sock: expected an absolute path",
            ),
            (
                "[pepsi-telemetry-client]\nSOCKET = /s\nENDPOINT = http://t.example.org\nTOKEN_FILE = /t\n",
                "[pepsi-telemetry-client] ENDPOINT = \"http://t.example.org\": http:// only to a loopback host",
            ),
            (
                "MAX_QUEUE = 0\n",
                "[pepsi-telemetry-client] MAX_QUEUE = 0: expected 1 to 10000000",
            ),
            (
                "MAX_CONNECTIONS = 70000\n",
                "[pepsi-telemetry-client] MAX_CONNECTIONS = 70000: expected 1 to 65536",
            ),
            (
                "BATCH_SIZE = 0\n",
                "[pepsi-telemetry-client] BATCH_SIZE = 0: expected 1 to 2048",
            ),
            (
                "MAX_QUEUE = 100000\nBATCH_SIZE = 2049\n",
                "[pepsi-telemetry-client] BATCH_SIZE = 2049: expected 1 to 2048",
            ),
            (
                "MAX_QUEUE = 100\nBATCH_SIZE = 200\n",
                "[pepsi-telemetry-client] BATCH_SIZE = 200 is above MAX_QUEUE = 100",
            ),
            (
                "EXPORT_INTERVAL = 1ms\n",
                "[pepsi-telemetry-client] EXPORT_INTERVAL = 1ms: expected at least 10ms",
            ),
            (
                "EXPORT_TIMEOUT = 10ms\n",
                "[pepsi-telemetry-client] EXPORT_TIMEOUT = 10ms: expected at least 100ms",
            ),
            (
                "METRICS_INTERVAL = 10ms\n",
                "[pepsi-telemetry-client] METRICS_INTERVAL = 10ms: expected at least 100ms",
            ),
            (
                "HOSTNAME = \"\"\n",
                "[pepsi-telemetry-client] HOSTNAME is empty",
            ),
            ("ADDRESSES = maybe\n", "ADDRESSES"),
        ];
        for (extra, want) in cases {
            let text = if extra.starts_with('[') {
                extra.to_owned()
            } else {
                format!("{BASE}{extra}")
            };
            let e = format!("{:#}", options(&text).unwrap_err());
            assert!(e.contains(want), "{extra:?}: {e}");
        }
        let o = options(&format!(
            "{BASE}ADDRESSES = yes\nMAX_QUEUE = 1000\nBATCH_SIZE = 1000\nEXPORT_INTERVAL = 200ms\n"
        ))
        .unwrap();
        assert!(o.addresses);
        assert_eq!((o.max_queue, o.batch_size), (1000, 1000));
        assert_eq!(o.export_interval, Duration::from_millis(200));
        let o = options(&format!("{BASE}BATCH_SIZE = 2048\n")).unwrap();
        assert_eq!(o.batch_size, MAX_BATCH_SIZE);
    }

    #[test]
    fn the_token_file_must_hold_a_token_and_its_error_never_shows_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let mut o = options(BASE).unwrap();
        o.token_file = path.clone();
        let cases: [(Option<&str>, Result<&str, &str>); 6] = [
            (None, Err("cannot read it")),
            (Some(""), Err("holds no token")),
            (Some("# only a comment\n\n"), Err("holds no token")),
            (Some("short-secret\n"), Err("not 16 to 512 visible ASCII")),
            (
                Some("a token with spaces in it\n"),
                Err("not 16 to 512 visible ASCII"),
            ),
            (
                Some("# the receiver's\n  0123456789abcdef0123  \nsecond\n"),
                Ok("0123456789abcdef0123"),
            ),
        ];
        for (content, want) in cases {
            let _ = std::fs::remove_file(&path);
            if let Some(c) = content {
                std::fs::write(&path, c).unwrap();
            }
            match (Credentials::load(&o), want) {
                (Ok(c), Ok(want)) => assert_eq!(c.token, want),
                (Err(e), Err(want)) => {
                    let e = format!("{e:#}");
                    assert!(
                        e.contains(want) && e.contains(&path.display().to_string()),
                        "{e}"
                    );
                    assert!(!e.contains("secret") && !e.contains("spaces"), "{e}");
                }
                (got, want) => panic!("{content:?}: {got:?}, wanted {want:?}"),
            }
        }
        o.ca_file = Some(dir.path().join("ca.pem"));
        std::fs::write(dir.path().join("ca.pem"), "no certificate here\n").unwrap();
        let e = format!("{:#}", Credentials::load(&o).unwrap_err());
        assert!(e.contains("CA_FILE") && e.contains("ca.pem"), "{e}");
    }
}
