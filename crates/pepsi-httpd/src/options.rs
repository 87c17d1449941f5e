//! `[pepsi-httpd]`: where pepsi-httpd listens, as whom, and every limit it enforces. Read
//! once at start and validated; pure, no I/O.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ipnet::IpNet;
use pepsi_conf::config::Config;

/// The section pepsi-httpd reads.
pub const SECTION: &str = "pepsi-httpd";

/// The bounds of `LATENCY_WINDOW`.
const MIN_LATENCY_WINDOW: Duration = Duration::from_secs(60);
const MAX_LATENCY_WINDOW: Duration = Duration::from_secs(31 * 86_400);

/// An address block of `METRICS_ALLOW` or `TRUSTED_PROXIES`: `192.0.2.0/24`, `::1/128`, or
/// one address (a full-length prefix).
pub fn parse_block(text: &str) -> Result<IpNet, String> {
    let t = text.trim();
    let (addr, prefix) = match t.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (t, None),
    };
    let net: IpAddr = addr
        .parse()
        .map_err(|_| format!("{t:?} is not an IP address or address/prefix"))?;
    let max = if net.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) => p
            .parse::<u8>()
            .ok()
            .filter(|&p| p <= max)
            .ok_or_else(|| format!("{t:?}: the prefix must be a number from 0 to {max}"))?,
    };
    IpNet::new(net, prefix)
        .map_err(|_| format!("{t:?}: the prefix must be a number from 0 to {max}"))
}

/// True when one of `blocks` holds `ip`; an IPv4-mapped IPv6 address counts as IPv4, since
/// a dual-stack listener reports IPv4 peers so.
pub fn any_contains(blocks: &[IpNet], ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    blocks.iter().any(|b| b.contains(&ip))
}

/// A database URL that may hold a password: kept out of `Debug` output.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(pub String);

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DatabaseUrl(..)")
    }
}

