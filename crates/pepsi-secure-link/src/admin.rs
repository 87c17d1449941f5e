//! What the operator tool, the admin API and the sender's page show of a link: one summary
//! type ([`Link`]), read with bound values only.
//!
//! The operator's side, shared by the tool `pepsi-secure-link` and pepsi-httpd's admin API
//! (docs/secure-link.md, "The operator tool", "The admin API"): the listing ([`Filter`],
//! [`list`]), one link with its access log ([`detail`]), and revoke, extend and purge, each
//! in the caller's transaction with its `pepsi.event_log` row (`pepsi_contract::audit`).
//! Their input is checked here, pure ([`Filter::from_pairs`], [`link_id`], [`until`]), so
//! both surfaces refuse the same things in the same words. The changes themselves are
//! `store`'s; nothing here reads a sealed part, a code or a session.

use chrono::{DateTime, TimeDelta, Utc};
use pepsi_conf::address::Address;
use pepsi_contract::audit::{self, Actor};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgConnection, PgPool, Row as _};

use crate::store::{self, Access, Error, MAX_LIFETIME, Refusal};

/// Where a link stands, the most final first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkState {
    Purged,
    Revoked,
    Expired,
    Active,
}

impl LinkState {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Purged => "purged",
            LinkState::Revoked => "revoked",
            LinkState::Expired => "expired",
            LinkState::Active => "active",
        }
    }
}

/// One link, without anything secret (no sealed bytes, no digest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Link {
    pub link_id: String,
    pub sender: String,
    pub recipient: String,
    pub created: DateTime<Utc>,
    pub expires: DateTime<Utc>,
    pub generation: i32,
    pub state: LinkState,
    pub revoked_by: Option<String>,
    /// The message's size in bytes.
    pub size: i64,
    /// The latest line of its access log.
    pub last_access: Option<DateTime<Utc>>,
}

/// The columns [`Link::from_row`] reads, from `pepsi.secure_link_message m`.
pub(crate) const COLUMNS: &str = "m.link_id, m.sender, m.recipient, m.created_at, m.expires_at, \
     m.generation, m.revoked_by, m.size, \
     CASE WHEN m.purged_at IS NOT NULL THEN 'purged' WHEN m.revoked_at IS NOT NULL THEN 'revoked' \
          WHEN m.expires_at <= now() THEN 'expired' ELSE 'active' END AS state, \
     (SELECT max(a.at) FROM pepsi.secure_link_access a WHERE a.message_id = m.message_id) \
         AS last_access";

impl Link {
    pub(crate) fn from_row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Link> {
        let state: String = r.try_get("state")?;
        Ok(Link {
            link_id: r.try_get("link_id")?,
            sender: r.try_get("sender")?,
            recipient: r.try_get("recipient")?,
            created: r.try_get("created_at")?,
            expires: r.try_get("expires_at")?,
            generation: r.try_get("generation")?,
            state: match state.as_str() {
                "purged" => LinkState::Purged,
                "revoked" => LinkState::Revoked,
                "expired" => LinkState::Expired,
                _ => LinkState::Active,
            },
            revoked_by: r.try_get("revoked_by")?,
            size: r.try_get("size")?,
            last_access: r.try_get("last_access")?,
        })
    }
}

/// The link `link_id`, or [`Refusal::Unknown`].
pub async fn get(pool: &PgPool, link_id: &str) -> Result<Link, Error> {
    // COLUMNS is a constant of this module: nothing of the input enters the text.
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM pepsi.secure_link_message m WHERE m.link_id = $1"
    )))
    .bind(link_id)
    .fetch_optional(pool)
    .await?
    .ok_or(Refusal::Unknown)?;
    Ok(Link::from_row(&row)?)
}

// ----- the operator's listing and actions (the tool `pepsi-secure-link`, the admin API) -----

/// The links a listing shows unless told otherwise.
pub const DEFAULT_LIMIT: i64 = 100;
/// The most links one listing shows.
pub const MAX_LIMIT: i64 = 10_000;
/// What a revocation records as the revoker when the operator names nobody.
pub const DEFAULT_REVOKER: &str = "operator";
/// The longest address accepted as a filter (as `store` bounds what it keeps).
const MAX_FILTER_ADDRESS: usize = 320;

