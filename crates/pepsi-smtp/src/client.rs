//! The I/O half of the client: one connection to one server, its session (greeting,
//! EHLO/LHLO, STARTTLS, AUTH) and its transactions (DATA, or BDAT under CHUNKING). Every
//! read and write runs under a timeout; a failure marks the connection unusable, and the
//! caller opens a new one.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use crate::auth::{self, Mechanism};
use crate::caps::Capabilities;
use crate::command;
use crate::data::{crlf_line_ends, dot_stuff, has_utf8_headers, is_8bit};
use crate::envelope::{Envelope, mail_command, rcpt_command};
use crate::reply::{MAX_LINE, MAX_REPLY_LINES, Reply, parse_line, parse_reply};
use crate::tls::{
    Credentials, OpenOptions, TlsInfo, TlsOptions, TlsPolicy, client_config, server_name,
};

/// SMTP (RFC 5321) or LMTP (RFC 2033): the hello verb and the replies after the data differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Smtp,
    Lmtp,
}

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// A host name or address, and a port.
    Tcp { host: String, port: u16 },
    /// A unix socket.
    Unix(PathBuf),
}

impl Target {
    /// `unix:/path`, `/path` (a unix socket), `host:port` or `[v6-address]:port`.
    pub fn parse(text: &str) -> Result<Target, String> {
        let text = text.trim();
        let expected = || {
            format!(
                "unix:/path/to/socket, an absolute socket path, host:port or [IPv6]:port, not {text:?}"
            )
        };
        if let Some(path) = text.strip_prefix("unix:") {
            return if path.starts_with('/') {
                Ok(Target::Unix(PathBuf::from(path)))
            } else {
                Err(expected())
            };
        }
        if text.starts_with('/') {
            return Ok(Target::Unix(PathBuf::from(text)));
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (addr, port) = rest.split_once("]:").ok_or_else(expected)?;
            (addr, port)
        } else {
            let (host, port) = text.rsplit_once(':').ok_or_else(expected)?;
            if host.contains(':') {
                return Err(expected());
            }
            (host, port)
        };
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(expected)?;
        if host.is_empty() {
            return Err(expected());
        }
        Ok(Target::Tcp {
            host: host.to_owned(),
            port,
        })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Target::Tcp { host, port } => write!(f, "{host}:{port}"),
            Target::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// How long each step may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Establishing the connection.
    pub connect: Duration,
    /// Waiting for the 220 greeting.
    pub greeting: Duration,
    /// Each command and its reply (EHLO/LHLO, MAIL, RCPT, DATA, RSET, QUIT).
    pub command: Duration,
    /// Sending the message, and each reply after its final dot.
    pub data: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(30),
            greeting: Duration::from_secs(60),
            command: Duration::from_secs(60),
            data: Duration::from_secs(600),
        }
    }
}

/// The step of the conversation a reply or a failure belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Connect,
    Greeting,
    Ehlo,
    Helo,
    Lhlo,
    /// The STARTTLS command and the TLS handshake after it.
    StartTls,
    /// AUTH and its challenges.
    Auth,
    Mail,
    Rcpt,
    /// The DATA command.
    Data,
    /// The message and the replies after its final dot.
    DataEnd,
    /// `BDAT <size> LAST` with the message, and the replies after it (CHUNKING).
    Bdat,
    Rset,
    Quit,
}

impl Phase {
    /// The name `state.bounce.phase` records: `connect`, `greeting`, `EHLO`, `MAIL`, `RCPT`,
    /// `DATA` (for the command and the end of data alike) ….
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Connect => "connect",
            Phase::Greeting => "greeting",
            Phase::Ehlo => "EHLO",
            Phase::Helo => "HELO",
            Phase::Lhlo => "LHLO",
            Phase::StartTls => "STARTTLS",
            Phase::Auth => "AUTH",
            Phase::Mail => "MAIL",
            Phase::Rcpt => "RCPT",
            Phase::Data | Phase::DataEnd => "DATA",
            Phase::Bdat => "BDAT",
            Phase::Rset => "RSET",
            Phase::Quit => "QUIT",
        }
    }

    /// `in reply to …` wording of a bounce.
    fn what(self) -> &'static str {
        match self {
            Phase::Connect => "connect",
            Phase::Greeting => "greeting",
            Phase::Ehlo => "EHLO command",
            Phase::Helo => "HELO command",
            Phase::Lhlo => "LHLO command",
            Phase::StartTls => "STARTTLS command",
            Phase::Auth => "AUTH command",
            Phase::Mail => "MAIL FROM command",
            Phase::Rcpt => "RCPT TO command",
            Phase::Data => "DATA command",
            Phase::DataEnd => "end of DATA command",
            Phase::Bdat => "BDAT command",
            Phase::Rset => "RSET command",
            Phase::Quit => "QUIT command",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what())
    }
}

