//! Reading the key store: our identities (the public columns any role may read, and the
//! sealed private half the crypto role alone may), correspondents' keys and the trusted
//! CAs. Addresses are compared lower-case, as they are stored.

use chrono::{DateTime, Utc};
use pepsi_crypto::Scheme;
use sqlx::{PgPool, Row as _};
use zeroize::Zeroizing;

use crate::{KeymatError, Keyring};

/// The public columns of `crypto_identity`, for every query that any role may run.
const IDENTITY_COLUMNS: &str = "identity_id, address, scheme, capability, fingerprint, \
     public_key, kek_id, status, is_primary, published, created_at, expires_at, revoked_at, \
     private_purged_at";

/// What an identity may be used for (`capability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    Sign,
    Encrypt,
    Both,
}

impl Capability {
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Sign => "sign",
            Capability::Encrypt => "encrypt",
            Capability::Both => "both",
        }
    }

    pub fn parse(s: &str) -> Option<Capability> {
        match s {
            "sign" => Some(Capability::Sign),
            "encrypt" => Some(Capability::Encrypt),
            "both" => Some(Capability::Both),
            _ => None,
        }
    }

    pub fn signs(self) -> bool {
        self != Capability::Encrypt
    }

    pub fn decrypts(self) -> bool {
        self != Capability::Sign
    }
}

/// One row of `crypto_identity`, without its private half.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub id: i64,
    pub address: String,
    pub scheme: Scheme,
    pub capability: Capability,
    pub fingerprint: String,
    pub public_key: Vec<u8>,
    /// The KEK that sealed the private half; None once purged.
    pub kek_id: Option<String>,
    /// `active`, `retired` or `revoked`.
    pub status: String,
    pub is_primary: bool,
    pub published: bool,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub private_purged_at: Option<DateTime<Utc>>,
}

impl Identity {
    fn from_row(row: &sqlx::postgres::PgRow) -> Result<Identity, sqlx::Error> {
        let scheme: String = row.try_get("scheme")?;
        let capability: String = row.try_get("capability")?;
        let decode = |what: &str, v: &str| sqlx::Error::Decode(format!("{what} {v:?}").into());
        Ok(Identity {
            id: row.try_get("identity_id")?,
            address: row.try_get("address")?,
            scheme: Scheme::parse(&scheme).ok_or_else(|| decode("scheme", &scheme))?,
            capability: Capability::parse(&capability)
                .ok_or_else(|| decode("capability", &capability))?,
            fingerprint: row.try_get("fingerprint")?,
            public_key: row.try_get("public_key")?,
            kek_id: row.try_get("kek_id")?,
            status: row.try_get("status")?,
            is_primary: row.try_get("is_primary")?,
            published: row.try_get("published")?,
            created_at: row.try_get("created_at")?,
            expires_at: row.try_get("expires_at")?,
            revoked_at: row.try_get("revoked_at")?,
            private_purged_at: row.try_get("private_purged_at")?,
        })
    }

    /// Active and not past its expiry at `now`.
    pub fn is_usable(&self, now: DateTime<Utc>) -> bool {
        self.status == "active" && self.expires_at.is_none_or(|e| e > now)
    }
}

/// An identity with its private half opened.
pub struct Unsealed {
    pub identity: Identity,
    pub secret: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for Unsealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unsealed")
            .field("identity", &self.identity)
            .field("secret", &"(not shown)")
            .finish()
    }
}

/// The identities of `addresses` (lower-cased here), every status, primary first, newest
/// first. Public columns only: any role that reads the key store may run it.
pub async fn identities(pool: &PgPool, addresses: &[String]) -> Result<Vec<Identity>, KeymatError> {
    let lower: Vec<String> = addresses.iter().map(|a| a.to_lowercase()).collect();
    let sql = format!(
        "SELECT {IDENTITY_COLUMNS} FROM pepsi.crypto_identity WHERE address = ANY($1) \
         ORDER BY address, is_primary DESC, created_at DESC, identity_id DESC"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&lower)
        .fetch_all(pool)
        .await?;
    Ok(rows
        .iter()
        .map(Identity::from_row)
        .collect::<Result<_, _>>()?)
}