impl LinkState {
    pub const ALL: [LinkState; 4] = [
        LinkState::Active,
        LinkState::Expired,
        LinkState::Revoked,
        LinkState::Purged,
    ];

    /// `text` as a state; the error names `field`, the value and the states there are.
    pub fn parse(field: &str, text: &str) -> Result<LinkState, String> {
        LinkState::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| {
                format!("{field} {text:?} is not a link state: active, expired, revoked or purged")
            })
    }
}

/// A listing: the links found, newest first, and the limit it was cut at.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    pub links: Vec<Link>,
    pub limit: i64,
}

/// One link and its access log, oldest first.
#[derive(Debug, Clone, Serialize)]
pub struct Detail {
    pub link: Link,
    pub access: Vec<Access>,
}

/// How many links a purge of every expired or revoked link purged.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Purged {
    pub purged: u64,
}

/// Which links a listing shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// The sender's address in compared form (`Address::key`).
    pub sender: Option<String>,
    pub recipient: Option<String>,
    pub state: Option<LinkState>,
    pub limit: i64,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            sender: None,
            recipient: None,
            state: None,
            limit: DEFAULT_LIMIT,
        }
    }
}

/// The query parameters of a listing.
pub const FILTER_FIELDS: [&str; 4] = ["sender", "recipient", "state", "limit"];

impl Filter {
    /// The filter of query parameters (`sender`, `recipient`, `state`, `limit`); an unknown
    /// parameter or a bad value is an error naming it.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Filter, String> {
        let mut f = Filter::default();
        for (k, v) in pairs {
            match k.as_str() {
                "sender" => f.sender = Some(filter_address(k, v)?),
                "recipient" => f.recipient = Some(filter_address(k, v)?),
                "state" => f.state = Some(LinkState::parse(k, v)?),
                "limit" => {
                    let n = v.parse::<i64>().map_err(|_| {
                        format!("limit {v:?} is not a whole number from 1 to {MAX_LIMIT}")
                    })?;
                    f.limit = limit(k, n)?;
                }
                other => {
                    return Err(format!(
                        "unknown parameter {other:?}: this route takes {}",
                        FILTER_FIELDS.join(", ")
                    ));
                }
            }
        }
        Ok(f)
    }
}

/// An address to filter by, in the form addresses are compared in (`Address::key`).
pub fn filter_address(field: &str, text: &str) -> Result<String, String> {
    if text.len() > MAX_FILTER_ADDRESS || text.chars().any(char::is_control) {
        return Err(format!(
            "{field} {text:?} is not an address: at most {MAX_FILTER_ADDRESS} bytes, no \
             control characters"
        ));
    }
    Address::parse(text)
        .map(|a| a.key())
        .map_err(|e| format!("{field} {e}"))
}

/// A listing's limit: 1 to [`MAX_LIMIT`].
pub fn limit(field: &str, n: i64) -> Result<i64, String> {
    if (1..=MAX_LIMIT).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{field} {n} is not valid: 1 to {MAX_LIMIT}"))
    }
}

/// `text` as a link id (22 characters of base64url, as a listing shows them).
pub fn link_id(text: &str) -> Result<&str, String> {
    let t = text.trim();
    if crate::url::is_link_id(t) {
        Ok(t)
    } else {
        Err(format!(
            "{:?} is not a link id: expected 22 characters (letters, digits, - and _) as \
             `pepsi-secure-link list` shows them",
            text.chars().take(64).collect::<String>()
        ))
    }
}

