//! One delivery attempt for one recipient: route the domain, walk its MX hosts and their
//! addresses in order, and take the first answer a server gives.
//!
//! The rules (docs/relay-internet.md, "Trying hosts"):
//! - a connect failure, a timeout, a greeting or EHLO/HELO refusal, a 421 at any point
//!   before the recipient is answered, or a connection lost before MAIL FROM is answered
//!   moves on to the next address, then the next host;
//! - any other reply from a server that took the session is the answer: 2xx delivered,
//!   4xx and a connection lost later transient, 5xx permanent; the next MX is not asked;
//! - when every address is used up, the attempt is transient and its diagnostic names
//!   each host and what went wrong there.

use std::fmt;
use std::net::IpAddr;

use pepsi_outbound::delivery::{Failure, RcptResult};
use pepsi_outbound::keep::Keeper;
use pepsi_outbound::mime::{Prepared, prepare_for_peer};
use pepsi_smtp::{
    ClientError, Connection, Envelope, OpenOptions, Phase, Protocol, RcptOutcome, Target,
    TlsOptions, TlsPolicy,
};
use sqlx::PgPool;

use crate::cache::{self, Candidate, Health};
use crate::options::Options;
use crate::route::{self, Hop, NoRoute};
use crate::sts::{Applied, Fetcher};
use crate::tls_result::{self, Counted};
use pepsi_outbound::dns::{Dns, Lookup, Validating};
use pepsi_smtp::dane::Tlsa;
use pepsi_smtp::sts::Mode;

/// What went wrong at one host or address, for the diagnostic of an attempt that found no
/// server to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub host: String,
    pub address: Option<IpAddr>,
    pub what: String,
    /// RFC 3463 code of this failure.
    pub status: String,
    pub phase: &'static str,
}

impl Note {
    fn line(&self) -> String {
        match self.address {
            Some(a) => format!("{} [{a}]: {}", self.host, self.what),
            None => format!("{}: {}", self.host, self.what),
        }
    }
}

/// The transient failure of an attempt in which no server answered: every note in order.
/// Its status is the last note's that is not a DNS failure, so "no answer from host" wins
/// over a lookup problem at a backup MX.
pub fn exhausted(notes: &[Note]) -> Failure {
    let diagnostic = if notes.is_empty() {
        "no MX host could be tried".to_owned()
    } else {
        notes.iter().map(Note::line).collect::<Vec<_>>().join("; ")
    };
    let last = notes
        .iter()
        .rev()
        .find(|n| n.status != "4.4.3")
        .or(notes.last());
    Failure {
        diagnostic,
        enhanced_status: Some(last.map_or("4.4.3".to_owned(), |n| n.status.clone())),
        smtp_code: None,
        remote_mta: None,
        reply_text: None,
        phase: Some(last.map_or("routing", |n| n.phase).to_owned()),
    }
}

/// A failure to open a session that another address may not have.
fn session_note(host: &str, address: IpAddr, e: &ClientError) -> Note {
    let f = Failure::from_client(e, host);
    Note {
        host: host.to_owned(),
        address: Some(address),
        what: e.to_string(),
        status: f
            .enhanced_status
            .filter(|s| s.starts_with('4'))
            .unwrap_or_else(|| "4.4.2".into()),
        phase: e.phase().as_str(),
    }
}

/// What a transaction's outcome means for the walk over the hosts.
enum Verdict {
    /// The server answered for the recipient.
    Answer(RcptResult),
    /// The server went away before answering: try the next address.
    Next(Note),
}

fn verdict(host: &str, address: IpAddr, remote: &str, outcome: &RcptOutcome) -> Verdict {
    match outcome {
        RcptOutcome::Refused { phase, reply }
            if reply.code == 421 && matches!(phase, Phase::Mail | Phase::Rcpt) =>
        {
            Verdict::Next(Note {
                host: host.to_owned(),
                address: Some(address),
                what: format!("the server answered the {phase} with {reply}"),
                status: reply.status(),
                phase: phase.as_str(),
            })
        }
        RcptOutcome::Failed(e) if e.is_temporary() && e.phase() == Phase::Mail => {
            Verdict::Next(session_note(host, address, e))
        }
        other => Verdict::Answer(RcptResult::from_outcome(other, remote)),
    }
}

