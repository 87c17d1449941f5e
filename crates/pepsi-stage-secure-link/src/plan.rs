//! Which recipients of a message are reached by secure link, decided from facts gathered
//! beforehand: who sent it and whether they asked, what the row's state says, and for each
//! recipient whether it is external and what its domain's policy is. Pure; tested as a
//! table.

use pepsi_contract::state::SecureLinkReason as Reason;
use pepsi_secure_link::policy::Mode;

/// The facts about the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Message {
    /// A notice or receipt this stage made (`state.secure_link.made`).
    pub made: bool,
    /// `state.secure_link.reason`: the encrypt stage's fallback, or this stage's own
    /// decision recorded when it split the row.
    pub reason: Option<Reason>,
    /// The sender asked: the control header says yes, or the subject carries the tag.
    pub asked: bool,
    /// The message came from an authenticated sender (SMTP AUTH, or a local submission).
    pub authenticated: bool,
    /// The envelope sender is null: there is nobody to give the links to.
    pub null_sender: bool,
    /// The message is larger than a link may keep (`store::MAX_MESSAGE`).
    pub too_large: bool,
}

/// The facts about one recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recipient {
    /// Not in one of our domains (`pepsi_contract::local`).
    pub external: bool,
    /// The mode of the policy row that decides for it (`policy::Policies::resolve`).
    pub policy: Option<Mode>,
}

/// What happens to one recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The message goes on to it as it is (the control header removed).
    Pass(Pass),
    /// It gets a notice with a link; the message is kept sealed.
    Secure(Reason),
    /// The message is returned to the sender for it.
    Return(Return),
}

/// Why a recipient gets the message as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Nobody asked and no policy says so.
    NotAsked,
    /// A mail this stage made.
    Made,
    /// One of our own domains: the message never leaves this server for it.
    Local,
    /// A `never` policy, though the sender asked.
    Never,
    /// The sender asked without authenticating: not honoured.
    Unauthenticated,
    /// A policy said so, but the sender is null: there is nobody to give the links to.
    NullSender,
}

/// Why a recipient's copy is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Return {
    /// The encrypt stage's fallback, and no link can be made for it (a local recipient, a
    /// `never` policy, a policy that no longer allows the fallback): encryption is required
    /// and there is no key, as the encrypt stage would have said (5.7.5).
    NoKey,
    /// A link was due but the message is too large to keep (5.3.4).
    TooLarge,
}

impl Return {
    /// The RFC 3463 status of the bounce.
    pub fn status(self) -> &'static str {
        match self {
            Return::NoKey => "5.7.5",
            Return::TooLarge => "5.3.4",
        }
    }
}

/// Decides for each recipient, in order.
pub fn decide(message: &Message, recipients: &[Recipient]) -> Vec<Decision> {
    recipients.iter().map(|r| one(message, r)).collect()
}

fn one(m: &Message, r: &Recipient) -> Decision {
    if m.made {
        return Decision::Pass(Pass::Made);
    }
    let secure = |reason| {
        if m.too_large {
            Decision::Return(Return::TooLarge)
        } else {
            Decision::Secure(reason)
        }
    };
    if m.reason == Some(Reason::EncryptFallback) {
        // Encryption is required and there is no key: a link, or returned; never in the
        // clear.
        let allowed = r.external && !m.null_sender && r.policy.is_some_and(Mode::allows_fallback);
        return match allowed {
            true => secure(Reason::EncryptFallback),
            false => Decision::Return(Return::NoKey),
        };
    }
    if !r.external {
        return Decision::Pass(Pass::Local);
    }
    let asked_by_sender = m.asked && m.authenticated;
    let due = m.reason.is_some() || asked_by_sender || r.policy == Some(Mode::Always);
    if !due {
        return Decision::Pass(match m.asked {
            true => Pass::Unauthenticated,
            false => Pass::NotAsked,
        });
    }
    if r.policy == Some(Mode::Never) {
        return Decision::Pass(Pass::Never);
    }
    if m.null_sender {
        return Decision::Pass(Pass::NullSender);
    }
    secure(match m.reason {
        Some(reason) => reason,
        None if asked_by_sender => Reason::Asked,
        None => Reason::Policy,
    })
}

/// The recipients of each kind, by index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub pass: Vec<usize>,
    pub secure: Vec<usize>,
    pub returned: Vec<(usize, Return)>,
}

impl Split {
    pub fn of(decisions: &[Decision]) -> Split {
        let mut s = Split::default();
        for (i, d) in decisions.iter().enumerate() {
            match d {
                Decision::Pass(_) => s.pass.push(i),
                Decision::Secure(_) => s.secure.push(i),
                Decision::Return(why) => s.returned.push((i, *why)),
            }
        }
        s
    }

