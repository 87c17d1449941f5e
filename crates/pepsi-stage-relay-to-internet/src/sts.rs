//! Which MTA-STS policy (RFC 8461) applies to mail for a recipient domain: the domain's
//! `_mta-sts` TXT record, the policy fetched over HTTPS from `mta-sts.<domain>`, and the
//! policy cached in `pepsi.mta_sts_policy` until its `max_age` runs out.
//!
//! - A TXT record whose id is the cached policy's, with the policy younger than
//!   `MTA_STS_REFRESH`: the cached policy, without a fetch.
//! - A TXT record with another id, or a policy due for refresh: fetched and stored; when
//!   the fetch fails, the cached policy still applies while it lasts (§5.1), else none.
//! - No TXT record (or a broken one, or a DNS failure): the cached policy while it lasts,
//!   else none. An attacker who blocks the record or the policy host therefore cannot
//!   switch a policy off before its `max_age` is over.
//!
//! The fetch trusts only a certificate valid for `mta-sts.<domain>`, follows no redirect,
//! takes only `200` with `text/plain`, reads at most [`sts::MAX_POLICY_BYTES`], and is over
//! within `MTA_STS_TIMEOUT`. The policy host is resolved by the stage's resolver and, like
//! an MX host, refused on an internal address unless `ALLOW_INTERNAL_ADDRESSES`.
//!
//! The cache is advisory for the database's sake: an error reading or writing it is logged
//! and the policy from the network applies.

use std::sync::Arc;
use std::time::Duration;

use pepsi_outbound::dns::{Dns, HttpResolver};
use pepsi_smtp::sts::{self, Mode, Policy, Record};
use sqlx::{PgPool, Row as _};

use crate::options::{Options, Sts};

const CACHED: &str = "SELECT policy_id, body, extract(epoch FROM now() - fetched_at)::float8 \
                      AS age FROM pepsi.mta_sts_cached($1)";
const STORE: &str = "SELECT pepsi.mta_sts_store($1, $2, $3, $4, $5, $6)";
const REFRESH_FAILED: &str = "SELECT pepsi.mta_sts_refresh_failed($1, $2)";
const GC: &str = "SELECT pepsi.mta_sts_gc()";

/// The policy that applies to one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// None: the domain publishes none, or withdrew it (mode `none`).
    NoPolicy,
    /// The domain announces a policy (a TXT record) that could not be had, and none is
    /// cached: delivery goes on as without one, and TLS reports say why (`result_type`).
    Unavailable {
        result_type: &'static str,
        detail: String,
    },
    /// An `enforce` or `testing` policy.
    Policy(Policy),
}

impl Applied {
    fn of(policy: Policy) -> Applied {
        match policy.mode {
            Mode::None => Applied::NoPolicy,
            _ => Applied::Policy(policy),
        }
    }
}

/// A failed fetch, in TLS reporting's classes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchError {
    pub result_type: &'static str,
    pub detail: String,
}

/// The policy reader of one stage section: its HTTPS client and settings.
pub struct Fetcher {
    http: reqwest::Client,
    options: Sts,
    /// Domains whose last fetch failed, when, and how: within `MTA_STS_FETCH_BACKOFF` the
    /// failure stands without asking again, so a policy host that is down or slow costs
    /// one fetch per worker and period, not one per message.
    failed: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, FetchError)>>,
}

/// The most domains [`Fetcher`] remembers a failed fetch of; past it the memory starts over.
const MAX_FAILED: usize = 10_000;

impl Fetcher {
    /// Sets up the HTTPS client: the section's resolver, no redirects, HTTPS only, the
    /// roots of `MTA_STS_CA_FILE` (else the bundled web PKI roots).
    pub fn new(options: &Options) -> anyhow::Result<Fetcher> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dns = Arc::new(Dns::new(&options.dns_servers, options.dns_timeout)?);
        let sts = options.sts.clone();
        let mut builder = reqwest::Client::builder()
            .timeout(sts.timeout)
            .connect_timeout(sts.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .https_only(true)
            .dns_resolver(Arc::new(HttpResolver {
                dns,
                allowed: if options.allow_internal {
                    |_| true
                } else {
                    pepsi_outbound::dns::is_public
                },
                option: "ALLOW_INTERNAL_ADDRESSES",
            }))
            .user_agent(concat!(
                "pepsi-stage-relay-to-internet/",
                env!("CARGO_PKG_VERSION")
            ));
        if let Some(path) = &sts.ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("MTA_STS_CA_FILE {}: {e}", path.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| anyhow::anyhow!("MTA_STS_CA_FILE {}: {e}", path.display()))?;
            if certs.is_empty() {
                anyhow::bail!(
                    "MTA_STS_CA_FILE {} holds no PEM certificate",
                    path.display()
                );
            }
            builder = builder.tls_built_in_root_certs(false);
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder
            .build()
            .map_err(|e| anyhow::anyhow!("cannot set up the MTA-STS HTTPS client: {e}"))?;
        Ok(Fetcher {
            http,
            options: sts,
            failed: Default::default(),
        })
    }

