//! pepsi-keydisc: answers the key requests of messages whose encryption is required
//! (`pepsi.key_request`, written by pepsi-stage-encrypt through `crypto_request_key`). For
//! each due request it asks the methods the stage named — WKD over HTTPS (advanced, then
//! direct), DNS OPENPGPKEY (RFC 7929) and SMIMEA (RFC 8162), a VKS keyserver — records what
//! each answered, stores a key found as a `peer_key` of that source, and settles the
//! request: found, or none (a negative answer cached until `negative_until`). Settling calls
//! `pepsi.keydisc_release`, which sends the parked messages back to their stage, and wakes the
//! dispatcher. A method that failed (a timeout, a server error) is asked again later, up to
//! MAX_ATTEMPTS, before the request settles without a key.
//!
//! Reads and writes `pepsi.key_request` and `pepsi.peer_key` only; every input from the
//! network is bounded (MAX_RESPONSE bytes, METHOD_TIMEOUT) and a key is kept only when it
//! names the address and can encrypt now.

pub mod names;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use hickory_resolver::proto::rr::{RData, RecordType};
use names::Method;
use pepsi_conf::cli::{CommonArgs, init_logging, run_async};
use pepsi_conf::config::Config;
use pepsi_crypto::{Scheme, openpgp, smime};
use pepsi_outbound::dns::{Dns, Lookup};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::PgPool;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "keydisc",
        exec: "pepsi-keydisc",
    };
}

const LONG_ABOUT: &str = "\
Find the keys of correspondents for mail whose encryption is required. pepsi-stage-encrypt \
parks such a message and records a request in pepsi.key_request; pepsi-keydisc asks the methods \
the stage named (wkd: Web Key Directory over HTTPS, the advanced then the direct method; \
openpgpkey: the DNS OPENPGPKEY record of RFC 7929; smimea: the DNS SMIMEA record of RFC 8162; \
keyserver: a VKS keyserver's by-email lookup), records each method's answer in \
methods_replied, stores a key found (one that names the address and can encrypt) as a peer key \
cached for POSITIVE_TTL, and settles the request. Settled without a key, the answer is cached \
for NEGATIVE_TTL: a message for the address meanwhile is returned at once. Settling releases \
the parked messages (pepsi.keydisc_release) and wakes the dispatcher. A method that failed \
rather than answered is asked again after RETRY, up to MAX_ATTEMPTS times.

