//! Mailbox quotas: the limits (`pepsi.quota_limit`, per mailbox and per domain), the usage
//! the Maildir delivery last found (`pepsi.quota_usage`), and the decisions made from them.
//!
//! A mailbox's limits are its own row (`alice@example.test`), else the delivery stage's
//! `QUOTA`/`QUOTA_MESSAGES`; a domain's row (`@example.test`) limits what all its mailboxes
//! hold together. The Maildir writer enforces a mailbox's limits against the Maildir++
//! `maildirsize` it shares with an IMAP server and reports the usage after every delivery
//! under a quota; the stage records it here, which is what the domain limit and the
//! ingress's RCPT check read. A mailbox counts as full at RCPT when its recorded usage, no
//! older than the ingress's `QUOTA_USAGE_TTL`, leaves no room for one more message (bytes or
//! count), or when its domain's recorded total does.
//!
//! [`full`], [`parse_scope`] and [`Limits::fits`] are pure and tested as tables; the rest are
//! single statements.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use pepsi_conf::address::{self, Address};

pub use pepsi_conf::mailbox::{Limits, Usage};

/// What a quota row is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// A mailbox, in comparison form (`alice@example.test`).
    Mailbox(String),
    /// Every mailbox of a domain together (`example.test`).
    Domain(String),
}

impl Scope {
    /// The `scope` column: the address, or `@domain`.
    pub fn key(&self) -> String {
        match self {
            Scope::Mailbox(m) => m.clone(),
            Scope::Domain(d) => format!("@{d}"),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key())
    }
}

/// `alice@example.test` (a mailbox) or `@example.test` (a domain), normalized; the error
/// says what is wrong.
pub fn parse_scope(text: &str) -> Result<Scope, String> {
    let text = text.trim();
    if text.chars().any(char::is_whitespace) {
        return Err(format!(
            "{text:?} has white space: neither an address (alice@example.test) nor @ and a domain \
             (@example.test)"
        ));
    }
    if let Some(domain) = text.strip_prefix('@') {
        if domain.contains('@') {
            return Err(format!("{text:?} is not @ and a domain name"));
        }
        return pepsi_conf::address::normalize_domain(domain)
            .map(Scope::Domain)
            .ok_or_else(|| format!("{text:?} is not @ and a domain name"));
    }
    match Address::parse(text) {
        Ok(a) => Ok(Scope::Mailbox(a.key())),
        Err(_) => Err(format!(
            "{text:?} is neither an address (alice@example.test) nor @ and a domain (@example.test)"
        )),
    }
}

/// A mailbox's recorded usage, the limits it was recorded under and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recorded {
    pub usage: Usage,
    pub limits: Limits,
    pub measured_at: DateTime<Utc>,
}

/// Whether mail for a mailbox should be refused at RCPT: its own usage (recorded no earlier
/// than `fresh_since`) exhausts the limits it was recorded under, or the domain's total
/// exhausts the domain's limits. Pure.
pub fn full(
    mailbox: Option<&Recorded>,
    domain: Option<(Limits, Usage)>,
    fresh_since: DateTime<Utc>,
) -> bool {
    mailbox.is_some_and(|r| r.measured_at >= fresh_since && r.limits.exhausted(r.usage))
        || domain.is_some_and(|(limits, used)| limits.exhausted(used))
}

/// The limits rows of a mailbox and of its domain (each `None` without a row).
pub async fn limits_of(
    pool: &PgPool,
    mailbox: &str,
) -> Result<(Option<Limits>, Option<Limits>), sqlx::Error> {
    let rows: Vec<(String, Option<i64>, Option<i64>)> = sqlx::query_as(
        "SELECT scope, storage, messages FROM pepsi.quota_limit WHERE scope = ANY($1)",
    )
    .bind(vec![
        mailbox.to_owned(),
        format!("@{}", address::domain_part(mailbox).unwrap_or_default()),
    ])
    .fetch_all(pool)
    .await?;
    let mut own = None;
    let mut domain = None;
    for (scope, bytes, messages) in rows {
        let limits = Limits::from_row(bytes, messages);
        if scope.starts_with('@') {
            domain = Some(limits);
        } else {
            own = Some(limits);
        }
    }
    Ok((own, domain))
}

