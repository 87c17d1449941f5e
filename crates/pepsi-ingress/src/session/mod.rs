//! One SMTP session: the explicit state machine (`State`), the command loop, and the
//! per-verb handlers in the files beside this one. Parsing is `crate::protocol`'s job;
//! this module decides what a command means in the current state and does the I/O.
//!
//! A session must never reply 250 to the end of data before the message's row has
//! committed, and never run a command that arrived before a TLS handshake completed.

mod auth;
pub mod conn;
mod data;
mod ehlo;
mod mail;
mod rcpt;
mod starttls;

use std::net::SocketAddr;
use std::sync::Arc;

use mail_auth::IprevOutput;
use tokio::sync::watch;

use crate::config::Options;
use crate::shared::{Listener, Shared};
use conn::{Conn, End, Line};
use pepsi_smtp::data::DataDecoder;
use pepsi_smtp::params::{MailParams, RcptParams};
use pepsi_smtp::{Command, ParseError, Reply};

/// Where the session is in the SMTP dialogue.
pub enum State {
    /// Connected (or just finished STARTTLS): EHLO or HELO comes next.
    Connected,
    /// Greeted: ready for MAIL.
    Greeted,
    /// MAIL accepted, no recipient yet.
    Mail(Transaction),
    /// At least one recipient accepted: RCPT, DATA or BDAT.
    Rcpt(Transaction),
    /// Inside a BDAT sequence, before its LAST chunk.
    Chunking(Transaction, DataDecoder),
}

/// One mail transaction's envelope.
#[derive(Debug)]
pub struct Transaction {
    /// When MAIL FROM was taken: the start of the transaction's span.
    pub started: std::time::SystemTime,
    /// None for the null reverse path.
    pub from: Option<String>,
    pub params: MailParams,
    pub rcpts: Vec<String>,
    pub rcpt_params: Vec<RcptParams>,
}

/// Whether the command loop goes on.
pub enum Flow {
    Continue,
    Close,
}

/// The negotiated TLS parameters.
#[derive(Debug, Clone)]
pub struct TlsInfo {
    pub version: String,
    pub cipher: String,
}

pub struct Session {
    shared: Arc<Shared>,
    /// The settings in force when the session started; a later override applies to the
    /// sessions after it.
    settings: Arc<Options>,
    listener: Arc<Listener>,
    conn: Conn,
    peer: SocketAddr,
    state: State,
    helo: Option<String>,
    esmtp: bool,
    tls: Option<TlsInfo>,
    auth_user: Option<String>,
    bad_commands: u32,
    /// Commands received, and of them NOOP, RSET, VRFY, HELP and EXPN.
    commands: u32,
    junk_commands: u32,
    /// The bytes of the message being received, counted against MESSAGE_MEMORY.
    held: crate::limits::Held,
    iprev: Option<IprevOutput>,
    shutdown: watch::Receiver<bool>,
}

impl Session {
    pub fn new(
        shared: Arc<Shared>,
        settings: Arc<Options>,
        listener: Arc<Listener>,
        conn: Conn,
        peer: SocketAddr,
        tls: Option<TlsInfo>,
    ) -> Session {
        let shutdown = shared.shutdown.clone();
        let held = shared.memory.hold();
        Session {
            shared,
            settings,
            listener,
            conn,
            peer,
            state: State::Connected,
            helo: None,
            esmtp: false,
            tls,
            auth_user: None,
            bad_commands: 0,
            commands: 0,
            junk_commands: 0,
            held,
            iprev: None,
            shutdown,
        }
    }

    /// Queues a reply, counting refusals towards MAX_BAD_COMMANDS.
    fn send(&mut self, reply: Reply) {
        if reply.code >= 500 {
            self.bad_commands += 1;
        }
        self.conn.reply(&reply);
    }

