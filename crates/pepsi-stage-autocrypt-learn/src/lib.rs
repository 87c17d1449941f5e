//! pepsi-stage-autocrypt-learn: records what inbound mail tells about its sender's keys.
//! An Autocrypt header (Level 1) updates the sender's `peer_key` row of source `autocrypt`
//! by the peer-state rules of `state` (last seen, the header's key and preference, newer
//! messages only); a message our decrypt stage opened, signed validly by its From address,
//! proves that the sender holds our key (`peer_has_own_key`).
//!
//! Only mail whose From address is authenticated is learnt from (`sender`: DMARC pass, a
//! DKIM signature aligned with From, or the mailbox's own login): anyone can write an
//! Autocrypt header under somebody else's From.
//!
//! Reads: the header block (`Load::Headers`), `state.auth`, `state.origin.auth_user`,
//! `state.crypto.decrypted`, the sender's `peer_key` row. Writes: `pepsi.peer_key`, `pepsi.peer_has_own_key`. Terminal helper:
//! `advance`; the message itself is never changed, and nothing here can stop it: a
//! malformed header is ignored as Level 1 says.

pub mod sender;
pub mod state;

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::message;
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::{Crypto, Decryption};
use pepsi_crypto::{autocrypt, mime, openpgp};
use sqlx::Row as _;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-autocrypt-learn",
        exec: "pepsi-stage-autocrypt-learn",
    };
    pub const PROGRAM: &str = "pepsi-stage-autocrypt-learn";
}

/// The program; no options of its own beyond NEXT_STAGE.
pub struct AutocryptLearn;

impl Stage for AutocryptLearn {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Headers;
    const BATCH: bool = false;
    type Section = ();

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(AutocryptLearn)
    }

    fn section(&self, _cfg: &Config, _name: &StageName) -> anyhow::Result<()> {
        Ok(())
    }

    async fn process(&self, _: &(), ctx: &mut StageContext<'_>) -> Result<Terminal, StageError> {
        let headers = ctx.headers()?.to_vec();
        let from = message::from_addresses(&headers);
        // One author only (Level 1 §2.3), and no delivery reports.
        let report = mime::content_type(&headers).is_some_and(|c| c.mime == "multipart/report");
        let [from] = from.as_slice() else {
            return ctx.advance();
        };
        if report {
            return ctx.advance();
        }
        let from = from.to_lowercase();
        let now = Utc::now();
        let date = message::field_values(&headers, "Date")
            .into_iter()
            .next()
            // The weekday is left out: a wrong one (common enough) does not make a date
            // unreadable.
            .and_then(|d| {
                let d = d
                    .split_once(',')
                    .map_or(d.as_str(), |(_, rest)| rest)
                    .trim()
                    .to_owned();
                DateTime::parse_from_rfc2822(&d).ok()
            })
            .map(|d| d.with_timezone(&Utc));
        let date = state::effective_date(date, now);
        let seen = autocrypt::from_message(&headers, &from).map(|h| state::Seen {
            keydata: h.keydata,
            prefer_mutual: h.prefer_encrypt == autocrypt::PreferEncrypt::Mutual,
        });
        // Anyone can put a key into mail with somebody else's From: only a From that DMARC,
        // an aligned DKIM signature or the sender's login vouches for changes the peer state.
        match sender::authenticated(ctx.state(), &from) {
            Some(how) => {
                tracing::debug!(id = ctx.id(), from, ?how, "From authenticated");
                learn(ctx, &from, date, seen.as_ref()).await?;
            }
            None if seen.is_some() => tracing::info!(
                id = ctx.id(),
                from,
                "Autocrypt header ignored: the From address is not authenticated \
                 (no DMARC pass, aligned DKIM signature or login)"
            ),
            None => {}
        }
        prove_own_key(ctx, &from).await?;
        ctx.advance()
    }
}

