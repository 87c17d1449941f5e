//! `[pepsi-telemetry]`: where the receiver listens, whom it lets in, where it keeps what it
//! receives and for how long, and the limits it holds every client to. Read once at start
//! and validated; no I/O here (the token file and the certificate are read by `tokens` and
//! `server`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use pepsi_conf::config::Config;
use sqlx::postgres::PgConnectOptions;

/// The section the receiver reads.
pub const SECTION: &str = "pepsi-telemetry";

/// The configuration file when neither `-c` nor `PEPSI_CONFIG` names one: the receiver's
/// own directory, apart from a Pepsi host's `/etc/pepsi` (it usually runs on another host,
/// and on a shared one it must neither need group pepsi for `secrets.d/` nor go when the
/// `pepsi` package is purged).
pub const DEFAULT_CONFIG: &str = "/etc/pepsi-telemetry/pepsi-telemetry.conf";

/// The connection to the database, its password kept out of `Debug` output.
#[derive(Clone)]
pub struct Database(pub PgConnectOptions);

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Database {
    /// `role@host/database`, for logs (never the password).
    pub fn describe(&self) -> String {
        let o = &self.0;
        format!(
            "{}@{}/{}",
            o.get_username(),
            o.get_host(),
            o.get_database().unwrap_or("")
        )
    }
}

/// Everything the receiver needs to know before it serves.
#[derive(Debug, Clone)]
pub struct Options {
    /// `LISTEN`: the address it listens on (127.0.0.1:4318, OTLP/HTTP's port).
    pub listen: SocketAddr,
    /// `TLS_CERT` and `TLS_KEY`: HTTPS when both are set.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `TOKEN_FILE`: the accepted bearer tokens, one a line.
    pub token_file: PathBuf,
    /// `DATABASE_URL`, else `[database] URL`; a URL without a host is pinned to
    /// `[database] SOCKET_DIR`.
    pub database: Database,
    /// `DATABASE_MAX_CONNECTIONS` (4).
    pub database_max_connections: u32,
    /// `RETENTION` (7d): spans that ended and points taken longer ago are deleted.
    pub retention: Duration,
    /// `RETENTION_SWEEP` (10m): how often the deletion runs.
    pub retention_sweep: Duration,
    /// `RETENTION_BATCH` (5000): rows one DELETE takes; a sweep repeats it until done.
    pub retention_batch: u32,
    /// `MAX_BODY` (4 MiB): the largest request body, after gzip decoding too; beyond, 413.
    pub max_body: usize,
    /// `MAX_CONNECTIONS` (256): connections served at once; further ones wait.
    pub max_connections: usize,
    /// `MAX_CONNECTIONS_PER_ADDRESS` (32): connections from one IPv4 address (one IPv6 /64)
    /// at once; a further one is closed as soon as it is accepted.
    pub max_connections_per_address: usize,
    /// `HEADER_TIMEOUT` (10s): a client must finish the TLS handshake and send its first
    /// request head within this of connecting, and each later head within this of its first
    /// byte.
    pub header_timeout: Duration,
    /// `IDLE_TIMEOUT` (30s): a connection that has been answered and sends nothing more
    /// for this long is closed.
    pub idle_timeout: Duration,
    /// `REQUEST_TIMEOUT` (30s): a client must send its whole body within this (408).
    pub request_timeout: Duration,
    /// `MAX_ITEMS` (10000): spans, or data points, taken from one request; the rest are
    /// rejected (partial_success).
    pub max_items: usize,
    /// `MAX_ATTRIBUTES` (128): attributes kept of a resource, a span or a data point; the
    /// rest are dropped and counted in `otel.dropped_attributes_count`.
    pub max_attributes: usize,
    /// `ALLOW_ROOT` (no): serve as root (a development machine).
    pub allow_root: bool,
}

/// OTLP/HTTP's port, on loopback.
const DEFAULT_LISTEN: ([u8; 4], u16) = ([127, 0, 0, 1], 4318);

const DAY: u64 = 86_400;