/// Why a conversation step failed. 4xx replies, every network or TLS failure and every
/// [`ClientError::Policy`] refusal are temporary; 5xx replies and an extension the message
/// needs but the peer lacks are permanent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {target}: {detail}")]
    Connect { target: String, detail: String },
    #[error("no answer within {}s to the {phase}", after.as_secs())]
    Timeout { phase: Phase, after: Duration },
    /// The attempt's own time limit ([`Connection::set_deadline`]) ran out.
    #[error("the delivery attempt reached its time limit during the {phase}")]
    Deadline { phase: Phase },
    #[error("connection lost during the {phase}: {detail}")]
    Io { phase: Phase, detail: String },
    #[error("the server closed the connection during the {phase}")]
    Closed { phase: Phase },
    #[error("malformed reply to the {phase}: {detail}")]
    Malformed { phase: Phase, detail: String },
    #[error("the server answered the {phase} with {reply}")]
    Refused { phase: Phase, reply: Reply },
    /// AUTH with an OAuth 2.0 access token refused: the server's error challenge (RFC 7628
    /// §3.2.2, JSON such as `{"status":"invalid_token"}`, decoded) and its final reply.
    #[error(
        "the server answered the AUTH command ({mechanism}) with {reply}, after its error challenge {challenge}"
    )]
    TokenRefused {
        mechanism: &'static str,
        challenge: String,
        reply: Reply,
    },
    /// The TLS handshake failed or the certificate was not accepted (`problem` says how,
    /// when it was the certificate).
    #[error("{detail}")]
    Tls {
        detail: String,
        problem: Option<crate::tls::CertProblem>,
    },
    /// This side will not go on: the TLS policy wants STARTTLS and the peer lacks it, AUTH
    /// would send the password in clear text, the peer offers no usable AUTH mechanism, or
    /// the TLS configuration (a CA file) is unusable. Temporary, so mail waits for a fix.
    #[error("{detail}")]
    Policy {
        phase: Phase,
        /// The RFC 3463 code of the failure.
        status: &'static str,
        detail: String,
    },
    #[error("{detail}")]
    NotOffered {
        phase: Phase,
        /// The RFC 3463 code of the failure.
        status: &'static str,
        detail: String,
    },
    /// A command this side will not send: it would carry a line break or a NUL into the
    /// session, which the peer would read as a command of its own. Permanent.
    #[error("{detail}")]
    Unsendable { phase: Phase, detail: String },
}

impl ClientError {
    pub fn is_temporary(&self) -> bool {
        match self {
            ClientError::Refused { reply, .. } | ClientError::TokenRefused { reply, .. } => {
                !reply.is_permanent()
            }
            ClientError::NotOffered { .. } | ClientError::Unsendable { .. } => false,
            _ => true,
        }
    }

    pub fn phase(&self) -> Phase {
        match self {
            ClientError::Connect { .. } => Phase::Connect,
            ClientError::Timeout { phase, .. }
            | ClientError::Deadline { phase }
            | ClientError::Io { phase, .. }
            | ClientError::Closed { phase }
            | ClientError::Malformed { phase, .. }
            | ClientError::Refused { phase, .. }
            | ClientError::Policy { phase, .. }
            | ClientError::NotOffered { phase, .. }
            | ClientError::Unsendable { phase, .. } => *phase,
            ClientError::Tls { .. } => Phase::StartTls,
            ClientError::TokenRefused { .. } => Phase::Auth,
        }
    }

    /// A command line of `phase` that [`command::check_line`] refused.
    pub fn unsendable(phase: Phase, e: command::Unsendable) -> ClientError {
        ClientError::Unsendable {
            phase,
            detail: format!("refusing to send a {phase} command containing {e}"),
        }
    }

    /// The RFC 3463 code that describes the failure: the server's own for a refusal, else
    /// 4.4.1 no answer, 4.5.0 protocol error, 4.7.5 cryptographic failure, 5.5.2 a command
    /// that would not be one command, 4.4.2 a connection lost.
    pub fn status(&self) -> String {
        match self {
            ClientError::Refused { reply, .. } | ClientError::TokenRefused { reply, .. } => {
                reply.status()
            }
            ClientError::Connect { .. } => "4.4.1".into(),
            ClientError::Malformed { .. } => "4.5.0".into(),
            ClientError::Tls { .. } => "4.7.5".into(),
            ClientError::NotOffered { status, .. } | ClientError::Policy { status, .. } => {
                (*status).into()
            }
            ClientError::Unsendable { .. } => "5.5.2".into(),
            _ => "4.4.2".into(),
        }
    }
}

/// What became of one recipient in a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RcptOutcome {
    /// The server took the message for this recipient; its final reply.
    Accepted(Reply),
    /// The server refused at `phase` with a 4xx or 5xx reply.
    Refused { phase: Phase, reply: Reply },
    /// No answer for this recipient: the connection failed, or the message cannot go to
    /// this peer at all.
    Failed(ClientError),
}

