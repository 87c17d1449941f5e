//! Secure links in PostgreSQL (pepsi-0020.sql): sealed messages, one-time codes, sessions
//! and the access log. Every statement is a prepared one with bound values; nothing here
//! formats input into SQL.
//!
//! A link is `{link_id}/{generation}#{link half}`. The database never holds a link half,
//! a code or a session token: only the db half, and sha256 digests of codes and tokens.
//! Every refusal names why (expired, revoked, purged, superseded by a resend, ...), so the
//! portal can tell the recipient what to do next.

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::{Connection as _, PgConnection, PgPool, Row as _};

use crate::RandomUnavailable;
use crate::code::{self, Attempt, Code};
use crate::seal::{self, LinkHalf, SealError, Sealed};

/// The largest message kept behind a link.
pub const MAX_MESSAGE: usize = 64 * 1024 * 1024;
/// The longest a link may live, from now.
pub const MAX_LIFETIME: TimeDelta = TimeDelta::days(365);
/// Codes one link may be sent per hour (each send is a mail to the recipient).
pub const CODES_PER_HOUR: i64 = 5;
/// How long a session lasts after a correct code (never beyond the link's expiry).
pub const SESSION_LIFETIME: TimeDelta = TimeDelta::minutes(30);
/// The longest address, client key and actor name accepted.
const MAX_ADDRESS: usize = 320;
const MAX_CLIENT_KEY: usize = 100;

/// Why a link, a code or a session was refused. The portal shows a page per reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no such link")]
    Unknown,
    #[error("the link has expired")]
    Expired,
    #[error("the sender revoked the link")]
    Revoked,
    #[error("the message was purged")]
    Purged,
    #[error("a newer link was sent; only the latest one works")]
    Superseded,
    #[error("no code was sent for this link, or it was used")]
    NoCode,
    #[error("the code has expired; ask for a new one")]
    CodeExpired,
    #[error("wrong code; {left} tries left")]
    WrongCode { left: i16 },
    #[error("too many wrong codes; ask for a new one")]
    Locked,
    #[error("{CODES_PER_HOUR} codes were sent for this link in the last hour; try later")]
    TooManyCodes,
    #[error("the session is unknown or has ended; enter a new code")]
    NoSession,
    #[error("the link's key does not open the message")]
    WrongKey,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Permanent for this request: the person has to do something else.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A caller's value out of bounds: permanent.
    #[error("{0}")]
    Invalid(String),
    /// Temporary: try again.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Random(#[from] RandomUnavailable),
}

impl Error {
    /// True when trying again later may succeed.
    pub fn is_temporary(&self) -> bool {
        matches!(self, Error::Db(_) | Error::Random(_))
    }
}

impl From<SealError> for Error {
    fn from(e: SealError) -> Self {
        match e {
            SealError::Random(r) => Error::Random(r),
            SealError::DoesNotOpen | SealError::BadLinkHalf => Error::Refused(Refusal::WrongKey),
        }
    }
}

/// A link just made: what the notice mail carries, and the sender's manage token for the
/// receipt. Neither the link half nor the token exists anywhere else.
#[derive(Debug)]
pub struct Created {
    pub link_id: String,
    pub generation: i32,
    pub link_half: LinkHalf,
    pub expires: DateTime<Utc>,
    /// The sender's token (`url::manage_url`): base64url of 32 random bytes.
    pub manage_token: ManageToken,
}

/// The sender's manage token. Its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct ManageToken(pub String);

impl std::fmt::Debug for ManageToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ManageToken(..)")
    }
}

impl ManageToken {
    /// The token's 32 bytes, when `text` is one.
    fn bytes(&self) -> Option<[u8; seal::HALF_LEN]> {
        crate::b64_exact::<{ seal::HALF_LEN }>(&self.0)
    }
}

/// A resend: the new link's half and generation; the old link no longer opens the message.
#[derive(Debug)]
pub struct Resent {
    pub generation: i32,
    pub link_half: LinkHalf,
}

/// A session's token, handed to the browser (a cookie); the database keeps its digest.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionToken(pub String);

impl std::fmt::Debug for SessionToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionToken(..)")
    }
}

/// One line of a link's access log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Access {
    pub at: DateTime<Utc>,
    pub event: String,
    pub client_key: Option<String>,
    pub detail: Option<String>,
}