/// Everything pepsi-httpd needs to know before it serves.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpdOptions {
    /// `ADDRESS`: where it listens (default 127.0.0.1:8080).
    pub address: SocketAddr,
    /// `CERT_FILE` and `KEY_FILE`: serve HTTPS when both are set.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `USER` and `GROUP`: whom it becomes after binding and loading its key, before the
    /// first connection.
    pub user: Option<String>,
    pub group: Option<String>,
    /// `ALLOW_ROOT`: serve as root when no USER is set (a development checkout).
    pub allow_root: bool,
    /// `SESSION_IDLE_TIMEOUT`: a session unused this long has ended (default 30m).
    pub session_idle: Duration,
    /// `SESSION_MAX_AGE`: a session ends this long after the login, used or not (12h).
    pub session_max_age: Duration,
    /// `LOGIN_THROTTLE_WINDOW`: how long failed logins are counted (15m).
    pub login_window: Duration,
    /// `LOGIN_MAX_FAILURES_PER_ADDRESS`: failed logins from one client address (an IPv6
    /// /64) within the window before further attempts are refused with 429 (20).
    pub login_max_per_address: u32,
    /// `LOGIN_MAX_FAILURES_PER_ACCOUNT`: the same per administrator name (5).
    pub login_max_per_account: u32,
    /// `LOGIN_CONCURRENCY`: password checks (Argon2id, about 19 MiB and tens of
    /// milliseconds of CPU each) running at once over all clients (2).
    pub login_concurrency: usize,
    /// `LOGIN_QUEUE_TIMEOUT`: how long a login waits for one of those; past it the login
    /// is answered 503 without being checked or counted (5s).
    pub login_queue_timeout: Duration,
    /// `MAX_BODY_SIZE`: the largest request body (1 MiB); larger ones get 413.
    pub max_body: usize,
    /// `REQUEST_TIMEOUT`: a request not answered within this gets 503 (30s).
    pub request_timeout: Duration,
    /// `HEADER_TIMEOUT`: a client must send its request head within this (10s).
    pub header_timeout: Duration,
    /// `MAX_CONNECTIONS`: connections served at once; further ones wait (256).
    pub max_connections: usize,
    /// `MAX_CONNECTIONS_PER_CLIENT`: connections one client address (an IPv6 /64) may hold
    /// at once; one more is answered 503 and closed (16). A `TRUSTED_PROXIES` peer is not
    /// limited by it.
    pub max_connections_per_client: usize,
    /// `METRICS_PUBLIC`: /metrics needs no credential (no).
    pub metrics_public: bool,
    /// `METRICS_ALLOW`: client address blocks that read /metrics without a credential.
    pub metrics_allow: Vec<IpNet>,
    /// `METRICS_CACHE`: a scrape let in without a credential (METRICS_PUBLIC, METRICS_ALLOW)
    /// is answered from the rendering of the last such scrape while it is younger than
    /// this, and such scrapes build one at a time (5s; 0 = every scrape reads the database).
    pub metrics_cache: Duration,
    /// `TRUSTED_PROXIES`: address blocks of reverse proxies in front of pepsi-httpd. A
    /// request from one of them is the client's that the last `X-Forwarded-For` hop not
    /// itself a trusted proxy names: that address is throttled, logged, and matched against
    /// METRICS_ALLOW. Their connections are not limited by MAX_CONNECTIONS_PER_CLIENT.
    pub trusted_proxies: Vec<IpNet>,
    /// `BULK_LIMIT`: the most rows one bulk queue action takes (10000).
    pub bulk_limit: i64,
    /// `COOKIE_SECURE`: mark the session cookie Secure (default: when TLS is on). Set it
    /// behind a TLS-terminating proxy.
    pub secure_cookie: bool,
    /// `CONFIG_DATABASE_URL`: where the configuration API writes `pepsi.config_override`,
    /// as the pepsi-config role (the httpd role may only read the table). Without it the
    /// API's override writes answer 409.
    pub config_database_url: Option<DatabaseUrl>,
    /// Our own MTA-STS policy (RFC 8461), served at `/.well-known/mta-sts.txt` when
    /// `MTA_STS_MODE` is set: `MTA_STS_MODE`, `MTA_STS_MX` (default `[pepsi] HOSTNAME`) and
    /// `MTA_STS_MAX_AGE` (default 7d).
    pub mta_sts: Option<pepsi_smtp::sts::Policy>,
    /// `TLSRPT_UPLOAD` (default no): take TLS reports POSTed to `/tlsrpt`; with it,
    /// `TLSRPT_MAX_PER_DAY` (1000), the most taken in a day.
    pub tlsrpt_upload: Option<u32>,
    /// `LATENCY_WINDOW`: the stage passes (spans in `pepsi.telemetry_span` that ended this
    /// long ago or less) whose durations the pipeline's latency percentiles cover (1h;
    /// 1m to 31d).
    pub latency_window: Duration,
}

