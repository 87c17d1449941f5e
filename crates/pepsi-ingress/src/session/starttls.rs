//! STARTTLS (RFC 3207). Whatever the client sent after the command and before the
//! handshake is thrown away (CVE-2011-0411): a command injected in plaintext must never
//! run inside the TLS session. The dialogue restarts at EHLO afterwards.

use super::conn::{End, Stream};
use super::{Flow, Session, State, TlsInfo};
use pepsi_smtp::Reply;

impl Session {
    pub(super) async fn starttls(&mut self) -> Result<Flow, End> {
        if self.tls.is_some() {
            self.send(Reply::new(503, "5.5.1", "TLS is already active"));
            return Ok(Flow::Continue);
        }
        let Some(handle) = self.listener.tls.clone() else {
            self.send(Reply::new(
                502,
                "5.5.1",
                "STARTTLS is not offered on this listener",
            ));
            return Ok(Flow::Continue);
        };
        self.conn
            .reply(&Reply::new(220, "2.0.0", "ready to start TLS"));
        self.conn.flush().await.map_err(End::Io)?;
        let injected = self.conn.discard_buffered();
        if injected > 0 {
            tracing::warn!(peer = %self.peer, octets = injected, "discarded plaintext pipelined behind STARTTLS");
        }
        let Stream::Plain(tcp) = std::mem::replace(&mut self.conn.stream, Stream::Gone) else {
            return Ok(Flow::Close);
        };
        let timeout = self.settings.tls_handshake_timeout;
        match tokio::time::timeout(timeout, handle.acceptor().accept(tcp)).await {
            Ok(Ok(tls)) => {
                let (version, cipher) = pepsi_smtp::tls::describe(tls.get_ref().1);
                self.tls = Some(TlsInfo { version, cipher });
                self.conn.stream = Stream::Tls(Box::new(tls));
                self.helo = None;
                self.esmtp = false;
                self.state = State::Connected;
                Ok(Flow::Continue)
            }
            Ok(Err(e)) => {
                tracing::info!(peer = %self.peer, "TLS handshake failed: {e}");
                Ok(Flow::Close)
            }
            Err(_) => {
                tracing::info!(peer = %self.peer, "TLS handshake timed out");
                Ok(Flow::Close)
            }
        }
    }
}