fn check_address(what: &str, address: &str) -> Result<(), Error> {
    if address.is_empty() || address.len() > MAX_ADDRESS || !address.contains('@') {
        return Err(Error::Invalid(format!(
            "{what} {address:?} is not an address of at most {MAX_ADDRESS} bytes"
        )));
    }
    Ok(())
}

fn check_client_key(client_key: &str) -> Result<(), Error> {
    if client_key.len() > MAX_CLIENT_KEY {
        return Err(Error::Invalid(format!(
            "client key {client_key:?} is longer than {MAX_CLIENT_KEY} bytes"
        )));
    }
    Ok(())
}

/// The state of a message row, as every action reads it first.
struct Row {
    message_id: i64,
    generation: i32,
    expires_at: DateTime<Utc>,
    revoked: bool,
    purged: bool,
    expired: bool,
}

impl Row {
    /// Refuses a purged, revoked or expired link, in that order (the most final first).
    fn usable(&self) -> Result<(), Refusal> {
        if self.purged {
            Err(Refusal::Purged)
        } else if self.revoked {
            Err(Refusal::Revoked)
        } else if self.expired {
            Err(Refusal::Expired)
        } else {
            Ok(())
        }
    }
}

/// Reads and locks the message row of `link_id`.
async fn lock(tx: &mut PgConnection, link_id: &str) -> Result<Row, Error> {
    let row = sqlx::query(
        "SELECT message_id, generation, expires_at, revoked_at IS NOT NULL AS revoked, \
                purged_at IS NOT NULL AS purged, expires_at <= now() AS expired \
           FROM pepsi.secure_link_message WHERE link_id = $1 FOR UPDATE",
    )
    .bind(link_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(Refusal::Unknown)?;
    Ok(Row {
        message_id: row.get("message_id"),
        generation: row.get("generation"),
        expires_at: row.get("expires_at"),
        revoked: row.get("revoked"),
        purged: row.get("purged"),
        expired: row.get("expired"),
    })
}

async fn log(
    tx: &mut PgConnection,
    message_id: i64,
    event: &str,
    client_key: Option<&str>,
    detail: Option<&str>,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO pepsi.secure_link_access (message_id, event, client_key, detail) \
         VALUES ($1, $2, $3, $4)",
    )
    .bind(message_id)
    .bind(event)
    .bind(client_key)
    .bind(detail)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

async fn read_sealed(tx: &mut PgConnection, message_id: i64) -> Result<Sealed, Error> {
    let row = sqlx::query(
        "SELECT nonce, ciphertext, db_half FROM pepsi.secure_link_message WHERE message_id = $1",
    )
    .bind(message_id)
    .fetch_one(&mut *tx)
    .await?;
    let nonce: Option<Vec<u8>> = row.get("nonce");
    let ciphertext: Option<Vec<u8>> = row.get("ciphertext");
    let db_half: Option<Vec<u8>> = row.get("db_half");
    match (nonce, ciphertext, db_half) {
        (Some(nonce), Some(ciphertext), Some(db_half)) => Ok(Sealed {
            // The table's CHECKs hold the lengths.
            nonce: nonce.try_into().map_err(|_| Refusal::WrongKey)?,
            ciphertext,
            db_half: db_half.try_into().map_err(|_| Refusal::WrongKey)?,
        }),
        _ => Err(Refusal::Purged.into()),
    }
}

async fn store_sealed(
    tx: &mut PgConnection,
    message_id: i64,
    sealed: &Sealed,
    generation: i32,
) -> Result<(), Error> {
    sqlx::query(
        "UPDATE pepsi.secure_link_message SET nonce = $2, ciphertext = $3, db_half = $4, \
                generation = $5 WHERE message_id = $1",
    )
    .bind(message_id)
    .bind(&sealed.nonce[..])
    .bind(&sealed.ciphertext)
    .bind(&sealed.db_half[..])
    .bind(generation)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Keeps `message` (the whole RFC 5322 message) sealed for `recipient` from `sender` for
/// `lifetime`, and returns the link. Nothing of the link half stays behind.
pub async fn create(
    tx: &mut PgConnection,
    sender: &str,
    recipient: &str,
    message: &[u8],
    lifetime: TimeDelta,
) -> Result<Created, Error> {
    check_address("sender", sender)?;
    check_address("recipient", recipient)?;
    if message.len() > MAX_MESSAGE {
        return Err(Error::Invalid(format!(
            "message of {} bytes is larger than {MAX_MESSAGE}",
            message.len()
        )));
    }
    if lifetime <= TimeDelta::zero() || lifetime > MAX_LIFETIME {
        return Err(Error::Invalid(format!(
            "lifetime of {}s is not between 1s and {} days",
            lifetime.num_seconds(),
            MAX_LIFETIME.num_days()
        )));
    }
    let link_id = crate::b64(&crate::random::<16>()?);
    let (sealed, link_half) = seal::seal(&link_id, message)?;
    let manage = crate::random::<{ seal::HALF_LEN }>()?;
    let wrapped = seal::wrap_half(&link_id, &manage, &link_half)?;
    let manage_token = ManageToken(crate::b64(&manage));
    let row = sqlx::query(
        "INSERT INTO pepsi.secure_link_message \
             (link_id, sender, recipient, expires_at, nonce, ciphertext, db_half, size, \
              manage_hash, manage_wrap) \
         VALUES ($1, $2, $3, now() + make_interval(secs => $4), $5, $6, $7, $8, $9, $10) \
         RETURNING message_id, generation, expires_at",
    )
    .bind(&link_id)
    .bind(sender)
    .bind(recipient)
    .bind(lifetime.num_seconds() as f64)
    .bind(&sealed.nonce[..])
    .bind(&sealed.ciphertext)
    .bind(&sealed.db_half[..])
    .bind(message.len() as i64)
    .bind(&code::token_hash(&manage_token.0)[..])
    .bind(&wrapped[..])
    .fetch_one(&mut *tx)
    .await?;
    log(tx, row.get("message_id"), "created", None, None).await?;
    Ok(Created {
        link_id,
        generation: row.get("generation"),
        link_half,
        expires: row.get("expires_at"),
        manage_token,
    })
}

/// A new one-time code for the link `link_id` of `generation`, to be mailed to its
/// recipient in the same transaction. It replaces any earlier code; at most
/// [`CODES_PER_HOUR`] are sent per link and hour.
pub async fn send_code(
    tx: &mut PgConnection,
    link_id: &str,
    generation: i32,
    client_key: &str,
) -> Result<Code, Error> {
    check_client_key(client_key)?;
    let row = lock(tx, link_id).await?;
    row.usable()?;
    if generation != row.generation {
        return Err(Refusal::Superseded.into());
    }
    let recent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pepsi.secure_link_code \
          WHERE message_id = $1 AND created_at > now() - interval '1 hour'",
    )
    .bind(row.message_id)
    .fetch_one(&mut *tx)
    .await?;
    if recent >= CODES_PER_HOUR {
        return Err(Refusal::TooManyCodes.into());
    }
    let code = code::new_code()?;
    sqlx::query(
        "INSERT INTO pepsi.secure_link_code (message_id, generation, code_hash, expires_at, \
                attempts_left) \
         VALUES ($1, $2, $3, now() + make_interval(secs => $4), $5)",
    )
    .bind(row.message_id)
    .bind(row.generation)
    .bind(&code::code_hash(link_id, code.as_str())[..])
    .bind(code::LIFETIME.num_seconds() as f64)
    .bind(code::ATTEMPTS)
    .execute(&mut *tx)
    .await?;
    log(tx, row.message_id, "code_sent", Some(client_key), None).await?;
    Ok(code)
}

/// Checks `typed` against the latest code of the link `link_id` of `generation`; the right
/// code opens a session. Runs in a transaction of its own, committed whatever the outcome:
/// a wrong try must count even when the caller's work fails afterwards.
pub async fn check_code(
    pool: &PgPool,
    link_id: &str,
    generation: i32,
    typed: &str,
    client_key: &str,
) -> Result<SessionToken, Error> {
    check_client_key(client_key)?;
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let outcome = check_code_in(&mut tx, link_id, generation, typed, client_key).await;
    match outcome {
        Err(Error::Db(e)) => Err(Error::Db(e)),
        other => {
            tx.commit().await?;
            other
        }
    }
}

async fn check_code_in(
    tx: &mut PgConnection,
    link_id: &str,
    generation: i32,
    typed: &str,
    client_key: &str,
) -> Result<SessionToken, Error> {
    let row = lock(tx, link_id).await?;
    row.usable()?;
    if generation != row.generation {
        return Err(Refusal::Superseded.into());
    }
    let latest = sqlx::query(
        "SELECT code_id, generation, code_hash, attempts_left, used_at IS NOT NULL AS used, \
                expires_at <= now() AS expired \
           FROM pepsi.secure_link_code WHERE message_id = $1 \
          ORDER BY created_at DESC, code_id DESC LIMIT 1",
    )
    .bind(row.message_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(Refusal::NoCode)?;
    if latest.get::<i32, _>("generation") != row.generation || latest.get::<bool, _>("used") {
        return Err(Refusal::NoCode.into());
    }
    if latest.get::<bool, _>("expired") {
        return Err(Refusal::CodeExpired.into());
    }
    let code_id: i64 = latest.get("code_id");
    let before: i16 = latest.get("attempts_left");
    let stored: Vec<u8> = latest.get("code_hash");
    let decided = code::attempt(before, code::matches(&stored, link_id, typed));
    if decided != Attempt::Accepted && before > 0 {
        sqlx::query("UPDATE pepsi.secure_link_code SET attempts_left = $2 WHERE code_id = $1")
            .bind(code_id)
            .bind(decided.left(before))
            .execute(&mut *tx)
            .await?;
        log(tx, row.message_id, "code_wrong", Some(client_key), None).await?;
        if decided == Attempt::Locked {
            log(tx, row.message_id, "code_locked", Some(client_key), None).await?;
        }
    }
    match decided {
        Attempt::Locked => return Err(Refusal::Locked.into()),
        Attempt::Wrong { left } => return Err(Refusal::WrongCode { left }.into()),
        Attempt::Accepted => {}
    }
    sqlx::query("UPDATE pepsi.secure_link_code SET used_at = now() WHERE code_id = $1")
        .bind(code_id)
        .execute(&mut *tx)
        .await?;
    let token = code::new_token()?;
    let lifetime = SESSION_LIFETIME.min(row.expires_at - Utc::now());
    sqlx::query(
        "INSERT INTO pepsi.secure_link_session (message_id, generation, token_hash, expires_at) \
         VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
    )
    .bind(row.message_id)
    .bind(row.generation)
    .bind(&code::token_hash(&token)[..])
    .bind(lifetime.num_seconds().max(0) as f64)
    .execute(&mut *tx)
    .await?;
    log(tx, row.message_id, "session_opened", Some(client_key), None).await?;
    Ok(SessionToken(token))
}

/// The message behind the link `link_id` with its half `link_half`, for the holder of
/// `session`; logs `opened`.
pub async fn open(
    pool: &PgPool,
    link_id: &str,
    link_half: &LinkHalf,
    session: &SessionToken,
    client_key: &str,
) -> Result<Vec<u8>, Error> {
    check_client_key(client_key)?;
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    // Locked like every other action: a resend or a purge waits for the read, and the read
    // never sees half of one.
    let state = lock(&mut tx, link_id).await?;
    state.usable()?;
    let session_generation: Option<i32> = sqlx::query_scalar(
        "SELECT generation FROM pepsi.secure_link_session \
          WHERE token_hash = $1 AND message_id = $2 AND expires_at > now()",
    )
    .bind(&code::token_hash(&session.0)[..])
    .bind(state.message_id)
    .fetch_optional(&mut *tx)
    .await?;
    match session_generation {
        None => return Err(Refusal::NoSession.into()),
        Some(g) if g != state.generation => return Err(Refusal::Superseded.into()),
        Some(_) => {}
    }
    let sealed = read_sealed(&mut tx, state.message_id).await?;
    let message = seal::open(link_id, &sealed, link_half)?;
    log(&mut tx, state.message_id, "opened", Some(client_key), None).await?;
    tx.commit().await?;
    Ok(message)
}

/// Whether `link_half` opens the message of the usable link `link_id` of `generation`: the
/// portal asks before it mails a code, so that a link id alone cannot make it mail the
/// recipient. Logs nothing.
pub async fn check_link(
    pool: &PgPool,
    link_id: &str,
    generation: i32,
    link_half: &LinkHalf,
) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let row = lock(&mut tx, link_id).await?;
    row.usable()?;
    if generation != row.generation {
        return Err(Refusal::Superseded.into());
    }
    let sealed = read_sealed(&mut tx, row.message_id).await?;
    seal::open(link_id, &sealed, link_half)?;
    tx.commit().await?;
    Ok(())
}

/// Appends `event` (`attachment_downloaded`, `reply_sent`) to the access log of `link_id`.
pub async fn record(
    tx: &mut PgConnection,
    link_id: &str,
    event: &str,
    client_key: &str,
    detail: Option<&str>,
) -> Result<(), Error> {
    check_client_key(client_key)?;
    let message_id: i64 =
        sqlx::query_scalar("SELECT message_id FROM pepsi.secure_link_message WHERE link_id = $1")
            .bind(link_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(Refusal::Unknown)?;
    log(tx, message_id, event, Some(client_key), detail).await
}

/// The digest of `session`, as `pepsi.secure_link_queue_mail` takes it for a reply (the
/// database checks there that the session is open).
pub fn session_hash(session: &SessionToken) -> [u8; 32] {
    code::token_hash(&session.0)
}

/// Revokes the link `link_id` for good; `by` names who did (the sender, an operator).
pub async fn revoke(tx: &mut PgConnection, link_id: &str, by: &str) -> Result<(), Error> {
    if by.is_empty() || by.len() > MAX_ADDRESS {
        return Err(Error::Invalid(format!(
            "revoked by {by:?}: name someone in at most {MAX_ADDRESS} bytes"
        )));
    }
    let row = lock(tx, link_id).await?;
    if row.purged {
        return Err(Refusal::Purged.into());
    }
    if row.revoked {
        return Err(Refusal::Revoked.into());
    }
    sqlx::query(
        "UPDATE pepsi.secure_link_message SET revoked_at = now(), revoked_by = $2 \
          WHERE message_id = $1",
    )
    .bind(row.message_id)
    .bind(by)
    .execute(&mut *tx)
    .await?;
    log(tx, row.message_id, "revoked", None, Some(by)).await
}

/// Moves the expiry of `link_id` to `until` (later or earlier), within [`MAX_LIFETIME`] of
/// now. A revoked or purged link stays so.
pub async fn extend(
    tx: &mut PgConnection,
    link_id: &str,
    until: DateTime<Utc>,
) -> Result<DateTime<Utc>, Error> {
    let now = Utc::now();
    if until <= now || until > now + MAX_LIFETIME {
        return Err(Error::Invalid(format!(
            "expiry {until} is not between now and {} days from now",
            MAX_LIFETIME.num_days()
        )));
    }
    let row = lock(tx, link_id).await?;
    if row.purged {
        return Err(Refusal::Purged.into());
    }
    if row.revoked {
        return Err(Refusal::Revoked.into());
    }
    sqlx::query("UPDATE pepsi.secure_link_message SET expires_at = $2 WHERE message_id = $1")
        .bind(row.message_id)
        .bind(until)
        .execute(&mut *tx)
        .await?;
    log(
        tx,
        row.message_id,
        "extended",
        None,
        Some(&until.to_rfc3339()),
    )
    .await?;
    Ok(until)
}

/// Checks the sender's `token` for `link_id` (in constant time against the stored digest)
/// and returns the wrapped link half, if the link still has one. A wrong token is refused
/// as an unknown link: the page gives nothing away.
async fn check_manage(
    tx: &mut PgConnection,
    link_id: &str,
    token: &ManageToken,
) -> Result<Option<Vec<u8>>, Error> {
    let row = sqlx::query(
        "SELECT manage_hash, manage_wrap FROM pepsi.secure_link_message WHERE link_id = $1",
    )
    .bind(link_id)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(Refusal::Unknown)?;
    let stored: Option<Vec<u8>> = row.get("manage_hash");
    let right = stored.is_some_and(|h| {
        aws_lc_rs::constant_time::verify_slices_are_equal(&h, &code::token_hash(&token.0)).is_ok()
    });
    if !right {
        return Err(Refusal::Unknown.into());
    }
    Ok(row.get("manage_wrap"))
}

/// Whether `token` is the sender's token of `link_id`: `Ok` or [`Refusal::Unknown`].
pub async fn check_sender(pool: &PgPool, link_id: &str, token: &ManageToken) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    check_manage(&mut conn, link_id, token).await.map(|_| ())
}

/// Revokes `link_id` for its sender, who proves it with `token`; `by` names the sender.
pub async fn revoke_by_sender(
    tx: &mut PgConnection,
    link_id: &str,
    token: &ManageToken,
    by: &str,
) -> Result<(), Error> {
    check_manage(tx, link_id, token).await?;
    revoke(tx, link_id, by).await
}

/// A new link for `link_id` for its sender, who proves it with `token`: the link half is
/// unwrapped with the token, the message re-sealed ([`resend`]) and the new half wrapped
/// under the same token, so the sender's page keeps working and only the new link opens
/// the message.
pub async fn resend_by_sender(
    tx: &mut PgConnection,
    link_id: &str,
    token: &ManageToken,
) -> Result<Resent, Error> {
    let wrapped = check_manage(tx, link_id, token)
        .await?
        .ok_or(Refusal::Purged)?;
    let key = token.bytes().ok_or(Refusal::Unknown)?;
    let current = seal::unwrap_half(link_id, &key, &wrapped)?;
    let resent = resend(tx, link_id, &current).await?;
    let rewrapped = seal::wrap_half(link_id, &key, &resent.link_half)?;
    sqlx::query("UPDATE pepsi.secure_link_message SET manage_wrap = $2 WHERE link_id = $1")
        .bind(link_id)
        .bind(&rewrapped[..])
        .execute(&mut *tx)
        .await?;
    Ok(resent)
}

/// A new link for `link_id`: opens the message with the current link's half, seals it
/// again under fresh halves and bumps the generation. The stored db half, nonce and
/// ciphertext are all replaced, so the old link half derives a key that opens nothing, and
/// the old generation's codes and sessions are refused. The current half is needed because
/// nothing else can open the message: neither the database nor the sender's side keeps a
/// key to it.
pub async fn resend(
    tx: &mut PgConnection,
    link_id: &str,
    current: &LinkHalf,
) -> Result<Resent, Error> {
    let row = lock(tx, link_id).await?;
    row.usable()?;
    let message = seal::open(link_id, &read_sealed(tx, row.message_id).await?, current)?;
    let (sealed, link_half) = seal::seal(link_id, &message)?;
    let generation = row.generation + 1;
    store_sealed(tx, row.message_id, &sealed, generation).await?;
    log(
        tx,
        row.message_id,
        "resent",
        None,
        Some(&generation.to_string()),
    )
    .await?;
    Ok(Resent {
        generation,
        link_half,
    })
}

/// Deletes the sealed bytes of every link expired or revoked at `now`; the rows and their
/// access logs stay. Returns how many were purged.
pub async fn purge_expired(tx: &mut PgConnection, now: DateTime<Utc>) -> Result<u64, Error> {
    let purged = sqlx::query(
        "WITH purged AS ( \
             UPDATE pepsi.secure_link_message \
                SET nonce = NULL, ciphertext = NULL, db_half = NULL, manage_wrap = NULL, \
                    purged_at = $1 \
              WHERE purged_at IS NULL AND (expires_at <= $1 OR revoked_at <= $1) \
             RETURNING message_id) \
         INSERT INTO pepsi.secure_link_access (message_id, event) \
         SELECT message_id, 'purged' FROM purged",
    )
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(purged.rows_affected())
}

/// Purges the link `link_id` now, whatever its expiry: deletes its sealed bytes as
/// [`purge_expired`] does, sets `purged_at` and logs `purged`; the row and its access log
/// stay. A link purged already is refused.
pub async fn purge_one(tx: &mut PgConnection, link_id: &str) -> Result<(), Error> {
    let row = lock(tx, link_id).await?;
    if row.purged {
        return Err(Refusal::Purged.into());
    }
    sqlx::query(
        "UPDATE pepsi.secure_link_message \
            SET nonce = NULL, ciphertext = NULL, db_half = NULL, manage_wrap = NULL, \
                purged_at = now() \
          WHERE message_id = $1",
    )
    .bind(row.message_id)
    .execute(&mut *tx)
    .await?;
    log(tx, row.message_id, "purged", None, None).await
}

/// The access log of `link_id`, oldest first.
pub async fn access_log(pool: &PgPool, link_id: &str) -> Result<Vec<Access>, Error> {
    let rows = sqlx::query(
        "SELECT a.at, a.event, a.client_key, a.detail \
           FROM pepsi.secure_link_access a \
           JOIN pepsi.secure_link_message m USING (message_id) \
          WHERE m.link_id = $1 ORDER BY a.at, a.access_id",
    )
    .bind(link_id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(|r| Access {
            at: r.get("at"),
            event: r.get("event"),
            client_key: r.get("client_key"),
            detail: r.get("detail"),
        })
        .collect())
}