/// `MTA_STS_MODE`, `MTA_STS_MX` and `MTA_STS_MAX_AGE` of `[pepsi-httpd]`: the policy this
/// server publishes for its domains, or None when it publishes none.
pub fn mta_sts_policy(cfg: &Config) -> anyhow::Result<Option<pepsi_smtp::sts::Policy>> {
    use pepsi_smtp::sts::{self, Mode, Policy};
    let s = cfg.section(SECTION);
    let Some(mode) = s.parse_opt("MTA_STS_MODE", Mode::parse)? else {
        return Ok(None);
    };
    let mx = match s.string_opt("MTA_STS_MX")? {
        Some(list) => list
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|m| !m.is_empty())
            .map(|m| {
                sts::parse_pattern(m).map_err(|e| anyhow::anyhow!("[{SECTION}] MTA_STS_MX: {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?,
        None => vec![
            sts::parse_pattern(&cfg.name_option(&s, "MTA_STS_MX")?).map_err(|e| {
                anyhow::anyhow!("[{SECTION}] MTA_STS_MX (from [pepsi] HOSTNAME): {e}")
            })?,
        ],
    };
    if mx.is_empty() || mx.len() > sts::MAX_MX_PATTERNS {
        bail!(
            "[{SECTION}] MTA_STS_MX: expected 1 to {} host names or *.domain patterns",
            sts::MAX_MX_PATTERNS
        );
    }
    let max_age = s
        .duration_opt("MTA_STS_MAX_AGE")?
        .unwrap_or(Duration::from_secs(7 * 86_400))
        .as_secs();
    if max_age == 0 || max_age > u64::from(sts::MAX_AGE_LIMIT) {
        bail!(
            "[{SECTION}] MTA_STS_MAX_AGE = {max_age}s: expected more than 0 and at most {}s (a year)",
            sts::MAX_AGE_LIMIT
        );
    }
    Ok(Some(Policy {
        mode,
        max_age: max_age as u32,
        mx,
    }))
}

impl HttpdOptions {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Self> {
        let s = cfg.section(SECTION);
        let address = match s.string_opt("ADDRESS")? {
            Some(a) => a.parse().map_err(|_| {
                anyhow::anyhow!(
                    "[{SECTION}] ADDRESS = {a:?}: expected host:port with a numeric address (127.0.0.1:8080, [::1]:8080)"
                )
            })?,
            None => SocketAddr::from(([127, 0, 0, 1], 8080)),
        };
        let tls = match (s.path_opt("CERT_FILE")?, s.path_opt("KEY_FILE")?) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => bail!("[{SECTION}]: CERT_FILE and KEY_FILE go together; one is missing"),
        };
        let count = |opt: &str, default: u32| -> anyhow::Result<u32> {
            let n = s.number_opt::<u32>(opt)?.unwrap_or(default);
            if n == 0 {
                bail!("[{SECTION}] {opt} = 0: expected at least 1");
            }
            Ok(n)
        };
        let metrics_allow = s
            .list_opt("METRICS_ALLOW")?
            .unwrap_or_default()
            .iter()
            .map(|c| parse_block(c))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("[{SECTION}] METRICS_ALLOW: {e}"))?;
        let trusted_proxies = s
            .list_opt("TRUSTED_PROXIES")?
            .unwrap_or_default()
            .iter()
            .map(|c| parse_block(c))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("[{SECTION}] TRUSTED_PROXIES: {e}"))?;
        let max_body = s.size_opt("MAX_BODY_SIZE")?.unwrap_or(1 << 20);
        if !(1024..=64 << 20).contains(&max_body) {
            bail!("[{SECTION}] MAX_BODY_SIZE = {max_body}: expected 1k to 64M");
        }
        let bulk_limit = i64::from(count("BULK_LIMIT", 10_000)?);
        let session_idle = s
            .duration_opt("SESSION_IDLE_TIMEOUT")?
            .unwrap_or(Duration::from_secs(1800));
        let session_max_age = s
            .duration_opt("SESSION_MAX_AGE")?
            .unwrap_or(Duration::from_secs(12 * 3600));
        if session_idle.is_zero() || session_max_age.is_zero() {
            bail!("[{SECTION}] SESSION_IDLE_TIMEOUT and SESSION_MAX_AGE must be longer than 0");
        }
        let request_timeout = s
            .duration_opt("REQUEST_TIMEOUT")?
            .unwrap_or(Duration::from_secs(30))
            .max(Duration::from_millis(100));
        let login_queue_timeout = s
            .duration_opt("LOGIN_QUEUE_TIMEOUT")?
            .unwrap_or(Duration::from_secs(5));
        if login_queue_timeout >= request_timeout {
            bail!(
                "[{SECTION}] LOGIN_QUEUE_TIMEOUT = {login_queue_timeout:?}: expected less than REQUEST_TIMEOUT ({request_timeout:?})"
            );
        }
        let config_database_url = match s.string_opt("CONFIG_DATABASE_URL")? {
            Some(url) => {
                // The value is not quoted: it may hold a password.
                let scheme_ok = ["postgres://", "postgresql://"].iter().any(|p| {
                    url.get(..p.len())
                        .is_some_and(|h| h.eq_ignore_ascii_case(p))
                });
                if !scheme_ok {
                    bail!(
                        "[{SECTION}] CONFIG_DATABASE_URL is not a PostgreSQL URL: expected postgres://..."
                    );
                }
                url.parse::<sqlx::postgres::PgConnectOptions>()
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "[{SECTION}] CONFIG_DATABASE_URL is not a PostgreSQL URL: {e}"
                        )
                    })?;
                Some(DatabaseUrl(url))
            }
            None => None,
        };
        let latency_window = s
            .duration_opt("LATENCY_WINDOW")?
            .unwrap_or(Duration::from_secs(3600));
        if !(MIN_LATENCY_WINDOW..=MAX_LATENCY_WINDOW).contains(&latency_window) {
            bail!("[{SECTION}] LATENCY_WINDOW = {latency_window:?}: expected 1m to 31d");
        }
        Ok(Self {
            latency_window,
            mta_sts: mta_sts_policy(cfg)?,
            tlsrpt_upload: match s.bool_opt("TLSRPT_UPLOAD")?.unwrap_or(false) {
                true => Some(count("TLSRPT_MAX_PER_DAY", 1000)?),
                false => None,
            },
            config_database_url,
            address,
            secure_cookie: s.bool_opt("COOKIE_SECURE")?.unwrap_or(tls.is_some()),
            tls,
            user: s.string_opt("USER")?,
            group: s.string_opt("GROUP")?,
            allow_root: s.bool_opt("ALLOW_ROOT")?.unwrap_or(false),
            session_idle,
            session_max_age,
            login_window: s
                .duration_opt("LOGIN_THROTTLE_WINDOW")?
                .unwrap_or(Duration::from_secs(900))
                .max(Duration::from_secs(1)),
            login_max_per_address: count("LOGIN_MAX_FAILURES_PER_ADDRESS", 20)?,
            login_max_per_account: count("LOGIN_MAX_FAILURES_PER_ACCOUNT", 5)?,
            login_concurrency: count("LOGIN_CONCURRENCY", 2)? as usize,
            login_queue_timeout,
            max_body: usize::try_from(max_body).context("MAX_BODY_SIZE")?,
            request_timeout,
            header_timeout: s
                .duration_opt("HEADER_TIMEOUT")?
                .unwrap_or(Duration::from_secs(10))
                .max(Duration::from_millis(100)),
            max_connections: count("MAX_CONNECTIONS", 256)? as usize,
            max_connections_per_client: count("MAX_CONNECTIONS_PER_CLIENT", 16)? as usize,
            metrics_public: s.bool_opt("METRICS_PUBLIC")?.unwrap_or(false),
            metrics_allow,
            metrics_cache: s
                .duration_opt("METRICS_CACHE")?
                .unwrap_or(Duration::from_secs(5)),
            trusted_proxies,
            bulk_limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> anyhow::Result<HttpdOptions> {
        HttpdOptions::from_config(&Config::from_str_named(text, "t.conf").unwrap())
    }

    #[test]
    fn our_mta_sts_policy() {
        assert_eq!(settings("").unwrap().mta_sts, None);
        let p =
            settings("[pepsi]\nHOSTNAME = mx.example.org\n[pepsi-httpd]\nMTA_STS_MODE = enforce\n")
                .unwrap()
                .mta_sts
                .unwrap();
        assert_eq!(
            p.to_text(),
            "version: STSv1\r\nmode: enforce\r\nmx: mx.example.org\r\nmax_age: 604800\r\n"
        );
        let p = settings(
            "[pepsi-httpd]\nMTA_STS_MODE = testing\nMTA_STS_MX = mx1.example.org, *.Example.net\nMTA_STS_MAX_AGE = 1d\n",
        )
        .unwrap()
        .mta_sts
        .unwrap();
        assert_eq!(
            (p.max_age, p.mx.as_slice()),
            (
                86400,
                &["mx1.example.org".to_owned(), "*.example.net".to_owned()][..]
            )
        );
        for (bad, why) in [
            ("MTA_STS_MODE = on\n", "MTA_STS_MODE"),
            (
                "MTA_STS_MODE = enforce\nMTA_STS_MX = bad host!\n",
                "MTA_STS_MX",
            ),
            (
                "MTA_STS_MODE = enforce\nMTA_STS_MAX_AGE = 0s\n",
                "MTA_STS_MAX_AGE",
            ),
        ] {
            let err = format!(
                "{:#}",
                settings(&format!("[pepsi-httpd]\n{bad}")).unwrap_err()
            );
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn defaults_and_errors_name_the_option() {
        let d = settings("").unwrap();
        assert_eq!(d.address, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(d.tls, None);
        assert!(!d.secure_cookie && !d.metrics_public);
        assert_eq!(d.session_idle, Duration::from_secs(1800));
        assert_eq!(d.login_concurrency, 2);
        assert_eq!(d.max_connections_per_client, 16);
        assert_eq!(d.metrics_cache, Duration::from_secs(5));
        assert_eq!(d.login_queue_timeout, Duration::from_secs(5));
        assert_eq!(d.latency_window, Duration::from_secs(3600));
        assert_eq!(
            settings("[pepsi-httpd]\nLATENCY_WINDOW = 15m\n")
                .unwrap()
                .latency_window,
            Duration::from_secs(900)
        );
        let tls = settings("[pepsi-httpd]\nCERT_FILE = c.pem\nKEY_FILE = k.pem\n").unwrap();
        assert!(tls.secure_cookie, "a TLS server marks its cookie Secure");
        assert_eq!(d.config_database_url, None);
        let url = settings("[pepsi-httpd]\nCONFIG_DATABASE_URL = postgres://cfg:pw@db/pepsi\n")
            .unwrap()
            .config_database_url
            .unwrap();
        assert_eq!(url.0, "postgres://cfg:pw@db/pepsi");
        assert!(!format!("{url:?}").contains("pw"), "Debug hides the URL");
        let cases = [
            ("ADDRESS = localhost:80", "ADDRESS = \"localhost:80\""),
            ("CERT_FILE = c.pem", "CERT_FILE and KEY_FILE go together"),
            ("METRICS_ALLOW = 10.0.0.0/33", "METRICS_ALLOW"),
            (
                "TRUSTED_PROXIES = proxy.example",
                "TRUSTED_PROXIES: \"proxy.example\"",
            ),
            (
                "LOGIN_MAX_FAILURES_PER_ACCOUNT = 0",
                "LOGIN_MAX_FAILURES_PER_ACCOUNT = 0",
            ),
            ("MAX_BODY_SIZE = 10", "MAX_BODY_SIZE = 10"),
            ("LOGIN_CONCURRENCY = 0", "LOGIN_CONCURRENCY = 0"),
            (
                "MAX_CONNECTIONS_PER_CLIENT = 0",
                "MAX_CONNECTIONS_PER_CLIENT = 0",
            ),
            ("LOGIN_QUEUE_TIMEOUT = 1m", "LOGIN_QUEUE_TIMEOUT = 60s"),
            ("SESSION_IDLE_TIMEOUT = 0", "SESSION_IDLE_TIMEOUT"),
            (
                "LATENCY_WINDOW = 10s",
                "LATENCY_WINDOW = 10s: expected 1m to 31d",
            ),
            ("LATENCY_WINDOW = 40d", "LATENCY_WINDOW = 3456000s"),
            ("LATENCY_WINDOW = soon", "LATENCY_WINDOW"),
            (
                "CONFIG_DATABASE_URL = mysql://u:pw@h/db",
                "CONFIG_DATABASE_URL is not a PostgreSQL URL",
            ),
        ];
        for (line, want) in cases {
            let e = format!(
                "{:#}",
                settings(&format!("[pepsi-httpd]\n{line}\n")).unwrap_err()
            );
            assert!(e.contains(want), "{line}: {e}");
        }
    }

    #[test]
    fn cidr_blocks_contain_their_addresses() {
        let cases = [
            ("127.0.0.0/8", "127.1.2.3", true),
            ("127.0.0.0/8", "128.0.0.1", false),
            ("192.0.2.7", "192.0.2.7", true),
            ("192.0.2.7", "192.0.2.8", false),
            ("0.0.0.0/0", "203.0.113.1", true),
            ("::1", "::1", true),
            ("2001:db8::/32", "2001:db8:1::1", true),
            ("2001:db8::/32", "2001:db9::1", false),
            ("127.0.0.0/8", "::ffff:127.0.0.1", true),
            ("::/0", "127.0.0.1", false),
        ];
        for (block, ip, want) in cases {
            let c = parse_block(block).unwrap();
            assert_eq!(
                any_contains(&[c], ip.parse().unwrap()),
                want,
                "{block} ∋ {ip}"
            );
        }
        let bad = [
            (
                "10.0.0.0/33",
                "\"10.0.0.0/33\": the prefix must be a number from 0 to 32",
            ),
            (
                "::/129",
                "\"::/129\": the prefix must be a number from 0 to 128",
            ),
            ("host", "\"host\" is not an IP address or address/prefix"),
            (
                "10.0.0.0/x",
                "\"10.0.0.0/x\": the prefix must be a number from 0 to 32",
            ),
            (
                "10.0.0.0/",
                "\"10.0.0.0/\": the prefix must be a number from 0 to 32",
            ),
            ("/8", "\"/8\" is not an IP address or address/prefix"),
        ];
        for (text, want) in bad {
            assert_eq!(parse_block(text).unwrap_err(), want, "{text}");
        }
    }
}
