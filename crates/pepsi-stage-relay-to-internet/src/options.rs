//! The `[stage-<name>]` settings of one relay stage, read and validated once at start.
//! Pure: no I/O besides reading the loaded configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use pepsi_conf::address::normalize_domain;
use pepsi_conf::config::{Config, ConfigError};
use pepsi_outbound::delivery::RetryPolicy;
use pepsi_outbound::dns;
use pepsi_smtp::{Timeouts, TlsPolicy};

/// Which address families the stage connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6 {
    /// IPv6 and IPv4; among addresses of the same health, IPv6 first.
    Prefer,
    /// IPv4 only: AAAA records are not even looked up.
    No,
}

impl Ipv6 {
    fn parse(text: &str) -> Result<Ipv6, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "prefer" | "yes" => Ok(Ipv6::Prefer),
            "no" => Ok(Ipv6::No),
            _ => Err(format!("prefer or no, not {:?}", text.trim())),
        }
    }

    pub fn enabled(self) -> bool {
        self == Ipv6::Prefer
    }
}

/// The settings of one stage section.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// `DNS_SERVERS`: the resolvers to ask; empty for the system's (/etc/resolv.conf).
    pub dns_servers: Vec<SocketAddr>,
    /// `DNS_TIMEOUT`: per query and server.
    pub dns_timeout: Duration,
    /// `SMTP_PORT`: where MX hosts are contacted.
    pub smtp_port: u16,
    /// `HELO_NAME`: the name given in EHLO/HELO, and the name that tells a loop back to
    /// this host among a domain's MX hosts.
    pub helo_name: String,
    pub timeouts: Timeouts,
    pub ipv6: Ipv6,
    /// `ALLOW_INTERNAL_ADDRESSES`: connect to MX hosts and literals in loopback, private,
    /// link-local and other non-public ranges (off: a DSN or a hostile MX record could make
    /// this host talk to internal services).
    pub allow_internal: bool,
    /// `ATTEMPT_TIMEOUT`: one delivery attempt of a message, every host and address of it
    /// included; past it the recipient waits for its retry. Shorter than the MAX_RUNTIME
    /// the pass runs under (checked at start), so the dispatcher never has to kill a
    /// worker for a slow peer.
    pub attempt_timeout: Duration,
    /// `MAX_ADDRESSES`: the most addresses one delivery attempt connects to.
    pub max_addresses: usize,
    /// `CONNECTION_IDLE`: how long a session is kept for the next message; zero closes it
    /// after each.
    pub connection_idle: Duration,
    /// `TLS`: the policy for destinations `TLS_DOMAINS` does not name.
    pub tls: TlsPolicy,
    /// `TLS_DOMAINS`: per recipient domain (normalized), a policy of its own.
    pub tls_domains: BTreeMap<String, TlsPolicy>,
    /// `TLS_CA_FILE`: the CAs a `verify` session trusts instead of the system's.
    pub tls_ca_file: Option<PathBuf>,
    /// The MTA-STS settings (`MTA_STS*`).
    pub sts: Sts,
    /// `TLS_REPORTING`: count every session's TLS result for the daily TLS reports.
    pub tls_reporting: bool,
    /// `DANE`: use the DNSSEC-validated TLSA records of MX hosts (RFC 7672), found through
    /// `DANE_DNS_SERVERS` (default no).
    pub dane: bool,
    /// `DANE_DNS_SERVERS`: the validating resolver whose AD bit is trusted (default the
    /// stage's `DNS_SERVERS`).
    pub dane_dns_servers: Vec<SocketAddr>,
    pub policy: RetryPolicy,
}