/// Applies the peer-state rules to the stored row in one transaction (the row locked, so
/// two messages from one sender cannot interleave).
async fn learn(
    ctx: &StageContext<'_>,
    from: &str,
    date: DateTime<Utc>,
    seen: Option<&state::Seen>,
) -> Result<(), StageError> {
    let mut tx = ctx.pool().begin().await?;
    let row = sqlx::query(
        "SELECT last_seen, autocrypt_timestamp, public_key, prefer_encrypt \
         FROM pepsi.peer_key WHERE address = $1 AND scheme = 'openpgp' AND source = 'autocrypt' \
         FOR UPDATE",
    )
    .bind(from)
    .fetch_optional(&mut *tx)
    .await?;
    let peer = match &row {
        Some(r) => Some(state::Peer {
            last_seen: r
                .try_get::<Option<DateTime<Utc>>, _>("last_seen")?
                .unwrap_or(date),
            autocrypt_timestamp: r
                .try_get::<Option<DateTime<Utc>>, _>("autocrypt_timestamp")?
                .unwrap_or(date),
            keydata: r.try_get("public_key")?,
            prefer_mutual: r.try_get::<Option<String>, _>("prefer_encrypt")?.as_deref()
                == Some("mutual"),
        }),
        None => None,
    };
    let Some(new) = state::update(peer.as_ref(), date, seen) else {
        return Ok(());
    };
    if peer.as_ref() == Some(&new) {
        return Ok(());
    }
    let info = match openpgp::inspect(&new.keydata) {
        Ok(mut infos) if !infos.is_empty() => infos.remove(0),
        _ => {
            tracing::info!(
                id = ctx.id(),
                from,
                "Autocrypt key does not parse; not stored"
            );
            return Ok(());
        }
    };
    let verdict = if info.revoked {
        "revoked"
    } else if info.can_encrypt {
        "valid"
    } else {
        "unusable"
    };
    sqlx::query(
        "INSERT INTO pepsi.peer_key (address, scheme, fingerprint, public_key, source, verdict, \
         last_seen, autocrypt_timestamp, prefer_encrypt) \
         VALUES ($1, 'openpgp', $2, $3, 'autocrypt', $4, $5, $6, $7) \
         ON CONFLICT (address, scheme, source) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
         public_key = EXCLUDED.public_key, verdict = EXCLUDED.verdict, verdict_at = now(), \
         last_seen = EXCLUDED.last_seen, autocrypt_timestamp = EXCLUDED.autocrypt_timestamp, \
         prefer_encrypt = EXCLUDED.prefer_encrypt, updated_at = now()",
    )
    .bind(from)
    .bind(&info.fingerprint)
    .bind(&new.keydata)
    .bind(verdict)
    .bind(new.last_seen)
    .bind(new.autocrypt_timestamp)
    .bind(if new.prefer_mutual {
        "mutual"
    } else {
        "nopreference"
    })
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::info!(id = ctx.id(), from, fingerprint = %info.fingerprint, "Autocrypt peer state updated");
    Ok(())
}

/// A message our decrypt stage opened with one of our keys and whose signature is good
/// and names its From address: that sender holds our key.
async fn prove_own_key(ctx: &StageContext<'_>, from: &str) -> Result<(), StageError> {
    // Another stage's key: one that does not parse proves nothing.
    let crypto = Crypto::from_state(ctx.state()).ok().flatten();
    let Some(Decryption::Decrypted { key, signature, .. }) = crypto.and_then(|c| c.decrypted)
    else {
        return Ok(());
    };
    if signature != "good" || key.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO pepsi.peer_has_own_key (address, fingerprint) VALUES ($1, $2) \
         ON CONFLICT (address, fingerprint) DO UPDATE SET proven_at = now()",
    )
    .bind(from)
    .bind(key)
    .execute(ctx.pool())
    .await?;
    Ok(())
}

const ABOUT: &str = "Record what inbound mail tells about its sender's keys: a valid Autocrypt \
header (Level 1) in a message whose From is authenticated (DMARC pass, a DKIM signature aligned \
with From, or the sender's own login) updates the sender's Autocrypt peer state in \
pepsi.peer_key (the key, prefer-encrypt, last seen; older messages change nothing), and a message the decrypt stage \
opened with one of our keys, validly signed by its From address, is recorded in \
pepsi.peer_has_own_key. Never changes or stops the message. Options of [stage-NAME]: \
NEXT_STAGE. Place it after pepsi-stage-decrypt. See docs/crypto.md.";

/// The command line of `pepsi-stage-autocrypt-learn`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-autocrypt-learn` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<AutocryptLearn>(&constants::CONFIG_SOURCE, ABOUT, "")
}
