//! The `pepsi.dns_address` cache: the addresses of the MX hosts this stage resolved, with
//! their connect health, through the stored functions of `procedures.sql` (one statement
//! each). The order addresses are tried in is decided there, in one place.
//!
//! The cache is advisory: a database error here is logged and delivery goes on with what
//! the DNS says, so a cache problem never holds mail.

use std::net::IpAddr;

use sqlx::{PgPool, Row as _};

const CANDIDATES: &str = "SELECT address, health FROM pepsi.dns_address_candidates($1, $2)";
const STORE: &str = "SELECT address, health FROM pepsi.dns_address_store($1, $2, $3, $4)";
const REPORT: &str = "SELECT pepsi.dns_address_report($1, $2, $3)";
const GC: &str = "SELECT pepsi.dns_address_gc()";

/// What the cache knows about an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// The last connect succeeded.
    Working,
    /// Never connected to.
    Untried,
    /// The last connect failed.
    Failed,
}

/// An address to try, with its health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub address: IpAddr,
    pub health: Health,
}

fn candidates(rows: Vec<sqlx::postgres::PgRow>) -> Result<Vec<Candidate>, sqlx::Error> {
    rows.into_iter()
        .map(|r| {
            let address: String = r.try_get("address")?;
            let health: String = r.try_get("health")?;
            let address = address
                .parse::<IpAddr>()
                .map_err(|e| sqlx::Error::Decode(format!("address {address:?}: {e}").into()))?;
            let health = match health.as_str() {
                "working" => Health::Working,
                "untried" => Health::Untried,
                _ => Health::Failed,
            };
            Ok(Candidate { address, health })
        })
        .collect()
}

/// The unexpired addresses of `host`, in the order to try them.
pub async fn cached(pool: &PgPool, host: &str, ipv6: bool) -> Result<Vec<Candidate>, sqlx::Error> {
    candidates(
        sqlx::query(CANDIDATES)
            .bind(host)
            .bind(ipv6)
            .fetch_all(pool)
            .await?,
    )
}

/// Records a fresh resolution of `host` and returns its addresses in the order to try them.
pub async fn store(
    pool: &PgPool,
    host: &str,
    addresses: &[IpAddr],
    ttl: u32,
    ipv6: bool,
) -> Result<Vec<Candidate>, sqlx::Error> {
    let text: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
    candidates(
        sqlx::query(STORE)
            .bind(host)
            .bind(&text)
            .bind(ttl.min(i32::MAX as u32) as i32)
            .bind(ipv6)
            .fetch_all(pool)
            .await?,
    )
}

/// Records whether a connect to `address` of `host` succeeded.
pub async fn report(pool: &PgPool, host: &str, address: IpAddr, ok: bool) {
    let result = sqlx::query(REPORT)
        .bind(host)
        .bind(address.to_string())
        .bind(ok)
        .execute(pool)
        .await;
    if let Err(e) = result {
        tracing::warn!(host, %address, "cannot record the connect result in pepsi.dns_address: {e}");
    }
}

/// Forgets addresses expired more than a day ago.
pub async fn gc(pool: &PgPool) {
    match sqlx::query_scalar::<_, i32>(GC).fetch_one(pool).await {
        Ok(n) if n > 0 => tracing::debug!(forgotten = n, "pepsi.dns_address swept"),
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot sweep pepsi.dns_address: {e}"),
    }
}