/// The longest RETENTION: ten years. Beyond, the cutoff (now minus RETENTION) would leave
/// the times PostgreSQL and chrono hold, and nothing would ever be old enough anyway.
pub const MAX_RETENTION: Duration = Duration::from_secs(3650 * DAY);

/// The longest HEADER_TIMEOUT, IDLE_TIMEOUT and REQUEST_TIMEOUT: an hour.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// A duration as a configuration file writes it: `7d`, `10m`, `200ms`.
pub fn shown(d: Duration) -> String {
    let s = d.as_secs();
    match (d.subsec_nanos(), s) {
        (0, s) if s > 0 && s % DAY == 0 => format!("{}d", s / DAY),
        (0, s) if s > 0 && s % 3_600 == 0 => format!("{}h", s / 3_600),
        (0, s) if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        (0, s) => format!("{s}s"),
        _ => format!("{}ms", d.as_millis()),
    }
}

impl Options {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Self> {
        let s = cfg.section(SECTION);
        let listen = match s.string_opt("LISTEN")? {
            Some(a) => a.trim().parse().map_err(|_| {
                anyhow::anyhow!(
                    "[{SECTION}] LISTEN = {a:?}: expected a numeric address and port (0.0.0.0:4318, [::]:4318)"
                )
            })?,
            None => SocketAddr::from(DEFAULT_LISTEN),
        };
        let tls = match (s.path_opt("TLS_CERT")?, s.path_opt("TLS_KEY")?) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => bail!("[{SECTION}] TLS_CERT is set but TLS_KEY is not"),
            (None, Some(_)) => bail!("[{SECTION}] TLS_KEY is set but TLS_CERT is not"),
        };
        // The bearer tokens would cross the network in the clear.
        if tls.is_none()
            && !listen.ip().is_loopback()
            && !s.bool_opt("INSECURE_PLAINTEXT")?.unwrap_or(false)
        {
            bail!(
                "[{SECTION}] LISTEN = {listen} without TLS_CERT and TLS_KEY: clients would send their tokens in the clear; set both (or INSECURE_PLAINTEXT = yes behind a TLS-terminating proxy)"
            );
        }
        let Some(token_file) = s.path_opt("TOKEN_FILE")? else {
            bail!(
                "[{SECTION}] TOKEN_FILE is not set: name the file of accepted bearer tokens (one a line)"
            );
        };
        let socket_dir = pepsi_contract::db::socket_dir(cfg)?;
        let database = match s.string_opt("DATABASE_URL")? {
            Some(url) => pepsi_contract::db::pinned_options(&url, &socket_dir).map_err(|e| {
                anyhow::anyhow!("[{SECTION}] DATABASE_URL is not a PostgreSQL URL: {e}")
            })?,
            None => match cfg.section("database").string_opt("URL")? {
                Some(url) => pepsi_contract::db::pinned_options(&url, &socket_dir)
                    .map_err(|e| anyhow::anyhow!("[database] URL is not a PostgreSQL URL: {e}"))?,
                None => bail!(
                    "[{SECTION}] DATABASE_URL is not set (nor [database] URL): name the database the spans go to (postgres:///pepsi)"
                ),
            },
        };
        let positive = |opt: &str, default: u32| -> anyhow::Result<u32> {
            let n = s.number_opt::<u32>(opt)?.unwrap_or(default);
            if n == 0 {
                bail!("[{SECTION}] {opt} = 0: expected at least 1");
            }
            Ok(n)
        };
        let within = |opt: &str,
                      default: Duration,
                      least: Duration,
                      most: Duration|
         -> anyhow::Result<Duration> {
            let d = s.duration_opt(opt)?.unwrap_or(default);
            if d < least || d > most {
                bail!(
                    "[{SECTION}] {opt} = {}: expected {} to {}",
                    shown(d),
                    shown(least),
                    shown(most)
                );
            }
            Ok(d)
        };
        let retention = within(
            "RETENTION",
            Duration::from_secs(7 * DAY),
            Duration::from_secs(60),
            MAX_RETENTION,
        )?;
        let retention_sweep = within(
            "RETENTION_SWEEP",
            Duration::from_secs(600),
            Duration::from_millis(100),
            Duration::from_secs(DAY),
        )?;
        let max_body = s.size_opt("MAX_BODY")?.unwrap_or(4 << 20);
        if !(1024..=256 << 20).contains(&max_body) {
            bail!("[{SECTION}] MAX_BODY = {max_body}: expected 1k to 256M");
        }
        let timeout = |opt: &str, default: u64| {
            within(
                opt,
                Duration::from_secs(default),
                Duration::from_millis(100),
                MAX_TIMEOUT,
            )
        };
        let count = |opt: &str, default: u32, most: u32| -> anyhow::Result<usize> {
            let n = s.number_opt::<u32>(opt)?.unwrap_or(default);
            if !(1..=most).contains(&n) {
                bail!("[{SECTION}] {opt} = {n}: expected 1 to {most}");
            }
            Ok(n as usize)
        };
        Ok(Options {
            listen,
            tls,
            token_file,
            database: Database(database),
            database_max_connections: positive("DATABASE_MAX_CONNECTIONS", 4)?,
            retention,
            retention_sweep,
            retention_batch: positive("RETENTION_BATCH", 5000)?,
            max_body: usize::try_from(max_body)?,
            max_connections: positive("MAX_CONNECTIONS", 256)? as usize,
            max_connections_per_address: positive("MAX_CONNECTIONS_PER_ADDRESS", 32)? as usize,
            header_timeout: timeout("HEADER_TIMEOUT", 10)?,
            idle_timeout: timeout("IDLE_TIMEOUT", 30)?,
            request_timeout: timeout("REQUEST_TIMEOUT", 30)?,
            max_items: count("MAX_ITEMS", 10_000, 1_000_000)?,
            max_attributes: count("MAX_ATTRIBUTES", 128, 1024)?,
            allow_root: s.bool_opt("ALLOW_ROOT")?.unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(text: &str) -> anyhow::Result<Options> {
        Options::from_config(&Config::from_str_named(text, "t.conf").unwrap())
    }

    const BASE: &str = "[pepsi-telemetry]\nTOKEN_FILE = /etc/pepsi-telemetry/tokens\nDATABASE_URL = postgres:///pepsi\n";

    #[test]
    fn defaults() {
        let o = options(BASE).unwrap();
        assert_eq!(o.listen, "127.0.0.1:4318".parse().unwrap());
        assert_eq!(o.tls, None);
        assert_eq!(o.retention, Duration::from_secs(7 * 86_400));
        assert_eq!(o.retention_sweep, Duration::from_secs(600));
        assert_eq!(o.max_body, 4 << 20);
        assert_eq!(o.max_connections, 256);
        assert_eq!(o.header_timeout, Duration::from_secs(10));
        assert_eq!(o.idle_timeout, Duration::from_secs(30));
        assert_eq!(o.max_connections_per_address, 32);
        assert_eq!((o.max_items, o.max_attributes), (10_000, 128));
        // A URL without a host: the socket directory, as every Pepsi program.
        assert_eq!(
            o.database.describe(),
            format!("{}@/var/run/postgresql/pepsi", o.database.0.get_username())
        );
        assert!(!o.allow_root);
    }

    #[test]
    fn each_bad_value_is_named() {
        let cases = [
            (
                "[pepsi-telemetry]\nDATABASE_URL = postgres:///pepsi\n",
                "[pepsi-telemetry] TOKEN_FILE is not set",
            ),
            (
                "[pepsi-telemetry]\nTOKEN_FILE = /t\n",
                "[pepsi-telemetry] DATABASE_URL is not set (nor [database] URL)",
            ),
            (
                "LISTEN = localhost:4318\n",
                "[pepsi-telemetry] LISTEN = \"localhost:4318\": expected a numeric address",
            ),
            (
                "LISTEN = 0.0.0.0:4318\n",
                "[pepsi-telemetry] LISTEN = 0.0.0.0:4318 without TLS_CERT and TLS_KEY",
            ),
            (
                "TLS_CERT = /c.pem\n",
                "[pepsi-telemetry] TLS_CERT is set but TLS_KEY is not",
            ),
            (
                "TLS_KEY = /k.pem\n",
                "[pepsi-telemetry] TLS_KEY is set but TLS_CERT is not",
            ),
            (
                "RETENTION = 30s\n",
                "[pepsi-telemetry] RETENTION = 30s: expected 1m to 3650d",
            ),
            // Now minus RETENTION must stay a time (it panicked, and ended the sweeps).
            (
                "RETENTION = 3651d\n",
                "[pepsi-telemetry] RETENTION = 3651d: expected 1m to 3650d",
            ),
            (
                "RETENTION = 18446744073709551615\n",
                "[pepsi-telemetry] RETENTION = 18446744073709551615s: expected 1m to 3650d",
            ),
            (
                "RETENTION_SWEEP = 2d\n",
                "[pepsi-telemetry] RETENTION_SWEEP = 2d: expected 100ms to 1d",
            ),
            (
                "MAX_CONNECTIONS_PER_ADDRESS = 0\n",
                "[pepsi-telemetry] MAX_CONNECTIONS_PER_ADDRESS = 0: expected at least 1",
            ),
            (
                "IDLE_TIMEOUT = 2h\n",
                "[pepsi-telemetry] IDLE_TIMEOUT = 2h: expected 100ms to 1h",
            ),
            (
                "MAX_ITEMS = 0\n",
                "[pepsi-telemetry] MAX_ITEMS = 0: expected 1 to 1000000",
            ),
            (
                "MAX_ATTRIBUTES = 5000\n",
                "[pepsi-telemetry] MAX_ATTRIBUTES = 5000: expected 1 to 1024",
            ),
            (
                "MAX_BODY = 12\n",
                "[pepsi-telemetry] MAX_BODY = 12: expected 1k to 256M",
            ),
            (
                "MAX_CONNECTIONS = 0\n",
                "[pepsi-telemetry] MAX_CONNECTIONS = 0: expected at least 1",
            ),
            (
                "HEADER_TIMEOUT = 10ms\n",
                "[pepsi-telemetry] HEADER_TIMEOUT = 10ms: expected 100ms to 1h",
            ),
        ];
        for (extra, want) in cases {
            let text = if extra.starts_with('[') {
                extra.to_owned()
            } else {
                format!("{BASE}{extra}")
            };
            let e = format!("{:#}", options(&text).unwrap_err());
            assert!(e.starts_with(want), "{extra:?}: {e}");
        }
    }

    #[test]
    fn the_longest_retention_is_taken() {
        let o = options(&format!("{BASE}RETENTION = 3650d\n")).unwrap();
        assert_eq!(o.retention, MAX_RETENTION);
    }

    #[test]
    fn durations_are_shown_as_a_configuration_writes_them() {
        for (d, want) in [
            (Duration::from_secs(7 * 86_400), "7d"),
            (Duration::from_secs(7_200), "2h"),
            (Duration::from_secs(600), "10m"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(200), "200ms"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(shown(d), want, "{d:?}");
        }
    }

    #[test]
    fn plaintext_beyond_loopback_only_when_asked_and_the_database_from_the_pepsi_section() {
        let o = options(&format!(
            "{BASE}LISTEN = [::]:4318\nINSECURE_PLAINTEXT = yes\n"
        ))
        .unwrap();
        assert_eq!(o.listen, "[::]:4318".parse().unwrap());
        let o = options(&format!(
            "{BASE}LISTEN = 0.0.0.0:4318\nTLS_CERT = /c.pem\nTLS_KEY = /k.pem\n"
        ))
        .unwrap();
        assert_eq!(o.tls, Some(("/c.pem".into(), "/k.pem".into())));
        let o = options(
            "[database]\nURL = postgres://t@db.example.org/pepsi\n[pepsi-telemetry]\nTOKEN_FILE = /t\n",
        )
        .unwrap();
        assert_eq!(o.database.describe(), "t@db.example.org/pepsi");
        // Never a password in Debug output.
        let o = options(
            "[pepsi-telemetry]\nTOKEN_FILE = /t\nDATABASE_URL = postgres://t:s3cret@db/pepsi\n",
        )
        .unwrap();
        assert!(!format!("{o:?}").contains("s3cret"));
    }
}
