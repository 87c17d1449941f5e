//! The DNS edge of every program that asks the DNS itself (the ingress's verdicts, the
//! relay to the internet, key discovery): the one reading of `DNS_SERVERS`, the one resolver
//! setup over hickory-resolver (the configured servers or the system's), and the lookups with
//! the three outcomes callers tell apart: records, a name that does not exist or has no such
//! records (an answer), and a lookup that failed (SERVFAIL, REFUSED, a timeout: try again
//! later).
//!
//! Names are always queried fully qualified, so no search domain is ever appended, and the
//! hosts file is never read: what the DNS says is the DNS's word alone.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::{Resolver, TokioResolver};

use pepsi_conf::config::{ConfigError, Section};

/// One MX record as the DNS gave it: the exchange in ASCII, lower case, without the
/// trailing dot (empty for the root, `.`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MxRecord {
    pub preference: u16,
    pub exchange: String,
}

/// What the MX lookup of a domain found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MxAnswer {
    /// MX records.
    Records(Vec<MxRecord>),
    /// The domain exists and has no MX records: its own A/AAAA are the implicit MX.
    NoRecords,
    /// The domain does not exist (NXDOMAIN).
    NoDomain,
}

/// `ip` or `ip:port` (`[v6]:port`), port 53 when none is given: one `DNS_SERVERS` item.
pub fn parse_server(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    text.parse::<SocketAddr>()
        .ok()
        .filter(|a| a.port() != 0)
        .ok_or_else(|| format!("an IP address or IP:port ([IPv6]:port), not {text:?}"))
}

/// A `DNS_SERVERS` value: servers separated by commas or white space.
pub fn parse_servers(text: &str) -> Result<Vec<SocketAddr>, String> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|i| !i.is_empty())
        .map(parse_server)
        .collect()
}

/// `DNS_SERVERS` of `section`, when set (which section, and what falls back to what, is the
/// caller's to say); an empty list means the system's resolvers.
pub fn servers_opt(section: &Section<'_>) -> Result<Option<Vec<SocketAddr>>, ConfigError> {
    section.parse_opt("DNS_SERVERS", parse_servers)
}

/// The resolver configuration for `servers` (UDP, TCP when truncated), or the system's
/// (`/etc/resolv.conf`) when empty: two attempts of `timeout` each, and never the hosts file.
/// Callers that need more (the ingress's negative caching) adjust the options.
pub fn resolver_config(
    servers: &[SocketAddr],
    timeout: Duration,
) -> anyhow::Result<(ResolverConfig, ResolverOpts)> {
    let (config, mut opts) = if servers.is_empty() {
        hickory_resolver::system_conf::read_system_conf().map_err(|e| {
            anyhow::anyhow!(
                "cannot read the system resolver configuration (/etc/resolv.conf): {e}; \
                 set DNS_SERVERS"
            )
        })?
    } else {
        let servers = servers
            .iter()
            .map(|addr| {
                let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                for c in &mut ns.connections {
                    c.port = addr.port();
                }
                ns
            })
            .collect();
        (
            ResolverConfig::from_name_servers(servers),
            ResolverOpts::default(),
        )
    };
    opts.timeout = timeout;
    opts.attempts = 2;
    opts.use_hosts_file = ResolveHosts::Never;
    Ok((config, opts))
}

/// Why a lookup gave no records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// NXDOMAIN: the name does not exist.
    NoDomain,
    /// The name exists without records of the type asked for.
    NoRecords,
    /// No answer: the servers failed, refused or did not answer in time.
    Failed(String),
}

impl std::fmt::Display for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lookup::NoDomain => f.write_str("the name does not exist (NXDOMAIN)"),
            Lookup::NoRecords => f.write_str("no records"),
            Lookup::Failed(why) => write!(f, "DNS lookup failed: {why}"),
        }
    }
}

/// Addresses of one host and how long they may be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addresses {
    pub addresses: Vec<IpAddr>,
    /// Seconds until the answer expires (the smaller TTL of the A and AAAA answers).
    pub ttl: u32,
}

/// A resolver: one per stage section, or per program.
pub struct Dns {
    resolver: TokioResolver,
}

impl Dns {
    /// Asks `servers`, or the system's resolvers when empty ([`resolver_config`]).
    pub fn new(servers: &[SocketAddr], timeout: Duration) -> anyhow::Result<Dns> {
        let (config, opts) = resolver_config(servers, timeout)?;
        let resolver = Resolver::builder_with_config(config, TokioRuntimeProvider::default())
            .with_options(opts)
            .build()
            .map_err(|e| anyhow::anyhow!("cannot set up the DNS resolver: {e}"))?;
        Ok(Dns { resolver })
    }