/// A byte stream the client can speak over: TCP, a unix socket, or TLS over either.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One open session with a server, after its greeting and EHLO/LHLO (and, as asked,
/// STARTTLS with a second EHLO, and AUTH).
pub struct Connection {
    stream: BufReader<Box<dyn Stream>>,
    protocol: Protocol,
    timeouts: Timeouts,
    caps: Capabilities,
    remote_mta: String,
    /// The host connected to (TCP): the certificate's default name.
    host: Option<String>,
    tls: Option<TlsInfo>,
    authenticated: bool,
    /// Set after a network failure, a malformed reply or a 421: never use it again.
    broken: bool,
    last_used: Instant,
    /// When the current attempt must end ([`Connection::set_deadline`]): every read and
    /// write waits at most until then.
    deadline: Option<Instant>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("protocol", &self.protocol)
            .field("remote_mta", &self.remote_mta)
            .field("caps", &self.caps)
            .field("tls", &self.tls)
            .field("authenticated", &self.authenticated)
            .field("broken", &self.broken)
            .finish()
    }
}

/// The peer's name from its greeting (`220 mx.example.org ESMTP`), when it looks like one.
fn greeting_name(greeting: &Reply) -> Option<String> {
    let word = greeting.lines.first()?.split_ascii_whitespace().next()?;
    let ok = word
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b".-_[]:".contains(&b));
    ok.then(|| word.to_owned())
}

impl Connection {
    /// Connects, reads the greeting and says EHLO (falling back to HELO when EHLO is
    /// refused with 5xx) or LHLO as `hello_name`. No TLS, no AUTH.
    pub async fn open(
        target: &Target,
        protocol: Protocol,
        hello_name: &str,
        timeouts: Timeouts,
    ) -> Result<Connection, ClientError> {
        Self::open_plain(target, protocol, hello_name, timeouts).await
    }

    /// [`Connection::open`], then STARTTLS as `options.tls.policy` asks (EHLO again over
    /// TLS, the new capabilities replacing the old), then AUTH with `options.auth`.
    ///
    /// - `none`: no STARTTLS.
    /// - `may`: STARTTLS when offered, any certificate; clear text when it is not offered
    ///   or refused; when the handshake fails, one new clear-text connection.
    /// - `encrypt`: STARTTLS required, the certificate not checked.
    /// - `verify`: STARTTLS required, the certificate verified against `ca_file` (or the
    ///   system's roots) for `server_name` (or the target's host).
    ///
    /// Credentials go out only over TLS, except under policy `none`. A TLS or policy failure
    /// is temporary; a 5xx answer to AUTH (535) is permanent, a 4xx one (454) temporary.
    pub async fn open_with(
        target: &Target,
        protocol: Protocol,
        hello_name: &str,
        timeouts: Timeouts,
        options: &OpenOptions,
    ) -> Result<Connection, ClientError> {
        let policy = options.tls.policy;
        let mut conn = Self::open_plain(target, protocol, hello_name, timeouts).await?;
        if policy != TlsPolicy::None {
            if conn.caps.starttls {
                if let Err(e) = conn.starttls(hello_name, &options.tls).await {
                    if policy != TlsPolicy::May {
                        conn.quit().await;
                        return Err(e);
                    }
                    // Opportunistic: a refused STARTTLS leaves the session usable in clear
                    // text; after a failed handshake only a new connection is.
                    tracing::info!(
                        "STARTTLS with {} failed, going on without TLS (policy may): {e}",
                        conn.remote_mta
                    );
                    if !conn.is_usable() {
                        conn.quit().await;
                        conn = Self::open_plain(target, protocol, hello_name, timeouts).await?;
                    }
                }
            } else if policy.requires_tls() {
                let err = ClientError::Policy {
                    phase: Phase::StartTls,
                    // 4.7.4: security features not supported
                    status: "4.7.4",
                    detail: format!(
                        "TLS policy {policy} requires STARTTLS, which {} does not offer",
                        conn.remote_mta
                    ),
                };
                conn.quit().await;
                return Err(err);
            }
        }
        if let Some(creds) = &options.auth
            && let Err(e) = conn.authenticate(creds, policy, target).await
        {
            conn.quit().await;
            return Err(e);
        }
        Ok(conn)
    }