    /// Runs the dialogue to its end.
    pub async fn run(mut self) {
        let s = &self.settings;
        let greeting = Reply::plain(220, vec![format!("{} ESMTP pepsi-ingress", s.hostname)]);
        self.conn.reply(&greeting);
        let end = self.command_loop().await;
        let farewell = match end {
            Err(End::Timeout) => Some(Reply::new(
                421,
                "4.4.2",
                format!("{} timeout, closing", self.settings.hostname),
            )),
            Err(End::Expired) => {
                tracing::info!(peer = %self.peer, "closed at MAX_SESSION_TIME");
                Some(Reply::new(
                    421,
                    "4.4.2",
                    format!(
                        "{} session time limit reached, closing",
                        self.settings.hostname
                    ),
                ))
            }
            Err(End::Shutdown) => Some(Reply::new(
                421,
                "4.3.2",
                format!("{} shutting down, try again later", self.settings.hostname),
            )),
            Ok(()) | Err(End::Closed) | Err(End::Io(_)) => None,
        };
        match &end {
            Err(End::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                tracing::info!(peer = %self.peer, "closed: {e}")
            }
            Err(End::Io(e)) => tracing::debug!(peer = %self.peer, "connection lost: {e}"),
            _ => {}
        }
        if let Some(reply) = farewell {
            self.conn.reply(&reply);
        }
        // A client whose writes failed gets nothing more; the rest is bounded like every
        // write (WRITE_TIMEOUT), the close included.
        if !matches!(end, Err(End::Io(_))) {
            let _ = self.conn.flush().await;
        }
        let timeout = self.settings.write_timeout;
        let _ = tokio::time::timeout(
            timeout,
            tokio::io::AsyncWriteExt::shutdown(&mut self.conn.stream),
        )
        .await;
    }

    async fn command_loop(&mut self) -> Result<(), End> {
        let max = self.settings.max_command_length;
        let timeout = self.settings.command_timeout;
        loop {
            let line = {
                let shutdown = &mut self.shutdown;
                tokio::select! {
                    biased;
                    line = self.conn.line(max, timeout) => line?,
                    _ = crate::wake::stopped(shutdown) => return Err(End::Shutdown),
                }
            };
            let flow = match line {
                Line::TooLong => {
                    self.send(Reply::new(
                        500,
                        "5.5.2",
                        format!("line too long (limit {max} octets)"),
                    ));
                    Flow::Continue
                }
                Line::Text(text) => {
                    self.commands += 1;
                    if self.commands > self.settings.max_commands {
                        self.conn
                            .reply(&Reply::new(421, "4.7.0", "too many commands, closing"));
                        tracing::info!(peer = %self.peer, "dropped at MAX_COMMANDS");
                        return Ok(());
                    }
                    if self.conn.expired() {
                        return Err(End::Expired);
                    }
                    self.command(&text).await?
                }
            };
            if let Flow::Close = flow {
                return Ok(());
            }
            if self.bad_commands >= self.settings.max_bad_commands {
                self.conn
                    .reply(&Reply::new(421, "4.7.0", "too many errors, closing"));
                tracing::info!(peer = %self.peer, "dropped after too many errors");
                return Ok(());
            }
        }
    }

