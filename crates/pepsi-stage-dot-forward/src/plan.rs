//! What a pass does with a message, from its recipients' `.forward` files: pure, no I/O.
//!
//! A forward is applied to one recipient at a time, on a row of its own, because its
//! `Delivered-To` field (the loop guard every forwarding hop adds) must be in that
//! recipient's copies only: a row with several recipients of which some forward is split
//! first, each forwarding recipient onto its own row at this stage.

use pepsi_common::local::address_key;
use pepsi_common::state::{Dsn, DsnRcpt};

use crate::forward_file::Forward;

/// The pass's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No recipient forwards: the message goes on unchanged.
    Advance,
    /// Several recipients, some forwarding: each of `alone` moves to a row of its own at this
    /// stage (decided there), this row keeps `keep` and is planned again.
    Split { keep: Vec<usize>, alone: Vec<usize> },
    /// The one recipient forwards, but this message was delivered to it before (its
    /// address is in a `Delivered-To` field): a forwarding loop, bounced with 5.4.6.
    Loop,
    /// The one recipient forwards: the message goes to `rcpt_to` instead, of which `kept`
    /// are the `\name` copies that stay here and are not forwarded again.
    Forward {
        rcpt_to: Vec<String>,
        kept: Vec<String>,
    },
}

/// The plan for a row with `rcpts`, where `forwards[i]` is recipient i's effective
/// `.forward` (`None`: none, not read, or one that changes nothing), and `delivered_to` the
/// message's `Delivered-To` values.
pub fn plan(rcpts: &[String], forwards: &[Option<Forward>], delivered_to: &[String]) -> Plan {
    let forwarding: Vec<usize> = (0..rcpts.len())
        .filter(|&i| forwards.get(i).is_some_and(Option::is_some))
        .collect();
    let Some(&first) = forwarding.first() else {
        return Plan::Advance;
    };
    if rcpts.len() > 1 {
        let others: Vec<usize> = (0..rcpts.len())
            .filter(|i| !forwarding.contains(i))
            .collect();
        return if others.is_empty() {
            Plan::Split {
                keep: vec![first],
                alone: forwarding[1..].to_vec(),
            }
        } else {
            Plan::Split {
                keep: others,
                alone: forwarding,
            }
        };
    }
    let me = address_key(&rcpts[0]);
    if delivered_to.iter().any(|d| address_key(d) == me) {
        return Plan::Loop;
    }
    let f = forwards[0].as_ref().expect("forwarding[0] is 0");
    let mut rcpt_to: Vec<String> = Vec::new();
    for a in f.targets.iter().chain(&f.keep) {
        if !rcpt_to.iter().any(|r| address_key(r) == address_key(a)) {
            rcpt_to.push(a.clone());
        }
    }
    Plan::Forward {
        rcpt_to,
        kept: f.keep.clone(),
    }
}

/// `state.dsn` for the forwarded copies of `source` (the row's one recipient, whose entry is
/// `dsn.rcpt[0]`): every new recipient asks for the notices the source asked for, and its
/// ORCPT names the original recipient (the source's own ORCPT, else `rfc822;<source>`), as
/// RFC 3461 §6.2 wants of a forwarding MTA.
pub fn forwarded_dsn(dsn: Option<Dsn>, source: &str, count: usize) -> Dsn {
    let dsn = dsn.unwrap_or_default();
    let from = dsn.rcpt(0).cloned().unwrap_or_default();
    let entry = DsnRcpt {
        orcpt: Some(
            from.orcpt
                .clone()
                .unwrap_or_else(|| format!("rfc822;{source}")),
        ),
        ..from
    };
    Dsn {
        rcpt: vec![entry; count],
        ..dsn
    }
}