/// The new expiry of an extension: `until` (RFC 3339) or `days` from `now`, exactly one of
/// them, within [`MAX_LIFETIME`] of `now`.
pub fn until(
    until: Option<&str>,
    days: Option<i64>,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, String> {
    let max = MAX_LIFETIME.num_days();
    let at = match (until, days) {
        (Some(_), Some(_)) => return Err("give until or days, not both".into()),
        (None, None) => {
            return Err(format!(
                "give the new expiry: until (RFC 3339, e.g. 2027-01-31T12:00:00Z) or days (1 \
                 to {max} from now)"
            ));
        }
        (Some(t), None) => DateTime::parse_from_rfc3339(t.trim())
            .map_err(|e| {
                format!("until {t:?} is not an RFC 3339 time (e.g. 2027-01-31T12:00:00Z): {e}")
            })?
            .with_timezone(&Utc),
        (None, Some(d)) if (1..=max).contains(&d) => now + TimeDelta::days(d),
        (None, Some(d)) => return Err(format!("days {d} is not valid: 1 to {max}")),
    };
    if at <= now || at > now + MAX_LIFETIME {
        return Err(format!(
            "until {} is not between now and {max} days from now",
            at.to_rfc3339()
        ));
    }
    Ok(at)
}

/// The links `filter` selects, newest first, at most `filter.limit` of them.
pub async fn list(pool: &PgPool, filter: &Filter) -> Result<Vec<Link>, Error> {
    const LIST: &str = "SELECT * FROM (SELECT m.message_id, {COLUMNS} \
                          FROM pepsi.secure_link_message m \
                         WHERE ($1::text IS NULL OR lower(m.sender) = $1) \
                           AND ($2::text IS NULL OR lower(m.recipient) = $2)) l \
                        WHERE $3::text IS NULL OR l.state = $3 \
                        ORDER BY l.created_at DESC, l.message_id DESC LIMIT $4";
    // COLUMNS is a constant of this module: nothing of the input enters the text.
    let sql = LIST.replace("{COLUMNS}", COLUMNS);
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(filter.sender.as_deref())
        .bind(filter.recipient.as_deref())
        .bind(filter.state.map(LinkState::as_str))
        .bind(filter.limit.clamp(1, MAX_LIMIT))
        .fetch_all(pool)
        .await?;
    Ok(rows
        .iter()
        .map(Link::from_row)
        .collect::<sqlx::Result<_>>()?)
}

/// The link `link_id` and its access log; [`Refusal::Unknown`] when there is none.
pub async fn detail(pool: &PgPool, link_id: &str) -> Result<Detail, Error> {
    let link = get(pool, link_id).await?;
    let access = store::access_log(pool, link_id).await?;
    Ok(Detail { link, access })
}

/// Revokes `link_id` (`store::revoke`, recording `by`), with its `secure_link.revoke` row
/// in the audit log, in the caller's transaction.
pub async fn revoke(
    tx: &mut PgConnection,
    actor: &Actor,
    link_id: &str,
    by: &str,
) -> Result<(), Error> {
    store::revoke(tx, link_id, by).await?;
    let detail = json!({"link_id": link_id, "by": by});
    audit::record(tx, actor, "secure_link.revoke", None, detail).await?;
    Ok(())
}

/// Moves the expiry of `link_id` to `until` (`store::extend`), with its
/// `secure_link.extend` row in the audit log, in the caller's transaction.
pub async fn extend(
    tx: &mut PgConnection,
    actor: &Actor,
    link_id: &str,
    until: DateTime<Utc>,
) -> Result<DateTime<Utc>, Error> {
    let until = store::extend(tx, link_id, until).await?;
    let detail = json!({"link_id": link_id, "until": until});
    audit::record(tx, actor, "secure_link.extend", None, detail).await?;
    Ok(until)
}

/// Purges `link_id` now, whatever its state but purged (`store::purge_one`), with its
/// `secure_link.purge` row in the audit log, in the caller's transaction.
pub async fn purge_one(tx: &mut PgConnection, actor: &Actor, link_id: &str) -> Result<(), Error> {
    store::purge_one(tx, link_id).await?;
    let detail = json!({"link_id": link_id});
    audit::record(tx, actor, "secure_link.purge", None, detail).await?;
    Ok(())
}

/// Purges every link expired or revoked by now (`store::purge_expired`), with one
/// `secure_link.purge` row in the audit log counting them.
pub async fn purge_expired(tx: &mut PgConnection, actor: &Actor) -> Result<Purged, Error> {
    let purged = store::purge_expired(tx, Utc::now()).await?;
    let detail = json!({"expired": true, "purged": purged});
    audit::record(tx, actor, "secure_link.purge", None, detail).await?;
    Ok(Purged { purged })
}

/// Why an operator's action on `link_id` was refused: the refusal's reason, and who revoked
/// a revoked link.
pub async fn why(pool: &PgPool, link_id: &str, refusal: Refusal) -> String {
    match refusal {
        Refusal::Unknown => {
            format!("no link {link_id} (`pepsi-secure-link list` shows them)")
        }
        Refusal::Revoked => match get(pool, link_id).await.ok().and_then(|l| l.revoked_by) {
            Some(by) => format!("link {link_id} is revoked already (by {by})"),
            None => format!("link {link_id} is revoked already"),
        },
        other => format!("link {link_id}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_listing_is_filtered_by_checked_query_parameters() {
        let ok = |list: &[(&str, &str)]| Filter::from_pairs(&pairs(list)).unwrap();
        assert_eq!(ok(&[]), Filter::default());
        assert_eq!(
            ok(&[
                ("sender", " CEO@Example.TEST "),
                ("recipient", "p@bücher.example"),
                ("state", "revoked"),
                ("limit", "10000"),
            ]),
            Filter {
                sender: Some("ceo@example.test".into()),
                recipient: Some("p@xn--bcher-kva.example".into()),
                state: Some(LinkState::Revoked),
                limit: 10_000,
            }
        );
        // (parameters, words the error must hold)
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("limit", "0")], "limit 0 is not valid: 1 to 10000"),
            (&[("limit", "10001")], "limit 10001 is not valid"),
            (&[("limit", "ten")], "limit \"ten\" is not a whole number"),
            (&[("state", "open")], "state \"open\" is not a link state"),
            (
                &[("state", "Active")],
                "state \"Active\" is not a link state",
            ),
            (
                &[("sender", "nobody")],
                "sender \"nobody\" is not an address",
            ),
            (
                &[("recipient", "a\u{7}@x.example")],
                "no control characters",
            ),
            (&[("page", "2")], "unknown parameter \"page\""),
        ];
        for (list, says) in cases {
            let e = Filter::from_pairs(&pairs(list)).unwrap_err();
            assert!(e.contains(says), "{list:?}: {e}");
        }
    }

    #[test]
    fn states_parse_as_they_print() {
        for s in LinkState::ALL {
            assert_eq!(LinkState::parse("state", s.as_str()), Ok(s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::Value::from(s.as_str())
            );
        }
    }

    #[test]
    fn link_ids_have_their_form() {
        assert_eq!(
            link_id(" AAAAAAAAAAAAAAAAAAAA-_ "),
            Ok("AAAAAAAAAAAAAAAAAAAA-_")
        );
        for bad in [
            "",
            "AAAA",
            "AAAAAAAAAAAAAAAAAAAAA=",
            "AAAAAAAAAAAAAAAAAAAAAAA",
        ] {
            let e = link_id(bad).unwrap_err();
            assert!(e.contains("is not a link id"), "{bad}: {e}");
        }
    }

    #[test]
    fn an_extension_is_a_time_or_days_within_a_year() {
        let at = |t: &str| DateTime::parse_from_rfc3339(t).unwrap().with_timezone(&Utc);
        let now = at("2026-12-06T10:00:00Z");
        // (until, days, the expiry or words the error must hold)
        type Case<'a> = (Option<&'a str>, Option<i64>, Result<DateTime<Utc>, &'a str>);
        let cases: &[Case] = &[
            (None, Some(30), Ok(now + TimeDelta::days(30))),
            (None, Some(365), Ok(now + TimeDelta::days(365))),
            (
                Some("2027-01-01T01:00:00+01:00"),
                None,
                Ok(at("2027-01-01T00:00:00Z")),
            ),
            (None, None, Err("give the new expiry")),
            (Some("2027-01-01T00:00:00Z"), Some(3), Err("not both")),
            (None, Some(0), Err("days 0 is not valid: 1 to 365")),
            (None, Some(366), Err("days 366 is not valid")),
            (
                Some("tomorrow"),
                None,
                Err("until \"tomorrow\" is not an RFC 3339 time"),
            ),
            (
                Some("2026-12-06T09:00:00Z"),
                None,
                Err("is not between now and 365 days from now"),
            ),
            (
                Some("2028-01-01T00:00:00Z"),
                None,
                Err("is not between now and 365 days from now"),
            ),
        ];
        for (u, d, want) in cases {
            match (until(*u, *d, now), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, *w, "{u:?} {d:?}"),
                (Err(e), Err(says)) => assert!(e.contains(says), "{u:?} {d:?}: {e}"),
                (got, _) => panic!("{u:?} {d:?}: {got:?}, expected {want:?}"),
            }
        }
    }
}