    async fn open_plain(
        target: &Target,
        protocol: Protocol,
        hello_name: &str,
        timeouts: Timeouts,
    ) -> Result<Connection, ClientError> {
        let connect_failed = |detail: String| ClientError::Connect {
            target: target.to_string(),
            detail,
        };
        let stream: Box<dyn Stream> = match target {
            Target::Tcp { host, port } => {
                let s = tokio::time::timeout(
                    timeouts.connect,
                    tokio::net::TcpStream::connect((host.as_str(), *port)),
                )
                .await
                .map_err(|_| {
                    connect_failed(format!("timed out after {}s", timeouts.connect.as_secs()))
                })?
                .map_err(|e| connect_failed(e.to_string()))?;
                let _ = s.set_nodelay(true);
                Box::new(s)
            }
            Target::Unix(path) => Box::new(
                tokio::time::timeout(timeouts.connect, tokio::net::UnixStream::connect(path))
                    .await
                    .map_err(|_| {
                        connect_failed(format!("timed out after {}s", timeouts.connect.as_secs()))
                    })?
                    .map_err(|e| connect_failed(e.to_string()))?,
            ),
        };
        let mut conn = Connection {
            stream: BufReader::new(stream),
            protocol,
            timeouts,
            caps: Capabilities::default(),
            remote_mta: match target {
                Target::Tcp { host, .. } => host.clone(),
                Target::Unix(path) => path.display().to_string(),
            },
            host: match target {
                Target::Tcp { host, .. } => Some(host.clone()),
                Target::Unix(_) => None,
            },
            tls: None,
            authenticated: false,
            broken: false,
            last_used: Instant::now(),
            deadline: None,
        };
        let greeting = conn.read_reply(Phase::Greeting, timeouts.greeting).await?;
        if greeting.code != 220 {
            return Err(ClientError::Refused {
                phase: Phase::Greeting,
                reply: greeting,
            });
        }
        if let Some(name) = greeting_name(&greeting) {
            conn.remote_mta = name;
        }
        conn.hello(hello_name).await?;
        Ok(conn)
    }

    async fn hello(&mut self, name: &str) -> Result<(), ClientError> {
        let (phase, verb) = match self.protocol {
            Protocol::Lmtp => (Phase::Lhlo, "LHLO"),
            Protocol::Smtp => (Phase::Ehlo, "EHLO"),
        };
        let reply = self.command(phase, &format!("{verb} {name}\r\n")).await?;
        if reply.code == 250 {
            self.caps = Capabilities::parse(&reply);
            return Ok(());
        }
        if self.protocol == Protocol::Smtp && reply.is_permanent() {
            let helo = self
                .command(Phase::Helo, &format!("HELO {name}\r\n"))
                .await?;
            if helo.code == 250 {
                self.caps = Capabilities::default();
                return Ok(());
            }
            return Err(ClientError::Refused {
                phase: Phase::Helo,
                reply: helo,
            });
        }
        Err(ClientError::Refused { phase, reply })
    }

