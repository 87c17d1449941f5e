//! What becomes of each recipient after a conversation: the pure decision, tested as a
//! table. The stage (lib.rs) carries it out through the stage contract.
//!
//! - accepted recipients of an accepted message go on (held for an operator instead when
//!   the filter quarantined the message), with the filter's changes;
//! - a recipient refused at RCPT, or every accepted one of a rejected message, is returned
//!   to the sender with the filter's reply;
//! - a recipient deferred at RCPT, or every accepted one of a tempfailed message (or of any
//!   message while the filter is down and `DOWN_ACTION = tempfail`), waits and is asked
//!   about again, until the message is older than MAX_LIFETIME: then it is returned (4.4.7);
//! - every accepted recipient of a discarded message is dropped without a notice.

use std::time::Duration;

use pepsi_outbound::delivery::{Failure, RetryPolicy};

use crate::edits::Edits;
use crate::session::{Conversation, RcptAnswer, SmtpReply, Unavailable, Verdict};

/// What the stage does when the filter cannot be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownAction {
    /// Every recipient waits and is tried again (4.7.1), like a filter's tempfail.
    Tempfail,
    /// The message goes on unfiltered.
    Pass,
}

impl DownAction {
    pub fn parse(v: &str) -> Result<DownAction, String> {
        match v.trim().to_ascii_lowercase().as_str() {
            "tempfail" => Ok(DownAction::Tempfail),
            "pass" | "accept" => Ok(DownAction::Pass),
            _ => Err("tempfail or pass".into()),
        }
    }
}

/// The conversation that stands for a filter that could not be asked (to the end): the
/// recipients it already refused or deferred (`decided`) keep that answer, the others get
/// `action`'s.
pub fn fallback(
    action: DownAction,
    decided: &[Option<RcptAnswer>],
    filter: &str,
    why: &Unavailable,
) -> Conversation {
    let (answer, verdict) = match action {
        DownAction::Pass => (RcptAnswer::Accepted, Verdict::Accept),
        DownAction::Tempfail => {
            let reply = SmtpReply {
                code: 451,
                enhanced: "4.7.1".into(),
                text: format!("the content filter {filter} is unavailable: {why}"),
            };
            (
                RcptAnswer::Deferred(reply.clone()),
                Verdict::Tempfail(reply),
            )
        }
    };
    Conversation {
        rcpts: decided
            .iter()
            .map(|d| d.clone().unwrap_or_else(|| answer.clone()))
            .collect(),
        verdict,
        edits: Edits::default(),
        leading_space: false,
    }
}

/// The row's facts the decision needs.
#[derive(Debug, Clone, Copy)]
pub struct Facts {
    /// How old the message is.
    pub age: Duration,
    /// How often this stage deferred it before.
    pub attempts: u32,
}

/// The decision for one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Recipients (indices) that go on, with the filter's changes.
    pub pass: Vec<usize>,
    /// Set when the passing recipients are held for an operator instead: the reason.
    pub hold: Option<String>,
    /// Recipients that wait, with the reply that deferred each.
    pub defer: Vec<(usize, SmtpReply)>,
    /// Recipients returned to the sender, each with its failure.
    pub refuse: Vec<(usize, Failure)>,
    /// Recipients dropped without a notice.
    pub discard: Vec<usize>,
    /// When the waiting recipients are asked about again.
    pub retry_after: Duration,
}

/// A filter's refusal as a bounce's failure.
pub fn failure(reply: &SmtpReply, filter: &str) -> Failure {
    Failure {
        diagnostic: format!("refused by the content filter {filter}: {reply}"),
        enhanced_status: Some(reply.enhanced.clone()),
        smtp_code: Some(reply.code),
        remote_mta: None,
        reply_text: Some(reply.to_string()),
        phase: Some("milter".into()),
    }
}

