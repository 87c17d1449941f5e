//! The daemon's TOML configuration: keys and defaults of the plan, unknown keys refused,
//! secrets overridable from the environment, everything checked once at start-up.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Deserialize;

/// Where the daemon and counterctl look when `-config` is not given, in order.
pub const DEFAULT_PATHS: [&str; 2] = [
    "/etc/migadu_counters/config.toml",
    "/usr/local/etc/migadu_counters/config.toml",
];

pub const ENV_AUTH_TOKEN: &str = "MIGADU_COUNTERS_AUTH_TOKEN";
pub const ENV_REDIS_PASSWORD: &str = "MIGADU_COUNTERS_REDIS_PASSWORD";
pub const ENV_NOTIFY_PASSWORD: &str = "MIGADU_COUNTERS_NOTIFY_PASSWORD";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub addr: String,
    pub admin_addr: String,
    pub auth_token: String,
    pub allowed_cidrs: Vec<String>,
    pub domains_cdb: PathBuf,
    pub exempt: Vec<String>,
    pub count_junk: bool,
    pub workers: usize,
    /// Most queued jobs a worker takes at once, their transactions pipelined on one connection.
    pub batch_size: usize,
    pub queue_size: usize,
    pub max_cached_domains: usize,
    pub read_header_timeout: u64,
    pub write_timeout: u64,
    pub idle_timeout: u64,
    pub handler_timeout: u64,
    pub logging: LoggingConfig,
    pub redis: RedisConfig,
    pub notify: NotifyConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: ":5555".into(),
            admin_addr: ":9095".into(),
            auth_token: String::new(),
            allowed_cidrs: Vec::new(),
            domains_cdb: "/usr/local/etc/rspamd/db/rspamd_domains_db".into(),
            exempt: vec!["support@migadu.com".into(), "contact@migadu.com".into()],
            count_junk: false,
            workers: 16,
            batch_size: 64,
            queue_size: 10_000,
            max_cached_domains: 10_000,
            read_header_timeout: 5,
            write_timeout: 30,
            idle_timeout: 60,
            handler_timeout: 4,
            logging: LoggingConfig::default(),
            redis: RedisConfig::default(),
            notify: NotifyConfig::default(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// `stderr`, `stdout` or a file path.
    pub output: String,
    /// `console` or `json`.
    pub format: String,
    pub level: String,
    /// Default: the same destination as `output`; `off` disables the counting log.
    pub counting_output: Option<String>,
    /// `text` or `json`.
    pub counting_format: String,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            output: "stderr".into(),
            format: "console".into(),
            level: "info".into(),
            counting_output: None,
            counting_format: "text".into(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    pub db: i64,
    pub password: String,
    pub pool_size: usize,
    pub timeout_ms: u64,
    pub master_name: String,
    pub sentinels: Vec<String>,
    pub sentinel_password: String,
    pub write_addr: String,
    pub read_addrs: Vec<String>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            db: 0,
            password: String::new(),
            pool_size: 32,
            timeout_ms: 500,
            master_name: "mymaster".into(),
            sentinels: Vec::new(),
            sentinel_password: String::new(),
            write_addr: "127.0.0.1:6379".into(),
            read_addrs: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    pub org_url: String,
    pub address_url: String,
    pub domain_url: String,
    pub user: String,
    pub password: String,
    pub timeout_seconds: u64,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            org_url: String::new(),
            address_url: String::new(),
            domain_url: String::new(),
            user: String::new(),
            password: String::new(),
            timeout_seconds: 5,
        }
    }
}

/// An `allowed_cidrs` entry: `10.0.0.0/8`, `::1/128`, or a bare address (a host route).
pub fn parse_network(s: &str) -> Option<IpNet> {
    let (ip, prefix) = match s.trim().split_once('/') {
        Some((ip, p)) => (ip.parse::<IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
        None => (s.trim().parse::<IpAddr>().ok()?, None),
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    IpNet::new(ip, prefix.unwrap_or(max)).ok()
}

/// True when one of `nets` holds `ip`. IPv4-mapped IPv6 peers match IPv4 networks, since a
/// dual-stack listener reports them so.
pub fn any_contains(nets: &[IpNet], ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    nets.iter().any(|n| n.contains(&ip))
}

/// Config errors, each naming the file or key and the value at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("no config file: none of {0} exists (give one with -config)")]
    NotFound(String),
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: {key}: {message}")]
    Invalid {
        path: PathBuf,
        key: &'static str,
        message: String,
    },
}

/// `-config` if given, else the first default path that exists.
pub fn discover(explicit: Option<&Path>) -> Result<PathBuf, ConfigError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    DEFAULT_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| ConfigError::NotFound(DEFAULT_PATHS.join(", ")))
}

