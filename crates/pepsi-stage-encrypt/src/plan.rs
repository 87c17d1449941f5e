//! What the encrypt stage does with one message, decided from facts gathered beforehand:
//! the policy, which scheme each recipient can be encrypted to, and where key discovery
//! stands for those without a key. Pure; tested as tables.

use pepsi_crypto::Scheme;

/// `POLICY` and the `encrypt` setting: whether mail must, may or must not leave encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Policy {
    /// Never encrypted here.
    Off,
    /// Encrypted when every recipient has a usable key; sent as it is otherwise.
    Opportunistic,
    /// Encrypted, or not sent: a recipient without a key waits for key discovery and is
    /// returned to the sender when discovery settles without one.
    Required,
}

impl Policy {
    pub fn parse(text: &str) -> Result<Policy, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "off" | "no" => Ok(Policy::Off),
            "opportunistic" => Ok(Policy::Opportunistic),
            "required" | "yes" => Ok(Policy::Required),
            other => Err(format!(
                "{other:?} is not one of off, opportunistic, required"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Off => "off",
            Policy::Opportunistic => "opportunistic",
            Policy::Required => "required",
        }
    }
}

/// The policy of a message: the sender's own (its address's setting, else its domain's,
/// else the stage's POLICY), raised to `required` by any recipient whose own setting
/// requires encryption. A recipient's `off` or `opportunistic` does not lower the sender's.
pub fn message_policy(sender: Policy, recipients: &[Option<Policy>]) -> Policy {
    if recipients.contains(&Some(Policy::Required)) {
        Policy::Required
    } else {
        sender
    }
}

/// Where key discovery stands for an address (`pepsi.crypto_request_key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discovery {
    /// Asked, not settled yet.
    Pending,
    /// Settled without a key; the negative answer is still cached.
    NoKey,
    /// Settled with a key that cannot be used (expired, revoked, of a scheme PREFER
    /// leaves out).
    Unusable,
    /// Discovery is not used (`DISCOVERY = no`).
    Off,
}

/// The facts about one recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipient {
    /// The scheme its chosen key is for; None when it has no usable key.
    pub scheme: Option<Scheme>,
    /// For a recipient without a key under `required`: where discovery stands.
    pub discovery: Option<Discovery>,
    /// Not named in To or Cc (a Bcc): encrypted on a row of its own, so that the key ids in
    /// the ciphertext do not tell the others it received the message.
    pub hidden: bool,
    /// Refused for want of a key, it goes to SECURE_LINK_STAGE instead: the stage is set,
    /// the secure-link policy of its domain or the sender's says `fallback` or `always`,
    /// and the message has not fallen back before.
    pub fallback: bool,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Recipients returned to the sender (indices), with why.
    pub refuse: Vec<(usize, Refusal)>,
    /// Recipients that would be refused but go to SECURE_LINK_STAGE (indices), to be
    /// reached by a secure link instead.
    pub secure_link: Vec<usize>,
    /// What happens to the others.
    pub then: Then,
}

/// Why a recipient is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Discovery settled without a key (or is off).
    NoKey,
    /// Discovery did not settle within DISCOVERY_TIMEOUT.
    DiscoveryTimedOut,
    /// Discovery found a key that cannot be used.
    UnusableKey,
}

/// What happens to the recipients not refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Then {
    /// Nothing left: every recipient was refused or goes to a secure link.
    Nothing,
    /// On as it is.
    Plain,
    /// Encrypted to every remaining recipient with this scheme.
    Encrypt(Scheme),
    /// The remaining recipients need different schemes, or some are hidden: the first group
    /// stays on this row, each other group becomes a row of its own at this stage (each
    /// then encrypts).
    Split(Vec<Vec<usize>>),
    /// Parked until discovery settles for these addresses' recipients (indices).
    Park(Vec<usize>),
}