Options of [pepsi-keydisc] (defaults in brackets): INTERVAL (2s) between passes, BATCH (20) \
requests per pass, METHOD_TIMEOUT (10s), MAX_RESPONSE (1M), POSITIVE_TTL (7d), NEGATIVE_TTL \
(1d), RETRY (5m), MAX_ATTEMPTS (3), KEYSERVER (https://keys.openpgp.org), WKD_PORT (443), \
TLS_CA_FILE (extra trust anchors for WKD and the keyserver, PEM), DNS_SERVERS (ip or ip:port \
list; [pepsi] DNS_SERVERS, else /etc/resolv.conf), ALLOW_PRIVATE_ADDRESSES (no: only globally \
routable addresses are connected to, so a recipient's domain cannot point at this host's or \
its network's services). A method that failed MAX_ATTEMPTS times settles without a key for \
RETRY only. See docs/crypto.md.

Exit status: 0, or 1 when it cannot start (configuration, database).";

/// Answer key-discovery requests.
#[derive(Debug, Parser)]
#[command(name = "pepsi-keydisc", version, about, long_about = LONG_ABOUT)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// One pass over the due requests, then exit (prints what it did)
    #[arg(long)]
    once: bool,
    /// With --once: the pass as JSON
    #[arg(long, requires = "once")]
    json: bool,
}

/// The command line of `pepsi-keydisc`: its `--help` and its manual page.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// `[pepsi-keydisc]`, read once.
#[derive(Debug, Clone)]
pub struct Options {
    pub interval: Duration,
    pub batch: i64,
    pub method_timeout: Duration,
    pub max_response: u64,
    pub positive_ttl: Duration,
    pub negative_ttl: Duration,
    pub retry: Duration,
    pub max_attempts: i32,
    pub keyserver: String,
    pub wkd_port: u16,
    pub ca_file: Option<std::path::PathBuf>,
    pub dns_servers: Vec<SocketAddr>,
    /// `ALLOW_PRIVATE_ADDRESSES` (no): connect to loopback and private addresses too (a WKD
    /// on the local network, tests).
    pub allow_private: bool,
}

impl Options {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Options> {
        let s = cfg.section("pepsi-keydisc");
        let dns_servers =
            pepsi_outbound::dns::servers_opt(s.or_global().section_for("DNS_SERVERS"))?
                .unwrap_or_default();
        let options = Options {
            interval: s
                .duration_opt("INTERVAL")?
                .unwrap_or(Duration::from_secs(2)),
            batch: s.number_opt("BATCH")?.unwrap_or(20),
            method_timeout: s
                .duration_opt("METHOD_TIMEOUT")?
                .unwrap_or(Duration::from_secs(10)),
            max_response: s.size_opt("MAX_RESPONSE")?.unwrap_or(1 << 20),
            positive_ttl: s
                .duration_opt("POSITIVE_TTL")?
                .unwrap_or(Duration::from_secs(7 * 86_400)),
            negative_ttl: s
                .duration_opt("NEGATIVE_TTL")?
                .unwrap_or(Duration::from_secs(86_400)),
            retry: s.duration_opt("RETRY")?.unwrap_or(Duration::from_secs(300)),
            max_attempts: s.number_opt("MAX_ATTEMPTS")?.unwrap_or(3),
            keyserver: s
                .string_opt("KEYSERVER")?
                .unwrap_or_else(|| "https://keys.openpgp.org".to_owned()),
            wkd_port: s.number_opt("WKD_PORT")?.unwrap_or(443),
            ca_file: s.path_opt("TLS_CA_FILE")?,
            dns_servers,
            allow_private: s.bool_opt("ALLOW_PRIVATE_ADDRESSES")?.unwrap_or(false),
        };
        if options.interval.is_zero() || options.batch < 1 || options.max_attempts < 1 {
            anyhow::bail!("[pepsi-keydisc] INTERVAL, BATCH and MAX_ATTEMPTS must be above zero");
        }
        if !options.keyserver.starts_with("https://") {
            anyhow::bail!(
                "[pepsi-keydisc] KEYSERVER {:?}: a keyserver is asked over HTTPS only",
                options.keyserver
            );
        }
        // Every URL fetched must name its host (the resolver checks the addresses of names
        // only): say so at start rather than fail each request.
        if let Err(e) = url_domain(&options.keyserver) {
            anyhow::bail!("[pepsi-keydisc] KEYSERVER {e}: name the keyserver by its host name");
        }
        Ok(options)
    }
}

/// What one method answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Keys that name the address and can encrypt, with their scheme.
    Found(Vec<(Scheme, Vec<u8>)>, String),
    /// The method answered: no key (or none usable).
    None(String),
    /// The method could not be asked; try again later.
    Failed(String),
}

impl Answer {
    fn to_json(&self) -> Value {
        let (result, detail) = match self {
            Answer::Found(_, d) => ("found", d),
            Answer::None(d) => ("none", d),
            Answer::Failed(d) => ("error", d),
        };
        json!({ "result": result, "detail": detail, "at": chrono::Utc::now().to_rfc3339() })
    }
}

/// The network side of discovery: one resolver and one HTTPS client for a pass.
pub struct Finder {
    options: Options,
    dns: Arc<Dns>,
    http: reqwest::Client,
}

/// Whether an address is one a public key server may have.
pub fn is_global(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.is_unspecified()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                // IETF protocol assignments (192.0.0.0/24) and benchmarking (198.18.0.0/15).
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 224)
        }
        std::net::IpAddr::V6(v6) => {
            let seg = v6.segments();
            // NAT64 (RFC 6052 well-known prefix 64:ff9b::/96): the IPv4 address it carries is
            // the one reached. The local-use prefix 64:ff9b:1::/48 (RFC 8215) is never global.
            let nat64 = (seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0])
                .then(|| std::net::Ipv4Addr::from(u128::from(v6) as u32));
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (seg[0] & 0xfe00) == 0xfc00
                || (seg[0] & 0xffc0) == 0xfe80
                || (seg[0] == 0x64 && seg[1] == 0xff9b && seg[2] == 1)
                || nat64.is_some_and(|v4| !is_global(v4.into()))
                || v6.to_ipv4_mapped().is_some_and(|v4| !is_global(v4.into())))
        }
    }
}