    /// STARTTLS: the command, the handshake under `options`, and EHLO again. A refused
    /// command leaves the session usable in clear text; any later failure breaks it.
    async fn starttls(
        &mut self,
        hello_name: &str,
        options: &TlsOptions,
    ) -> Result<(), ClientError> {
        let config_error = |detail: String| ClientError::Policy {
            phase: Phase::StartTls,
            // 4.3.5: system incorrectly configured
            status: "4.3.5",
            detail,
        };
        let config = client_config(options).map_err(config_error)?;
        let name = server_name(options, self.host.as_deref()).map_err(config_error)?;
        let reply = self.command(Phase::StartTls, "STARTTLS\r\n").await?;
        if reply.code != 220 {
            return Err(ClientError::Refused {
                phase: Phase::StartTls,
                reply,
            });
        }
        // Whatever arrived with the 220 was sent before the handshake and must not be read
        // as if it came over TLS (the STARTTLS command injection of CVE-2011-0411).
        if !self.stream.buffer().is_empty() {
            self.broken = true;
            return Err(ClientError::Malformed {
                phase: Phase::StartTls,
                detail: format!(
                    "{} sent data after its STARTTLS reply, before the TLS handshake",
                    self.remote_mta
                ),
            });
        }
        self.broken = true; // until the handshake and the new EHLO succeed
        let plain =
            std::mem::replace(&mut self.stream, BufReader::new(Box::new(Detached))).into_inner();
        let connector = tokio_rustls::TlsConnector::from(config);
        let shown = name.to_str().into_owned();
        let stream =
            match tokio::time::timeout(self.timeouts.command, connector.connect(name, plain)).await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    return Err(ClientError::Tls {
                        detail: handshake_failure(&self.remote_mta, &shown, options.policy, &e),
                        problem: certificate_problem(&e),
                    });
                }
                Err(_) => {
                    return Err(ClientError::Timeout {
                        phase: Phase::StartTls,
                        after: self.timeouts.command,
                    });
                }
            };
        let verified = options.policy == TlsPolicy::Verify || !options.dane.is_empty();
        let name = server_name(options, self.host.as_deref()).map_err(config_error)?;
        let checked = (options.audit && !verified)
            .then(|| crate::tls::audit(options, &name, stream.get_ref().1));
        self.tls = Some(TlsInfo::of(stream.get_ref().1, verified, checked));
        self.stream = BufReader::new(Box::new(stream));
        self.broken = false;
        self.caps = Capabilities::default();
        self.hello(hello_name).await
    }

    /// AUTH as `creds` say: with a password PLAIN (preferred) or LOGIN, with an access token
    /// OAUTHBEARER (preferred) or XOAUTH2 ([`auth::choose`]). Refuses to send either secret
    /// without TLS unless the policy is `none`, where the operator chose clear text.
    async fn authenticate(
        &mut self,
        creds: &Credentials,
        policy: TlsPolicy,
        target: &Target,
    ) -> Result<(), ClientError> {
        let secret = creds.secret();
        if self.tls.is_none() && policy != TlsPolicy::None {
            return Err(ClientError::Policy {
                phase: Phase::Auth,
                // 4.7.11: encryption required for the authentication mechanism
                status: "4.7.11",
                detail: format!(
                    "refusing to send the {} of {:?} to {} in clear text: the session is not encrypted (TLS policy {policy}; only policy none allows AUTH without TLS)",
                    secret.as_str(),
                    creds.username(),
                    self.remote_mta
                ),
            });
        }
        let Some(mechanism) = auth::choose(&self.caps, secret) else {
            let spoken: Vec<&str> = secret.mechanisms().iter().map(|m| m.as_str()).collect();
            return Err(ClientError::Policy {
                phase: Phase::Auth,
                // 4.7.4: security features not supported
                status: "4.7.4",
                detail: format!(
                    "{} offers no AUTH mechanism this client speaks ({}); it offers: {}",
                    self.remote_mta,
                    spoken.join(", "),
                    if self.caps.auth.is_empty() {
                        "none".to_owned()
                    } else {
                        self.caps.auth.join(" ")
                    }
                ),
            });
        };
        let reply = match creds {
            Credentials::Password { username, password } => match mechanism {
                Mechanism::Login => {
                    let mut reply = self.command(Phase::Auth, "AUTH LOGIN\r\n").await?;
                    for answer in [username, password] {
                        if reply.code != 334 {
                            break;
                        }
                        reply = self
                            .command(Phase::Auth, &auth::response_line(answer))
                            .await?;
                    }
                    reply
                }
                _ => {
                    self.command(Phase::Auth, &auth::plain_command(username, password))
                        .await?
                }
            },
            Credentials::Bearer { username, token } => {
                return self.bearer(mechanism, username, token, target).await;
            }
        };
        if reply.code == 235 {
            self.authenticated = true;
            return Ok(());
        }
        if reply.code == 334 {
            // a challenge this client cannot answer: the exchange is out of step
            self.broken = true;
        }
        Err(ClientError::Refused {
            phase: Phase::Auth,
            reply,
        })
    }

    /// AUTH OAUTHBEARER or XOAUTH2 with `token`. A server that refuses the token sends an
    /// error challenge (334 and base64 JSON) first; the client answers it as the mechanism
    /// says (`^A`, or an empty line) so the server ends the exchange with its final reply,
    /// and the error names both.
    async fn bearer(
        &mut self,
        mechanism: Mechanism,
        username: &str,
        token: &str,
        target: &Target,
    ) -> Result<(), ClientError> {
        if !auth::is_bearer_token(token) || username.contains(['\x01', '\r', '\n', '\0']) {
            return Err(ClientError::Policy {
                phase: Phase::Auth,
                // 4.7.0: other or undefined security status
                status: "4.7.0",
                detail: format!(
                    "refusing to send the access token of {username:?}: a bearer token is letters, digits and -._~+/ (RFC 6750), and a user name has no control character"
                ),
            });
        }
        let initial = match (mechanism, target) {
            (Mechanism::OAuthBearer, Target::Tcp { host, port }) => {
                auth::oauthbearer_response(username, token, Some(host), Some(*port))
            }
            (Mechanism::OAuthBearer, Target::Unix(_)) => {
                auth::oauthbearer_response(username, token, None, None)
            }
            _ => auth::xoauth2_response(username, token),
        };
        let (first, second) = auth::initial_lines(mechanism, &initial);
        let mut reply = self.command(Phase::Auth, &first).await?;
        if let Some(line) = second
            && reply.code == 334
        {
            reply = self.command(Phase::Auth, &line).await?;
        }
        let mut challenge = None;
        if reply.code == 334 {
            challenge = Some(auth::error_challenge(&reply));
            reply = self
                .command(Phase::Auth, auth::abort_line(mechanism))
                .await?;
        }
        if reply.code == 235 {
            self.authenticated = true;
            return Ok(());
        }
        if reply.code == 334 {
            // a second challenge: the exchange is out of step
            self.broken = true;
        }
        Err(match challenge {
            Some(challenge) => ClientError::TokenRefused {
                mechanism: mechanism.as_str(),
                challenge,
                reply,
            },
            None => ClientError::Refused {
                phase: Phase::Auth,
                reply,
            },
        })
    }

    /// The TLS session, when STARTTLS succeeded.
    pub fn tls(&self) -> Option<TlsInfo> {
        self.tls.clone()
    }

    /// True after a successful AUTH.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// The extensions the peer offered (after STARTTLS: those offered over TLS).
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The peer's name for `state.bounce.remote_mta`: the name in its greeting, else the
    /// configured host or socket path.
    pub fn remote_mta(&self) -> &str {
        &self.remote_mta
    }

    /// Bounds everything from now on by `deadline` (None: each step by its own timeout
    /// only). A step cut short fails with [`ClientError::Deadline`]; under LMTP the
    /// recipients whose replies came before it keep them.
    pub fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    /// False once the connection failed or the server announced it is closing.
    pub fn is_usable(&self) -> bool {
        !self.broken
    }

    /// Time since the last exchange.
    pub fn idle(&self) -> Duration {
        self.last_used.elapsed()
    }

    /// Resets the session for the next transaction; on a kept connection this also proves
    /// the server still listens before a message is committed to it.
    pub async fn rset(&mut self) -> Result<(), ClientError> {
        let reply = self.command(Phase::Rset, "RSET\r\n").await?;
        if reply.code == 250 {
            Ok(())
        } else {
            self.broken = true;
            Err(ClientError::Refused {
                phase: Phase::Rset,
                reply,
            })
        }
    }

    /// Says QUIT and closes, ignoring what the server does.
    pub async fn quit(mut self) {
        if !self.broken {
            let _ = self.command(Phase::Quit, "QUIT\r\n").await;
        }
        let _ = self.stream.get_mut().shutdown().await;
    }

    /// One transaction: MAIL, RCPT for each recipient, DATA with the dot-stuffed message.
    /// Returns one outcome per recipient of `env`, in order. With PIPELINING, MAIL and all
    /// RCPTs go in one write. Under LMTP each accepted recipient gets its own reply after the
    /// final dot (RFC 2033); under SMTP the one reply counts for all.
    pub async fn send(&mut self, env: &Envelope, message: &[u8]) -> Vec<RcptOutcome> {
        let n = env.recipients.len();
        let all = |e: ClientError| vec![RcptOutcome::Failed(e); n];
        if self.broken {
            return all(ClientError::Closed { phase: Phase::Mail });
        }
        if env.has_utf8_address() && !self.caps.smtputf8 {
            return all(ClientError::NotOffered {
                phase: Phase::Mail,
                status: "5.6.7",
                detail: format!(
                    "SMTPUTF8 required but not supported by {} (the message has non-ASCII addresses)",
                    self.remote_mta
                ),
            });
        }
        let eight_bit = is_8bit(message);
        let smtputf8 =
            env.utf8_message || env.has_utf8_address() || (eight_bit && has_utf8_headers(message));
        let mail = match mail_command(env, &self.caps, message.len(), eight_bit, smtputf8) {
            Ok(line) => line,
            Err(e) => return all(ClientError::unsendable(Phase::Mail, e)),
        };
        // A recipient whose RCPT line cannot be sent fails alone; the others go ahead.
        let mut outcomes: Vec<Option<RcptOutcome>> = vec![None; n];
        let mut rcpts: Vec<(usize, String)> = Vec::with_capacity(n);
        for (i, r) in env.recipients.iter().enumerate() {
            match rcpt_command(r, &self.caps) {
                Ok(line) => rcpts.push((i, line)),
                Err(e) => {
                    outcomes[i] = Some(RcptOutcome::Failed(ClientError::unsendable(Phase::Rcpt, e)))
                }
            }
        }
        let finish = |outcomes: Vec<Option<RcptOutcome>>, rest: &dyn Fn() -> RcptOutcome| {
            outcomes
                .into_iter()
                .map(|o| o.unwrap_or_else(rest))
                .collect::<Vec<_>>()
        };
        if rcpts.is_empty() {
            return finish(outcomes, &|| unreachable!("every recipient has failed"));
        }

        // MAIL and RCPT replies
        let mail_reply;
        let mut rcpt_replies: Vec<Reply> = Vec::with_capacity(n);
        if self.caps.pipelining {
            let batch: String = std::iter::once(mail.as_str())
                .chain(rcpts.iter().map(|(_, line)| line.as_str()))
                .collect();
            if let Err(e) = self
                .write(Phase::Mail, batch.as_bytes(), self.timeouts.command)
                .await
            {
                return all(e);
            }
            mail_reply = match self.read_reply(Phase::Mail, self.timeouts.command).await {
                Ok(r) => r,
                Err(e) => return all(e),
            };
            for _ in 0..rcpts.len() {
                match self.read_reply(Phase::Rcpt, self.timeouts.command).await {
                    Ok(r) => rcpt_replies.push(r),
                    Err(e) => return all(e),
                }
            }
        } else {
            mail_reply = match self.command(Phase::Mail, &mail).await {
                Ok(r) => r,
                Err(e) => return all(e),
            };
            if mail_reply.is_positive() {
                for (_, cmd) in &rcpts {
                    match self.command(Phase::Rcpt, cmd).await {
                        Ok(r) => rcpt_replies.push(r),
                        Err(e) => return all(e),
                    }
                }
            }
        }
        if !mail_reply.is_positive() {
            let _ = self.reset_after_failure().await;
            let refused = RcptOutcome::Refused {
                phase: Phase::Mail,
                reply: mail_reply,
            };
            return finish(outcomes, &|| refused.clone());
        }
        let mut accepted = Vec::new();
        for ((i, _), reply) in rcpts.iter().zip(rcpt_replies) {
            let i = *i;
            if reply.is_positive() {
                accepted.push(i);
            } else {
                outcomes[i] = Some(RcptOutcome::Refused {
                    phase: Phase::Rcpt,
                    reply,
                });
            }
        }
        if accepted.is_empty() {
            let _ = self.reset_after_failure().await;
            return finish(outcomes, &|| unreachable!("every recipient has a reply"));
        }

        // DATA, or BDAT when the peer offers CHUNKING (SMTP only: LMTP peers keep DATA)
        let final_phase = if self.caps.chunking && self.protocol == Protocol::Smtp {
            let body = crlf_line_ends(message);
            let mut payload = format!("BDAT {} LAST\r\n", body.len()).into_bytes();
            payload.extend_from_slice(&body);
            if let Err(e) = self.write(Phase::Bdat, &payload, self.timeouts.data).await {
                return finish(outcomes, &|| RcptOutcome::Failed(e.clone()));
            }
            Phase::Bdat
        } else {
            let data_reply = match self.command(Phase::Data, "DATA\r\n").await {
                Ok(r) => r,
                Err(e) => return finish(outcomes, &|| RcptOutcome::Failed(e.clone())),
            };
            if data_reply.code != 354 {
                let _ = self.reset_after_failure().await;
                let refused = RcptOutcome::Refused {
                    phase: Phase::Data,
                    reply: data_reply,
                };
                return finish(outcomes, &|| refused.clone());
            }
            let payload = dot_stuff(message);
            if let Err(e) = self
                .write(Phase::DataEnd, &payload, self.timeouts.data)
                .await
            {
                return finish(outcomes, &|| RcptOutcome::Failed(e.clone()));
            }
            Phase::DataEnd
        };
        let replies_due = match self.protocol {
            Protocol::Lmtp => accepted.len(),
            Protocol::Smtp => 1,
        };
        let mut final_replies = Vec::with_capacity(replies_due);
        for _ in 0..replies_due {
            match self.read_reply(final_phase, self.timeouts.data).await {
                Ok(r) => final_replies.push(r),
                // The recipients answered so far keep their answer; the rest are unknown.
                Err(e) => {
                    self.broken = true;
                    let failed = RcptOutcome::Failed(e);
                    for (k, &i) in accepted.iter().enumerate() {
                        outcomes[i] = Some(match final_replies.get(k) {
                            Some(r) => final_outcome(final_phase, r.clone()),
                            None => failed.clone(),
                        });
                    }
                    return finish(outcomes, &|| unreachable!());
                }
            }
        }
        for (k, &i) in accepted.iter().enumerate() {
            let reply = match self.protocol {
                Protocol::Lmtp => final_replies[k].clone(),
                Protocol::Smtp => final_replies[0].clone(),
            };
            outcomes[i] = Some(final_outcome(final_phase, reply));
        }
        finish(outcomes, &|| unreachable!())
    }

    /// RSET after a refused MAIL, RCPT or DATA, so the session is clean for the next
    /// transaction; if even that fails, the connection is not reused.
    async fn reset_after_failure(&mut self) -> Result<(), ClientError> {
        if self.broken {
            return Ok(());
        }
        self.rset().await.inspect_err(|_| self.broken = true)
    }

    /// Sends one command line and reads its reply.
    async fn command(&mut self, phase: Phase, line: &str) -> Result<Reply, ClientError> {
        command::check_line(line).map_err(|e| ClientError::unsendable(phase, e))?;
        self.write(phase, line.as_bytes(), self.timeouts.command)
            .await?;
        self.read_reply(phase, self.timeouts.command).await
    }

    /// `limit`, cut short by the deadline; true when the deadline is what bounds it.
    fn bounded(&self, limit: Duration) -> (Duration, bool) {
        match self.deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left < limit {
                    (left, true)
                } else {
                    (limit, false)
                }
            }
            None => (limit, false),
        }
    }

    fn timed_out(phase: Phase, after: Duration, by_deadline: bool) -> ClientError {
        if by_deadline {
            ClientError::Deadline { phase }
        } else {
            ClientError::Timeout { phase, after }
        }
    }

    async fn write(
        &mut self,
        phase: Phase,
        bytes: &[u8],
        limit: Duration,
    ) -> Result<(), ClientError> {
        let (limit, by_deadline) = self.bounded(limit);
        let stream = self.stream.get_mut();
        let result = tokio::time::timeout(limit, async {
            stream.write_all(bytes).await?;
            stream.flush().await
        })
        .await;
        self.last_used = Instant::now();
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.broken = true;
                Err(ClientError::Io {
                    phase,
                    detail: e.to_string(),
                })
            }
            Err(_) => {
                self.broken = true;
                Err(Self::timed_out(phase, limit, by_deadline))
            }
        }
    }

    /// Reads one (possibly multi-line) reply within `limit`. A 421 marks the connection
    /// closing.
    async fn read_reply(&mut self, phase: Phase, limit: Duration) -> Result<Reply, ClientError> {
        let (limit, by_deadline) = self.bounded(limit);
        let result =
            tokio::time::timeout(limit, read_lines(&mut self.stream, phase, &self.remote_mta))
                .await;
        self.last_used = Instant::now();
        let result = match result {
            Ok(r) => r,
            Err(_) => Err(Self::timed_out(phase, limit, by_deadline)),
        };
        match result {
            Ok(reply) => {
                if reply.code == 421 {
                    self.broken = true;
                }
                Ok(reply)
            }
            Err(e) => {
                self.broken = true;
                Err(e)
            }
        }
    }
}