/// Decides the pass, for a filter named `filter` (for diagnostics).
pub fn decide(conv: &Conversation, facts: Facts, policy: &RetryPolicy, filter: &str) -> Decision {
    let expired = facts.age >= policy.max_lifetime;
    let mut d = Decision {
        pass: Vec::new(),
        hold: None,
        defer: Vec::new(),
        refuse: Vec::new(),
        discard: Vec::new(),
        retry_after: Duration::ZERO,
    };
    let wait = |d: &mut Decision, i: usize, reply: &SmtpReply| {
        if expired {
            let mut f = failure(reply, filter);
            f.diagnostic = format!(
                "the content filter {filter} deferred the message until its MAX_LIFETIME \
                 ({}s) passed; last reply: {reply}",
                policy.max_lifetime.as_secs()
            );
            f.enhanced_status = Some("4.4.7".into());
            d.refuse.push((i, f));
        } else {
            d.defer.push((i, reply.clone()));
        }
    };
    for (i, answer) in conv.rcpts.iter().enumerate() {
        match (answer, &conv.verdict) {
            (RcptAnswer::Refused(r), _) => d.refuse.push((i, failure(r, filter))),
            (RcptAnswer::Deferred(r), _) => wait(&mut d, i, r),
            (RcptAnswer::Accepted, Verdict::Accept) => d.pass.push(i),
            (RcptAnswer::Accepted, Verdict::Reject(r)) => d.refuse.push((i, failure(r, filter))),
            (RcptAnswer::Accepted, Verdict::Tempfail(r)) => wait(&mut d, i, r),
            (RcptAnswer::Accepted, Verdict::Discard) => d.discard.push(i),
        }
    }
    if !d.pass.is_empty() {
        d.hold = conv.edits.quarantine.clone();
    }
    if !d.defer.is_empty() {
        let left = policy
            .max_lifetime
            .saturating_sub(facts.age)
            .max(Duration::from_secs(1));
        d.retry_after = policy.backoff(facts.attempts + 1).min(left);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(text: &str) -> SmtpReply {
        SmtpReply::parse(text)
    }

    fn conv(rcpts: Vec<RcptAnswer>, verdict: Verdict, quarantine: Option<&str>) -> Conversation {
        Conversation {
            rcpts,
            verdict,
            edits: Edits {
                quarantine: quarantine.map(str::to_owned),
                ..Edits::default()
            },
            leading_space: false,
        }
    }

    /// (pass, hold, defer, refuse statuses, discard)
    type Shape = (
        Vec<usize>,
        bool,
        Vec<usize>,
        Vec<(usize, String)>,
        Vec<usize>,
    );

    fn shape(d: &Decision) -> Shape {
        (
            d.pass.clone(),
            d.hold.is_some(),
            d.defer.iter().map(|(i, _)| *i).collect(),
            d.refuse
                .iter()
                .map(|(i, f)| (*i, f.enhanced_status.clone().unwrap()))
                .collect(),
            d.discard.clone(),
        )
    }

    #[test]
    fn decisions_as_a_table() {
        use RcptAnswer::*;
        let deny = reply("550 5.1.1 no such user");
        let later = reply("451 4.7.1 greylisted");
        let spam = reply("554 5.7.1 spam");
        let young = Facts {
            age: Duration::from_secs(60),
            attempts: 0,
        };
        let old = Facts {
            age: Duration::from_secs(6 * 86400),
            attempts: 9,
        };
        let mixed = vec![Accepted, Refused(deny.clone()), Deferred(later.clone())];
        let cases: Vec<(Conversation, Facts, Shape)> = vec![
            (
                conv(mixed.clone(), Verdict::Accept, None),
                young,
                (vec![0], false, vec![2], vec![(1, "5.1.1".into())], vec![]),
            ),
            (
                conv(mixed.clone(), Verdict::Accept, Some("held")),
                young,
                (vec![0], true, vec![2], vec![(1, "5.1.1".into())], vec![]),
            ),
            (
                conv(mixed.clone(), Verdict::Reject(spam.clone()), None),
                young,
                (
                    vec![],
                    false,
                    vec![2],
                    vec![(0, "5.7.1".into()), (1, "5.1.1".into())],
                    vec![],
                ),
            ),
            (
                conv(mixed.clone(), Verdict::Tempfail(later.clone()), None),
                young,
                (vec![], false, vec![0, 2], vec![(1, "5.1.1".into())], vec![]),
            ),
            (
                conv(mixed.clone(), Verdict::Discard, None),
                young,
                (vec![], false, vec![2], vec![(1, "5.1.1".into())], vec![0]),
            ),
            (
                conv(mixed, Verdict::Tempfail(later), Some("ignored")),
                old,
                (
                    vec![],
                    false,
                    vec![],
                    vec![
                        (0, "4.4.7".into()),
                        (1, "5.1.1".into()),
                        (2, "4.4.7".into()),
                    ],
                    vec![],
                ),
            ),
        ];
        let policy = RetryPolicy::default();
        for (c, facts, want) in cases {
            let d = decide(&c, facts, &policy, "spamd");
            assert_eq!(shape(&d), want, "{c:?}");
            assert_eq!(d.retry_after.is_zero(), d.defer.is_empty());
        }
    }

    #[test]
    fn waits_grow_and_never_pass_the_lifetime() {
        let policy = RetryPolicy {
            initial: Duration::from_secs(60),
            max_lifetime: Duration::from_secs(1000),
            ..RetryPolicy::default()
        };
        let c = conv(
            vec![RcptAnswer::Accepted],
            Verdict::Tempfail(SmtpReply::tempfailed()),
            None,
        );
        let after = |age: u64, attempts: u32| {
            decide(
                &c,
                Facts {
                    age: Duration::from_secs(age),
                    attempts,
                },
                &policy,
                "f",
            )
            .retry_after
            .as_secs()
        };
        assert_eq!(after(0, 0), 60);
        assert_eq!(after(0, 1), 120);
        assert_eq!(after(900, 3), 100, "capped at the lifetime left");
    }

    #[test]
    fn a_filter_that_is_down_defers_everyone_or_lets_everyone_pass() {
        let why = Unavailable("connection refused".into());
        let down = fallback(DownAction::Tempfail, &[None, None], "spamd", &why);
        let d = decide(
            &down,
            Facts {
                age: Duration::ZERO,
                attempts: 0,
            },
            &RetryPolicy::default(),
            "spamd",
        );
        assert_eq!(d.defer.len(), 2);
        assert!(d.defer[0].1.text.contains("connection refused"));
        let refused = RcptAnswer::Refused(SmtpReply::rejected());
        let open = fallback(
            DownAction::Pass,
            &[None, Some(refused.clone())],
            "spamd",
            &why,
        );
        assert_eq!(
            open.rcpts,
            vec![RcptAnswer::Accepted, refused],
            "a recipient refused before the filter failed stays refused"
        );
        assert_eq!(DownAction::parse(" Tempfail "), Ok(DownAction::Tempfail));
        assert!(DownAction::parse("reject").is_err());
    }
}