/// Reads, applies environment overrides, and validates.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    parse(&text, path, &env)
}

/// Parsing and validation without touching the process: the environment is a function.
pub fn parse(
    text: &str,
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let mut cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().replace('\n', " "),
    })?;
    if let Some(v) = env(ENV_AUTH_TOKEN) {
        cfg.auth_token = v;
    }
    if let Some(v) = env(ENV_REDIS_PASSWORD) {
        cfg.redis.password = v;
    }
    if let Some(v) = env(ENV_NOTIFY_PASSWORD) {
        cfg.notify.password = v;
    }
    cfg.exempt = cfg.exempt.iter().map(|e| e.trim().to_lowercase()).collect();
    validate(&cfg).map_err(|(key, message)| ConfigError::Invalid {
        path: path.to_path_buf(),
        key,
        message,
    })?;
    Ok(cfg)
}

fn validate(c: &Config) -> Result<(), (&'static str, String)> {
    if c.auth_token.trim().is_empty() {
        return Err((
            "auth_token",
            format!("missing: set it in the file or in {ENV_AUTH_TOKEN}"),
        ));
    }
    for (key, v) in [("addr", &c.addr), ("admin_addr", &c.admin_addr)] {
        if split_host_port(v).is_none() {
            return Err((key, format!("{v:?} is not host:port")));
        }
    }
    for cidr in &c.allowed_cidrs {
        if parse_network(cidr).is_none() {
            return Err(("allowed_cidrs", format!("{cidr:?} is not a network")));
        }
    }
    for (key, v) in [
        ("workers", c.workers as u64),
        ("batch_size", c.batch_size as u64),
        ("queue_size", c.queue_size as u64),
        ("handler_timeout", c.handler_timeout),
        ("read_header_timeout", c.read_header_timeout),
        ("write_timeout", c.write_timeout),
        ("idle_timeout", c.idle_timeout),
        ("redis.pool_size", c.redis.pool_size as u64),
        ("redis.timeout_ms", c.redis.timeout_ms),
        ("notify.timeout_seconds", c.notify.timeout_seconds),
    ] {
        if v == 0 {
            return Err((key, "must be greater than 0".into()));
        }
    }
    let l = &c.logging;
    if !matches!(l.format.as_str(), "console" | "json") {
        return Err((
            "logging.format",
            format!("{:?} is not console or json", l.format),
        ));
    }
    if !matches!(l.counting_format.as_str(), "text" | "json") {
        return Err((
            "logging.counting_format",
            format!("{:?} is not text or json", l.counting_format),
        ));
    }
    if !matches!(l.level.as_str(), "debug" | "info" | "warn" | "error") {
        return Err((
            "logging.level",
            format!("{:?} is not debug, info, warn or error", l.level),
        ));
    }
    if l.output.trim().is_empty() {
        return Err(("logging.output", "empty".into()));
    }
    let r = &c.redis;
    if r.db != 0 {
        return Err((
            "redis.db",
            format!(
                "{} is not 0: the web app reads the counters from db 0",
                r.db
            ),
        ));
    }
    if r.sentinels.is_empty() {
        for a in std::iter::once(&r.write_addr).chain(&r.read_addrs) {
            if split_host_port(a).is_none_or(|(h, _)| h.is_empty()) {
                return Err(("redis.write_addr", format!("{a:?} is not host:port")));
            }
        }
    } else {
        if r.master_name.is_empty() {
            return Err(("redis.master_name", "empty while sentinels are set".into()));
        }
        for a in &r.sentinels {
            if split_host_port(a).is_none_or(|(h, _)| h.is_empty()) {
                return Err(("redis.sentinels", format!("{a:?} is not host:port")));
            }
        }
    }
    let n = &c.notify;
    for (key, url) in [
        ("notify.org_url", &n.org_url),
        ("notify.address_url", &n.address_url),
        ("notify.domain_url", &n.domain_url),
    ] {
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            return Err((key, format!("{url:?} is not an http(s) URL")));
        }
    }
    Ok(())
}

