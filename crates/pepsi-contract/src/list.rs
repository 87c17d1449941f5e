//! Mailing-list addresses (docs/lists.md): how an address names a list and what it asks of
//! it, and the one query that tells whether such a list exists.
//!
//! A list `team@example.org` answers at:
//!
//! | address | what it is |
//! | --- | --- |
//! | `team@example.org` | a post to the list |
//! | `team-join@`, `team-subscribe@` | a subscription request (confirmed by mail) |
//! | `team-leave@`, `team-unsubscribe@` | an unsubscription request |
//! | `team-request@` | commands in the subject or body (`join`, `leave`, `help`) |
//! | `team-owner@` | the list's owners |
//! | `team-bounces@`, `team+bounces-<member>@` | bounces (VERP: `<member>` is the member's address with `@` as `=`) |
//! | `team-confirm+<token>@` | the reply to a confirmation request |
//!
//! [`ListAddress::parse`] reads that grammar (pure, tested as a table); which list exists is
//! [`existing`]'s one query. A list's own address never ends in one of the suffixes (the
//! schema's CHECK on `mailing_list.address`), so the reading is never ambiguous.

use pepsi_conf::address::{self, Address};
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool, Row as _};

/// What an address of a list asks of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// A post to the list.
    Post,
    Join,
    Leave,
    /// Commands in the subject or the body.
    Request,
    /// The list's owners.
    Owner,
    /// A bounce; with VERP, the member address it was sent to.
    Bounces(Option<String>),
    /// The reply to a confirmation request, with its token.
    Confirm(String),
}

/// An address read as a list's: the list's own address (`local@domain`, lower-case) and
/// what the address asks of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListAddress {
    pub list: String,
    pub command: Command,
}

/// The longest token `-confirm+<token>` may carry: a hex SHA-256 is 64.
pub const MAX_TOKEN_LEN: usize = 128;

/// The length of the tokens the list stage mails in its confirmations (120 random bits in
/// base32).
pub const CONFIRM_TOKEN_LEN: usize = 24;

/// The longest list name (the local part of its address): `<name>-confirm+<token>` must fit
/// the 64 octets RFC 5321 allows a local part, or a reply to a confirmation is refused.
pub const MAX_NAME_LEN: usize = 64 - "-confirm+".len() - CONFIRM_TOKEN_LEN;

/// The endings of a list's fixed command addresses and what each asks. A list's name never
/// ends in one of them nor in [`CONFIRM_SUFFIX`] (pepsi-list's check and the schema's CHECK
/// on `mailing_list.address`, which a test holds to this table).
pub const SUFFIXES: &[(&str, Command)] = &[
    ("-join", Command::Join),
    ("-subscribe", Command::Join),
    ("-leave", Command::Leave),
    ("-unsubscribe", Command::Leave),
    ("-request", Command::Request),
    ("-owner", Command::Owner),
    ("-bounces", Command::Bounces(None)),
];

/// The ending of a confirmation's address, before its `+<token>`.
pub const CONFIRM_SUFFIX: &str = "-confirm";

/// Every ending a list's name may not have: the fixed command addresses' and `-confirm`.
pub fn reserved_suffixes() -> impl Iterator<Item = &'static str> {
    SUFFIXES
        .iter()
        .map(|(s, _)| *s)
        .chain(std::iter::once(CONFIRM_SUFFIX))
}