/// Decides. `timed_out`: the message has waited for discovery longer than
/// DISCOVERY_TIMEOUT.
pub fn plan(policy: Policy, recipients: &[Recipient], timed_out: bool) -> Plan {
    let mut refuse = Vec::new();
    let mut waiting = Vec::new();
    let mut keyed = Vec::new();
    let mut secure_link = Vec::new();
    for (i, r) in recipients.iter().enumerate() {
        let mut refused = |why| match r.fallback {
            true => secure_link.push(i),
            false => refuse.push((i, why)),
        };
        match (r.scheme, policy) {
            (Some(s), _) => keyed.push((i, s)),
            (None, Policy::Required) => match r.discovery.unwrap_or(Discovery::Off) {
                Discovery::Pending if timed_out => refused(Refusal::DiscoveryTimedOut),
                Discovery::Pending => waiting.push(i),
                Discovery::NoKey | Discovery::Off => refused(Refusal::NoKey),
                Discovery::Unusable => refused(Refusal::UnusableKey),
            },
            (None, _) => waiting.push(i),
        }
    }
    let then = match policy {
        Policy::Off => {
            return Plan {
                refuse: Vec::new(),
                secure_link: Vec::new(),
                then: Then::Plain,
            };
        }
        Policy::Opportunistic if !waiting.is_empty() => Then::Plain,
        Policy::Required if !waiting.is_empty() => {
            // The whole message waits: what has a key now is encrypted when the rest does.
            let mut all = waiting;
            all.extend(keyed.iter().map(|(i, _)| *i));
            all.sort_unstable();
            Then::Park(all)
        }
        _ if keyed.is_empty() => Then::Nothing,
        _ => {
            let mut groups: Vec<(Scheme, Vec<usize>)> = Vec::new();
            let mut hidden = Vec::new();
            for (i, s) in keyed {
                if recipients[i].hidden {
                    hidden.push((s, vec![i]));
                    continue;
                }
                match groups.iter_mut().find(|(g, _)| *g == s) {
                    Some((_, v)) => v.push(i),
                    None => groups.push((s, vec![i])),
                }
            }
            groups.extend(hidden);
            if groups.len() == 1 {
                Then::Encrypt(groups[0].0)
            } else {
                Then::Split(groups.into_iter().map(|(_, v)| v).collect())
            }
        }
    };
    Plan {
        refuse,
        secure_link,
        then,
    }
}

