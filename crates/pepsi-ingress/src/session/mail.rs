//! MAIL FROM: opens a transaction after checking the session may send (greeted,
//! authenticated where the listener requires it, a sender its login owns) and the declared
//! parameters.

use super::{Session, State, Transaction};
use pepsi_smtp::Reply;
use pepsi_smtp::address::Path;
use pepsi_smtp::command::Param;
use pepsi_smtp::params::mail_params;

impl Session {
    pub(super) async fn mail(&mut self, from: Path, params: Vec<Param>) -> Reply {
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
        let limit = self.settings.max_message_size;
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
        if let Some(address) = &from.address
            && let Some(reply) = self.not_owned(std::slice::from_ref(address), 553).await
        {
            return reply;
        }
        self.state = State::Mail(Transaction {
            started: std::time::SystemTime::now(),
            from: from.address,
            params,
            rcpts: Vec::new(),
            rcpt_params: Vec::new(),
        });
        Reply::new(250, "2.1.0", "sender ok")
    }
}

impl Session {
    /// Under SENDER_LOGIN_BINDING, for an authenticated session: a refusal (`code` 5.7.1)
    /// naming the first of `addresses` the login does not own, or 451 4.3.0 when that
    /// cannot be looked up; None when the session may use them all.
    pub(super) async fn not_owned(&self, addresses: &[String], code: u16) -> Option<Reply> {
        let login = self.auth_user.as_deref()?;
        if !self.listener.config.sender_login_binding {
            return None;
        }
        let s = &self.settings;
        let lookup = crate::sender::first_not_owned(&self.shared.pool, &s.local, login, addresses);
        match super::within(s.lookup_timeout, lookup).await {
            Ok(None) => None,
            Ok(Some(address)) => {
                tracing::info!(peer = %self.peer, login, sender = ?address, "sender not owned by the login");
                Some(Reply::new(
                    code,
                    "5.7.1",
                    format!(
                        "<{address}> is not an address of {login} (SENDER_LOGIN_BINDING: your own \
                         address, an alias of yours, or one your send_as setting lists)"
                    ),
                ))
            }
            Err(e) => {
                tracing::warn!(login, "sender ownership lookup failed: {e}");
                Some(Reply::new(
                    451,
                    "4.3.0",
                    "temporary failure checking the sender",
                ))
            }
        }
    }

    /// Under SENDER_LOGIN_BINDING, for an authenticated session: the header block must name
    /// one author (`sender::sole_author`), one the login owns; a 550 5.7.1 saying what is
    /// wrong otherwise (451 4.3.0 when ownership cannot be looked up).
    pub(super) async fn author_not_owned(&self, headers: &[u8]) -> Option<Reply> {
        let login = self.auth_user.as_deref()?;
        if !self.listener.config.sender_login_binding {
            return None;
        }
        match crate::sender::sole_author(headers) {
            Ok(author) => self.not_owned(&[author], 550).await,
            Err(problem) => {
                tracing::info!(peer = %self.peer, login, problem, "message refused: no single From address to check");
                Some(Reply::new(
                    550,
                    "5.7.1",
                    format!(
                        "{problem} (SENDER_LOGIN_BINDING: an authenticated message has one \
                         From field naming one address of yours)"
                    ),
                ))
            }
        }
    }
}