/// What the mailboxes of `domain` hold together, by their recorded usage.
pub async fn domain_usage(pool: &PgPool, domain: &str) -> Result<Usage, sqlx::Error> {
    let (bytes, messages): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(storage), 0)::bigint, coalesce(sum(messages), 0)::bigint \
         FROM pepsi.quota_usage WHERE domain = $1",
    )
    .bind(domain)
    .fetch_one(pool)
    .await?;
    Ok(Usage {
        bytes: bytes.max(0) as u64,
        messages: messages.max(0) as u64,
    })
}

/// Records a mailbox's usage, as found under `limits`, now.
pub async fn record(
    pool: &PgPool,
    mailbox: &str,
    usage: Usage,
    limits: Limits,
) -> Result<(), sqlx::Error> {
    let big = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    sqlx::query(
        "INSERT INTO pepsi.quota_usage (mailbox, storage, messages, storage_limit, messages_limit) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (mailbox) DO UPDATE SET storage = EXCLUDED.storage, \
             messages = EXCLUDED.messages, storage_limit = EXCLUDED.storage_limit, \
             messages_limit = EXCLUDED.messages_limit, measured_at = now()",
    )
    .bind(mailbox)
    .bind(big(usage.bytes))
    .bind(big(usage.messages))
    .bind(limits.bytes.map(big))
    .bind(limits.messages.map(big))
    .execute(pool)
    .await?;
    Ok(())
}

/// A `quota_usage` row: storage, messages, the limits it was measured under, when.
type UsageRow = (i64, i64, Option<i64>, Option<i64>, DateTime<Utc>);

/// A mailbox's recorded usage, if any.
pub async fn recorded(pool: &PgPool, mailbox: &str) -> Result<Option<Recorded>, sqlx::Error> {
    let row: Option<UsageRow> = sqlx::query_as(
        "SELECT storage, messages, storage_limit, messages_limit, measured_at \
         FROM pepsi.quota_usage WHERE mailbox = $1",
    )
    .bind(mailbox)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(bytes, messages, bl, ml, at)| Recorded {
        usage: Usage {
            bytes: bytes.max(0) as u64,
            messages: messages.max(0) as u64,
        },
        limits: Limits::from_row(bl, ml),
        measured_at: at,
    }))
}

/// The RCPT check: [`full`] over the mailbox's recorded usage and its domain's limits and
/// total (two statements; the domain's only when it has limits).
pub async fn is_full(
    pool: &PgPool,
    mailbox: &str,
    fresh_since: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let own = recorded(pool, mailbox).await?;
    let (_, domain_limits) = limits_of(pool, mailbox).await?;
    let domain = match domain_limits {
        Some(limits) if limits.any() => Some((
            limits,
            domain_usage(pool, address::domain_part(mailbox).unwrap_or_default()).await?,
        )),
        _ => None,
    };
    Ok(full(own.as_ref(), domain, fresh_since))
}

/// Sets the limits of `scope` (replacing any), with its `pepsi.event_log` row
/// (`quota.set`), in one transaction. Limits without any limit are refused by the table.
pub async fn set_limit(
    pool: &PgPool,
    actor: &crate::audit::Actor,
    scope: &Scope,
    limits: Limits,
) -> Result<(), sqlx::Error> {
    let big = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO pepsi.quota_limit (scope, storage, messages) VALUES ($1, $2, $3) \
         ON CONFLICT (scope) DO UPDATE SET storage = EXCLUDED.storage, \
             messages = EXCLUDED.messages, updated_at = now()",
    )
    .bind(scope.key())
    .bind(limits.bytes.map(big))
    .bind(limits.messages.map(big))
    .execute(&mut *tx)
    .await?;
    crate::audit::record(
        &mut tx,
        actor,
        "quota.set",
        None,
        serde_json::json!({"scope": scope.key(), "storage": limits.bytes, "messages": limits.messages}),
    )
    .await?;
    tx.commit().await
}