    /// The MX records of `domain` (ASCII, without the trailing dot).
    pub async fn mx(&self, domain: &str) -> Result<MxAnswer, Lookup> {
        match self.resolver.mx_lookup(fqdn(domain)).await {
            Ok(lookup) => {
                let records: Vec<MxRecord> = lookup
                    .answers()
                    .iter()
                    .filter_map(|r| match &r.data {
                        RData::MX(mx) => Some(MxRecord {
                            preference: mx.preference,
                            exchange: mx
                                .exchange
                                .to_ascii()
                                .trim_end_matches('.')
                                .to_ascii_lowercase(),
                        }),
                        _ => None,
                    })
                    .collect();
                Ok(if records.is_empty() {
                    MxAnswer::NoRecords
                } else {
                    MxAnswer::Records(records)
                })
            }
            Err(e) => match classify(&e) {
                Lookup::NoDomain => Ok(MxAnswer::NoDomain),
                Lookup::NoRecords => Ok(MxAnswer::NoRecords),
                failed => Err(failed),
            },
        }
    }

    /// The A (and with `ipv6` the AAAA) records of `host`. Records of either kind are an
    /// answer even when the other lookup failed.
    pub async fn addresses(&self, host: &str, ipv6: bool) -> Result<Addresses, Lookup> {
        let name = fqdn(host);
        let v4 = self.resolver.ipv4_lookup(name.clone());
        let (v4, v6) = if ipv6 {
            let (a, b) = tokio::join!(v4, self.resolver.ipv6_lookup(name));
            (a, Some(b))
        } else {
            (v4.await, None)
        };
        let now = Instant::now();
        let mut addresses = Vec::new();
        let mut ttl = u32::MAX;
        let mut misses = Vec::new();
        for result in std::iter::once(v4).chain(v6) {
            match result {
                Ok(lookup) => {
                    let before = addresses.len();
                    for r in lookup.answers() {
                        match &r.data {
                            RData::A(a) => addresses.push(IpAddr::V4(a.0)),
                            RData::AAAA(a) => addresses.push(IpAddr::V6(a.0)),
                            _ => {}
                        }
                    }
                    if addresses.len() > before {
                        let left = lookup.valid_until().saturating_duration_since(now);
                        ttl = ttl.min(left.as_secs().min(u32::MAX as u64) as u32);
                    } else {
                        misses.push(Lookup::NoRecords);
                    }
                }
                Err(e) => misses.push(classify(&e)),
            }
        }
        if !addresses.is_empty() {
            addresses.dedup();
            return Ok(Addresses { addresses, ttl });
        }
        if let Some(failed) = misses.iter().find(|m| matches!(m, Lookup::Failed(_))) {
            return Err(failed.clone());
        }
        if misses.iter().all(|m| *m == Lookup::NoDomain) {
            return Err(Lookup::NoDomain);
        }
        Err(Lookup::NoRecords)
    }
}

impl Dns {
    /// The records of type `kind` at `name`, whatever their type: the lookups of key
    /// discovery (OPENPGPKEY, SMIMEA), which share this resolver's setup.
    pub async fn records(
        &self,
        name: &str,
        kind: hickory_resolver::proto::rr::RecordType,
    ) -> Result<Vec<RData>, Lookup> {
        match self.resolver.lookup(fqdn(name), kind).await {
            Ok(lookup) => {
                let records: Vec<RData> = lookup
                    .answers()
                    .iter()
                    .filter(|r| r.data.record_type() == kind)
                    .map(|r| r.data.clone())
                    .collect();
                if records.is_empty() {
                    Err(Lookup::NoRecords)
                } else {
                    Ok(records)
                }
            }
            Err(e) => Err(classify(&e)),
        }
    }
}

fn fqdn(name: &str) -> String {
    format!("{}.", name.trim_end_matches('.'))
}

/// Tells an answer without records from a failed lookup.
fn classify(e: &NetError) -> Lookup {
    match e {
        NetError::Dns(DnsError::NoRecordsFound(no)) => match no.response_code {
            ResponseCode::NXDomain => Lookup::NoDomain,
            ResponseCode::NoError => Lookup::NoRecords,
            code => Lookup::Failed(format!("the server answered {code}")),
        },
        NetError::Dns(DnsError::ResponseCode(code)) => {
            Lookup::Failed(format!("the server answered {code}"))
        }
        NetError::Timeout => Lookup::Failed("no answer in time".into()),
        other => Lookup::Failed(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_servers_values() {
        let ok: &[(&str, &[&str])] = &[
            ("192.0.2.53", &["192.0.2.53:53"]),
            ("127.0.0.1:5353 ::1", &["127.0.0.1:5353", "[::1]:53"]),
            ("127.0.0.1:5353, [::1]:54", &["127.0.0.1:5353", "[::1]:54"]),
            (" , ", &[]),
        ];
        for (text, expected) in ok {
            let expected: Vec<SocketAddr> = expected.iter().map(|a| a.parse().unwrap()).collect();
            assert_eq!(parse_servers(text), Ok(expected), "{text:?}");
        }
        for text in ["dns.example", "127.0.0.1:0", "192.0.2.53:dns", "::1:53x"] {
            let err = parse_servers(text).expect_err(text);
            assert!(
                err.contains("IP:port") && err.contains(text),
                "{text:?}: {err}"
            );
        }
    }
}
