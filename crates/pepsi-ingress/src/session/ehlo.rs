//! EHLO and HELO: the greeting, and the list of extensions this listener offers now (AUTH
//! only where it may be used, STARTTLS only before TLS).

use super::{Session, State};
use pepsi_smtp::Reply;
use pepsi_smtp::address::check_domain;

impl Session {
    pub(super) fn ehlo(&mut self, domain: String, extended: bool) -> Reply {
        if let Err(why) = check_domain(&domain) {
            return Reply::new(
                501,
                "5.5.4",
                format!("{} argument: {why}", if extended { "EHLO" } else { "HELO" }),
            );
        }
        let s = &self.settings;
        let mut lines = vec![format!("{} greets {domain}", s.hostname)];
        if extended {
            lines.extend([
                "PIPELINING".to_owned(),
                format!("SIZE {}", s.max_message_size),
                "8BITMIME".to_owned(),
                "SMTPUTF8".to_owned(),
                "ENHANCEDSTATUSCODES".to_owned(),
                "DSN".to_owned(),
                "CHUNKING".to_owned(),
            ]);
            if self.tls.is_none() && self.listener.tls.is_some() {
                lines.push("STARTTLS".to_owned());
            }
            if self.listener.config.auth
                && self.auth_user.is_none()
                && (self.tls.is_some() || self.listener.config.plaintext_auth)
            {
                lines.push("AUTH PLAIN LOGIN".to_owned());
            }
            lines.push("HELP".to_owned());
        }
        self.helo = Some(domain);
        self.esmtp = extended;
        self.state = State::Greeted;
        Reply::plain(250, lines)
    }
}