    async fn command(&mut self, line: &[u8]) -> Result<Flow, End> {
        let command = match pepsi_smtp::command::parse(line) {
            Ok(c) => c,
            Err(ParseError::Unknown(verb)) => {
                self.send(Reply::new(
                    500,
                    "5.5.1",
                    format!("command {verb:?} not recognised"),
                ));
                return Ok(Flow::Continue);
            }
            Err(ParseError::Syntax(code, why)) => {
                let basic = if code == "5.5.2" { 500 } else { 501 };
                self.send(Reply::new(basic, code, why));
                return Ok(Flow::Continue);
            }
        };
        if matches!(
            command,
            Command::Noop | Command::Rset | Command::Vrfy | Command::Help | Command::Expn
        ) {
            self.junk_commands += 1;
            if self.junk_commands > self.settings.max_junk_commands {
                self.conn.reply(&Reply::new(
                    421,
                    "4.7.0",
                    "too many NOOP, RSET, VRFY, HELP or EXPN commands, closing",
                ));
                tracing::info!(peer = %self.peer, "dropped at MAX_JUNK_COMMANDS");
                return Ok(Flow::Close);
            }
        }
        let verb = verb(&command);
        let counts = match &command {
            Command::Rcpt { .. } => Counted::Recipient,
            Command::Data | Command::Bdat { last: true, .. } => Counted::Message,
            _ => Counted::Nothing,
        };
        let reply = match command {
            Command::Ehlo(domain) => self.ehlo(domain, true),
            Command::Helo(domain) => self.ehlo(domain, false),
            Command::Mail { from, params } => self.mail(from, params).await,
            Command::Rcpt { to, params } => self.rcpt(to, params).await,
            Command::Data => self.data().await?,
            Command::Bdat { size, last } => self.bdat(size, last).await?,
            Command::Rset => {
                self.reset();
                Reply::new(250, "2.0.0", "reset")
            }
            Command::Noop => Reply::new(250, "2.0.0", "ok"),
            Command::Help => Reply::new(
                214,
                "2.0.0",
                "commands: EHLO HELO MAIL RCPT DATA BDAT RSET NOOP VRFY HELP QUIT STARTTLS AUTH",
            ),
            Command::Vrfy => Reply::new(
                252,
                "2.1.5",
                "cannot verify the user, but will accept mail and attempt delivery",
            ),
            Command::Expn => Reply::new(502, "5.5.1", "EXPN is not available"),
            Command::Quit => {
                self.conn.reply(&Reply::new(
                    221,
                    "2.0.0",
                    format!("{} closing", self.settings.hostname),
                ));
                return Ok(Flow::Close);
            }
            Command::StartTls => return self.starttls().await,
            Command::Auth { mechanism, initial } => self.auth(mechanism, initial).await?,
        };
        let stats = &self.shared.stats;
        match (reply.code, counts) {
            (400.., _) => stats.refused(verb, reply.code, reply.enhanced.as_deref()),
            (200..300, Counted::Recipient) => stats.recipient(),
            (200..300, Counted::Message) => stats.message(),
            _ => {}
        }
        self.send(reply);
        Ok(Flow::Continue)
    }

    /// Abandons the transaction (RSET, EHLO): back to Greeted, or Connected if no greeting
    /// was ever given.
    fn reset(&mut self) {
        self.held = self.shared.memory.hold();
        self.state = if self.helo.is_some() {
            State::Greeted
        } else {
            State::Connected
        };
    }

    fn in_transaction(&self) -> bool {
        matches!(
            self.state,
            State::Mail(_) | State::Rcpt(_) | State::Chunking(..)
        )
    }
}

/// Runs one database lookup of a session (a recipient, a domain, a quota, a sender's
/// ownership, a password) for at most `limit` (LOOKUP_TIMEOUT). A database that does not
/// answer in time, such as a primary that vanished without closing its connections, fails
/// the lookup as one that refused it does, so the client hears the command's temporary
/// failure instead of waiting for the operating system to give up on the connection.
async fn within<T, E: std::fmt::Display>(
    limit: std::time::Duration,
    lookup: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, lookup).await {
        Ok(answer) => answer.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "the database did not answer within LOOKUP_TIMEOUT ({limit:?})"
        )),
    }
}

/// What an accepted command adds to the ingress's counters.
#[derive(Clone, Copy)]
enum Counted {
    Recipient,
    Message,
    Nothing,
}

/// The command's verb, as the refusal counters label it.
fn verb(command: &Command) -> &'static str {
    match command {
        Command::Ehlo(_) => "EHLO",
        Command::Helo(_) => "HELO",
        Command::Mail { .. } => "MAIL",
        Command::Rcpt { .. } => "RCPT",
        Command::Data => "DATA",
        Command::Bdat { .. } => "BDAT",
        Command::Rset => "RSET",
        Command::Noop => "NOOP",
        Command::Help => "HELP",
        Command::Vrfy => "VRFY",
        Command::Expn => "EXPN",
        Command::Quit => "QUIT",
        Command::StartTls => "STARTTLS",
        Command::Auth { .. } => "AUTH",
    }
}