/// The header block with a `Delivered-To` field for `recipient` in front: the loop guard
/// that every copy forwarded on its behalf carries.
pub fn with_delivered_to(headers: &[u8], recipient: &str) -> Vec<u8> {
    let mut out = format!("Delivered-To: {recipient}\r\n").into_bytes();
    out.extend_from_slice(headers);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fwd(targets: &[&str], keep: &[&str]) -> Option<Forward> {
        Some(Forward {
            targets: targets.iter().map(|s| s.to_string()).collect(),
            keep: keep.iter().map(|s| s.to_string()).collect(),
            ignored: Vec::new(),
        })
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// Recipients, their forwards, the Delivered-To values, and the plan wanted.
    type Case = (Vec<String>, Vec<Option<Forward>>, Vec<String>, Plan);

    #[test]
    fn plans_table() {
        let a = "alice@example.test";
        let b = "bob@example.test";
        let cases: Vec<Case> = vec![
            (s(&[a]), vec![None], s(&[]), Plan::Advance),
            (s(&[a, b]), vec![None, None], s(&[]), Plan::Advance),
            (
                s(&[a]),
                vec![fwd(&["x@example.org"], &[])],
                s(&[]),
                Plan::Forward {
                    rcpt_to: s(&["x@example.org"]),
                    kept: s(&[]),
                },
            ),
            (
                s(&[a]),
                vec![fwd(&["x@example.org", "y@example.org"], &[a])],
                s(&["carol@example.net"]),
                Plan::Forward {
                    rcpt_to: s(&["x@example.org", "y@example.org", a]),
                    kept: s(&[a]),
                },
            ),
            // Delivered to alice before, in any letter case: a loop.
            (
                s(&[a]),
                vec![fwd(&["x@example.org"], &[])],
                s(&["Alice@Example.TEST"]),
                Plan::Loop,
            ),
            // Another recipient's Delivered-To is no loop for alice.
            (
                s(&[a]),
                vec![fwd(&["x@example.org"], &[])],
                s(&[b]),
                Plan::Forward {
                    rcpt_to: s(&["x@example.org"]),
                    kept: s(&[]),
                },
            ),
            (
                s(&[a, b, "c@example.test"]),
                vec![None, fwd(&["x@example.org"], &[]), None],
                s(&[]),
                Plan::Split {
                    keep: vec![0, 2],
                    alone: vec![1],
                },
            ),
            (
                s(&[a, b]),
                vec![fwd(&["x@example.org"], &[]), fwd(&["y@example.org"], &[])],
                s(&[]),
                Plan::Split {
                    keep: vec![0],
                    alone: vec![1],
                },
            ),
        ];
        for (rcpts, forwards, delivered, want) in cases {
            assert_eq!(
                plan(&rcpts, &forwards, &delivered),
                want,
                "{rcpts:?} {forwards:?} {delivered:?}"
            );
        }
    }

    #[test]
    fn forwarded_copies_carry_the_original_recipient() {
        let dsn = Dsn {
            rcpt: vec![DsnRcpt {
                notify: Some(vec!["FAILURE".into()]),
                orcpt: None,
                ..Default::default()
            }],
            envid: Some("E1".into()),
            ..Default::default()
        };
        let d = forwarded_dsn(Some(dsn), "alice@example.test", 2);
        assert_eq!(d.envid.as_deref(), Some("E1"));
        assert_eq!(d.rcpt.len(), 2);
        for r in &d.rcpt {
            assert_eq!(r.orcpt.as_deref(), Some("rfc822;alice@example.test"));
            assert!(r.notify_includes("FAILURE"));
        }
        let own = Dsn {
            rcpt: vec![DsnRcpt {
                orcpt: Some("rfc822;first@example.org".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let d = forwarded_dsn(Some(own), "alice@example.test", 1);
        assert_eq!(d.rcpt[0].orcpt.as_deref(), Some("rfc822;first@example.org"));
        assert_eq!(forwarded_dsn(None, "a@b.c", 3).rcpt.len(), 3);
    }

    #[test]
    fn the_loop_guard_goes_first() {
        assert_eq!(
            with_delivered_to(b"Subject: x\r\n", "alice@example.test"),
            b"Delivered-To: alice@example.test\r\nSubject: x\r\n"
        );
    }
}
