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

impl Dns {
    /// The TXT records at `name`, each record's strings joined (RFC 7208 §3.3, RFC 8461
    /// §3.1); a name without TXT records, or that does not exist, has none.
    pub async fn txt(&self, name: &str) -> Result<Vec<String>, Lookup> {
        match self
            .records(name, hickory_resolver::proto::rr::RecordType::TXT)
            .await
        {
            Ok(records) => Ok(records
                .iter()
                .filter_map(|r| match r {
                    RData::TXT(txt) => Some(
                        txt.txt_data
                            .iter()
                            .map(|part| String::from_utf8_lossy(part))
                            .collect::<String>(),
                    ),
                    _ => None,
                })
                .collect()),
            Err(Lookup::NoRecords | Lookup::NoDomain) => Ok(Vec::new()),
            Err(failed) => Err(failed),
        }
    }
}

/// What a validating resolver answered for one name and type.
#[derive(Debug, Clone, PartialEq)]
pub struct Secured {
    /// The resolver set AD: it validated the answer (or the proof that there is none) with
    /// DNSSEC.
    pub secure: bool,
    /// The records of the type asked for; empty for NXDOMAIN or NODATA.
    pub records: Vec<RData>,
}

/// Lookups whose DNSSEC status counts (DANE, RFC 7672): asked of a validating resolver the
/// operator names (a local unbound, say), with the AD and DO bits set, and the AD bit of
/// the answer taken as its word. The resolver must be one this host trusts to validate and
/// reaches over a path nobody else can touch (loopback): the AD bit is not protected on
/// the wire. UDP, then TCP when the answer is truncated.
pub struct Validating {
    servers: Vec<SocketAddr>,
    timeout: Duration,
}

/// The largest answer read over UDP (the EDNS buffer size of DNS Flag Day 2020).
const EDNS_PAYLOAD: u16 = 1232;

impl Validating {
    /// Asks `servers`, or the system's resolvers (`/etc/resolv.conf`) when empty.
    pub fn new(servers: &[SocketAddr], timeout: Duration) -> anyhow::Result<Validating> {
        let servers = if servers.is_empty() {
            let (config, _) = resolver_config(&[], timeout)?;
            config
                .name_servers()
                .iter()
                .map(|ns| SocketAddr::new(ns.ip, 53))
                .collect()
        } else {
            servers.to_vec()
        };
        Ok(Validating { servers, timeout })
    }

    /// The records of type `kind` at `name`, and whether they are secure. NXDOMAIN and
    /// NODATA are answers (no records); SERVFAIL (which a validating resolver also gives for
    /// bogus data), a refusal or no answer in time is [`Lookup::Failed`].
    pub async fn lookup(
        &self,
        name: &str,
        kind: hickory_resolver::proto::rr::RecordType,
    ) -> Result<Secured, Lookup> {
        let mut last = Lookup::Failed("no resolver configured".into());
        for server in &self.servers {
            match self.ask(*server, name, kind).await {
                Ok(answer) => {
                    let secure = answer.metadata.authentic_data;
                    return match answer.metadata.response_code {
                        ResponseCode::NoError | ResponseCode::NXDomain => Ok(Secured {
                            secure,
                            records: answer
                                .answers
                                .iter()
                                .filter(|r| r.data.record_type() == kind)
                                .map(|r| r.data.clone())
                                .collect(),
                        }),
                        code => Err(Lookup::Failed(format!("{server} answered {code}"))),
                    };
                }
                Err(why) => last = Lookup::Failed(format!("{server}: {why}")),
            }
        }
        Err(last)
    }