impl ListAddress {
    /// The readings of `address` (case ignored) as a list address, most specific first: a
    /// command address gives its command reading, then the reading as a post to a list
    /// named by the whole local part (which exists only if no list has that name with a
    /// suffix, since list names cannot end in one). Text that is not an address gives none.
    pub fn candidates(address: &str) -> Vec<ListAddress> {
        let Ok(parsed) = Address::parse(address) else {
            return Vec::new();
        };
        let local = parsed.local().to_lowercase();
        let domain = parsed.domain();
        let at = |list: &str| format!("{list}@{domain}");
        let mut out = Vec::new();
        // A list's name holds no `+`, so the part before `-confirm+` or `+bounces-` must
        // hold none either: a member whose own local part holds `-confirm+` (VERP keeps
        // it) is read as the bounce it is.
        let name = |list: &str| !list.is_empty() && !list.contains('+');
        if let Some((list, token)) = local.split_once(&format!("{CONFIRM_SUFFIX}+"))
            && name(list)
        {
            if valid_token(token) {
                out.push(ListAddress {
                    list: at(list),
                    command: Command::Confirm(token.to_owned()),
                });
            }
        } else if let Some((list, member)) = local.split_once("+bounces-")
            && name(list)
        {
            if let Some(member) = verp_decode(member) {
                out.push(ListAddress {
                    list: at(list),
                    command: Command::Bounces(Some(member)),
                });
            }
        } else if !local.contains('+') {
            for (suffix, command) in SUFFIXES {
                if let Some(list) = local.strip_suffix(suffix)
                    && !list.is_empty()
                {
                    out.push(ListAddress {
                        list: at(list),
                        command: command.clone(),
                    });
                }
            }
        }
        if !local.contains('+') {
            out.push(ListAddress {
                list: at(&local),
                command: Command::Post,
            });
        }
        out
    }
}

fn valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= MAX_TOKEN_LEN
        && token.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// The VERP return path of a list's delivery to `member`: `list+bounces-<local>=<domain>@`
/// the list's domain (the member's local part lower-cased, its `@` as `=`).
pub fn verp_address(list: &str, member: &str) -> String {
    let (list_local, list_domain) = address::parts(list).unwrap_or((list, ""));
    let encoded = match address::parts(member) {
        Some((local, domain)) => format!("{}={}", local.to_lowercase(), domain.to_lowercase()),
        None => member.to_lowercase(),
    };
    format!("{list_local}+bounces-{encoded}@{list_domain}")
}

/// The member address a VERP local part's tail (after `+bounces-`) names: its last `=`
/// becomes the `@`. `None` when that does not give an address.
pub fn verp_decode(tail: &str) -> Option<String> {
    let (local, domain) = tail.rsplit_once('=')?;
    if local.is_empty() || domain.is_empty() || domain.contains('@') || local.contains('@') {
        return None;
    }
    Address::parse(&format!("{local}@{domain}"))
        .ok()
        .map(|a| a.key())
}

/// The stored form of a token (confirmations, member links, one-click unsubscribes): its
/// SHA-256. The token itself travels only in the mail or the link.
pub fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// A fresh token: 15 random bytes (120 bits) as [`CONFIRM_TOKEN_LEN`] characters of
/// lower-case base32 (RFC 4648's alphabet). Short, because it travels in a local part that
/// must stay within 64 octets (RFC 5321 §4.5.3.1.1): `team-confirm+<token>` leaves 31 for
/// the list's name. Fails only when the system has no random bytes to give.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 15];
    getrandom::fill(&mut bytes)?;
    Ok(base32(&bytes))
}

/// Lower-case base32 without padding (RFC 4648 §6), for whole groups of 5 bytes.
pub fn base32(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::with_capacity(bytes.len() * 8 / 5);
    for group in bytes.chunks(5) {
        let mut v: u64 = 0;
        for (i, b) in group.iter().enumerate() {
            v |= u64::from(*b) << (32 - 8 * i);
        }
        for i in 0..(group.len() * 8).div_ceil(5) {
            out.push(ALPHABET[((v >> (35 - 5 * i)) & 31) as usize] as char);
        }
    }
    out
}

/// What a confirmation limit counts (`list_confirm_rate.key_kind`): the address a
/// confirmation goes to (`confirm_limit_per_address`), or the client that asked for it, an
/// IP address or `token:<id>` (`confirm_limit_per_client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateKey {
    Address,
    Client,
}

impl RateKey {
    pub fn as_str(self) -> &'static str {
        match self {
            RateKey::Address => "address",
            RateKey::Client => "client",
        }
    }
}

/// The key a client's address counts under (`RateKey::Client`, and pepsi-httpd's other
/// limits): IPv4 as it is (an IPv4-mapped IPv6 address as its IPv4), IPv6 by its /64 (one
/// host usually holds a whole /64). The list stage and pepsi-httpd write the same form, so
/// one host asking by mail and on the web counts once.
pub fn client_key(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
    }
}