fn final_outcome(phase: Phase, reply: Reply) -> RcptOutcome {
    if reply.is_positive() {
        RcptOutcome::Accepted(reply)
    } else {
        RcptOutcome::Refused { phase, reply }
    }
}

/// The stream's stand-in while STARTTLS moves the real one into the TLS session; a
/// connection whose handshake failed keeps it, and every use of it fails.
struct Detached;

impl AsyncRead for Detached {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        _buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Err(std::io::ErrorKind::NotConnected.into()))
    }
}

impl AsyncWrite for Detached {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        _buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Err(std::io::ErrorKind::NotConnected.into()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// The class of certificate problem that failed a handshake, if that is what failed it.
fn certificate_problem(e: &std::io::Error) -> Option<crate::tls::CertProblem> {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(why)) => Some(crate::tls::CertProblem::of(why)),
        _ => None,
    }
}

/// Why the handshake with `peer` failed, naming the certificate problem when there is one.
fn handshake_failure(peer: &str, name: &str, policy: TlsPolicy, e: &std::io::Error) -> String {
    let rustls_error = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::InvalidCertificate(why)) => format!(
            "TLS policy {policy}: the certificate of {peer} is not trusted for {name}: {why:?}"
        ),
        Some(other) => format!("TLS handshake with {peer} failed: {other}"),
        None => format!("TLS handshake with {peer} failed: {e}"),
    }
}