    /// The policy that applies to mail for `domain` now.
    pub async fn policy(&self, dns: &Dns, pool: &PgPool, domain: &str) -> Applied {
        let cached = cached(pool, domain).await;
        let cached_policy = cached
            .as_ref()
            .and_then(|c| Policy::parse(c.body.as_bytes()).ok());
        let record = match dns.txt(&format!("_mta-sts.{domain}")).await {
            Ok(answers) => Record::select(&answers).unwrap_or_else(|e| {
                tracing::info!(domain, "MTA-STS record ignored: {e}");
                None
            }),
            Err(e) => {
                tracing::info!(domain, "MTA-STS record lookup failed: {e}");
                None
            }
        };
        let Some(record) = record else {
            return cached_policy.map_or(Applied::NoPolicy, Applied::of);
        };
        if let (Some(c), Some(p)) = (&cached, &cached_policy)
            && c.id == record.id
            && c.age < self.options.refresh
        {
            return Applied::of(p.clone());
        }
        match self.fetch_unless_failed_lately(domain).await {
            Ok((policy, body)) => {
                store(pool, domain, &record.id, &policy, &body).await;
                tracing::info!(
                    domain,
                    id = record.id,
                    mode = %policy.mode,
                    "MTA-STS policy fetched"
                );
                Applied::of(policy)
            }
            Err(e) => {
                tracing::info!(domain, "MTA-STS policy not fetched: {}", e.detail);
                match cached_policy {
                    Some(p) => {
                        refresh_failed(pool, domain, &e.detail).await;
                        Applied::of(p)
                    }
                    None => Applied::Unavailable {
                        result_type: e.result_type,
                        detail: e.detail,
                    },
                }
            }
        }
    }

    /// [`Fetcher::fetch`], unless a fetch for `domain` failed within
    /// `MTA_STS_FETCH_BACKOFF`: then that failure again.
    async fn fetch_unless_failed_lately(
        &self,
        domain: &str,
    ) -> Result<(Policy, String), FetchError> {
        let backoff = self.options.fetch_backoff;
        if let Some((at, e)) = self.failed.lock().expect("sts memory").get(domain)
            && at.elapsed() < backoff
        {
            return Err(e.clone());
        }
        let result = self.fetch(domain).await;
        let mut failed = self.failed.lock().expect("sts memory");
        match &result {
            Ok(_) => {
                failed.remove(domain);
            }
            Err(e) if !backoff.is_zero() => {
                if failed.len() >= MAX_FAILED {
                    failed.clear();
                }
                failed.insert(domain.to_owned(), (std::time::Instant::now(), e.clone()));
            }
            Err(_) => {}
        }
        result
    }

    /// Fetches and parses the policy of `domain`, with its body as served.
    pub async fn fetch(&self, domain: &str) -> Result<(Policy, String), FetchError> {
        let url = sts::policy_url(domain, self.options.port);
        let fetch_error = |detail: String| FetchError {
            result_type: "sts-policy-fetch-error",
            detail,
        };
        let mut response = self.http.get(&url).send().await.map_err(|e| {
            let detail = format!("{url}: {}", chain(&e));
            if is_certificate_error(&e) {
                FetchError {
                    result_type: "sts-webpki-invalid",
                    detail,
                }
            } else {
                fetch_error(detail)
            }
        })?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(fetch_error(format!(
                "{url} answered {} (a policy needs 200)",
                response.status()
            )));
        }
        let media_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let essence = media_type.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("text/plain") {
            return Err(FetchError {
                result_type: "sts-policy-invalid",
                detail: format!("{url} is {media_type:?}, not text/plain"),
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| fetch_error(format!("{url}: {}", chain(&e))))?
        {
            if body.len() + chunk.len() > sts::MAX_POLICY_BYTES {
                return Err(FetchError {
                    result_type: "sts-policy-invalid",
                    detail: format!(
                        "{url} is longer than the {} bytes a policy may have",
                        sts::MAX_POLICY_BYTES
                    ),
                });
            }
            body.extend_from_slice(&chunk);
        }
        let policy = Policy::parse(&body).map_err(|e| FetchError {
            result_type: "sts-policy-invalid",
            detail: format!("{url}: {e}"),
        })?;
        Ok((policy, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// An error and its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// Whether the policy host's certificate was what failed a fetch.
fn is_certificate_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        let rustls = s.downcast_ref::<rustls::Error>().or_else(|| {
            s.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::InvalidCertificate(_)) = rustls {
            return true;
        }
        source = s.source();
    }
    false
}

struct Cached {
    id: String,
    body: String,
    age: Duration,
}

async fn cached(pool: &PgPool, domain: &str) -> Option<Cached> {
    let row = sqlx::query(CACHED)
        .bind(domain)
        .fetch_optional(pool)
        .await
        .inspect_err(|e| tracing::warn!(domain, "cannot read pepsi.mta_sts_policy: {e}"))
        .ok()??;
    let age: f64 = row.try_get("age").ok()?;
    Some(Cached {
        id: row.try_get("policy_id").ok()?,
        body: row.try_get("body").ok()?,
        age: Duration::from_secs_f64(age.max(0.0)),
    })
}

async fn store(pool: &PgPool, domain: &str, id: &str, policy: &Policy, body: &str) {
    let result = sqlx::query(STORE)
        .bind(domain)
        .bind(id)
        .bind(policy.mode.as_str())
        .bind(&policy.mx)
        .bind(policy.max_age as i32)
        .bind(body)
        .execute(pool)
        .await;
    if let Err(e) = result {
        tracing::warn!(
            domain,
            "cannot store the MTA-STS policy in pepsi.mta_sts_policy: {e}"
        );
    }
}

async fn refresh_failed(pool: &PgPool, domain: &str, why: &str) {
    if let Err(e) = sqlx::query(REFRESH_FAILED)
        .bind(domain)
        .bind(why)
        .execute(pool)
        .await
    {
        tracing::warn!(domain, "cannot write pepsi.mta_sts_policy: {e}");
    }
}

/// Forgets policies expired a week ago.
pub async fn gc(pool: &PgPool) {
    if let Err(e) = sqlx::query(GC).execute(pool).await {
        tracing::warn!("cannot sweep pepsi.mta_sts_policy: {e}");
    }
}