/// What a kept session was opened for: reused only for exactly the same
/// (`pepsi_outbound::keep`, under its `MX_HOSTS` rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub host: String,
    pub address: IpAddr,
    pub tls: TlsPolicy,
    /// The certificate was audited when the session opened (an MTA-STS `testing` policy).
    pub audit: bool,
    /// The certificate was checked against the host's TLSA records (DANE).
    pub dane: bool,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.host, self.address)
    }
}

/// The attempt's parts: options, resolver, the cache's database, the kept sessions and
/// the MTA-STS policy reader.
pub struct Attempt<'a> {
    pub options: &'a Options,
    pub dns: &'a Dns,
    pub pool: &'a PgPool,
    pub keeper: &'a Keeper<Key>,
    pub sts: &'a Fetcher,
    /// The validating resolver of DANE, when `DANE = yes`.
    pub validating: Option<&'a Validating>,
}

/// How the sessions of one delivery (or, with DANE, of one MX host) are secured: the TLS
/// policy, whether to audit the certificate, the TLSA records to match, and the transport
/// policy their results count under.
#[derive(Clone)]
struct Security {
    tls: TlsPolicy,
    audit: bool,
    dane: Vec<Tlsa>,
    applied: Applied,
    counted: Counted,
}

impl Security {
    /// An `enforce` policy's refusal of an MX host it does not name.
    fn refuses(&self, host: &str) -> Option<&'static str> {
        match &self.applied {
            Applied::Policy(p) if !p.allows(host) => Some(match p.mode {
                Mode::Enforce => "enforce",
                _ => "testing",
            }),
            _ => None,
        }
    }
}