/// How the stage honours the MTA-STS policies of recipient domains (RFC 8461).
#[derive(Debug, Clone, PartialEq)]
pub struct Sts {
    /// `MTA_STS`: look policies up and apply them (default yes).
    pub enabled: bool,
    /// `MTA_STS_PORT`: the HTTPS port of policy hosts (443).
    pub port: u16,
    /// `MTA_STS_TIMEOUT`: one policy fetch, connect to last byte (20s).
    pub timeout: Duration,
    /// `MTA_STS_CA_FILE`: the CAs a policy host's certificate must lead to (default: the
    /// system's; MX certificates under a policy are checked against `TLS_CA_FILE`).
    pub ca_file: Option<PathBuf>,
    /// `MTA_STS_REFRESH`: a cached policy is fetched again once it is this old, even when
    /// its id has not changed, so it never runs out while the domain still publishes it
    /// (1d).
    pub refresh: Duration,
    /// `MTA_STS_FETCH_BACKOFF`: after a failed fetch, the failure stands this long before
    /// the policy host is asked again (5m; 0: ask every time).
    pub fetch_backoff: Duration,
}

/// `example.org:verify, other.net:encrypt`: a policy per recipient domain.
pub fn parse_tls_domains(items: &[String]) -> Result<BTreeMap<String, TlsPolicy>, String> {
    let mut map = BTreeMap::new();
    for item in items {
        let (domain, mode) = item
            .rsplit_once(':')
            .ok_or_else(|| format!("domain:policy items, not {item:?}"))?;
        let domain = normalize_domain(domain)
            .filter(|d| !d.starts_with('['))
            .ok_or_else(|| format!("a domain name before the colon in {item:?}"))?;
        let mode = mode
            .parse::<TlsPolicy>()
            .map_err(|e| format!("{item:?}: {e}"))?;
        if map.insert(domain.clone(), mode).is_some() {
            return Err(format!("{domain} is named twice"));
        }
    }
    Ok(map)
}

