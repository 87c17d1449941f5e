//! The envelope of one transaction and the MAIL / RCPT command lines built from it: which
//! ESMTP parameters go out depends on what the peer offers. Pure, no I/O.

use serde_json::{Map, Value};

use super::caps::Capabilities;
use crate::encoding::xtext_encode as xtext;
use crate::state::{Dsn, Origin, StateError};

/// One recipient with its RFC 3461 parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recipient {
    pub address: String,
    /// `NOTIFY` keywords (`SUCCESS`, `FAILURE`, `DELAY` or `NEVER`), as the client gave them.
    pub notify: Option<Vec<String>>,
    /// `ORCPT`, decoded: `rfc822;alice@example.org`.
    pub orcpt: Option<String>,
}

/// Sender, recipients and the message-level parameters of one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Envelope {
    /// The reverse path, empty for the null sender.
    pub mail_from: String,
    pub recipients: Vec<Recipient>,
    /// `RET`: `FULL` or `HDRS`.
    pub ret: Option<String>,
    /// `ENVID`, decoded.
    pub envid: Option<String>,
    /// The message itself needs SMTPUTF8 (the sender declared it at ingress).
    pub utf8_message: bool,
}

impl Envelope {
    /// The envelope of a queued message: `state.dsn` gives RET/ENVID and each recipient's
    /// NOTIFY/ORCPT (by position), `state.origin.smtputf8` whether the message is UTF-8.
    /// Either key may be absent; a malformed one is an error naming it.
    pub fn from_state(
        mail_from: &str,
        rcpt_to: &[String],
        state: &Map<String, Value>,
    ) -> Result<Self, StateError> {
        let dsn = Dsn::from_state(state)?.unwrap_or_default();
        let origin = Origin::from_state(state)?.unwrap_or_default();
        Ok(Envelope {
            mail_from: mail_from.to_owned(),
            recipients: rcpt_to
                .iter()
                .enumerate()
                .map(|(i, address)| {
                    let per = dsn.rcpt(i);
                    Recipient {
                        address: address.clone(),
                        notify: per
                            .and_then(|r| r.notify.as_ref())
                            .map(|n| n.iter().map(|s| s.to_ascii_uppercase()).collect()),
                        orcpt: per.and_then(|r| r.orcpt.clone()),
                    }
                })
                .collect(),
            ret: dsn.ret.map(|r| r.as_str().to_owned()),
            envid: dsn.envid,
            utf8_message: origin.smtputf8,
        })
    }

    /// True when an address of the envelope is not ASCII: only an SMTPUTF8 peer can take it.
    pub fn has_utf8_address(&self) -> bool {
        !self.mail_from.is_ascii() || self.recipients.iter().any(|r| !r.address.is_ascii())
    }
}

/// `MAIL FROM:<…>` with the parameters the peer offers: SIZE, BODY=8BITMIME for an 8-bit
/// message, SMTPUTF8 when `smtputf8` (a UTF-8 address, UTF-8 header fields, or declared by
/// the sender), RET/ENVID under DSN.
pub fn mail_command(
    env: &Envelope,
    caps: &Capabilities,
    size: usize,
    eight_bit: bool,
    smtputf8: bool,
) -> String {
    let mut cmd = format!("MAIL FROM:<{}>", env.mail_from);
    if caps.size.is_some() {
        cmd.push_str(&format!(" SIZE={size}"));
    }
    if eight_bit && caps.eight_bit_mime {
        cmd.push_str(" BODY=8BITMIME");
    }
    if caps.smtputf8 && smtputf8 {
        cmd.push_str(" SMTPUTF8");
    }
    if caps.dsn {
        if let Some(ret) = &env.ret {
            cmd.push_str(&format!(" RET={}", ret.to_ascii_uppercase()));
        }
        if let Some(envid) = &env.envid {
            cmd.push_str(&format!(" ENVID={}", xtext(envid)));
        }
    }
    cmd.push_str("\r\n");
    cmd
}