impl Finder {
    pub fn new(options: Options) -> anyhow::Result<Finder> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dns = Arc::new(Dns::new(&options.dns_servers, options.method_timeout)?);
        // reqwest asks our resolver, so WKD hosts resolve as the DNS says; an address that
        // is not globally routable is refused unless ALLOW_PRIVATE_ADDRESSES, so a
        // recipient's domain cannot point the service at the host's own network.
        let mut builder = reqwest::Client::builder()
            .timeout(options.method_timeout)
            .connect_timeout(options.method_timeout)
            // Redirects stay on HTTPS and on a host name (an address literal would skip the
            // resolver's check), three at most.
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                let literal = attempt.url().domain().is_none();
                if attempt.previous().len() >= 3 || literal {
                    attempt.stop()
                } else {
                    attempt.follow()
                }
            }))
            .https_only(true)
            .dns_resolver(Arc::new(pepsi_outbound::dns::HttpResolver {
                dns: dns.clone(),
                allowed: if options.allow_private {
                    |_| true
                } else {
                    is_global
                },
                option: "ALLOW_PRIVATE_ADDRESSES",
            }))
            .user_agent(concat!("pepsi-keydisc/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &options.ca_file {
            let pem = std::fs::read(path)
                .with_context(|| format!("[pepsi-keydisc] TLS_CA_FILE {}", path.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem).with_context(|| {
                format!("[pepsi-keydisc] TLS_CA_FILE {}: not PEM", path.display())
            })? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().context("cannot set up the HTTPS client")?;
        Ok(Finder { options, dns, http })
    }

    /// Asks one method about one address.
    pub async fn ask(&self, method: Method, address: &str) -> Answer {
        let Some((local, domain)) = pepsi_conf::address::parts(address) else {
            return Answer::None(format!("{address:?} is not an address"));
        };
        // A domain name, not an address literal or a bare host name: nothing a recipient
        // writes may name a host the DNS did not. Judged as the URL parser reads the host,
        // which takes `0x7f.0.0.1` or full-width digits for an IPv4 address.
        let literal = domain.starts_with('[')
            || domain.parse::<std::net::IpAddr>().is_ok()
            || domain
                .split('.')
                .all(|l| l.chars().all(|c| c.is_ascii_digit()))
            || !domain.contains('.')
            || url_domain(&format!("https://{domain}/")).is_err();
        if literal {
            return Answer::None(format!("{domain:?} is not a domain name discovery asks"));
        }
        let answer = match method {
            Method::Wkd => self.wkd(local, domain, address).await,
            Method::OpenPgpKey => {
                self.dane(
                    local,
                    domain,
                    address,
                    "_openpgpkey",
                    RecordType::OPENPGPKEY,
                )
                .await
            }
            Method::Smimea => {
                self.dane(local, domain, address, "_smimecert", RecordType::SMIMEA)
                    .await
            }
            Method::Keyserver => {
                let url = names::vks_url(&self.options.keyserver, address);
                match self.fetch(&url).await {
                    Ok(Some(body)) => keep_openpgp(&body, address, &format!("from {url}")),
                    Ok(None) => Answer::None(format!("{url}: not found")),
                    Err(e) => Answer::Failed(e),
                }
            }
        };
        tracing::debug!(address, method = method.as_str(), ?answer, "asked");
        answer
    }

    async fn wkd(&self, local: &str, domain: &str, address: &str) -> Answer {
        let [advanced, direct] = names::wkd_urls(local, domain, self.options.wkd_port);
        // The advanced method's host exists only where a domain set it up; without it the
        // direct method applies (draft-koch-openpgp-webkey-service §3.1).
        let host = format!("openpgpkey.{}", domain.to_ascii_lowercase());
        let url = match self.dns.addresses(&host, true).await {
            Ok(_) => advanced,
            Err(Lookup::NoDomain | Lookup::NoRecords) => direct.clone(),
            Err(Lookup::Failed(e)) => return Answer::Failed(format!("{host}: {e}")),
        };
        let answer = match self.fetch(&url).await {
            Ok(Some(body)) => keep_openpgp(&body, address, &format!("from {url}")),
            Ok(None) => Answer::None(format!("{url}: not found")),
            Err(e) => Answer::Failed(e),
        };
        // A domain whose advanced host answers nothing usable (a wildcard record, no
        // certificate for it) may still serve the direct method.
        match answer {
            Answer::Failed(e) if url != direct => match self.fetch(&direct).await {
                Ok(Some(body)) => keep_openpgp(&body, address, &format!("from {direct}")),
                Ok(None) => Answer::None(format!("{direct}: not found (advanced: {e})")),
                Err(e2) => Answer::Failed(format!("{e}; {e2}")),
            },
            other => other,
        }
    }

    async fn dane(
        &self,
        local: &str,
        domain: &str,
        address: &str,
        label: &str,
        kind: RecordType,
    ) -> Answer {
        let name = names::dane_name(local, domain, label);
        let records = match self.dns.records(&name, kind).await {
            Ok(r) => r,
            Err(Lookup::NoDomain | Lookup::NoRecords) => {
                return Answer::None(format!("{name}: no {kind} record"));
            }
            Err(Lookup::Failed(e)) => return Answer::Failed(format!("{name}: {e}")),
        };
        let mut keys = Vec::new();
        for r in records {
            match r {
                RData::OPENPGPKEY(k) => {
                    if let Answer::Found(mut found, _) = keep_openpgp(&k.public_key, address, "") {
                        keys.append(&mut found);
                    }
                }
                RData::SMIMEA(s) => {
                    // Only a whole end-entity certificate the record itself vouches for
                    // (DANE-EE: usage 3, selector 0, no hash) can be encrypted to without
                    // a PKIX check of its own.
                    let t = s.0;
                    let whole = u8::from(t.cert_usage) == 3
                        && u8::from(t.selector) == 0
                        && u8::from(t.matching) == 0;
                    if whole && usable_certificate(&t.cert_data, address) {
                        keys.push((Scheme::Smime, t.cert_data));
                    }
                }
                _ => {}
            }
        }
        if keys.is_empty() {
            Answer::None(format!("{name}: no usable key for {address}"))
        } else {
            Answer::Found(keys, format!("{kind} at {name}"))
        }
    }

    /// GET `url`: the body (at most MAX_RESPONSE bytes), None on 404/410, an error otherwise.
    async fn fetch(&self, url: &str) -> Result<Option<Vec<u8>>, String> {
        // The HTTP client's connector skips the resolver, and with it the address check, for
        // an address literal: only a URL whose host is a domain name is ever fetched.
        let parsed = url_domain(url)?;
        let mut response = self
            .http
            .get(parsed)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND || status == reqwest::StatusCode::GONE {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(format!("{url}: HTTP {status}"));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| format!("{url}: {e}"))? {
            body.extend_from_slice(&chunk);
            if body.len() as u64 > self.options.max_response {
                return Err(format!(
                    "{url}: larger than {} bytes",
                    self.options.max_response
                ));
            }
        }
        Ok(Some(body))
    }
}

/// `url` parsed, when its host is a domain name; an error naming it when the URL parser
/// reads the host as an IP address (`0x7f.0.0.1`, `10.0.0.0x1`, full-width digits, `[::1]`)
/// or there is none.
pub fn url_domain(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
    if parsed.domain().is_none() {
        return Err(format!(
            "{url}: the host {:?} is not a domain name",
            parsed.host_str().unwrap_or_default()
        ));
    }
    Ok(parsed)
}

/// The OpenPGP certificates in `data` that name `address` and can encrypt.
fn keep_openpgp(data: &[u8], address: &str, detail: &str) -> Answer {
    let certs = match openpgp::split_keyring(data) {
        Ok(c) => c,
        Err(e) => return Answer::None(format!("not an OpenPGP key {detail}: {e}")),
    };
    let keys: Vec<(Scheme, Vec<u8>)> = certs
        .into_iter()
        .filter_map(|c| {
            let info = openpgp::inspect(&c).ok()?.into_iter().next()?;
            let ok = info.can_encrypt
                && !info.revoked
                && info
                    .addresses
                    .iter()
                    .any(|a| a.eq_ignore_ascii_case(address));
            ok.then(|| openpgp::public_part(&c).ok().map(|p| (Scheme::OpenPgp, p)))
                .flatten()
        })
        .collect();
    if keys.is_empty() {
        Answer::None(format!("no key {detail} names {address} and can encrypt"))
    } else {
        Answer::Found(keys, detail.trim().to_owned())
    }
}

fn usable_certificate(der: &[u8], address: &str) -> bool {
    smime::inspect(der)
        .ok()
        .and_then(|i| i.into_iter().next())
        .is_some_and(|i| {
            i.can_encrypt && i.addresses.iter().any(|a| a.eq_ignore_ascii_case(address))
        })
}

/// One due request, claimed.
#[derive(Debug, Clone)]
struct Request {
    address: String,
    methods: Vec<String>,
    attempts: i32,
}

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Pass {
    pub asked: usize,
    pub found: usize,
    pub none: usize,
    pub retry: usize,
    pub released: i64,
}

/// Claims the due requests (a lease of four method timeouts, so a crashed pass is taken
/// up again), asks their methods concurrently, and settles each.
pub async fn pass(pool: &PgPool, finder: &Finder) -> anyhow::Result<Pass> {
    let s = &finder.options;
    // The longest a pass may take over one request: a DNS lookup (two tries) and two
    // fetches per method, concurrently, and a margin.
    let lease = s.method_timeout.as_secs_f64() * 6.0 + 10.0;
    let rows: Vec<(String, Vec<String>, i32)> = sqlx::query_as(
        "WITH due AS MATERIALIZED (SELECT address FROM pepsi.key_request \
           WHERE status = 'pending' AND next_attempt_at <= now() \
           ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
         UPDATE pepsi.key_request k SET attempts = attempts + 1, \
         next_attempt_at = now() + make_interval(secs => $2) \
         FROM due WHERE k.address = due.address \
         RETURNING k.address, k.methods_asked, k.attempts",
    )
    .bind(s.batch)
    .bind(lease)
    .fetch_all(pool)
    .await?;
    let requests: Vec<Request> = rows
        .into_iter()
        .map(|(address, methods, attempts)| Request {
            address,
            methods,
            attempts,
        })
        .collect();
    let mut done = Pass::default();
    let answered = futures_answers(finder, &requests).await;
    let mut settled = Vec::new();
    for (request, answers) in requests.iter().zip(answered) {
        done.asked += 1;
        if settle(pool, s, request, &answers, &mut done).await? {
            settled.push(request.address.clone());
        }
    }
    // Released only once every request of the pass has settled: a message waiting for two
    // addresses, woken by the first, would otherwise find the second still pending and park
    // again until its recheck.
    if !settled.is_empty() {
        let mut tx = pool.begin().await?;
        for address in &settled {
            let n: i32 = sqlx::query_scalar("SELECT pepsi.keydisc_release($1)")
                .bind(address)
                .fetch_one(&mut *tx)
                .await?;
            done.released += i64::from(n);
        }
        tx.commit().await?;
        pepsi_contract::db::notify_workqueue(pool).await?;
    }
    Ok(done)
}

async fn futures_answers(finder: &Finder, requests: &[Request]) -> Vec<Vec<(Method, Answer)>> {
    let mut tasks = Vec::with_capacity(requests.len());
    for r in requests {
        let methods: Vec<Method> = r.methods.iter().filter_map(|m| Method::parse(m)).collect();
        tasks.push(async move {
            let mut answers = Vec::with_capacity(methods.len());
            let asked = methods.iter().map(|m| finder.ask(*m, &r.address));
            let results = futures_util::future::join_all(asked).await;
            for (m, a) in methods.into_iter().zip(results) {
                answers.push((m, a));
            }
            answers
        });
    }
    futures_util::future::join_all(tasks).await
}

/// Records the answers and settles the request: found (keys stored), none (the negative
/// cache), or another attempt later. Returns whether it settled.
async fn settle(
    pool: &PgPool,
    s: &Options,
    request: &Request,
    answers: &[(Method, Answer)],
    done: &mut Pass,
) -> anyhow::Result<bool> {
    let replied: BTreeMap<&str, Value> = answers
        .iter()
        .map(|(m, a)| (m.as_str(), a.to_json()))
        .collect();
    let replied = serde_json::to_value(&replied)?;
    let found: Vec<(Method, &(Scheme, Vec<u8>))> = answers
        .iter()
        .flat_map(|(m, a)| match a {
            Answer::Found(keys, _) => keys.iter().map(|k| (*m, k)).collect(),
            _ => Vec::new(),
        })
        .collect();
    let failed = answers.iter().any(|(_, a)| matches!(a, Answer::Failed(_)));
    // One key per method and scheme: the one valid longest (a domain in a key rollover
    // publishes two).
    // (method, scheme) → (valid until, fingerprint, key)
    type Best<'k> = BTreeMap<(&'static str, &'static str), (Option<i64>, String, &'k Vec<u8>)>;
    let mut best: Best = BTreeMap::new();
    for (method, (scheme, key)) in &found {
        let info = match scheme {
            Scheme::OpenPgp => openpgp::inspect(key),
            Scheme::Smime => smime::inspect(key),
        };
        let Some(info) = info.ok().and_then(|i| i.into_iter().next()) else {
            continue;
        };
        let lasts = info.expires_at.or(Some(i64::MAX));
        let slot = (method.as_str(), scheme.as_str());
        if best.get(&slot).is_none_or(|(l, _, _)| lasts > *l) {
            best.insert(slot, (lasts, info.fingerprint, key));
        }
    }
    // Every statement is tied to this pass's claim: a request another pass claimed since
    // (this one outlived its lease) or that a stage restarted is left to that one.
    let mut tx = pool.begin().await?;
    let (status, negative): (&str, Option<f64>) = if !best.is_empty() {
        ("found", None)
    } else if failed && request.attempts < s.max_attempts {
        let moved = sqlx::query(
            "UPDATE pepsi.key_request SET methods_replied = $2, \
             next_attempt_at = now() + make_interval(secs => $3) \
             WHERE address = $1 AND status = 'pending' AND attempts = $4",
        )
        .bind(&request.address)
        .bind(&replied)
        .bind(s.retry.as_secs_f64())
        .bind(request.attempts)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        if moved.rows_affected() > 0 {
            done.retry += 1;
            tracing::info!(address = %request.address, attempt = request.attempts, "a method failed; asking again later");
        }
        return Ok(false);
    } else if failed {
        // Methods that kept failing (an outage) are not a fact about the address: the
        // answer is cached only until the next RETRY.
        ("none", Some(s.retry.as_secs_f64()))
    } else {
        ("none", Some(s.negative_ttl.as_secs_f64()))
    };
    let settled = sqlx::query(
        "UPDATE pepsi.key_request SET status = $2, settled_at = now(), methods_replied = $3, \
         negative_until = CASE WHEN $4::float8 IS NULL THEN NULL \
                               ELSE now() + make_interval(secs => $4) END \
         WHERE address = $1 AND status = 'pending' AND attempts = $5",
    )
    .bind(&request.address)
    .bind(status)
    .bind(&replied)
    .bind(negative)
    .bind(request.attempts)
    .execute(&mut *tx)
    .await?;
    if settled.rows_affected() == 0 {
        tx.rollback().await?;
        tracing::info!(address = %request.address, "claimed again elsewhere; this answer is dropped");
        return Ok(false);
    }
    for ((method, scheme), (_, fingerprint, key)) in &best {
        sqlx::query(
            "INSERT INTO pepsi.peer_key (address, scheme, fingerprint, public_key, source, \
             verdict, cache_until) VALUES ($1, $2, $3, $4, $5, 'valid', now() + make_interval(secs => $6)) \
             ON CONFLICT (address, scheme, source) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
             public_key = EXCLUDED.public_key, verdict = 'valid', verdict_at = now(), \
             cache_until = EXCLUDED.cache_until, updated_at = now()",
        )
        .bind(&request.address)
        .bind(scheme)
        .bind(fingerprint)
        .bind(*key)
        .bind(method)
        .bind(s.positive_ttl.as_secs_f64())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    if status == "found" {
        done.found += 1;
        tracing::info!(address = %request.address, keys = best.len(), "key found");
    } else {
        done.none += 1;
        tracing::info!(address = %request.address, "no key found");
    }
    Ok(true)
}

/// Runs `pepsi-keydisc` with the process's arguments.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&constants::CONFIG_SOURCE, &cli.common.log_level);
    run_async(&constants::CONFIG_SOURCE, async move {
        let cfg = cli.common.load_config()?;
        let options = Options::from_config(&cfg)?;
        let interval = options.interval;
        let finder = Finder::new(options)?;
        let pool = pepsi_contract::db::connect(&cfg).await?;
        if cli.once {
            let p = pass(&pool, &finder).await?;
            let mut out = std::io::stdout().lock();
            if cli.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&p)?)?;
            } else {
                writeln!(
                    out,
                    "asked {}, found {}, none {}, retry {}, released {} message(s)",
                    p.asked, p.found, p.none, p.retry, p.released
                )?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        tracing::info!(?interval, "started");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            match pass(&pool, &finder).await {
                Ok(p) if p != Pass::default() => tracing::info!(?p, "pass done"),
                Ok(_) => {}
                Err(e) => tracing::warn!("pass failed: {e:#}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = term.recv() => return Ok(ExitCode::SUCCESS),
                _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_globally_routable_addresses_are_connected_to() {
        for (ip, global) in [
            ("93.184.216.34", true),
            ("2a00:1450:4001::1", true),
            ("127.0.0.1", false),
            ("10.1.2.3", false),
            ("172.16.0.1", false),
            ("192.168.1.1", false),
            ("169.254.169.254", false),
            ("100.64.0.1", false),
            ("0.0.0.0", false),
            ("224.0.0.1", false),
            ("::1", false),
            ("fd00::1", false),
            ("fe80::1", false),
            ("::ffff:127.0.0.1", false),
            ("::ffff:93.184.216.34", true),
            // Security review #8: NAT64 carries the IPv4 address it reaches.
            ("64:ff9b::7f00:1", false),
            ("64:ff9b::a9fe:a9fe", false),
            ("64:ff9b::a00:1", false),
            ("64:ff9b::5db8:d822", true),
            ("64:ff9b:1::5db8:d822", false),
            ("192.0.0.8", false),
            ("192.0.1.1", true),
            ("198.18.0.1", false),
            ("198.19.255.254", false),
            ("198.20.0.1", true),
        ] {
            assert_eq!(is_global(ip.parse().unwrap()), global, "{ip}");
        }
    }

    /// Security review #8: a host the URL parser reads as an IP address is never fetched.
    #[test]
    fn keydisc_ssrf_url_hosts_must_be_domain_names() {
        for (url, ok) in [
            (
                "https://openpgpkey.example.test/.well-known/openpgpkey/x",
                true,
            ),
            (
                "https://example.test:8443/.well-known/openpgpkey/hu/x?l=a",
                true,
            ),
            ("https://0x7f.0.0.1/", false),
            ("https://10.0.0.0x1/", false),
            ("https://0xa9.254.169.254/", false),
            ("https://openpgpkey.0x7f.0.0.1/", false),
            (
                "https://\u{ff11}\u{ff12}\u{ff17}.\u{ff10}.\u{ff10}.\u{ff11}/",
                false,
            ),
            ("https://127.1/", false),
            ("https://[::1]/", false),
            ("https://2130706433/", false),
        ] {
            assert_eq!(url_domain(url).is_ok(), ok, "{url}: {:?}", url_domain(url));
        }
        for domain in [
            "0x7f.0.0.1",
            "\u{ff11}\u{ff12}\u{ff17}.\u{ff10}.\u{ff10}.\u{ff11}",
        ] {
            for url in names::wkd_urls("a", domain, 443) {
                assert!(url_domain(&url).is_err(), "{url}");
            }
        }
    }
}