/// Counts one confirmation for `key` on list `list_id` and tells whether it is within the
/// list's limit for that kind of key in the current `confirm_window`. The window starts at
/// a multiple of its length, so every writer (the list stage, pepsi-httpd) counts the same
/// windows; the count is kept past the limit, so a flood stays refused until the window
/// ends. Call it in the transaction that sends the confirmation.
pub async fn count_confirmation(
    conn: &mut PgConnection,
    list_id: i64,
    kind: RateKey,
    key: &str,
) -> sqlx::Result<bool> {
    count_confirmation_within(conn, list_id, kind, key, None).await
}

/// [`count_confirmation`] against `limit` instead of the list's own limit when one is given
/// (the list stage's `CONFIRMATIONS_PER_CLIENT`); counted in the same row and window.
pub async fn count_confirmation_within(
    conn: &mut PgConnection,
    list_id: i64,
    kind: RateKey,
    key: &str,
    limit: Option<i32>,
) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "WITH l AS (SELECT CASE WHEN $2 = 'address' THEN confirm_limit_per_address \
                                ELSE confirm_limit_per_client END AS lim, \
                           extract(epoch FROM confirm_window) AS w \
                      FROM pepsi.mailing_list WHERE list_id = $1), \
              up AS (INSERT INTO pepsi.list_confirm_rate (list_id, key_kind, key, window_start, count) \
                     SELECT $1, $2, $3, \
                            to_timestamp(floor(extract(epoch FROM now()) / l.w) * l.w), 1 FROM l \
                     ON CONFLICT (list_id, key_kind, key, window_start) \
                     DO UPDATE SET count = pepsi.list_confirm_rate.count + 1 \
                     RETURNING count) \
         SELECT coalesce((SELECT count FROM up) <= coalesce($4, (SELECT lim FROM l)), false)",
    )
    .bind(list_id)
    .bind(kind.as_str())
    .bind(key)
    .bind(limit)
    .fetch_one(conn)
    .await
}

/// What happens to a post a list's content filter leaves with nothing
/// (`list_content_filter.empty_action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EmptyAction {
    Hold,
    Reject,
    Discard,
}

impl EmptyAction {
    /// The stored word (the schema's CHECK allows exactly these).
    pub fn parse(word: &str) -> Option<EmptyAction> {
        Some(match word {
            "hold" => EmptyAction::Hold,
            "reject" => EmptyAction::Reject,
            "discard" => EmptyAction::Discard,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EmptyAction::Hold => "hold",
            EmptyAction::Reject => "reject",
            EmptyAction::Discard => "discard",
        }
    }
}

/// A list's content filter (`pepsi.list_content_filter`): types lower-case (`image/png`, or
/// `image` for every `image/*`), extensions lower-case without their dot. pepsi-list writes
/// it, the list stage applies it (`pepsi_stage_list::content`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ContentFilter {
    pub filter_types: Vec<String>,
    pub pass_types: Vec<String>,
    pub filter_extensions: Vec<String>,
    pub pass_extensions: Vec<String>,
    pub collapse_alternatives: bool,
    pub empty_action: EmptyAction,
}

impl Default for ContentFilter {
    /// The schema's defaults: nothing removed, an emptied post refused.
    fn default() -> Self {
        ContentFilter {
            filter_types: Vec::new(),
            pass_types: Vec::new(),
            filter_extensions: Vec::new(),
            pass_extensions: Vec::new(),
            collapse_alternatives: false,
            empty_action: EmptyAction::Reject,
        }
    }
}

impl ContentFilter {
    /// Whether this filter can change anything (a row of empty lists and no collapse is
    /// the same as none).
    pub fn is_active(&self) -> bool {
        self.collapse_alternatives
            || !self.filter_types.is_empty()
            || !self.pass_types.is_empty()
            || !self.filter_extensions.is_empty()
            || !self.pass_extensions.is_empty()
    }
}