/// Removes the limits of `scope`, with its `quota.unset` event; false when it had none.
pub async fn unset_limit(
    pool: &PgPool,
    actor: &crate::audit::Actor,
    scope: &Scope,
) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let gone = sqlx::query("DELETE FROM pepsi.quota_limit WHERE scope = $1")
        .bind(scope.key())
        .execute(&mut *tx)
        .await?
        .rows_affected()
        > 0;
    if gone {
        crate::audit::record(
            &mut tx,
            actor,
            "quota.unset",
            None,
            serde_json::json!({"scope": scope.key()}),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(gone)
}

/// Every limits row, by scope.
pub async fn all_limits(pool: &PgPool) -> Result<Vec<(String, Limits)>, sqlx::Error> {
    let rows: Vec<(String, Option<i64>, Option<i64>)> =
        sqlx::query_as("SELECT scope, storage, messages FROM pepsi.quota_limit ORDER BY scope")
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(scope, b, m)| (scope, Limits::from_row(b, m)))
        .collect())
}

/// Every recorded usage, by mailbox.
pub async fn all_recorded(pool: &PgPool) -> Result<Vec<(String, Recorded)>, sqlx::Error> {
    #[allow(clippy::type_complexity)]
    let rows: Vec<(String, i64, i64, Option<i64>, Option<i64>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT mailbox, storage, messages, storage_limit, messages_limit, measured_at \
         FROM pepsi.quota_usage ORDER BY mailbox",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(mailbox, bytes, messages, bl, ml, at)| {
            (
                mailbox,
                Recorded {
                    usage: Usage {
                        bytes: bytes.max(0) as u64,
                        messages: messages.max(0) as u64,
                    },
                    limits: Limits::from_row(bl, ml),
                    measured_at: at,
                },
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_as_a_table() {
        for (text, want) in [
            (
                "Alice@Example.TEST",
                Ok(Scope::Mailbox("alice@example.test".into())),
            ),
            (" @Example.test ", Ok(Scope::Domain("example.test".into()))),
            ("@", Err("is not @ and a domain name")),
            ("alice", Err("is neither an address")),
            ("@exa mple", Err("has white space")),
            ("@a@b", Err("is not @ and a domain name")),
        ] {
            match (parse_scope(text), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text:?}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{text:?}: {got}"),
                (got, want) => panic!("{text:?}: got {got:?}, want {want:?}"),
            }
        }
        assert_eq!(Scope::Domain("d.test".into()).key(), "@d.test");
    }

    #[test]
    fn fullness_as_a_table() {
        let now = Utc::now();
        let old = now - chrono::Duration::minutes(10);
        let lim = |b: Option<u64>, c: Option<u64>| Limits {
            bytes: b,
            messages: c,
        };
        let used = |bytes, messages| Usage { bytes, messages };
        let rec = |limits, usage, at| Recorded {
            usage,
            limits,
            measured_at: at,
        };
        let fresh = now - chrono::Duration::minutes(5);
        let cases = [
            (
                Some(rec(lim(Some(100), None), used(100, 3), now)),
                None,
                true,
            ),
            (
                Some(rec(lim(Some(100), None), used(99, 3), now)),
                None,
                false,
            ),
            (Some(rec(lim(None, Some(3)), used(1, 3), now)), None, true),
            // Usage recorded before the freshness bound no longer refuses anything.
            (Some(rec(lim(None, Some(3)), used(1, 3), old)), None, false),
            (Some(rec(lim(None, None), used(1_000, 3), now)), None, false),
            (None, Some((lim(Some(500), None), used(500, 9))), true),
            (None, Some((lim(Some(500), None), used(499, 9))), false),
            (None, Some((lim(None, Some(10)), used(1, 10))), true),
            (None, None, false),
        ];
        for (i, (own, domain, want)) in cases.into_iter().enumerate() {
            assert_eq!(full(own.as_ref(), domain, fresh), want, "case {i}");
        }
        assert!(lim(Some(10), Some(2)).fits(used(5, 1), 5));
        assert!(!lim(Some(10), Some(2)).fits(used(5, 1), 6));
        assert!(!lim(Some(10), Some(2)).fits(used(0, 2), 1));
        assert_eq!(Limits::from_row(Some(0), Some(-1)), lim(None, None));
    }
}