    /// The reason recorded on a row split off to be secured: the first secured
    /// recipient's.
    pub fn reason(&self, decisions: &[Decision]) -> Option<Reason> {
        self.secure.iter().find_map(|i| match decisions[*i] {
            Decision::Secure(r) => Some(r),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::*;

    const EXT: Recipient = Recipient {
        external: true,
        policy: None,
    };
    const LOCAL: Recipient = Recipient {
        external: false,
        policy: None,
    };

    fn ext(policy: Mode) -> Recipient {
        Recipient {
            external: true,
            policy: Some(policy),
        }
    }

    fn local(policy: Mode) -> Recipient {
        Recipient {
            external: false,
            policy: Some(policy),
        }
    }

    #[test]
    fn decisions_as_a_table() {
        let plain = Message::default();
        let asked = Message {
            asked: true,
            authenticated: true,
            ..plain
        };
        let stranger = Message {
            asked: true,
            ..plain
        };
        let fallback = Message {
            reason: Some(Reason::EncryptFallback),
            ..plain
        };
        let split_asked = Message {
            reason: Some(Reason::Asked),
            ..plain
        };
        let made = Message {
            made: true,
            asked: true,
            authenticated: true,
            ..plain
        };
        let null = Message {
            null_sender: true,
            ..plain
        };
        let big = Message {
            too_large: true,
            ..asked
        };
        use Mode::*;
        let cases: Vec<(&str, Message, Recipient, Decision)> = vec![
            (
                "untagged mail passes",
                plain,
                EXT,
                Pass(super::Pass::NotAsked),
            ),
            (
                "a fallback policy alone does nothing",
                plain,
                ext(Fallback),
                Pass(super::Pass::NotAsked),
            ),
            (
                "always secures untagged mail",
                plain,
                ext(Always),
                Secure(Reason::Policy),
            ),
            (
                "asked by an authenticated sender",
                asked,
                EXT,
                Secure(Reason::Asked),
            ),
            (
                "asked, fallback policy: the ask counts",
                asked,
                ext(Fallback),
                Secure(Reason::Asked),
            ),
            (
                "asked and always",
                asked,
                ext(Always),
                Secure(Reason::Asked),
            ),
            (
                "never wins over the ask",
                asked,
                ext(Never),
                Pass(super::Pass::Never),
            ),
            (
                "local recipients keep the original",
                asked,
                LOCAL,
                Pass(super::Pass::Local),
            ),
            (
                "an always policy is for external recipients",
                plain,
                local(Always),
                Pass(super::Pass::Local),
            ),
            (
                "the tag from a stranger is ignored",
                stranger,
                EXT,
                Pass(super::Pass::Unauthenticated),
            ),
            (
                "a stranger to an always domain is secured",
                stranger,
                ext(Always),
                Secure(Reason::Policy),
            ),
            (
                "the encrypt fallback, allowed",
                fallback,
                ext(Fallback),
                Secure(Reason::EncryptFallback),
            ),
            (
                "the encrypt fallback, always",
                fallback,
                ext(Always),
                Secure(Reason::EncryptFallback),
            ),
            (
                "the encrypt fallback, never: returned",
                fallback,
                ext(Never),
                Return(super::Return::NoKey),
            ),
            (
                "the encrypt fallback, no policy left: returned",
                fallback,
                EXT,
                Return(super::Return::NoKey),
            ),
            (
                "the encrypt fallback, local: returned",
                fallback,
                local(Fallback),
                Return(super::Return::NoKey),
            ),
            (
                "a row split to be secured is secured",
                split_asked,
                EXT,
                Secure(Reason::Asked),
            ),
            (
                "a row split to be secured, now never",
                split_asked,
                ext(Never),
                Pass(super::Pass::Never),
            ),
            (
                "a notice is never secured again",
                made,
                ext(Always),
                Pass(super::Pass::Made),
            ),
            (
                "the null sender gets no link",
                null,
                ext(Always),
                Pass(super::Pass::NullSender),
            ),
            (
                "too large to keep: returned",
                big,
                EXT,
                Return(super::Return::TooLarge),
            ),
            (
                "too large but not due: passes",
                Message {
                    too_large: true,
                    ..plain
                },
                EXT,
                Pass(super::Pass::NotAsked),
            ),
        ];
        for (what, message, recipient, want) in cases {
            assert_eq!(decide(&message, &[recipient]), vec![want], "{what}");
        }
    }

    #[test]
    fn a_message_splits_by_decision() {
        let asked = Message {
            asked: true,
            authenticated: true,
            ..Message::default()
        };
        let d = decide(&asked, &[LOCAL, EXT, ext(Mode::Never), EXT]);
        let s = Split::of(&d);
        assert_eq!(
            s,
            Split {
                pass: vec![0, 2],
                secure: vec![1, 3],
                returned: vec![]
            }
        );
        assert_eq!(s.reason(&d), Some(Reason::Asked));
        let fallback = Message {
            reason: Some(Reason::EncryptFallback),
            ..Message::default()
        };
        let d = decide(&fallback, &[ext(Mode::Fallback), LOCAL]);
        assert_eq!(
            Split::of(&d),
            Split {
                pass: vec![],
                secure: vec![0],
                returned: vec![(1, super::Return::NoKey)]
            }
        );
        assert_eq!(super::Return::NoKey.status(), "5.7.5");
        assert_eq!(super::Return::TooLarge.status(), "5.3.4");
    }
}