impl Attempt<'_> {
    /// Delivers `message` to the one recipient of `env`, whose domain is `domain`
    /// (normalized).
    pub async fn deliver(&self, env: &Envelope, domain: &str, message: &[u8]) -> RcptResult {
        let hops = match self.route(domain).await {
            Ok(hops) => hops,
            Err(result) => return result,
        };
        let security = self.security(domain, &hops).await;
        let mx_secure = self.mx_secure(domain, &hops).await;
        let mut notes = Vec::new();
        let mut connects = 0usize;
        let mut refused_internal = 0usize;
        for hop in &hops {
            if let Some(why) = &hop.unusable {
                notes.push(Note {
                    host: hop.name.clone(),
                    address: None,
                    what: why.clone(),
                    status: "4.4.3".into(),
                    phase: "routing",
                });
                continue;
            }
            let security = match self.dane_for(domain, hop, mx_secure).await {
                Ok(Some(dane)) => dane,
                Ok(None) => security.clone(),
                Err(note) => {
                    notes.push(note);
                    continue;
                }
            };
            match security.refuses(&hop.name) {
                Some("enforce") => {
                    let why = format!(
                        "not tried: {} is not an MX host the MTA-STS policy of {domain} \
                         names (mode enforce)",
                        hop.name
                    );
                    self.count(
                        domain,
                        &security.counted,
                        &hop.name,
                        None,
                        &tls_result::Result::failure("validation-failure", why.clone()),
                    )
                    .await;
                    notes.push(Note {
                        host: hop.name.clone(),
                        address: None,
                        what: why,
                        status: "4.7.5".into(),
                        phase: "routing",
                    });
                    continue;
                }
                Some(_) => {
                    let why = format!(
                        "{} is not an MX host the MTA-STS policy of {domain} names (mode testing)",
                        hop.name
                    );
                    tracing::info!(rcpt = %recipient(env), "{why}: delivering all the same");
                    self.count(
                        domain,
                        &security.counted,
                        &hop.name,
                        None,
                        &tls_result::Result::failure("validation-failure", why),
                    )
                    .await;
                }
                None => {}
            }
            let candidates = match hop.literal {
                Some(ip) => vec![Candidate {
                    address: ip,
                    health: Health::Untried,
                }],
                None => match self.addresses(&hop.name).await {
                    Ok(c) => c,
                    // No MX and, authoritatively, no address either: nowhere to deliver
                    // (RFC 5321 §5.1), a permanent failure rather than five days of retries.
                    Err(lookup @ (Lookup::NoRecords | Lookup::NoDomain))
                        if hops.len() == 1 && hop.name == domain =>
                    {
                        let mut f = Failure::new(
                            format!("{domain} has no MX and no address record: {lookup}"),
                            "5.1.2",
                        );
                        f.phase = Some("routing".into());
                        return RcptResult::Permanent(f);
                    }
                    Err(lookup) => {
                        notes.push(Note {
                            host: hop.name.clone(),
                            address: None,
                            what: format!("no address: {lookup}"),
                            status: "4.4.3".into(),
                            phase: "routing",
                        });
                        continue;
                    }
                },
            };
            for candidate in candidates {
                if !self.options.allow_internal
                    && let Some(range) = route::internal_range(candidate.address)
                {
                    refused_internal += 1;
                    notes.push(Note {
                        host: hop.name.clone(),
                        address: Some(candidate.address),
                        what: format!(
                            "not tried: {} is a {range} address (ALLOW_INTERNAL_ADDRESSES = no)",
                            candidate.address
                        ),
                        status: "5.4.4".into(),
                        phase: "routing",
                    });
                    continue;
                }
                if connects == self.options.max_addresses {
                    notes.push(Note {
                        host: hop.name.clone(),
                        address: None,
                        what: format!(
                            "not tried: MAX_ADDRESSES = {} reached",
                            self.options.max_addresses
                        ),
                        status: "4.4.1".into(),
                        phase: "connect",
                    });
                    return RcptResult::Transient(exhausted(&notes));
                }
                connects += 1;
                match self
                    .try_address(hop, candidate.address, &security, domain, env, message)
                    .await
                {
                    Verdict::Answer(result) => return result,
                    Verdict::Next(note) => {
                        tracing::info!(rcpt = %recipient(env), "{}", note.line());
                        notes.push(note);
                    }
                }
            }
        }
        if connects == 0 && refused_internal > 0 && refused_internal == notes.len() {
            // Every address of the domain is internal: retrying changes nothing.
            let mut f = Failure::new(
                format!(
                    "every address of {domain}'s mail hosts is internal (loopback, private, \
                     link-local or reserved): refused"
                ),
                "5.4.4",
            );
            f.phase = Some("routing".into());
            tracing::info!(rcpt = %recipient(env), "{}", notes.iter().map(Note::line).collect::<Vec<_>>().join("; "));
            return RcptResult::Permanent(f);
        }
        RcptResult::Transient(exhausted(&notes))
    }

    /// The transport security of a delivery to `domain` through `hops`: an operator's
    /// `TLS_DOMAINS` entry wins; else an MTA-STS `enforce` policy demands `verify` (the
    /// certificate valid for the MX host name), a `testing` one audits the certificate
    /// under the usual policy; else `TLS`.
    async fn security(&self, domain: &str, hops: &[Hop]) -> Security {
        let tls = self.options.tls_for(domain);
        let ask = self.options.sts.enabled
            && !self.options.tls_domains.contains_key(domain)
            && hops.iter().all(|h| h.literal.is_none());
        let applied = if ask {
            self.sts.policy(self.dns, self.pool, domain).await
        } else {
            Applied::NoPolicy
        };
        let counted = Counted::of(&applied);
        if let Applied::Unavailable {
            result_type,
            detail,
        } = &applied
        {
            self.count(
                domain,
                &counted,
                "",
                None,
                &tls_result::Result::failure(result_type, detail.clone()),
            )
            .await;
        }
        let (tls, audit) = match &applied {
            Applied::Policy(p) if p.mode == Mode::Enforce => (TlsPolicy::Verify, false),
            Applied::Policy(_) => (tls, tls != TlsPolicy::None && tls != TlsPolicy::Verify),
            _ => (tls, false),
        };
        Security {
            tls,
            audit,
            dane: Vec::new(),
            applied,
            counted,
        }
    }

    /// Whether the MX answer of `domain` is DNSSEC-secure, as DANE needs it to be (RFC
    /// 7672 §2.2.1: an MX host from an insecure answer may be an attacker's); false without
    /// DANE, for an address literal, and when the validating resolver fails.
    async fn mx_secure(&self, domain: &str, hops: &[Hop]) -> bool {
        let Some(v) = self.validating else {
            return false;
        };
        if hops.iter().any(|h| h.literal.is_some()) {
            return false;
        }
        match v
            .lookup(domain, hickory_resolver::proto::rr::RecordType::MX)
            .await
        {
            Ok(answer) => answer.secure,
            Err(e) => {
                tracing::info!(
                    domain,
                    "DANE: the MX lookup at the validating resolver failed: {e}"
                );
                false
            }
        }
    }

    /// DANE for one MX host (RFC 7672 §2.2): with a secure MX answer and a secure TLSA
    /// RRset at `_25._tcp.<host>`, the session must use TLS and the certificate must match
    /// the usable records (with none usable, TLS without authentication); DANE then wins
    /// over an MTA-STS policy (RFC 8461 §2). A TLSA lookup that fails (SERVFAIL is also how
    /// a validating resolver answers bogus data) is no reason to go on in clear: the host is
    /// skipped. `Ok(None)`: DANE does not apply to the host.
    async fn dane_for(
        &self,
        domain: &str,
        hop: &Hop,
        mx_secure: bool,
    ) -> Result<Option<Security>, Note> {
        let Some(v) = self
            .validating
            .filter(|_| mx_secure && hop.literal.is_none())
        else {
            return Ok(None);
        };
        let name = format!("_25._tcp.{}", hop.name);
        let answer = match v
            .lookup(&name, hickory_resolver::proto::rr::RecordType::TLSA)
            .await
        {
            Ok(a) => a,
            Err(e) => {
                let what = format!(
                    "not tried: the TLSA lookup of {name} failed ({e}), and the domain's MX answer is DNSSEC-signed"
                );
                let counted = Counted {
                    policy_type: "tlsa",
                    policy_string: Vec::new(),
                };
                self.count(
                    domain,
                    &counted,
                    &hop.name,
                    None,
                    &tls_result::Result::failure("dnssec-invalid", what.clone()),
                )
                .await;
                return Err(Note {
                    host: hop.name.clone(),
                    address: None,
                    what,
                    status: "4.7.5".into(),
                    phase: "routing",
                });
            }
        };
        if !answer.secure || answer.records.is_empty() {
            return Ok(None);
        }
        let records: Vec<Tlsa> = answer
            .records
            .iter()
            .filter_map(|r| match r {
                hickory_resolver::proto::rr::RData::TLSA(t) => Some(Tlsa {
                    usage: u8::from(t.cert_usage),
                    selector: u8::from(t.selector),
                    matching: u8::from(t.matching),
                    data: t.cert_data.clone(),
                }),
                _ => None,
            })
            .collect();
        let usable: Vec<Tlsa> = records.iter().filter(|r| r.usable()).cloned().collect();
        Ok(Some(Security {
            tls: TlsPolicy::Encrypt,
            audit: false,
            dane: usable,
            applied: Applied::NoPolicy,
            counted: Counted {
                policy_type: "tlsa",
                policy_string: records.iter().map(Tlsa::to_text).collect(),
            },
        }))
    }

    /// Counts a TLS result for the domain's TLS report, when the stage keeps them.
    async fn count(
        &self,
        domain: &str,
        counted: &Counted,
        host: &str,
        address: Option<IpAddr>,
        result: &tls_result::Result,
    ) {
        if self.options.tls_reporting {
            tls_result::record(self.pool, domain, counted, host, address, result).await;
        }
    }

    /// The hosts for `domain`, or the attempt's result when there is no route.
    async fn route(&self, domain: &str) -> Result<Vec<Hop>, RcptResult> {
        let permanent = |r: NoRoute| RcptResult::Permanent(r.failure(domain));
        if let Some(ip) = route::literal(domain).map_err(permanent)? {
            return Ok(vec![Hop {
                name: domain.to_owned(),
                preference: 0,
                literal: Some(ip),
                unusable: None,
            }]);
        }
        let answer = self.dns.mx(domain).await.map_err(|e| {
            let mut f = Failure::new(format!("MX lookup for {domain}: {e}"), "4.4.3");
            f.phase = Some("routing".into());
            RcptResult::Transient(f)
        })?;
        let random = std::collections::hash_map::RandomState::new();
        let mut n = 0u64;
        route::hops(domain, answer, &self.options.helo_name, || {
            use std::hash::BuildHasher as _;
            n += 1;
            random.hash_one(n)
        })
        .map_err(permanent)
    }

    /// The addresses of `host` in the order to try them: from the cache while it has a
    /// live address that has not failed, else freshly resolved (keeping what the cache
    /// knows of each address's health). When the DNS fails, the stale cached addresses are
    /// better than none.
    async fn addresses(&self, host: &str) -> Result<Vec<Candidate>, Lookup> {
        let ipv6 = self.options.ipv6.enabled();
        let cached = cache::cached(self.pool, host, ipv6)
            .await
            .inspect_err(|e| tracing::warn!(host, "cannot read pepsi.dns_address: {e}"))
            .unwrap_or_default();
        if cached.iter().any(|c| c.health != Health::Failed) {
            return Ok(cached);
        }
        let resolved = match self.dns.addresses(host, ipv6).await {
            Ok(r) => r,
            Err(e @ Lookup::Failed(_)) if !cached.is_empty() => {
                tracing::info!(
                    host,
                    "re-resolving failed ({e}); trying the cached addresses"
                );
                return Ok(cached);
            }
            Err(e) => return Err(e),
        };
        match cache::store(self.pool, host, &resolved.addresses, resolved.ttl, ipv6).await {
            Ok(c) if !c.is_empty() => Ok(c),
            Ok(_) => Err(Lookup::NoRecords),
            Err(e) => {
                tracing::warn!(host, "cannot write pepsi.dns_address: {e}");
                Ok(resolved
                    .addresses
                    .into_iter()
                    .filter(|a| ipv6 || a.is_ipv4())
                    .map(|address| Candidate {
                        address,
                        health: Health::Untried,
                    })
                    .collect())
            }
        }
    }

    /// One session with one address of `hop`, recording in the cache whether it opened;
    /// the session runs under the TLS policy of `domain`, and the message goes in the form
    /// the peer can take (`mime::prepare_for_peer`).
    async fn try_address(
        &self,
        hop: &Hop,
        address: IpAddr,
        security: &Security,
        domain: &str,
        env: &Envelope,
        message: &[u8],
    ) -> Verdict {
        let host = hop.name.as_str();
        let target = Target::Tcp {
            host: address.to_string(),
            port: self.options.smtp_port,
        };
        let key = Key {
            host: host.to_owned(),
            address,
            tls: security.tls,
            audit: security.audit,
            dane: !security.dane.is_empty(),
        };
        let options = OpenOptions {
            tls: TlsOptions {
                policy: key.tls,
                ca_file: self.options.tls_ca_file.clone(),
                // The MX host name is what a verified certificate must carry.
                server_name: hop.literal.is_none().then(|| host.to_owned()),
                audit: key.audit,
                dane: security.dane.clone(),
            },
            auth: None,
        };
        let reports_tls = key.tls != TlsPolicy::None && hop.literal.is_none();
        let mut conn = match self.keeper.take(&key).await {
            Some(kept) => kept,
            None => {
                let opened = Connection::open_with(
                    &target,
                    Protocol::Smtp,
                    &self.options.helo_name,
                    self.options.timeouts,
                    &options,
                )
                .await;
                if hop.literal.is_none() {
                    cache::report(self.pool, host, address, opened.is_ok()).await;
                }
                match opened {
                    Ok(conn) => conn,
                    Err(e) => {
                        if reports_tls && let Some(result) = tls_result::of_open_error(&e) {
                            self.count(domain, &security.counted, host, Some(address), &result)
                                .await;
                        }
                        return Verdict::Next(session_note(host, address, &e));
                    }
                }
            }
        };
        let remote = conn.remote_mta().to_owned();
        if reports_tls {
            let result = tls_result::of_session(conn.tls().as_ref());
            if !result.is_success() && matches!(security.applied, Applied::Policy(_)) {
                tracing::info!(rcpt = %recipient(env), %remote, "MTA-STS testing: {}", result.detail);
            }
            self.count(domain, &security.counted, host, Some(address), &result)
                .await;
        }
        let tls = conn.tls().map_or("no TLS".to_owned(), |t| {
            format!("{} {}", t.version, t.cipher)
        });
        let downgraded;
        let payload = match prepare_for_peer(env, message, conn.capabilities(), &remote) {
            Prepared::Send { message, .. } => message,
            Prepared::Downgraded(bytes) => {
                tracing::info!(rcpt = %recipient(env), %remote, "8-bit message converted to 7 bits");
                downgraded = bytes;
                &downgraded
            }
            Prepared::Refuse(failure) => {
                self.keeper
                    .put(key, conn, self.options.connection_idle)
                    .await;
                return Verdict::Answer(RcptResult::Permanent(failure));
            }
        };
        let outcomes = conn.send(env, payload).await;
        self.keeper
            .put(key, conn, self.options.connection_idle)
            .await;
        let outcome =
            outcomes
                .into_iter()
                .next()
                .unwrap_or(RcptOutcome::Failed(ClientError::Closed {
                    phase: Phase::Rcpt,
                }));
        match &outcome {
            RcptOutcome::Accepted(reply) => tracing::info!(
                rcpt = %recipient(env), %remote, %address, %tls, "delivered: {reply}"
            ),
            RcptOutcome::Refused { phase, reply } => tracing::info!(
                rcpt = %recipient(env), %remote, %address, %tls, "refused at {}: {reply}", phase.as_str()
            ),
            RcptOutcome::Failed(e) => tracing::warn!(
                rcpt = %recipient(env), %remote, %address, %tls, "not delivered: {e}"
            ),
        }
        verdict(host, address, &remote, &outcome)
    }
}

