//! The envelope of one transaction and the MAIL / RCPT commands built from it: which
//! ESMTP parameters go out depends on what the peer offers. Pure, no I/O.

use crate::address::Path;
use crate::caps::Capabilities;
use crate::command::{Command, Param, Unsendable};
use crate::encoding::xtext_encode as xtext;

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
    /// True when an address of the envelope is not ASCII: only an SMTPUTF8 peer can take it.
    pub fn has_utf8_address(&self) -> bool {
        !self.mail_from.is_ascii() || self.recipients.iter().any(|r| !r.address.is_ascii())
    }
}

fn param(key: &str, value: Option<String>) -> Param {
    Param {
        key: key.to_owned(),
        value,
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
) -> Result<String, Unsendable> {
    let mut params = Vec::new();
    if caps.size.is_some() {
        params.push(param("SIZE", Some(size.to_string())));
    }
    if eight_bit && caps.eight_bit_mime {
        params.push(param("BODY", Some("8BITMIME".into())));
    }
    if caps.smtputf8 && smtputf8 {
        params.push(param("SMTPUTF8", None));
    }
    if caps.dsn {
        if let Some(ret) = &env.ret {
            params.push(param("RET", Some(ret.to_ascii_uppercase())));
        }
        if let Some(envid) = &env.envid {
            params.push(param("ENVID", Some(xtext(envid))));
        }
    }
    Command::Mail {
        from: Path::new(&env.mail_from),
        params,
    }
    .to_line()
}

/// `RCPT TO:<…>` with NOTIFY/ORCPT when the peer offers DSN.
pub fn rcpt_command(rcpt: &Recipient, caps: &Capabilities) -> Result<String, Unsendable> {
    let mut params = Vec::new();
    if caps.dsn {
        if let Some(notify) = rcpt.notify.as_ref().filter(|n| !n.is_empty()) {
            params.push(param("NOTIFY", Some(notify.join(","))));
        }
        if let Some(orcpt) = &rcpt.orcpt {
            // The address type is atom text; only the address is xtext.
            let value = match orcpt.split_once(';') {
                Some((kind, addr)) => format!("{};{}", kind.trim(), xtext(addr.trim())),
                None => format!("rfc822;{}", xtext(orcpt)),
            };
            params.push(param("ORCPT", Some(value)));
        }
    }
    Command::Rcpt {
        to: Path::new(&rcpt.address),
        params,
    }
    .to_line()
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(mail_command(env, &caps, 42, eight, smtputf8).unwrap(), want);
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
            rcpt_command(&r, &all()).unwrap(),
            "RCPT TO:<a@x> NOTIFY=SUCCESS,DELAY ORCPT=rfc822;a+2Btag@x\r\n"
        );
        assert_eq!(
            rcpt_command(&r, &Capabilities::default()).unwrap(),
            "RCPT TO:<a@x>\r\n"
        );
        // An ORCPT address type with a line break (the address part is xtext-encoded and
        // cannot carry one) is refused, not written.
        let smuggled = Recipient {
            orcpt: Some("rfc822\r\nRSET;a@x".into()),
            ..r
        };
        assert_eq!(rcpt_command(&smuggled, &all()).unwrap_err().what, "a CR");
    }
}