/// `RCPT TO:<…>` with NOTIFY/ORCPT when the peer offers DSN.
pub fn rcpt_command(rcpt: &Recipient, caps: &Capabilities) -> String {
    let mut cmd = format!("RCPT TO:<{}>", rcpt.address);
    if caps.dsn {
        if let Some(notify) = rcpt.notify.as_ref().filter(|n| !n.is_empty()) {
            cmd.push_str(&format!(" NOTIFY={}", notify.join(",")));
        }
        if let Some(orcpt) = &rcpt.orcpt {
            // The address type is atom text; only the address is xtext.
            match orcpt.split_once(';') {
                Some((kind, addr)) => {
                    cmd.push_str(&format!(" ORCPT={};{}", kind.trim(), xtext(addr.trim())))
                }
                None => cmd.push_str(&format!(" ORCPT=rfc822;{}", xtext(orcpt))),
            }
        }
    }
    cmd.push_str("\r\n");
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn all() -> Capabilities {
        Capabilities {
            pipelining: true,
            size: Some(0),
            eight_bit_mime: true,
            smtputf8: true,
            dsn: true,
            ..Capabilities::default()
        }
    }

    #[test]
    fn envelope_reads_the_dsn_state() {
        let state = json!({
            "dsn": {"ret": "HDRS", "envid": "id+1", "rcpt": [
                {"notify": ["success", "FAILURE"], "orcpt": "rfc822;a+x@example.org"},
                {"notify": null, "orcpt": null}
            ]},
            "origin": {"smtputf8": true}
        });
        let rcpt = vec!["a@x".to_owned(), "b@x".to_owned(), "c@x".to_owned()];
        let env = Envelope::from_state("s@x", &rcpt, state.as_object().unwrap()).unwrap();
        assert_eq!(env.ret.as_deref(), Some("HDRS"));
        assert_eq!(env.envid.as_deref(), Some("id+1"));
        assert!(env.utf8_message);
        assert_eq!(
            env.recipients[0].notify,
            Some(vec!["SUCCESS".into(), "FAILURE".into()])
        );
        assert_eq!(
            env.recipients[1],
            Recipient {
                address: "b@x".into(),
                ..Default::default()
            }
        );
        assert_eq!(env.recipients[2].address, "c@x");
        let bare = Envelope::from_state("", &rcpt[..1], &Map::new()).unwrap();
        assert_eq!(bare.recipients[0].notify, None);
        assert!(!bare.utf8_message);
        let bad = json!({"dsn": {"rcpt": [{"notify": "SUCCESS"}]}});
        let err = Envelope::from_state("", &rcpt[..1], bad.as_object().unwrap()).unwrap_err();
        assert!(
            err.to_string().starts_with("state.dsn.rcpt[0].notify: "),
            "{err}"
        );
    }

    /// (envelope, capabilities, 8-bit) → the MAIL command.
    #[test]
    fn mail_command_table() {
        let env = Envelope {
            mail_from: "s@x".into(),
            ret: Some("full".into()),
            envid: Some("a b".into()),
            ..Default::default()
        };
        let utf8 = Envelope {
            mail_from: "jörg@x".into(),
            ..Default::default()
        };
        let null = Envelope::default();
        let cases: Vec<(&Envelope, Capabilities, bool, &str)> = vec![
            (&env, Capabilities::default(), true, "MAIL FROM:<s@x>\r\n"),
            (
                &env,
                all(),
                true,
                "MAIL FROM:<s@x> SIZE=42 BODY=8BITMIME RET=FULL ENVID=a+20b\r\n",
            ),
            (
                &env,
                all(),
                false,
                "MAIL FROM:<s@x> SIZE=42 RET=FULL ENVID=a+20b\r\n",
            ),
            (
                &utf8,
                all(),
                false,
                "MAIL FROM:<jörg@x> SIZE=42 SMTPUTF8\r\n",
            ),
            (
                &utf8,
                Capabilities::default(),
                false,
                "MAIL FROM:<jörg@x>\r\n",
            ),
            (&null, all(), false, "MAIL FROM:<> SIZE=42\r\n"),
        ];
        for (env, caps, eight, want) in cases {
            let smtputf8 = env.utf8_message || env.has_utf8_address();
            assert_eq!(mail_command(env, &caps, 42, eight, smtputf8), want);
        }
    }

    #[test]
    fn rcpt_command_passes_dsn_only_when_offered() {
        let r = Recipient {
            address: "a@x".into(),
            notify: Some(vec!["SUCCESS".into(), "DELAY".into()]),
            orcpt: Some("rfc822;a+tag@x".into()),
        };
        assert_eq!(
            rcpt_command(&r, &all()),
            "RCPT TO:<a@x> NOTIFY=SUCCESS,DELAY ORCPT=rfc822;a+2Btag@x\r\n"
        );
        assert_eq!(
            rcpt_command(&r, &Capabilities::default()),
            "RCPT TO:<a@x>\r\n"
        );
    }
}