/// The SQL test of [`banned`] on the list `$1` and the lower-case address `$2`, as a
/// literal for `concat!` where it joins a larger query (the list stage's). A pattern
/// starting with `^` is a case-insensitive regular expression (pepsi-list has PostgreSQL
/// compile it before storing it), any other the address itself: CASE keeps an address
/// pattern from ever being read as an expression.
#[macro_export]
macro_rules! list_banned_sql {
    () => {
        "EXISTS (SELECT 1 FROM pepsi.list_ban WHERE (list_id = $1 OR list_id IS NULL) \
         AND CASE WHEN left(pattern, 1) = '^' THEN $2 ~* pattern \
                  ELSE lower(pattern) = $2 END)"
    };
}

/// Whether `address` (lower-case) is banned from list `list_id`: a `list_ban` row of the
/// list or of every list whose pattern is the address, or, when it starts with `^`, a
/// regular expression matching it without regard to case.
pub async fn banned(conn: &mut PgConnection, list_id: i64, address: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar(concat!("SELECT ", list_banned_sql!()))
        .bind(list_id)
        .bind(address)
        .fetch_one(conn)
        .await
}

/// How a request reached the list (`list_pending.requested_via`,
/// `list_member.subscribed_via`, the `via` of its events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Mail,
    Web,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Mail => "mail",
            Via::Web => "web",
        }
    }
}

/// Whether `address` (lower-case) is a member of list `list_id` (role `member`, whatever its
/// delivery status).
pub async fn is_member<'e>(
    db: impl sqlx::PgExecutor<'e>,
    list_id: i64,
    address: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pepsi.list_member WHERE list_id = $1 AND address = $2 \
         AND role = 'member')",
    )
    .bind(list_id)
    .bind(address)
    .fetch_one(db)
    .await
}

/// Makes `address` a member of list `list_id` (`subscribed_via` = `via`, as
/// `list_pending.requested_via` has it); nothing when it already is one.
pub async fn add_member(
    conn: &mut PgConnection,
    list_id: i64,
    address: &str,
    display_name: &str,
    via: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO pepsi.list_member (list_id, address, display_name, role, \
         subscribed_via) VALUES ($1, $2, $3, 'member', $4) \
         ON CONFLICT (list_id, address, role) DO NOTHING",
    )
    .bind(list_id)
    .bind(address)
    .bind(display_name)
    .bind(via)
    .execute(conn)
    .await?;
    Ok(())
}

/// A confirmed request, carried out by [`carry_out`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    pub address: String,
    pub display_name: String,
    /// What happened, as `list_event_log` has it: `member.subscribe` (a member made),
    /// `subscription.confirmed` (under `confirm_then_approve`: now waiting for a moderator)
    /// or `member.unsubscribe` (the member row removed).
    pub event: &'static str,
}

