//! Message authentication at the door: iprev, SPF (HELO and MAIL FROM), DKIM, ARC and
//! DMARC with `mail-auth`, over the resolver of `pepsi_outbound::dns` whose servers the
//! configuration names (`DNS_SERVERS`), so a test can point it at a DNS server of its own.
//! Verdicts come from the DNS alone: a local hosts file is not a domain's word.
//!
//! The verdicts become one `Authentication-Results` field and the `state.auth` object;
//! the mapping from verdicts to JSON is pure and tested as a table.

use std::net::IpAddr;

use mail_auth::{
    ArcOutput, AuthenticatedMessage, AuthenticationResults, DkimOutput, DkimResult, DmarcOutput,
    DmarcResult, IprevOutput, IprevResult, MessageAuthenticator, SpfOutput, SpfResult,
    common::headers::HeaderWriter as _, dmarc::Policy, dmarc::verify::DmarcParameters,
    spf::verify::SpfParameters,
};

use crate::config::DnsOptions;
use pepsi_conf::address;
use pepsi_contract::state::{Auth, AuthVerdict, Iprev};

/// The resolver and the names the verdicts are issued under.
pub struct Verifier {
    auth: MessageAuthenticator,
    authserv_id: String,
    hostname: String,
    budget: std::time::Duration,
    max_dkim_signatures: usize,
    /// Lookups that failed lately (DNS_FAILURE_TTL): SPF of a domain, DMARC of a domain,
    /// iprev of an address.
    failures: crate::limits::DnsFailures,
}

/// The verdicts for one message.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// `Authentication-Results: …` CRLF.
    pub header: String,
    /// `state.auth`.
    pub state: Auth,
}

impl Verifier {
    pub fn new(dns: &DnsOptions, authserv_id: &str, hostname: &str) -> anyhow::Result<Verifier> {
        let (config, mut opts) = pepsi_outbound::dns::resolver_config(&dns.servers, dns.timeout)?;
        // Negative answers are cached for at least DNS_NEGATIVE_TTL (at most an hour), even
        // when the zone gives none: each lookup the verdicts make for a name without the
        // record (most senders publish no DMARC, many no SPF) is asked once per period.
        opts.negative_min_ttl = Some(dns.negative_ttl);
        opts.negative_max_ttl = Some(dns.negative_ttl.max(std::time::Duration::from_secs(3600)));
        let auth = MessageAuthenticator::new(config, opts)
            .map_err(|e| anyhow::anyhow!("cannot set up the DNS resolver: {e}"))?;
        Ok(Verifier {
            auth,
            authserv_id: authserv_id.to_owned(),
            hostname: hostname.to_owned(),
            budget: dns.budget,
            max_dkim_signatures: dns.max_dkim_signatures,
            failures: crate::limits::DnsFailures::new(dns.failure_ttl),
        })
    }

    /// Reverse DNS with forward confirmation (RFC 8601 §3 iprev), within DNS_BUDGET (past
    /// it, `temperror`).
    pub async fn iprev(&self, ip: IpAddr) -> IprevOutput {
        let key = format!("iprev:{ip}");
        if self.failures.recent(&key) {
            return IprevOutput {
                result: IprevResult::TempError(recent_failure()),
                ptr: None,
            };
        }
        match tokio::time::timeout(self.budget, self.auth.verify_iprev(ip)).await {
            Ok(out) => {
                if matches!(out.result, IprevResult::TempError(_)) {
                    self.failures.record(&key);
                }
                out
            }
            Err(_) => {
                tracing::info!(%ip, budget = ?self.budget, "DNS_BUDGET spent on iprev: temperror");
                IprevOutput {
                    result: IprevResult::TempError(mail_auth::Error::Dns(
                        mail_auth::DnsError::Resolver("DNS_BUDGET spent".into()),
                    )),
                    ptr: None,
                }
            }
        }
    }

    /// Checks one message. `mail_from` is empty for the null sender.
    ///
    /// SPF of HELO and of MAIL FROM, each DKIM signature and ARC run at the same time, each
    /// until DNS_BUDGET has passed; one that has not finished by then is `temperror`. DMARC
    /// then has a budget of its own for the From domain's record and is computed from
    /// what finished: a check that did not finish counts only when its domain is aligned
    /// with From, so a sender whose own HELO or MAIL FROM domain answers slowly cannot
    /// turn a spoofed From's `dmarc=fail` into `temperror` (the message is taken, not held
    /// while a resolver is slow).
    pub async fn check(
        &self,
        ip: IpAddr,
        helo: &str,
        mail_from: &str,
        iprev: &IprevOutput,
        raw: &[u8],
    ) -> Verdict {
        let deadline = tokio::time::Instant::now() + self.budget;
        self.verdicts(ip, helo, mail_from, iprev, raw, deadline)
            .await
    }

