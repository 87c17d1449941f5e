//! MAIL FROM: opens a transaction after checking the session may send (greeted,
//! authenticated where the listener requires it) and the declared parameters.

use super::{Session, State, Transaction};
use crate::protocol::Reply;
use crate::protocol::address::Path;
use crate::protocol::command::Param;
use crate::protocol::params::mail_params;

impl Session {
    pub(super) fn mail(&mut self, from: Path, params: Vec<Param>) -> Reply {
        match self.state {
            State::Connected => return Reply::new(503, "5.5.1", "send EHLO or HELO first"),
            State::Greeted => {}
            _ => {
                return Reply::new(
                    503,
                    "5.5.1",
                    "a mail transaction is already open; send RSET first",
                );
            }
        }
        if self.listener.config.require_auth && self.auth_user.is_none() {
            return Reply::new(530, "5.7.0", "authentication required");
        }
        let params = match mail_params(&params, self.esmtp) {
            Ok(p) => p,
            Err(reply) => return reply,
        };
        let limit = self.shared.settings.max_message_size;
        if let Some(size) = params.size.filter(|&s| s > limit) {
            return Reply::new(
                552,
                "5.3.4",
                format!("declared size {size} exceeds the limit of {limit} octets"),
            );
        }
        if from.is_utf8() && !params.smtputf8 {
            return Reply::new(553, "5.6.7", "a UTF-8 address needs the SMTPUTF8 parameter");
        }
        self.state = State::Mail(Transaction {
            from: from.address,
            params,
            rcpts: Vec::new(),
            rcpt_params: Vec::new(),
        });
        Reply::new(250, "2.1.0", "sender ok")
    }
}