/// Of the schemes a recipient has a usable key for, the one to use: the first of
/// `prefer` that it has.
pub fn choose(available: &[Scheme], prefer: &[Scheme]) -> Option<Scheme> {
    prefer.iter().copied().find(|s| available.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Discovery::*;
    use Scheme::*;

    fn r(scheme: Option<Scheme>, discovery: Option<Discovery>) -> Recipient {
        Recipient {
            scheme,
            discovery,
            hidden: false,
            fallback: false,
        }
    }

    /// The recipient `r` with a secure-link fallback allowed.
    fn fb(r: &Recipient) -> Recipient {
        Recipient {
            fallback: true,
            ..r.clone()
        }
    }

    #[test]
    fn plans_as_a_table() {
        let pgp = r(Some(OpenPgp), None);
        let smime = r(Some(Smime), None);
        let none = r(None, None);
        let pending = r(None, Some(Pending));
        let nokey = r(None, Some(NoKey));
        let off = r(None, Some(Off));
        let unusable = r(None, Some(Unusable));
        let bcc = Recipient {
            hidden: true,
            ..pgp.clone()
        };
        type Case = (Policy, Vec<Recipient>, bool, Vec<(usize, Refusal)>, Then);
        let cases: Vec<Case> = vec![
            (Policy::Off, vec![pgp.clone()], false, vec![], Then::Plain),
            (
                Policy::Off,
                vec![pending.clone()],
                false,
                vec![],
                Then::Plain,
            ),
            (
                Policy::Opportunistic,
                vec![pgp.clone(), pgp.clone()],
                false,
                vec![],
                Then::Encrypt(OpenPgp),
            ),
            (
                Policy::Opportunistic,
                vec![pgp.clone(), none.clone()],
                false,
                vec![],
                Then::Plain,
            ),
            (
                Policy::Opportunistic,
                vec![smime.clone()],
                false,
                vec![],
                Then::Encrypt(Smime),
            ),
            (
                Policy::Opportunistic,
                vec![pgp.clone(), smime.clone(), pgp.clone()],
                false,
                vec![],
                Then::Split(vec![vec![0, 2], vec![1]]),
            ),
            (
                Policy::Required,
                vec![pgp.clone(), pending.clone()],
                false,
                vec![],
                Then::Park(vec![0, 1]),
            ),
            (
                Policy::Required,
                vec![pgp.clone(), pending.clone()],
                true,
                vec![(1, Refusal::DiscoveryTimedOut)],
                Then::Encrypt(OpenPgp),
            ),
            (
                Policy::Required,
                vec![nokey.clone(), pgp.clone()],
                false,
                vec![(0, Refusal::NoKey)],
                Then::Encrypt(OpenPgp),
            ),
            (
                Policy::Required,
                vec![off.clone()],
                false,
                vec![(0, Refusal::NoKey)],
                Then::Nothing,
            ),
            (
                Policy::Required,
                vec![unusable.clone(), pgp.clone()],
                false,
                vec![(0, Refusal::UnusableKey)],
                Then::Encrypt(OpenPgp),
            ),
            // A Bcc recipient gets a ciphertext of its own, even of the same scheme.
            (
                Policy::Opportunistic,
                vec![pgp.clone(), bcc.clone(), pgp.clone(), bcc.clone()],
                false,
                vec![],
                Then::Split(vec![vec![0, 2], vec![1], vec![3]]),
            ),
            (
                Policy::Opportunistic,
                vec![bcc.clone()],
                false,
                vec![],
                Then::Encrypt(OpenPgp),
            ),
            (
                Policy::Required,
                vec![nokey.clone(), pending.clone()],
                false,
                vec![(0, Refusal::NoKey)],
                Then::Park(vec![1]),
            ),
        ];
        for (policy, recipients, timed_out, refuse, then) in cases {
            let got = plan(policy, &recipients, timed_out);
            assert_eq!(
                got,
                Plan {
                    refuse,
                    secure_link: Vec::new(),
                    then
                },
                "{policy:?} {recipients:?} timed_out={timed_out}"
            );
        }
    }

    /// SECURE_LINK_STAGE: a recipient that would be refused for want of a key, and whose
    /// policy allows the fallback, goes to the secure-link stage instead; nothing else
    /// changes.
    #[test]
    fn the_secure_link_fallback_as_a_table() {
        let pgp = r(Some(OpenPgp), None);
        let pending = r(None, Some(Pending));
        let nokey = r(None, Some(NoKey));
        let off = r(None, Some(Off));
        let unusable = r(None, Some(Unusable));
        let none = r(None, None);
        type Case = (
            Policy,
            Vec<Recipient>,
            bool,
            Vec<(usize, Refusal)>,
            Vec<usize>,
            Then,
        );
        let cases: Vec<Case> = vec![
            // every recipient without a key: the message goes to the stage whole
            (
                Policy::Required,
                vec![fb(&nokey)],
                false,
                vec![],
                vec![0],
                Then::Nothing,
            ),
            (
                Policy::Required,
                vec![fb(&off)],
                false,
                vec![],
                vec![0],
                Then::Nothing,
            ),
            (
                Policy::Required,
                vec![fb(&unusable)],
                false,
                vec![],
                vec![0],
                Then::Nothing,
            ),
            // one with a key, one to the stage
            (
                Policy::Required,
                vec![fb(&nokey), pgp.clone()],
                false,
                vec![],
                vec![0],
                Then::Encrypt(OpenPgp),
            ),
            // the fallback allowed for one recipient only: the other is still returned
            (
                Policy::Required,
                vec![fb(&nokey), nokey.clone(), pgp.clone()],
                false,
                vec![(1, Refusal::NoKey)],
                vec![0],
                Then::Encrypt(OpenPgp),
            ),
            // discovery still pending: the message waits; timed out: the fallback
            (
                Policy::Required,
                vec![fb(&pending), pgp.clone()],
                false,
                vec![],
                vec![],
                Then::Park(vec![0, 1]),
            ),
            (
                Policy::Required,
                vec![fb(&pending), pgp.clone()],
                true,
                vec![],
                vec![0],
                Then::Encrypt(OpenPgp),
            ),
            (
                Policy::Required,
                vec![fb(&nokey), pending.clone()],
                false,
                vec![],
                vec![0],
                Then::Park(vec![1]),
            ),
            // not required: nothing is refused, so nothing falls back
            (
                Policy::Opportunistic,
                vec![fb(&none), pgp.clone()],
                false,
                vec![],
                vec![],
                Then::Plain,
            ),
            (
                Policy::Off,
                vec![fb(&nokey)],
                false,
                vec![],
                vec![],
                Then::Plain,
            ),
            // a key found: encrypted, whatever the policy allows
            (
                Policy::Required,
                vec![fb(&pgp)],
                false,
                vec![],
                vec![],
                Then::Encrypt(OpenPgp),
            ),
        ];
        for (policy, recipients, timed_out, refuse, secure_link, then) in cases {
            let got = plan(policy, &recipients, timed_out);
            assert_eq!(
                got,
                Plan {
                    refuse,
                    secure_link,
                    then
                },
                "{policy:?} {recipients:?} timed_out={timed_out}"
            );
        }
    }

    #[test]
    fn a_recipient_can_only_raise_the_policy() {
        use Policy::*;
        assert_eq!(
            message_policy(Opportunistic, &[None, Some(Required)]),
            Required
        );
        assert_eq!(message_policy(Required, &[Some(Off)]), Required);
        assert_eq!(message_policy(Opportunistic, &[Some(Off)]), Opportunistic);
        assert_eq!(message_policy(Off, &[]), Off);
        assert_eq!(Policy::parse(" Required ").unwrap(), Required);
        assert!(Policy::parse("maybe").unwrap_err().contains("maybe"));
        assert_eq!(choose(&[Smime, OpenPgp], &[OpenPgp, Smime]), Some(OpenPgp));
        assert_eq!(choose(&[Smime], &[OpenPgp]), None);
    }
}