    /// An SPF check of `domain` unless its lookup failed lately (then `temperror` at once);
    /// a check that fails now is remembered under `key`.
    async fn remembering<F>(
        &self,
        key: String,
        domain: &str,
        check: impl FnOnce() -> F,
    ) -> SpfOutput
    where
        F: std::future::Future<Output = SpfOutput>,
    {
        if self.failures.recent(&key) {
            return SpfOutput::new(domain.to_owned()).with_result(SpfResult::TempError);
        }
        let out = check().await;
        if out.result() == SpfResult::TempError {
            self.failures.record(&key);
        }
        out
    }

    async fn verdicts(
        &self,
        ip: IpAddr,
        helo: &str,
        mail_from: &str,
        iprev: &IprevOutput,
        raw: &[u8],
        deadline: tokio::time::Instant,
    ) -> Verdict {
        // An address literal in HELO names no domain to check.
        let helo_is_domain = !helo.starts_with('[');
        let mail_domain = sender_domain(mail_from, helo);
        let spf_helo = tokio::time::timeout_at(deadline, async {
            if helo_is_domain {
                self.remembering(format!("spf:{}", helo.to_ascii_lowercase()), helo, || {
                    self.auth
                        .verify_spf(SpfParameters::verify_ehlo(ip, helo, &self.hostname))
                })
                .await
            } else {
                SpfOutput::new(helo.to_owned())
            }
        });
        let spf_mail = tokio::time::timeout_at(deadline, async {
            if mail_from.is_empty() {
                None
            } else {
                Some(
                    self.remembering(format!("spf:{mail_domain}"), &mail_domain, || {
                        self.auth.verify_spf(SpfParameters::verify_mail_from(
                            ip,
                            helo,
                            &self.hostname,
                            mail_from,
                        ))
                    })
                    .await,
                )
            }
        });
        let mut message = AuthenticatedMessage::parse(raw);
        if let Some(m) = message.as_mut()
            && m.dkim_headers.len() > self.max_dkim_signatures
        {
            tracing::info!(
                %ip,
                signatures = m.dkim_headers.len(),
                max = self.max_dkim_signatures,
                "only the first MAX_DKIM_SIGNATURES DKIM signatures are verified"
            );
            m.dkim_headers.truncate(self.max_dkim_signatures);
        }
        // One copy of the message per signature, verified on its own: a signature whose
        // key lookup is slow keeps no other signature (an aligned one) waiting.
        let singles: Vec<AuthenticatedMessage<'_>> = message
            .iter()
            .flat_map(|m| {
                m.dkim_headers.iter().map(|h| {
                    let mut one = m.clone();
                    one.dkim_headers = vec![h.clone()];
                    one.errors.clear();
                    one
                })
            })
            .collect();
        let dkim = join_all(
            singles
                .iter()
                .map(|one| tokio::time::timeout_at(deadline, self.auth.verify_dkim(one)))
                .collect(),
        );
        let arc = tokio::time::timeout_at(deadline, async {
            match &message {
                Some(m) => Some(self.auth.verify_arc(m).await),
                None => None,
            }
        });
        let (spf_helo, spf_mail, dkim, arc) = tokio::join!(spf_helo, spf_mail, dkim, arc);

        let mut unfinished = Vec::new();
        let spf_helo = spf_helo.unwrap_or_else(|_| {
            unfinished.push("SPF of HELO");
            SpfOutput::new(helo.to_owned()).with_result(SpfResult::TempError)
        });
        let spf_mail = match spf_mail {
            Ok(out) => out.unwrap_or_else(|| spf_helo.clone()),
            Err(_) => {
                unfinished.push("SPF of MAIL FROM");
                SpfOutput::new(mail_domain.clone()).with_result(SpfResult::TempError)
            }
        };
        let mut results = AuthenticationResults::new(&self.authserv_id)
            .with_iprev_result(iprev, ip)
            .with_spf_ehlo_result(&spf_helo, ip, helo)
            .with_spf_mailfrom_result(&spf_mail, ip, mail_from, helo);
        let mut state = Auth {
            spf: Some(AuthVerdict {
                domain: Some(mail_domain.clone()),
                helo: Some(Box::new(AuthVerdict {
                    domain: Some(helo.to_owned()),
                    ..AuthVerdict::new(spf_name(spf_helo.result()))
                })),
                ..AuthVerdict::new(spf_name(spf_mail.result()))
            }),
            dkim: Vec::new(),
            dmarc: Some(AuthVerdict::new("none")),
            arc: Some(AuthVerdict::new("none")),
        };
        if let Some(message) = &message {
            // Malformed signatures first, as verify_dkim lists them.
            let mut dkim_outputs: Vec<DkimOutput<'_>> = message
                .errors
                .iter()
                .filter(|e| matches!(e.header, mail_auth::Error::Dkim(_)))
                .map(|e| DkimOutput::neutral(e.header.clone()))
                .collect();
            for (one, verified) in message.dkim_headers.iter().zip(dkim) {
                match verified {
                    Ok(outputs) => dkim_outputs.extend(outputs),
                    // With its signature, so DMARC counts it only when its d= is aligned.
                    Err(_) => {
                        unfinished.push("DKIM");
                        dkim_outputs
                            .push(DkimOutput::temp_err(budget_spent()).with_signature(&one.header));
                    }
                }
            }
            let arc = match arc {
                Ok(arc) => arc.unwrap_or_default(),
                Err(_) => {
                    unfinished.push("ARC");
                    ArcOutput::default().with_result(DkimResult::TempError(budget_spent()))
                }
            };
            let dmarc = self
                .dmarc(message, &dkim_outputs, &mail_domain, &spf_mail)
                .await;
            let header_from = message.from();
            results = results
                .with_dkim_results(&dkim_outputs, header_from)
                .with_arc_result(&arc, ip)
                .with_dmarc_result(&dmarc);
            state.dkim = dkim_outputs.iter().map(dkim_json).collect();
            state.arc = Some(dkim_result_json(arc.result()));
            state.dmarc = Some(dmarc_json(&dmarc.result(), dmarc.domain(), dmarc.policy()));
        }
        if !unfinished.is_empty() {
            unfinished.dedup();
            tracing::info!(
                %ip,
                budget = ?self.budget,
                unfinished = %unfinished.join(", "),
                "DNS_BUDGET spent: the unfinished checks are temperror"
            );
        }
        Verdict {
            header: results.to_header(),
            state,
        }
    }

