//! What a pass does with a message, from its recipients' `.forward` files: pure, no I/O.
//!
//! A forward is applied to one recipient at a time, on a row of its own, because its
//! `Delivered-To` field (the loop guard every forwarding hop adds) must be in that
//! recipient's copies only: a row with several recipients of which some forward is split
//! first, each forwarding recipient onto its own row at this stage.
//!
//! Loops are found by *key*, not by address: the stage gives every address the name of the
//! system account it reaches (extension and domain aside), so `alice+1@` and `alice@other`
//! are the same recipient here, a file naming its own account keeps a copy instead of
//! forwarding to itself, and no set of addresses of one account can multiply a message.

use pepsi_contract::state::{Dsn, DsnRcpt};

use crate::forward_file::Forward;

/// The pass's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No recipient forwards: the message goes on unchanged.
    Advance,
    /// Several recipients, some forwarding: each of `alone` moves to a row of its own at this
    /// stage (decided there), this row keeps the others and is planned again.
    Split { alone: Vec<usize> },
    /// The one recipient forwards, but this message was forwarded on its behalf before (its
    /// key is a `Delivered-To` field's): a forwarding loop, bounced with 5.4.6.
    Loop,
    /// The one recipient forwards, but the message has been forwarded `MAX_HOPS` times
    /// already: bounced with 5.4.6 too.
    TooManyHops,
    /// The one recipient forwards: the message goes to `rcpt_to` instead, of which `kept`
    /// are the `\name` copies that stay here and are not forwarded again.
    Forward {
        rcpt_to: Vec<String>,
        kept: Vec<String>,
    },
}

/// The file `f` of the recipient whose key is `source` as it applies: a target of the same
/// key (the account's own address, with or without an extension) is a kept copy, not a
/// forward to itself; kept copies count once per key. `None` when nothing changes (no
/// target, and no kept copy for another key than the source's).
pub fn effective(f: Forward, source: &str, key: &dyn Fn(&str) -> String) -> Option<Forward> {
    let mut targets = Vec::new();
    let mut keep: Vec<String> = Vec::new();
    let mut kept_keys: Vec<String> = Vec::new();
    let mut add_keep = |a: String, keep: &mut Vec<String>| {
        let k = key(&a);
        if !kept_keys.contains(&k) {
            kept_keys.push(k);
            keep.push(a);
        }
    };
    for a in f.keep {
        add_keep(a, &mut keep);
    }
    for t in f.targets {
        if key(&t) == source {
            add_keep(t, &mut keep);
        } else {
            targets.push(t);
        }
    }
    if targets.is_empty() && keep.iter().all(|k| key(k) == source) {
        return None;
    }
    Some(Forward {
        targets,
        keep,
        ignored: f.ignored,
    })
}

/// The plan for a row whose recipients have the keys `keys`, where `forwards[i]` is
/// recipient i's effective `.forward` (`None`: none, not read, or one that changes nothing),
/// `delivered` the keys of the message's `Delivered-To` fields and `max_hops` the most
/// forwards one message may take.
pub fn plan(
    keys: &[String],
    forwards: &[Option<Forward>],
    delivered: &[String],
    max_hops: usize,
) -> Plan {
    let forwarding: Vec<usize> = (0..keys.len())
        .filter(|&i| forwards.get(i).is_some_and(Option::is_some))
        .collect();
    let Some(&first) = forwarding.first() else {
        return Plan::Advance;
    };
    if keys.len() > 1 {
        // The row keeps the recipients that do not forward, or else the first that does.
        let alone = if forwarding.len() == keys.len() {
            forwarding[1..].to_vec()
        } else {
            forwarding
        };
        return Plan::Split { alone };
    }
    debug_assert_eq!(first, 0);
    if delivered.contains(&keys[0]) {
        return Plan::Loop;
    }
    if delivered.len() >= max_hops {
        return Plan::TooManyHops;
    }
    let f = forwards[0].as_ref().expect("forwarding[0] is 0");
    Plan::Forward {
        rcpt_to: f.targets.iter().chain(&f.keep).cloned().collect(),
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
            targets: s(targets),
            keep: s(keep),
            ignored: Vec::new(),
        })
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// The test's key: the local part before `+`, lower case (every domain one host's).
    fn key(a: &str) -> String {
        let local = a.split('@').next().unwrap_or(a);
        local.split('+').next().unwrap_or(local).to_lowercase()
    }

    #[test]
    fn effective_files_table() {
        let cases: Vec<(Option<Forward>, Option<Forward>)> = vec![
            (fwd(&["x@o.org"], &[]), fwd(&["x@o.org"], &[])),
            // Naming its own account keeps a copy: with an extension, another domain, or
            // twice, it is still one.
            (
                fwd(&["alice+1@d", "x@o.org", "Alice@e"], &["alice@d"]),
                fwd(&["x@o.org"], &["alice@d"]),
            ),
            (fwd(&["alice+1@d", "alice+2@d"], &[]), None),
            (fwd(&[], &["alice@d"]), None),
            (fwd(&[], &["carol@d"]), fwd(&[], &["carol@d"])),
        ];
        for (file, want) in cases {
            let got = effective(file.clone().unwrap(), "alice", &key);
            assert_eq!(got, want, "{file:?}");
        }
    }

    /// Recipients' keys, their forwards, the Delivered-To keys, and the plan wanted.
    type Case = (Vec<String>, Vec<Option<Forward>>, Vec<String>, Plan);

    #[test]
    fn plans_table() {
        let cases: Vec<Case> = vec![
            (s(&["alice"]), vec![None], s(&[]), Plan::Advance),
            (
                s(&["alice", "bob"]),
                vec![None, None],
                s(&[]),
                Plan::Advance,
            ),
            (
                s(&["alice"]),
                vec![fwd(&["x@o.org"], &[])],
                s(&[]),
                Plan::Forward {
                    rcpt_to: s(&["x@o.org"]),
                    kept: s(&[]),
                },
            ),
            (
                s(&["alice"]),
                vec![fwd(&["x@o.org", "y@o.org"], &["alice@d"])],
                s(&["x@o.org"]),
                Plan::Forward {
                    rcpt_to: s(&["x@o.org", "y@o.org", "alice@d"]),
                    kept: s(&["alice@d"]),
                },
            ),
            // Forwarded on alice's behalf before: a loop.
            (
                s(&["alice"]),
                vec![fwd(&["x@o.org"], &[])],
                s(&["bob", "alice"]),
                Plan::Loop,
            ),
            // Another account's Delivered-To is no loop for alice, below the hop limit.
            (
                s(&["alice"]),
                vec![fwd(&["x@o.org"], &[])],
                s(&["bob", "carol"]),
                Plan::Forward {
                    rcpt_to: s(&["x@o.org"]),
                    kept: s(&[]),
                },
            ),
            (
                s(&["alice"]),
                vec![fwd(&["x@o.org"], &[])],
                s(&["b", "c", "d"]),
                Plan::TooManyHops,
            ),
            (
                s(&["alice", "bob", "carol"]),
                vec![None, fwd(&["x@o.org"], &[]), None],
                s(&[]),
                Plan::Split { alone: vec![1] },
            ),
            (
                s(&["alice", "bob"]),
                vec![fwd(&["x@o.org"], &[]), fwd(&["y@o.org"], &[])],
                s(&[]),
                Plan::Split { alone: vec![1] },
            ),
        ];
        for (keys, forwards, delivered, want) in cases {
            assert_eq!(
                plan(&keys, &forwards, &delivered, 3),
                want,
                "{keys:?} {forwards:?} {delivered:?}"
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
