//! Relay control: which recipients a client may give. Pure.
//!
//! Unauthenticated clients reach local domains only; an authenticated client may send
//! anywhere. Everything else is refused at RCPT, so this server is never an open relay.

use pepsi_contract::local::LocalRecipients;

/// What to do with one recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RcptDecision {
    /// A local domain (or `<postmaster>`): accepted, subject to the mailbox check.
    Local,
    /// Another domain, from an authenticated client.
    Relay,
    /// Another domain from an unauthenticated client: 554 5.7.1.
    Refuse,
}

/// Decides for a recipient in `domain` (None for the bare `<postmaster>`) by the configured
/// local domains; the caller asks the settings layer about a domain this refuses or relays.
pub fn decide(domain: Option<&str>, local: &LocalRecipients, authenticated: bool) -> RcptDecision {
    let Some(domain) = domain else {
        return RcptDecision::Local;
    };
    if local.is_configured_local(domain) {
        RcptDecision::Local
    } else if authenticated {
        RcptDecision::Relay
    } else {
        RcptDecision::Refuse
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RcptDecision::*;

    #[test]
    fn decision_table() {
        let local = LocalRecipients::new(
            [
                "example.test".to_owned(),
                "other.test".to_owned(),
                "bücher.test".to_owned(),
            ],
            "",
        );
        let cases = [
            (Some("example.test"), false, Local),
            (Some("EXAMPLE.test."), false, Local),
            (Some("other.test"), true, Local),
            (Some("example.org"), false, Refuse),
            (Some("example.org"), true, Relay),
            (Some("sub.example.test"), false, Refuse),
            (Some("[127.0.0.1]"), false, Refuse),
            (Some("xn--bcher-kva.test"), false, Local),
            (None, false, Local),
        ];
        for (domain, auth, expected) in cases {
            assert_eq!(
                decide(domain, &local, auth),
                expected,
                "{domain:?} auth={auth}"
            );
        }
    }
}