    /// DMARC of the From domain from the SPF and DKIM outputs at hand, under a DNS_BUDGET
    /// of its own: the lookups it makes are the From domain's record and, for alignment,
    /// the organizational domains of aligned candidates, none of which the other checks'
    /// slowness may use up. Past it, `temperror`.
    async fn dmarc(
        &self,
        message: &AuthenticatedMessage<'_>,
        dkim: &[DkimOutput<'_>],
        mail_domain: &str,
        spf_mail: &SpfOutput,
    ) -> DmarcOutput {
        let from_domain =
            address::domain_part(message.from()).map_or(String::new(), str::to_ascii_lowercase);
        let key = format!("dmarc:{from_domain}");
        if self.failures.recent(&key) {
            return DmarcOutput::new(from_domain)
                .with_spf_result(DmarcResult::TempError(recent_failure()))
                .with_dkim_result(DmarcResult::TempError(recent_failure()));
        }
        let verify =
            self.auth
                .verify_dmarc(DmarcParameters::new(message, dkim, mail_domain, spf_mail));
        match tokio::time::timeout(self.budget, verify).await {
            Ok(dmarc) => {
                if matches!(dmarc.spf_result(), DmarcResult::TempError(_))
                    && matches!(dmarc.dkim_result(), DmarcResult::TempError(_))
                {
                    self.failures.record(&key);
                }
                dmarc
            }
            Err(_) => {
                tracing::info!(domain = %from_domain, budget = ?self.budget, "DNS_BUDGET spent on DMARC: temperror");
                DmarcOutput::new(from_domain)
                    .with_spf_result(DmarcResult::TempError(budget_spent()))
                    .with_dkim_result(DmarcResult::TempError(budget_spent()))
            }
        }
    }
}

/// The error of a check that had not finished when DNS_BUDGET was spent.
fn budget_spent() -> mail_auth::Error {
    mail_auth::Error::Dns(mail_auth::DnsError::Resolver("DNS_BUDGET spent".into()))
}

/// Runs `futures` at the same time; their outputs in the same order.
async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *output = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// The error a verdict carries when the same lookup failed lately (DNS_FAILURE_TTL).
fn recent_failure() -> mail_auth::Error {
    mail_auth::Error::Dns(mail_auth::DnsError::Resolver(
        "failed lately (DNS_FAILURE_TTL): not asked again".into(),
    ))
}

/// The domain SPF's MAIL FROM verdict is about: the sender's, or HELO's for the null
/// sender; lower case.
fn sender_domain(mail_from: &str, helo: &str) -> String {
    address::domain_part(mail_from)
        .unwrap_or(helo)
        .to_ascii_lowercase()
}

/// `state.origin.iprev`: the result, and the verified reverse name (also for the Received
/// field).
pub fn iprev_state(out: &IprevOutput) -> Iprev {
    let name = match out.result {
        IprevResult::Pass => out
            .ptr
            .as_ref()
            .and_then(|p| p.first())
            .map(|n| n.trim_end_matches('.').to_owned()),
        _ => None,
    };
    Iprev {
        result: iprev_name(&out.result).to_owned(),
        name,
    }
}

pub fn spf_name(r: SpfResult) -> &'static str {
    match r {
        SpfResult::Pass => "pass",
        SpfResult::Fail => "fail",
        SpfResult::SoftFail => "softfail",
        SpfResult::Neutral => "neutral",
        SpfResult::TempError => "temperror",
        SpfResult::PermError => "permerror",
        SpfResult::None => "none",
    }
}