/// Reads the lines of one reply, each checked as it comes: at most [`MAX_LINE`] octets,
/// UTF-8, `ddd-text` or `ddd text`, and at most [`MAX_REPLY_LINES`] of them. Anything else
/// is a [`ClientError::Malformed`] naming `peer` and what was wrong.
async fn read_lines<R: tokio::io::AsyncBufRead + Unpin>(
    stream: &mut R,
    phase: Phase,
    peer: &str,
) -> Result<Reply, ClientError> {
    let malformed = |detail: String| ClientError::Malformed { phase, detail };
    let mut lines: Vec<String> = Vec::new();
    loop {
        let mut buf = Vec::new();
        let read = (&mut *stream)
            .take(MAX_LINE as u64 + 2)
            .read_until(b'\n', &mut buf)
            .await
            .map_err(|e| ClientError::Io {
                phase,
                detail: e.to_string(),
            })?;
        if read == 0 {
            return Err(ClientError::Closed { phase });
        }
        if !buf.ends_with(b"\n") {
            if buf.len() <= MAX_LINE {
                // the peer closed in the middle of a line
                return Err(ClientError::Closed { phase });
            }
            return Err(malformed(format!(
                "reply line over {MAX_LINE} octets from {peer}"
            )));
        }
        while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            buf.pop();
        }
        // Reply text in another charset (a Latin-1 greeting) is the peer's business: only the
        // code and separator must be right, so it is read leniently.
        let line = String::from_utf8_lossy(&buf).into_owned();
        let parsed = parse_line(&line).map_err(|e| malformed(format!("{e} from {peer}")))?;
        lines.push(line);
        if parsed.last {
            break;
        }
        if lines.len() >= MAX_REPLY_LINES {
            return Err(malformed(format!(
                "reply of more than {MAX_REPLY_LINES} lines from {peer}"
            )));
        }
    }
    parse_reply(&lines).map_err(|e| malformed(format!("{e} from {peer}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_table() {
        let ok = |s: &str, t: Target| assert_eq!(Target::parse(s), Ok(t), "{s}");
        ok(
            "unix:/run/dovecot/lmtp",
            Target::Unix("/run/dovecot/lmtp".into()),
        );
        ok("/run/lmtp", Target::Unix("/run/lmtp".into()));
        ok(
            "127.0.0.1:24",
            Target::Tcp {
                host: "127.0.0.1".into(),
                port: 24,
            },
        );
        ok(
            "mail.example.org:2424",
            Target::Tcp {
                host: "mail.example.org".into(),
                port: 2424,
            },
        );
        ok(
            "[::1]:24",
            Target::Tcp {
                host: "::1".into(),
                port: 24,
            },
        );
        for bad in [
            "unix:relative",
            "host",
            "host:0",
            "host:x",
            ":24",
            "::1:24",
            "[::1]24",
        ] {
            let err = Target::parse(bad).unwrap_err();
            assert!(
                err.contains("host:port") && err.contains(bad),
                "{bad}: {err}"
            );
        }
        assert_eq!(Target::parse("[::1]:24").unwrap().to_string(), "[::1]:24");
        assert_eq!(Target::parse("/x").unwrap().to_string(), "unix:/x");
    }
}