/// Every identity, for listings (`pepsi-keys list`).
pub async fn all_identities(pool: &PgPool) -> Result<Vec<Identity>, KeymatError> {
    let sql = format!(
        "SELECT {IDENTITY_COLUMNS} FROM pepsi.crypto_identity \
         ORDER BY address, scheme, is_primary DESC, created_at DESC, identity_id DESC"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(pool)
        .await?;
    Ok(rows
        .iter()
        .map(Identity::from_row)
        .collect::<Result<_, _>>()?)
}

/// The identities of `addresses` that still hold a private half, opened with `keyring`
/// (the crypto role's query: it reads `private_wrapped`). A row that does not open is an
/// error naming it: a message is better retried than handled without the key.
pub async fn unsealed_identities(
    pool: &PgPool,
    keyring: &Keyring,
    addresses: &[String],
) -> Result<Vec<Unsealed>, KeymatError> {
    let lower: Vec<String> = addresses.iter().map(|a| a.to_lowercase()).collect();
    let sql = format!(
        "SELECT {IDENTITY_COLUMNS}, private_wrapped FROM pepsi.crypto_identity \
         WHERE address = ANY($1) AND private_wrapped IS NOT NULL \
         ORDER BY address, is_primary DESC, created_at DESC, identity_id DESC"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(&lower)
        .fetch_all(pool)
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let identity = Identity::from_row(row)?;
        let sealed: Vec<u8> = row.try_get("private_wrapped")?;
        let kek_id = identity.kek_id.clone().unwrap_or_default();
        let secret = keyring.open(&kek_id, identity.scheme, &identity.fingerprint, &sealed)?;
        out.push(Unsealed { identity, secret });
    }
    Ok(out)
}

/// One row of `peer_key`.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerKey {
    pub address: String,
    pub scheme: Scheme,
    pub fingerprint: String,
    pub public_key: Vec<u8>,
    pub source: String,
    pub dnssec_validated: bool,
    pub verdict: String,
    pub cache_until: Option<DateTime<Utc>>,
    pub last_seen: Option<DateTime<Utc>>,
    pub autocrypt_timestamp: Option<DateTime<Utc>>,
    pub prefer_encrypt: Option<String>,
    pub updated_at: DateTime<Utc>,
}

/// The peer keys of `addresses` (lower-cased here), newest first.
pub async fn peer_keys(pool: &PgPool, addresses: &[String]) -> Result<Vec<PeerKey>, KeymatError> {
    let lower: Vec<String> = addresses.iter().map(|a| a.to_lowercase()).collect();
    let rows = sqlx::query(
        "SELECT address, scheme, fingerprint, public_key, source, dnssec_validated, verdict, \
         cache_until, last_seen, autocrypt_timestamp, prefer_encrypt, updated_at \
         FROM pepsi.peer_key WHERE address = ANY($1) ORDER BY address, updated_at DESC",
    )
    .bind(&lower)
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let scheme: String = row.try_get("scheme")?;
        out.push(PeerKey {
            address: row.try_get("address")?,
            scheme: Scheme::parse(&scheme)
                .ok_or_else(|| sqlx::Error::Decode(format!("scheme {scheme:?}").into()))?,
            fingerprint: row.try_get("fingerprint")?,
            public_key: row.try_get("public_key")?,
            source: row.try_get("source")?,
            dnssec_validated: row.try_get("dnssec_validated")?,
            verdict: row.try_get("verdict")?,
            cache_until: row.try_get("cache_until")?,
            last_seen: row.try_get("last_seen")?,
            autocrypt_timestamp: row.try_get("autocrypt_timestamp")?,
            prefer_encrypt: row.try_get("prefer_encrypt")?,
            updated_at: row.try_get("updated_at")?,
        });
    }
    Ok(out)
}

/// The DER certificates of every trusted CA.
pub async fn trusted_cas(pool: &PgPool) -> Result<Vec<Vec<u8>>, KeymatError> {
    Ok(
        sqlx::query_scalar("SELECT certificate FROM pepsi.ca_trust ORDER BY fingerprint")
            .fetch_all(pool)
            .await?,
    )
}