fn iprev_name(r: &IprevResult) -> &'static str {
    match r {
        IprevResult::Pass => "pass",
        IprevResult::Fail(_) => "fail",
        IprevResult::TempError(_) => "temperror",
        IprevResult::PermError(_) => "permerror",
        IprevResult::None => "none",
    }
}

fn dkim_result_json(r: &DkimResult) -> AuthVerdict {
    let (name, reason) = match r {
        DkimResult::Pass => ("pass", None),
        DkimResult::Neutral(e) => ("neutral", Some(e)),
        DkimResult::Fail(e) => ("fail", Some(e)),
        DkimResult::PermError(e) => ("permerror", Some(e)),
        DkimResult::TempError(e) => ("temperror", Some(e)),
        DkimResult::None => ("none", None),
    };
    AuthVerdict {
        reason: reason.map(|e| e.to_string()),
        ..AuthVerdict::new(name)
    }
}

fn dkim_json(out: &DkimOutput<'_>) -> AuthVerdict {
    let mut v = dkim_result_json(out.result());
    if let Some(sig) = out.signature() {
        v.domain = Some(sig.d.to_ascii_lowercase());
        v.selector = Some(sig.s.clone());
    }
    v
}

fn dmarc_json(r: &DmarcResult, domain: &str, policy: Policy) -> AuthVerdict {
    let (name, reason) = match r {
        DmarcResult::Pass => ("pass", None),
        DmarcResult::Fail(e) => ("fail", Some(e.to_string())),
        DmarcResult::TempError(e) => ("temperror", Some(e.to_string())),
        DmarcResult::PermError(e) => ("permerror", Some(e.to_string())),
        DmarcResult::None => ("none", None),
    };
    let policy = match policy {
        Policy::Reject => "reject",
        Policy::Quarantine => "quarantine",
        Policy::None | Policy::Unspecified => "none",
    };
    AuthVerdict {
        domain: Some(domain.to_ascii_lowercase()),
        policy: Some(policy.to_owned()),
        reason,
        ..AuthVerdict::new(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn result_names() {
        let spf = [
            (SpfResult::Pass, "pass"),
            (SpfResult::Fail, "fail"),
            (SpfResult::SoftFail, "softfail"),
            (SpfResult::Neutral, "neutral"),
            (SpfResult::TempError, "temperror"),
            (SpfResult::PermError, "permerror"),
            (SpfResult::None, "none"),
        ];
        for (r, name) in spf {
            assert_eq!(spf_name(r), name);
        }
        let as_json = |v: AuthVerdict| serde_json::to_value(v).unwrap();
        assert_eq!(
            as_json(dkim_result_json(&DkimResult::Pass)),
            json!({"result": "pass"})
        );
        assert_eq!(
            as_json(dkim_result_json(&DkimResult::Fail(
                mail_auth::Error::NotAligned
            )))["result"],
            "fail"
        );
        assert_eq!(
            as_json(dmarc_json(
                &DmarcResult::None,
                "Example.ORG",
                Policy::Reject
            )),
            json!({"result": "none", "domain": "example.org", "policy": "reject"})
        );
        let pass = IprevOutput {
            result: IprevResult::Pass,
            ptr: Some(vec!["mail.example.org.".into()].into()),
        };
        assert_eq!(
            serde_json::to_value(iprev_state(&pass)).unwrap(),
            json!({"result": "pass", "name": "mail.example.org"})
        );
        let none = IprevOutput {
            result: IprevResult::None,
            ptr: None,
        };
        assert_eq!(
            serde_json::to_value(iprev_state(&none)).unwrap(),
            json!({"result": "none", "name": null})
        );
    }
}