fn recipient(env: &Envelope) -> &str {
    env.recipients.first().map_or("", |r| r.address.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pepsi_smtp::reply::parse_reply;

    fn note(host: &str, status: &str, what: &str) -> Note {
        Note {
            host: host.into(),
            address: Some("192.0.2.1".parse().unwrap()),
            what: what.into(),
            status: status.into(),
            phase: "connect",
        }
    }

    #[test]
    fn an_attempt_without_answer_names_every_host() {
        let f = exhausted(&[
            note("mx1.example", "4.4.1", "cannot connect: refused"),
            note("mx2.example", "4.3.2", "421 busy"),
            Note {
                address: None,
                phase: "routing",
                ..note("mx3.example", "4.4.3", "no address")
            },
        ]);
        assert_eq!(
            f.diagnostic,
            "mx1.example [192.0.2.1]: cannot connect: refused; \
             mx2.example [192.0.2.1]: 421 busy; mx3.example: no address"
        );
        assert_eq!(f.enhanced_status.as_deref(), Some("4.3.2"));
        assert_eq!(f.phase.as_deref(), Some("connect"));
        let only_dns = exhausted(&[Note {
            address: None,
            phase: "routing",
            ..note("mx.example", "4.4.3", "no address")
        }]);
        assert_eq!(only_dns.enhanced_status.as_deref(), Some("4.4.3"));
        assert_eq!(exhausted(&[]).diagnostic, "no MX host could be tried");
    }

    #[test]
    fn which_outcomes_move_on_to_the_next_host() {
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let refused = |phase, line: &str| RcptOutcome::Refused {
            phase,
            reply: parse_reply(&[line]).unwrap(),
        };
        let next = |o: &RcptOutcome| matches!(verdict("mx", ip, "mx", o), Verdict::Next(_));
        assert!(next(&refused(Phase::Mail, "421 4.3.2 shutting down")));
        assert!(next(&refused(Phase::Rcpt, "421 4.3.2 shutting down")));
        assert!(next(&RcptOutcome::Failed(ClientError::Closed {
            phase: Phase::Mail
        })));
        // a server that answered for the recipient has given the answer
        assert!(!next(&refused(Phase::Rcpt, "451 4.3.0 try later")));
        assert!(!next(&refused(Phase::Rcpt, "550 5.1.1 no such user")));
        assert!(!next(&refused(Phase::DataEnd, "421 4.3.2 bye")));
        assert!(!next(&RcptOutcome::Failed(ClientError::Closed {
            phase: Phase::DataEnd
        })));
        let Verdict::Answer(RcptResult::Permanent(f)) = verdict(
            "mx",
            ip,
            "mx.example",
            &refused(Phase::Rcpt, "550 5.1.1 no such user"),
        ) else {
            panic!("550 is a permanent answer");
        };
        assert_eq!(f.remote_mta.as_deref(), Some("mx.example"));
    }
}