    async fn ask(
        &self,
        server: SocketAddr,
        name: &str,
        kind: hickory_resolver::proto::rr::RecordType,
    ) -> Result<hickory_resolver::proto::op::Message, String> {
        use hickory_resolver::proto::op::{Edns, Message, Query};
        use hickory_resolver::proto::rr::Name;
        let qname = Name::from_ascii(fqdn(name)).map_err(|e| format!("{name:?}: {e}"))?;
        let mut query = Message::query();
        query.metadata.recursion_desired = true;
        query.metadata.authentic_data = true;
        query.add_query(Query::query(qname, kind));
        let mut edns = Edns::new();
        edns.set_dnssec_ok(true);
        edns.set_max_payload(EDNS_PAYLOAD);
        query.set_edns(edns);
        let id = query.metadata.id;
        let wire = query.to_vec().map_err(|e| e.to_string())?;
        let answer = tokio::time::timeout(self.timeout, async {
            let local: SocketAddr = if server.is_ipv4() {
                ([0, 0, 0, 0], 0).into()
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let socket = tokio::net::UdpSocket::bind(local)
                .await
                .map_err(|e| e.to_string())?;
            socket.connect(server).await.map_err(|e| e.to_string())?;
            socket.send(&wire).await.map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; usize::from(EDNS_PAYLOAD) + 512];
            loop {
                let n = socket.recv(&mut buf).await.map_err(|e| e.to_string())?;
                // Anything but the answer to this query (a stray datagram) is dropped.
                if let Ok(m) = Message::from_vec(&buf[..n])
                    && m.metadata.id == id
                {
                    return Ok::<_, String>(m);
                }
            }
        })
        .await
        .map_err(|_| "no answer in time".to_owned())??;
        if !answer.metadata.truncation {
            return Ok(answer);
        }
        tokio::time::timeout(self.timeout, async {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let mut tcp = tokio::net::TcpStream::connect(server)
                .await
                .map_err(|e| e.to_string())?;
            let len = u16::try_from(wire.len()).map_err(|_| "query too long".to_owned())?;
            tcp.write_all(&[&len.to_be_bytes()[..], &wire].concat())
                .await
                .map_err(|e| e.to_string())?;
            let mut len = [0u8; 2];
            tcp.read_exact(&mut len).await.map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
            tcp.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
            let m = Message::from_vec(&buf).map_err(|e| e.to_string())?;
            if m.metadata.id != id {
                return Err("the answer over TCP is not to this query".to_owned());
            }
            Ok(m)
        })
        .await
        .map_err(|_| "no answer in time over TCP".to_owned())?
    }
}

/// The non-public range `ip` lies in, if any: the destinations the relay and the
/// HTTPS fetches refuse unless `ALLOW_INTERNAL_ADDRESSES` (an IPv4-mapped IPv6 address is judged as its IPv4 address).
pub fn internal_range(ip: IpAddr) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(a) => {
            let [b0, b1, ..] = a.octets();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_private() {
                Some("private")
            } else if a.is_link_local() {
                Some("link-local")
            } else if a.is_unspecified() || b0 == 0 {
                Some("unspecified")
            } else if b0 == 100 && (64..128).contains(&b1) {
                Some("shared address space (carrier-grade NAT)")
            } else if a.is_multicast() || a.is_broadcast() || b0 >= 240 {
                Some("multicast or reserved")
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            let first = a.segments()[0];
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_unspecified() {
                Some("unspecified")
            } else if first & 0xfe00 == 0xfc00 {
                Some("private (unique local)")
            } else if first & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if a.is_multicast() {
                Some("multicast or reserved")
            } else {
                None
            }
        }
    }
}

/// An address outside every range [`internal_range`] names.
pub fn is_public(ip: IpAddr) -> bool {
    internal_range(ip).is_none()
}

/// A resolver for reqwest over a [`Dns`]: the HTTPS fetches of key discovery and MTA-STS
/// ask the same servers as the rest of the program, never the hosts file, and an address
/// `allowed` refuses (loopback, private …, unless the operator allowed them) is never
/// connected to. Checked at connect time, on every redirect too, which also closes DNS
/// rebinding.
pub struct HttpResolver {
    pub dns: std::sync::Arc<Dns>,
    /// Whether an address may be connected to.
    pub allowed: fn(IpAddr) -> bool,
    /// The option that would allow a refused address, for the error.
    pub option: &'static str,
}

impl reqwest::dns::Resolve for HttpResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let dns = self.dns.clone();
        let (allowed, option) = (self.allowed, self.option);
        Box::pin(async move {
            let found = dns.addresses(name.as_str(), true).await.map_err(
                |e| -> Box<dyn std::error::Error + Send + Sync> {
                    format!("{}: {e}", name.as_str()).into()
                },
            )?;
            let addrs: Vec<SocketAddr> = found
                .addresses
                .into_iter()
                .filter(|ip| allowed(*ip))
                .map(|ip| SocketAddr::new(ip, 0))
                .collect();
            if addrs.is_empty() {
                return Err(format!(
                    "{} has no globally routable address ({option})",
                    name.as_str()
                )
                .into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
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