/// Splits `host:port`, `:port` or `[v6]:port`; the host may be empty (all interfaces).
pub fn split_host_port(s: &str) -> Option<(String, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host.to_string(), port))
}

/// The shortest auth_token the service takes without a warning.
pub const SHORT_TOKEN: usize = 32;

/// What in a valid configuration leaves the service more exposed than it need be, as
/// start-up warnings; the plan's contracts (token checked before the source address,
/// `admin_addr = ":9095"`) stay as they are.
///
/// - A short `auth_token`: the token is checked before `allowed_cidrs`, so a client from
///   outside the allowed networks can tell a right token (403) from a wrong one (401); a
///   long random token keeps that from mattering.
/// - An `admin_addr` on every interface (the default): `/metrics` and `/health` answer
///   anyone who reaches the port.
pub fn exposure_warnings(c: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if c.auth_token.len() < SHORT_TOKEN {
        out.push(format!(
            "auth_token is shorter than {SHORT_TOKEN} characters: the token is checked before \
             allowed_cidrs, so a client outside them can try tokens; use a long random one"
        ));
    }
    let loopback = |host: &str| {
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    };
    if let Some((host, port)) = split_host_port(&c.admin_addr)
        && !loopback(&host)
    {
        out.push(format!(
            "admin_addr {:?} is reachable from other hosts: /metrics and /health answer \
             without authentication; bind it to 127.0.0.1:{port} or firewall the port",
            c.admin_addr
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposure_warnings_table() {
        let long = "t".repeat(SHORT_TOKEN);
        let cases = [
            (long.as_str(), "127.0.0.1:9095", &[][..]),
            (long.as_str(), "[::1]:9095", &[]),
            (long.as_str(), "localhost:9095", &[]),
            (long.as_str(), ":9095", &["admin_addr \":9095\""][..]),
            (
                long.as_str(),
                "0.0.0.0:9095",
                &["admin_addr \"0.0.0.0:9095\""],
            ),
            (
                "short",
                "127.0.0.1:9095",
                &["auth_token is shorter than 32"],
            ),
            ("short", ":9095", &["auth_token is shorter", "admin_addr"]),
        ];
        for (token, admin, expected) in cases {
            let c = Config {
                auth_token: token.into(),
                admin_addr: admin.into(),
                ..Config::default()
            };
            let got = exposure_warnings(&c);
            assert_eq!(got.len(), expected.len(), "{token} {admin}: {got:?}");
            for (g, e) in got.iter().zip(expected) {
                assert!(g.starts_with(e), "{g} should start with {e}");
            }
        }
    }

    fn parse_with(text: &str, env: &[(&str, &str)]) -> Result<Config, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let f = move |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        parse(text, Path::new("c.toml"), &f).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_of_the_plan() {
        let c = parse_with("auth_token = \"t\"", &[]).unwrap();
        assert_eq!(c.addr, ":5555");
        assert_eq!(c.admin_addr, ":9095");
        assert_eq!(
            c.domains_cdb,
            PathBuf::from("/usr/local/etc/rspamd/db/rspamd_domains_db")
        );
        assert_eq!(c.exempt, vec!["support@migadu.com", "contact@migadu.com"]);
        assert!(!c.count_junk);
        assert_eq!(
            (
                c.read_header_timeout,
                c.write_timeout,
                c.idle_timeout,
                c.handler_timeout
            ),
            (5, 30, 60, 4)
        );
        assert_eq!(
            (c.redis.db, c.redis.pool_size, c.redis.timeout_ms),
            (0, 32, 500)
        );
        assert_eq!(c.notify.timeout_seconds, 5);
        assert_eq!(c.logging.output, "stderr");
        assert_eq!(c.logging.counting_output, None);
        assert_eq!(c.logging.counting_format, "text");
    }

    #[test]
    fn rejections_name_the_key() {
        let cases: &[(&str, &str)] = &[
            (
                "",
                "config c.toml: auth_token: missing: set it in the file or in MIGADU_COUNTERS_AUTH_TOKEN",
            ),
            ("auth_token=\"t\"\nbogus = 1", "unknown field `bogus`"),
            (
                "auth_token=\"t\"\n[redis]\nnope = 1",
                "unknown field `nope`",
            ),
            ("auth_token=\"t\"\n[redis]\ndb = 1", "redis.db: 1 is not 0"),
            (
                "auth_token=\"t\"\nallowed_cidrs=[\"10.0.0.0/33\"]",
                "allowed_cidrs: \"10.0.0.0/33\" is not a network",
            ),
            (
                "auth_token=\"t\"\naddr=\"5555\"",
                "addr: \"5555\" is not host:port",
            ),
            (
                "auth_token=\"t\"\n[logging]\nformat=\"xml\"",
                "logging.format: \"xml\" is not console or json",
            ),
            (
                "auth_token=\"t\"\n[logging]\ncounting_format=\"xml\"",
                "logging.counting_format",
            ),
            (
                "auth_token=\"t\"\n[notify]\norg_url=\"ftp://x\"",
                "notify.org_url",
            ),
            (
                "auth_token=\"t\"\nworkers=0",
                "workers: must be greater than 0",
            ),
            (
                "auth_token=\"t\"\nbatch_size=0",
                "batch_size: must be greater than 0",
            ),
            (
                "auth_token=\"t\"\n[redis]\nsentinels=[\"a:1\"]\nmaster_name=\"\"",
                "redis.master_name",
            ),
        ];
        for (text, want) in cases {
            let err = parse_with(text, &[]).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let c = parse_with(include_str!("../config.toml.example"), &[]).unwrap();
        assert_eq!(c.redis.sentinels.len(), 3);
        assert_eq!(
            c.logging.counting_output.as_deref(),
            Some("/var/log/migadu_counters/counting.log")
        );
        assert!(c.notify.org_url.contains("$LEVEL"));
    }

    #[test]
    fn environment_overrides() {
        let c = parse_with(
            "auth_token=\"file\"\n[redis]\npassword=\"f\"\n[notify]\npassword=\"f\"",
            &[
                (ENV_AUTH_TOKEN, "env"),
                (ENV_REDIS_PASSWORD, "r"),
                (ENV_NOTIFY_PASSWORD, "n"),
            ],
        )
        .unwrap();
        assert_eq!(
            (
                c.auth_token.as_str(),
                c.redis.password.as_str(),
                c.notify.password.as_str()
            ),
            ("env", "r", "n")
        );
        assert!(parse_with("", &[(ENV_AUTH_TOKEN, "env")]).is_ok());
    }

    #[test]
    fn cidr_matching() {
        let cases: &[(&str, &str, bool)] = &[
            ("10.0.0.0/8", "10.1.2.3", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("127.0.0.1", "127.0.0.1", true),
            ("0.0.0.0/0", "8.8.8.8", true),
            ("10.0.0.0/8", "::ffff:10.0.0.1", true),
            ("::1/128", "::1", true),
            ("fd00::/8", "fe80::1", false),
            ("10.0.0.0/8", "::1", false),
            (" 10.0.0.0/8 ", "10.0.0.1", true),
            ("10.1.2.3/8", "10.200.0.1", true),
            ("::/0", "::ffff:10.0.0.1", false),
            ("2001:db8::/32", "2001:db8:ffff::1", true),
        ];
        for (net, ip, want) in cases {
            let c = parse_network(net).unwrap();
            assert_eq!(any_contains(&[c], ip.parse().unwrap()), *want, "{net} {ip}");
        }
        for bad in [
            "x/8",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0.0/x",
            "",
        ] {
            assert!(parse_network(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn host_port() {
        assert_eq!(split_host_port(":5555"), Some((String::new(), 5555)));
        assert_eq!(split_host_port("[::1]:80"), Some(("::1".into(), 80)));
        assert_eq!(split_host_port("localhost"), None);
    }
}