/// Carries out the unexpired request of list `list_id` waiting for the confirmation whose
/// token hashes to `token_hash`: a subscription makes a member (`subscribed_via` = `via`),
/// or under `confirm_then_approve` a request waiting for a moderator (stored under
/// `spare_hash`, the hash of a token never sent); an unsubscription removes the member row.
/// One `list_event_log` row, the person as actor. `None` when no such request waits (used,
/// expired, unknown). Call it in the transaction of whatever else the confirmation does.
pub async fn carry_out(
    conn: &mut PgConnection,
    list_id: i64,
    token_hash: &[u8],
    via: Via,
    spare_hash: &[u8],
) -> sqlx::Result<Option<Carried>> {
    let pending = sqlx::query(
        "DELETE FROM pepsi.list_pending WHERE list_id = $1 AND token_hash = $2 \
         AND waiting_for = 'confirm' AND expires_at > now() \
         RETURNING address, display_name, kind, requested_via, client",
    )
    .bind(list_id)
    .bind(token_hash)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(pending) = pending else {
        return Ok(None);
    };
    let address: String = pending.try_get("address")?;
    let display_name: String = pending.try_get("display_name")?;
    let kind: String = pending.try_get("kind")?;
    let policy: String =
        sqlx::query_scalar("SELECT subscription_policy FROM pepsi.mailing_list WHERE list_id = $1")
            .bind(list_id)
            .fetch_one(&mut *conn)
            .await?;
    let event = match kind.as_str() {
        "subscribe" if policy == "confirm_then_approve" => {
            sqlx::query(
                "INSERT INTO pepsi.list_pending (list_id, address, display_name, kind, \
                 waiting_for, token_hash, requested_via, client, expires_at) \
                 SELECT $1, $2, $3, 'subscribe', 'approve', $4, $5, $6, now() + pending_lifetime \
                 FROM pepsi.mailing_list WHERE list_id = $1",
            )
            .bind(list_id)
            .bind(&address)
            .bind(&display_name)
            .bind(spare_hash)
            .bind(pending.try_get::<String, _>("requested_via")?)
            .bind(pending.try_get::<String, _>("client")?)
            .execute(&mut *conn)
            .await?;
            "subscription.confirmed"
        }
        "subscribe" => {
            add_member(conn, list_id, &address, &display_name, via.as_str()).await?;
            "member.subscribe"
        }
        _ => {
            sqlx::query(
                "DELETE FROM pepsi.list_member WHERE list_id = $1 AND address = $2 \
                 AND role = 'member'",
            )
            .bind(list_id)
            .bind(&address)
            .execute(&mut *conn)
            .await?;
            "member.unsubscribe"
        }
    };
    sqlx::query(
        "INSERT INTO pepsi.list_event_log (list_id, address, event, detail, actor) \
         VALUES ($1, $2, $3, $4, $2)",
    )
    .bind(list_id)
    .bind(&address)
    .bind(event)
    .bind(serde_json::json!({"via": via.as_str()}))
    .execute(&mut *conn)
    .await?;
    Ok(Some(Carried {
        address,
        display_name,
        event,
    }))
}