impl Options {
    /// Reads `[stage-<stage>]`. `DNS_SERVERS`, `DNS_TIMEOUT` and `IPV6` fall back to
    /// `[pepsi]`; `HELO_NAME` to `[pepsi] HOSTNAME`, then to the system's host name.
    pub fn from_config(cfg: &Config, stage: &str) -> Result<Options, ConfigError> {
        let s = cfg.stage_section_named(stage);
        let layered = s.or_global();
        let dns_servers = dns::servers_opt(layered.section_for("DNS_SERVERS"))?.unwrap_or_default();
        let helo_name = cfg.name_option(&s, "HELO_NAME")?;
        let d = Timeouts::default();
        let positive = |opt: &str, default: Duration| -> Result<Duration, ConfigError> {
            Ok(s.duration_opt(opt)?
                .filter(|v| !v.is_zero())
                .unwrap_or(default))
        };
        let tls_domains = s
            .parse_opt("TLS_DOMAINS", |v| {
                let items: Vec<String> = v
                    .split(',')
                    .map(|i| i.trim().to_owned())
                    .filter(|i| !i.is_empty())
                    .collect();
                parse_tls_domains(&items)
            })?
            .unwrap_or_default();
        Ok(Options {
            dns_servers: dns_servers.clone(),
            dns_timeout: layered
                .duration_opt("DNS_TIMEOUT")?
                .filter(|v| !v.is_zero())
                .unwrap_or(Duration::from_secs(10)),
            smtp_port: s
                .parse_opt("SMTP_PORT", |v| {
                    v.trim()
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| "a port from 1 to 65535".to_owned())
                })?
                .unwrap_or(25),
            helo_name,
            timeouts: Timeouts {
                connect: positive("CONNECT_TIMEOUT", d.connect)?,
                greeting: positive("GREETING_TIMEOUT", Duration::from_secs(300))?,
                command: positive("COMMAND_TIMEOUT", Duration::from_secs(300))?,
                data: positive("DATA_TIMEOUT", d.data)?,
            },
            ipv6: layered
                .parse_opt("IPV6", Ipv6::parse)?
                .unwrap_or(Ipv6::Prefer),
            allow_internal: s.bool_opt("ALLOW_INTERNAL_ADDRESSES")?.unwrap_or(false),
            attempt_timeout: s
                .duration_opt("ATTEMPT_TIMEOUT")?
                .unwrap_or(pepsi_contract::stage::DEFAULT_ATTEMPT_TIMEOUT),
            max_addresses: s
                .parse_opt("MAX_ADDRESSES", |v| {
                    v.trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=100).contains(n))
                        .ok_or_else(|| "a number from 1 to 100".to_owned())
                })?
                .unwrap_or(10),
            connection_idle: s
                .duration_opt("CONNECTION_IDLE")?
                .unwrap_or(Duration::from_secs(5)),
            tls: s
                .parse_opt("TLS", |v| v.parse::<TlsPolicy>())?
                .unwrap_or(TlsPolicy::May),
            tls_domains,
            tls_ca_file: s.path_opt("TLS_CA_FILE")?,
            sts: Sts {
                enabled: s.bool_opt("MTA_STS")?.unwrap_or(true),
                port: s
                    .parse_opt("MTA_STS_PORT", |v| {
                        v.trim()
                            .parse::<u16>()
                            .ok()
                            .filter(|p| *p != 0)
                            .ok_or_else(|| "a port from 1 to 65535".to_owned())
                    })?
                    .unwrap_or(443),
                timeout: positive("MTA_STS_TIMEOUT", Duration::from_secs(20))?,
                ca_file: s.path_opt("MTA_STS_CA_FILE")?,
                refresh: positive("MTA_STS_REFRESH", Duration::from_secs(86_400))?,
                fetch_backoff: s
                    .duration_opt("MTA_STS_FETCH_BACKOFF")?
                    .unwrap_or(Duration::from_secs(300)),
            },
            tls_reporting: s.bool_opt("TLS_REPORTING")?.unwrap_or(true),
            dane: s.bool_opt("DANE")?.unwrap_or(false),
            dane_dns_servers: s
                .parse_opt("DANE_DNS_SERVERS", dns::parse_servers)?
                .filter(|l| !l.is_empty())
                .unwrap_or_else(|| dns_servers.clone()),
            policy: RetryPolicy::from_config(cfg, stage)?,
        })
    }

    /// The TLS policy for mail to `domain` (normalized).
    pub fn tls_for(&self, domain: &str) -> TlsPolicy {
        self.tls_domains.get(domain).copied().unwrap_or(self.tls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_timeout_against_the_governing_max_runtime() {
        let check = |text: &str| {
            let cfg = Config::from_str_named(text, "t.conf").unwrap();
            let s = Options::from_config(&cfg, "out").map_err(|e| e.to_string())?;
            pepsi_contract::stage::check_attempt_timeout(&cfg, "out", s.attempt_timeout)
        };
        let out = "[stage-out]\nPROGRAM = pepsi-stage-relay-to-internet\nHELO_NAME = h.test\n";
        assert_eq!(check(out), Ok(()), "the defaults fit");
        let err = check(&format!("{out}ATTEMPT_TIMEOUT = 10m\n")).unwrap_err();
        assert!(err.contains("[stage-out] MAX_RUNTIME"), "{err}");
        assert_eq!(
            check(&format!("{out}ATTEMPT_TIMEOUT = 10m\nMAX_RUNTIME = 15m\n")),
            Ok(())
        );
        // Fused behind dkim, the pass runs under dkim's MAX_RUNTIME.
        let fused = format!(
            "[stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nNEXT_STAGE = arc\nMAX_RUNTIME = 2m\n\
             [stage-arc]\nPROGRAM = pepsi-stage-arc\nNEXT_STAGE = out\n{out}"
        );
        let err = check(&fused).unwrap_err();
        assert!(err.contains("MAX_RUNTIME = 120s of [stage-dkim]"), "{err}");
        assert_eq!(check(&format!("{fused}ATTEMPT_TIMEOUT = 100s\n")), Ok(()));
    }

    fn settings(text: &str) -> Result<Options, String> {
        let cfg = Config::from_str_named(text, "t.conf").unwrap();
        Options::from_config(&cfg, "out").map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_fallbacks() {
        let s = settings(
            "[pepsi]\nHOSTNAME = mx.example.test\nDNS_SERVERS = 192.0.2.53\nIPV6 = no\n\
             [stage-out]\nPROGRAM = pepsi-stage-relay-to-internet\n",
        )
        .unwrap();
        assert_eq!(s.helo_name, "mx.example.test");
        assert_eq!(s.dns_servers, vec!["192.0.2.53:53".parse().unwrap()]);
        assert_eq!(s.dns_timeout, Duration::from_secs(10));
        assert_eq!(s.smtp_port, 25);
        assert_eq!(s.ipv6, Ipv6::No);
        assert_eq!(s.tls, TlsPolicy::May);
        assert_eq!(s.max_addresses, 10);
        assert_eq!(s.connection_idle, Duration::from_secs(5));
        assert_eq!(s.timeouts.greeting, Duration::from_secs(300));
        assert_eq!(s.tls_for("example.org"), TlsPolicy::May);

        let s = settings(
            "[pepsi]\nHOSTNAME = mx.example.test\nDNS_SERVERS = 192.0.2.53\n\
             [stage-out]\nHELO_NAME = out.example.test\nDNS_SERVERS = 127.0.0.1:5353, [::1]:53\n\
             DNS_TIMEOUT = 2s\nSMTP_PORT = 2525\nCONNECT_TIMEOUT = 5s\nDATA_TIMEOUT = 0\n\
             TLS = encrypt\nTLS_DOMAINS = Example.ORG:verify, bücher.example:none\n\
             MAX_ADDRESSES = 3\nRETRY_INITIAL = 1m\nTLS_CA_FILE = /etc/pepsi/ca.pem\n\
             CONNECTION_IDLE = 0\n",
        )
        .unwrap();
        assert_eq!(s.helo_name, "out.example.test");
        assert_eq!(
            s.dns_servers,
            vec![
                "127.0.0.1:5353".parse().unwrap(),
                "[::1]:53".parse().unwrap()
            ]
        );
        assert_eq!(s.dns_timeout, Duration::from_secs(2));
        assert_eq!(s.smtp_port, 2525);
        assert_eq!(s.ipv6, Ipv6::Prefer);
        assert_eq!(s.timeouts.connect, Duration::from_secs(5));
        assert_eq!(
            s.timeouts.data,
            Timeouts::default().data,
            "0 is the default"
        );
        assert_eq!(s.max_addresses, 3);
        assert!(s.connection_idle.is_zero());
        assert_eq!(s.tls_ca_file, Some(PathBuf::from("/etc/pepsi/ca.pem")));
        assert_eq!(s.policy.initial, Duration::from_secs(60));
        assert_eq!(s.tls_for("example.org"), TlsPolicy::Verify);
        assert_eq!(s.tls_for("xn--bcher-kva.example"), TlsPolicy::None);
        assert_eq!(s.tls_for("other.example"), TlsPolicy::Encrypt);
    }

    #[test]
    fn bad_values_name_the_option_and_what_was_expected() {
        let cases = [
            ("DNS_SERVERS = dns.example", "IP:port"),
            ("DNS_SERVERS = 127.0.0.1:0", "IP:port"),
            ("SMTP_PORT = 0", "a port from 1 to 65535"),
            ("SMTP_PORT = smtp", "a port from 1 to 65535"),
            ("TLS = always", "none, may, encrypt or verify"),
            ("TLS_DOMAINS = example.org", "domain:policy"),
            (
                "TLS_DOMAINS = example.org:strict",
                "a TLS policy (none, may",
            ),
            (
                "TLS_DOMAINS = a.example:may, A.example:none",
                "a.example is named twice",
            ),
            ("TLS_DOMAINS = [192.0.2.1]:may", "a domain name"),
            ("IPV6 = only", "prefer or no"),
            ("MAX_ADDRESSES = 0", "a number from 1 to 100"),
            ("CONNECT_TIMEOUT = soon", "CONNECT_TIMEOUT"),
        ];
        for (line, want) in cases {
            let err = settings(&format!("[stage-out]\n{line}\n")).unwrap_err();
            let option = line.split_once(' ').unwrap().0;
            assert!(
                err.contains(want) && err.contains(option) && err.contains("t.conf:2"),
                "{line}: {err}"
            );
        }
    }
}
