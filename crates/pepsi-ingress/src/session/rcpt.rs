//! RCPT TO: relay control, the recipient limit, the optional mailbox check, the quota
//! check (a local mailbox found full is refused with 452 4.2.2; a mailing list's address
//! never is, a list having no mailbox), and the RFC 3461 parameters kept for `state.dsn`.

use super::{Session, State, within};
use crate::relay::{RcptDecision, decide};
use pepsi_smtp::Reply;
use pepsi_smtp::address::Path;
use pepsi_smtp::command::Param;
use pepsi_smtp::params::rcpt_params;

impl Session {
    pub(super) async fn rcpt(&mut self, to: Path, params: Vec<Param>) -> Reply {
        let mut tx = match std::mem::replace(&mut self.state, State::Connected) {
            State::Mail(tx) | State::Rcpt(tx) => tx,
            other => {
                self.state = other;
                return Reply::new(503, "5.5.1", "send MAIL before RCPT");
            }
        };
        let reply = self.check_rcpt(&mut tx, to, params).await;
        self.state = if tx.rcpts.is_empty() {
            State::Mail(tx)
        } else {
            State::Rcpt(tx)
        };
        reply
    }

    async fn check_rcpt(
        &mut self,
        tx: &mut super::Transaction,
        to: Path,
        params: Vec<Param>,
    ) -> Reply {
        let s = &self.settings;
        if tx.rcpts.len() >= s.max_recipients {
            return Reply::new(
                452,
                "4.5.3",
                format!("too many recipients (limit {})", s.max_recipients),
            );
        }
        let params = match rcpt_params(&params) {
            Ok(p) => p,
            Err(reply) => return reply,
        };
        if to.is_utf8() && !tx.params.smtputf8 {
            return Reply::new(553, "5.6.7", "a UTF-8 address needs SMTPUTF8 on MAIL FROM");
        }
        let Some(mut address) = to.address.clone() else {
            return Reply::new(501, "5.1.3", "no recipient address");
        };
        let domain = to.domain();
        let mut decision = decide(domain.as_deref(), &s.local, self.auth_user.is_some());
        // A domain the configuration does not list may still be local through the
        // settings layer (`@domain` / `local_domain` = true).
        if let (Some(d), RcptDecision::Refuse | RcptDecision::Relay) = (&domain, decision) {
            let key = d.to_ascii_lowercase();
            let answer = match self.shared.domains.get(&key) {
                Some(local) => Ok(local),
                None => {
                    let answer = within(
                        s.lookup_timeout,
                        s.local.is_local_domain(&self.shared.pool, d),
                    )
                    .await;
                    if let Ok(local) = answer {
                        self.shared.domains.put(&key, local);
                    }
                    answer
                }
            };
            match answer {
                Ok(true) => decision = RcptDecision::Local,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(domain = ?d, "local-domain lookup failed: {e}");
                    return Reply::new(451, "4.3.0", "temporary failure checking the recipient");
                }
            }
        }
        if domain.is_none() {
            // The bare <postmaster> must always be accepted (RFC 5321 §4.5.1).
            match s.local_domains.first() {
                Some(d) => address = format!("postmaster@{d}"),
                None => {
                    return Reply::new(550, "5.1.1", "no local domain to deliver <postmaster> to");
                }
            }
        }
        match decision {
            RcptDecision::Refuse => {
                tracing::info!(peer = %self.peer, rcpt = ?address, "relay attempt refused");
                return Reply::new(554, "5.7.1", format!("relay access denied for <{address}>"));
            }
            RcptDecision::Local if self.listener.config.check_recipients && domain.is_some() => {
                let key = address.to_lowercase();
                let known = if self.shared.recipients.known(&key) {
                    Ok(true)
                } else {
                    within(
                        s.lookup_timeout,
                        crate::recipients::is_known(
                            &self.shared.pool,
                            &s.local,
                            &self.shared.alias_files,
                            &address,
                        ),
                    )
                    .await
                };
                match known {
                    Ok(true) => self.shared.recipients.put(&key),
                    Ok(false) => {
                        return Reply::new(550, "5.1.1", format!("no such mailbox <{address}>"));
                    }
                    Err(e) => {
                        tracing::warn!(rcpt = ?address, "recipient check failed: {e}");
                        return Reply::new(
                            451,
                            "4.3.0",
                            "temporary failure checking the recipient",
                        );
                    }
                }
            }
            RcptDecision::Local | RcptDecision::Relay => {}
        }
        if decision == RcptDecision::Local && s.check_quota && domain.is_some() {
            let mailbox = s.local.mailbox_key(&address);
            let full = match self.shared.quota_full.get(&mailbox) {
                Some(full) => Ok(full),
                None => {
                    let fresh_since = chrono::Utc::now()
                        - chrono::Duration::from_std(s.quota_usage_ttl)
                            .unwrap_or(chrono::Duration::MAX);
                    let answer = within(
                        s.lookup_timeout,
                        pepsi_contract::quota::is_full(&self.shared.pool, &mailbox, fresh_since),
                    )
                    .await;
                    if let Ok(full) = answer {
                        self.shared.quota_full.put(&mailbox, full);
                    }
                    answer
                }
            };
            // A list has no mailbox, yet its address falls under its domain's limits (or a
            // mailbox of the same name's): asked only when the quota would refuse, so the
            // usual RCPT costs no extra query.
            let full = match full {
                Ok(true) => within(
                    s.lookup_timeout,
                    crate::recipients::is_list(&self.shared.pool, &address),
                )
                .await
                .map(|list| !list),
                other => other,
            };
            match full {
                Ok(true) => {
                    tracing::info!(peer = %self.peer, rcpt = ?address, "mailbox full: refused");
                    return Reply::new(
                        452,
                        "4.2.2",
                        format!("mailbox <{address}> is full; try again later"),
                    );
                }
                Ok(false) => {}
                // The delivery enforces the quota itself: a check that cannot be made
                // accepts the recipient rather than turning mail away.
                Err(e) => tracing::warn!(rcpt = ?address, "quota check failed: {e}"),
            }
        }
        tx.rcpts.push(address);
        tx.rcpt_params.push(params);
        Reply::new(250, "2.1.5", "recipient ok")
    }
}