/// The first reading of `address` whose list exists: one query over every candidate.
pub async fn existing(db: &PgPool, address: &str) -> sqlx::Result<Option<ListAddress>> {
    let candidates = ListAddress::candidates(address);
    if candidates.is_empty() {
        return Ok(None);
    }
    let lists: Vec<&str> = candidates.iter().map(|c| c.list.as_str()).collect();
    let found: Vec<String> =
        sqlx::query_scalar("SELECT address FROM pepsi.mailing_list WHERE address = ANY($1)")
            .bind(&lists)
            .fetch_all(db)
            .await?;
    Ok(candidates.into_iter().find(|c| found.contains(&c.list)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(address: &str) -> Option<ListAddress> {
        ListAddress::candidates(address).into_iter().next()
    }

    fn la(list: &str, command: Command) -> Option<ListAddress> {
        Some(ListAddress {
            list: list.into(),
            command,
        })
    }

    #[test]
    fn command_addresses_table() {
        let cases: Vec<(&str, Option<ListAddress>)> = vec![
            ("team@example.org", la("team@example.org", Command::Post)),
            ("Team@Example.ORG", la("team@example.org", Command::Post)),
            (
                "team-join@example.org",
                la("team@example.org", Command::Join),
            ),
            (
                "team-subscribe@example.org",
                la("team@example.org", Command::Join),
            ),
            (
                "team-leave@example.org",
                la("team@example.org", Command::Leave),
            ),
            (
                "team-unsubscribe@example.org",
                la("team@example.org", Command::Leave),
            ),
            (
                "team-request@example.org",
                la("team@example.org", Command::Request),
            ),
            (
                "team-owner@example.org",
                la("team@example.org", Command::Owner),
            ),
            (
                "team-bounces@example.org",
                la("team@example.org", Command::Bounces(None)),
            ),
            (
                "dev-announce+bounces-bob.smith=mail.example.net@example.org",
                la(
                    "dev-announce@example.org",
                    Command::Bounces(Some("bob.smith@mail.example.net".into())),
                ),
            ),
            (
                "team-confirm+0a1b2c@example.org",
                la("team@example.org", Command::Confirm("0a1b2c".into())),
            ),
            // A token with other characters, or none: not a confirmation (nor a post,
            // since a list name has no `+`).
            ("team-confirm+a.b@example.org", None),
            ("team-confirm+@example.org", None),
            ("team+bounces-nobody@example.org", None),
            // A member whose local part holds `-confirm+` or `+bounces-`: still their
            // bounce, decoded whole.
            (
                "team+bounces-ann-confirm+x=example.net@example.org",
                la(
                    "team@example.org",
                    Command::Bounces(Some("ann-confirm+x@example.net".into())),
                ),
            ),
            (
                "team+bounces-a+bounces-b=example.net@example.org",
                la(
                    "team@example.org",
                    Command::Bounces(Some("a+bounces-b@example.net".into())),
                ),
            ),
            // A plus address of someone else: no list's.
            ("ann+news-join@example.org", None),
            ("-join@example.org", la("-join@example.org", Command::Post)),
            ("not an address", None),
        ];
        for (address, want) in cases {
            assert_eq!(first(address), want, "{address}");
        }
        // A command address is also read as a post to a list of the whole name, second.
        let all = ListAddress::candidates("team-join@example.org");
        assert_eq!(all.len(), 2);
        assert_eq!(all[1], la("team-join@example.org", Command::Post).unwrap());
    }

    /// The VERP address of a member decodes to the member as stored (local part lower
    /// case, an IDN domain as its A-label, which is how every entry path stores members).
    #[test]
    fn verp_round_trips_table() {
        for member in [
            "bob@example.net",
            "bob.smith+tag@mail.example.net",
            "ann-confirm+x@example.net",
            "o'brien=x@example.net",
            "jürgen@xn--bcher-kva.example",
        ] {
            let verp = verp_address("team@example.org", member);
            let read = first(&verp);
            assert_eq!(
                read,
                la("team@example.org", Command::Bounces(Some(member.into()))),
                "{member} as {verp}"
            );
        }
        // A member given with a U-label domain decodes to the A-label form stored.
        let verp = verp_address("team@example.org", "ann@bücher.example");
        assert_eq!(
            first(&verp),
            la(
                "team@example.org",
                Command::Bounces(Some("ann@xn--bcher-kva.example".into()))
            )
        );
    }

    #[test]
    fn a_confirmation_address_of_the_longest_name_fits_a_local_part() {
        let local = format!(
            "{}-confirm+{}",
            "n".repeat(MAX_NAME_LEN),
            "t".repeat(CONFIRM_TOKEN_LEN)
        );
        assert_eq!(local.len(), 64);
        assert_eq!(MAX_NAME_LEN, 31);
    }

    #[test]
    fn tokens_are_stored_as_their_hash() {
        let h = token_hash("abc");
        assert_eq!(h.len(), 32);
        assert_ne!(h, token_hash("abd"));
        let t = new_token().unwrap();
        assert_eq!(t.len(), CONFIRM_TOKEN_LEN);
        assert!(
            t.bytes()
                .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
        );
        assert_ne!(t, new_token().unwrap());
        // RFC 4648 §10's test vectors (whole groups).
        assert_eq!(base32(b"fooba"), "mzxw6ytb");
        assert_eq!(base32(b"foobafooba"), "mzxw6ytbmzxw6ytb");
        // The confirmation address of the longest list name fits in 64 octets.
        let name = "a".repeat(MAX_NAME_LEN);
        assert_eq!(format!("{name}-confirm+{t}").len(), 64);
    }

    #[test]
    fn verp_round_trips() {
        let verp = verp_address("team@example.org", "Bob.Smith@Mail.Example.NET");
        assert_eq!(verp, "team+bounces-bob.smith=mail.example.net@example.org");
        assert_eq!(
            first(&verp),
            la(
                "team@example.org",
                Command::Bounces(Some("bob.smith@mail.example.net".into()))
            )
        );
        // A member whose local part holds `=`: the last `=` is the `@`.
        let odd = verp_address("team@example.org", "a=b@example.net");
        assert_eq!(
            first(&odd).unwrap().command,
            Command::Bounces(Some("a=b@example.net".into()))
        );
        assert_eq!(verp_decode("nodomain"), None);
        assert_eq!(verp_decode("=example.net"), None);
    }
}
