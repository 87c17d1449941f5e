//! When mail leaves by secure link, per domain (`pepsi.secure_link_policy`, pepsi-0020): the
//! one rule the secure-link stage and the encrypt stage's fallback both read.
//!
//! A row names a recipient domain or a sender domain, a mode (`always`, `never`,
//! `fallback`) and the link's lifetime. For a recipient of a message, the row of the
//! recipient's domain decides; without one, the row of the sender's domain; without either,
//! nothing is set. [`Policies::resolve`] is that rule, pure; [`fetch`] reads the rows of the
//! domains asked for. Domains are compared in their stored form: ASCII lower case, IDN
//! labels as punycode (`pepsi_conf::address::normalize_domain`), which the table's CHECK
//! and the callers keep.

use std::collections::HashMap;

use chrono::TimeDelta;
use sqlx::PgPool;

/// The `mode` of a policy row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every message to (or from) the domain leaves by secure link.
    Always,
    /// Never, not even when the sender asks or encryption is required.
    Never,
    /// Only as the encrypt stage's fallback: when encryption is required and no key is
    /// found, a link instead of a 5.7.5 bounce.
    Fallback,
}

impl Mode {
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "always" => Some(Mode::Always),
            "never" => Some(Mode::Never),
            "fallback" => Some(Mode::Fallback),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Always => "always",
            Mode::Never => "never",
            Mode::Fallback => "fallback",
        }
    }

    /// Whether the encrypt stage may send a recipient without a key to a link instead of
    /// returning it.
    pub fn allows_fallback(self) -> bool {
        matches!(self, Mode::Always | Mode::Fallback)
    }
}

/// Which domain a row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    RecipientDomain,
    SenderDomain,
}

impl Scope {
    pub fn parse(text: &str) -> Option<Scope> {
        match text {
            "recipient_domain" => Some(Scope::RecipientDomain),
            "sender_domain" => Some(Scope::SenderDomain),
            _ => None,
        }
    }
}

/// What one row says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub mode: Mode,
    /// How long a link made under this row lives.
    pub lifetime: TimeDelta,
}

/// The rule that decides for one recipient, and which row it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub rule: Rule,
    pub scope: Scope,
}

/// Some rows of the table: the ones a message needs, or all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policies {
    rows: HashMap<(Scope, String), Rule>,
}

impl Policies {
    /// Adds (or replaces) the row of `domain` in `scope`.
    pub fn insert(&mut self, scope: Scope, domain: impl Into<String>, rule: Rule) {
        self.rows.insert((scope, domain.into()), rule);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The row that decides for a recipient in `recipient_domain` of a message from
    /// `sender_domain`: the recipient domain's row wins over the sender domain's. `None`
    /// for a domain not given (an address without one, the null sender).
    pub fn resolve(
        &self,
        recipient_domain: Option<&str>,
        sender_domain: Option<&str>,
    ) -> Option<Resolved> {
        let row = |scope: Scope, domain: Option<&str>| {
            let domain = domain?;
            self.rows
                .get(&(scope, domain.to_owned()))
                .map(|rule| Resolved { rule: *rule, scope })
        };
        row(Scope::RecipientDomain, recipient_domain)
            .or_else(|| row(Scope::SenderDomain, sender_domain))
    }
}

/// The rows of `recipient_domains` (as recipient domains) and `sender_domains` (as sender
/// domains), in one query. A row of a mode or scope this build does not know is left out
/// (a newer schema's), so it decides nothing rather than failing mail.
pub async fn fetch(
    pool: &PgPool,
    recipient_domains: &[String],
    sender_domains: &[String],
) -> Result<Vec<(Scope, String, Rule)>, sqlx::Error> {
    if recipient_domains.is_empty() && sender_domains.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT scope, domain, mode, EXTRACT(EPOCH FROM lifetime)::bigint \
           FROM pepsi.secure_link_policy \
          WHERE (scope = 'recipient_domain' AND domain = ANY($1)) \
             OR (scope = 'sender_domain' AND domain = ANY($2))",
    )
    .bind(recipient_domains)
    .bind(sender_domains)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(scope, domain, mode, secs)| {
            Some((
                Scope::parse(&scope)?,
                domain,
                Rule {
                    mode: Mode::parse(&mode)?,
                    lifetime: TimeDelta::seconds(secs),
                },
            ))
        })
        .collect())
}

/// [`fetch`] as [`Policies`].
pub async fn load(
    pool: &PgPool,
    recipient_domains: &[String],
    sender_domains: &[String],
) -> Result<Policies, sqlx::Error> {
    let mut policies = Policies::default();
    for (scope, domain, rule) in fetch(pool, recipient_domains, sender_domains).await? {
        policies.insert(scope, domain, rule);
    }
    Ok(policies)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(mode: Mode, days: i64) -> Rule {
        Rule {
            mode,
            lifetime: TimeDelta::days(days),
        }
    }

    /// (recipient domain, sender domain, what decides).
    #[test]
    fn the_recipient_domain_wins_over_the_sender_domain() {
        let mut p = Policies::default();
        p.insert(
            Scope::RecipientDomain,
            "bank.example",
            rule(Mode::Always, 7),
        );
        p.insert(
            Scope::RecipientDomain,
            "open.example",
            rule(Mode::Never, 30),
        );
        p.insert(
            Scope::SenderDomain,
            "example.test",
            rule(Mode::Fallback, 14),
        );
        p.insert(Scope::SenderDomain, "quiet.test", rule(Mode::Never, 30));
        use Scope::*;
        type Case<'a> = (Option<&'a str>, Option<&'a str>, Option<(Mode, i64, Scope)>);
        let cases: &[Case] = &[
            (
                Some("bank.example"),
                Some("example.test"),
                Some((Mode::Always, 7, RecipientDomain)),
            ),
            (
                Some("open.example"),
                Some("example.test"),
                Some((Mode::Never, 30, RecipientDomain)),
            ),
            (
                Some("other.example"),
                Some("example.test"),
                Some((Mode::Fallback, 14, SenderDomain)),
            ),
            (
                Some("other.example"),
                Some("quiet.test"),
                Some((Mode::Never, 30, SenderDomain)),
            ),
            (
                Some("bank.example"),
                Some("quiet.test"),
                Some((Mode::Always, 7, RecipientDomain)),
            ),
            (Some("other.example"), Some("else.test"), None),
            (Some("other.example"), None, None),
            (
                None,
                Some("example.test"),
                Some((Mode::Fallback, 14, SenderDomain)),
            ),
            // A sender-domain row is not read for the recipient's domain, nor the reverse.
            (Some("example.test"), Some("bank.example"), None),
        ];
        for (rcpt, sender, want) in cases {
            let got = p
                .resolve(*rcpt, *sender)
                .map(|r| (r.rule.mode, r.rule.lifetime.num_days(), r.scope));
            assert_eq!(got, *want, "{rcpt:?} from {sender:?}");
        }
        assert!(Policies::default().is_empty() && !p.is_empty());
    }

    #[test]
    fn modes_read_as_stored() {
        for m in [Mode::Always, Mode::Never, Mode::Fallback] {
            assert_eq!(Mode::parse(m.as_str()), Some(m));
        }
        assert_eq!(Mode::parse("Always"), None);
        assert!(Mode::Always.allows_fallback() && Mode::Fallback.allows_fallback());
        assert!(!Mode::Never.allows_fallback());
        assert_eq!(Scope::parse("sender_domain"), Some(Scope::SenderDomain));
        assert_eq!(Scope::parse("domain"), None);
    }
}
