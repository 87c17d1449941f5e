//! The part every relaying delivery stage shares (LMTP to a mailbox server, SMTP to a
//! smarthost): one configured peer, the worker's kept connection to it, and one attempt of
//! a message to all its recipients turned into per-recipient [`RcptResult`]s.
//!
//! A failure before the transaction (refused connection, timeout, a refused greeting,
//! EHLO/LHLO, STARTTLS or AUTH, or an access token that cannot be read: [`FreshAuth`]) is
//! about the peer, not a recipient: every recipient is deferred, whatever the reply code,
//! so a misconfigured or overloaded peer never bounces mail. Inside the transaction the
//! server's replies decide, per recipient.
//!
//! The relaying stages are one program over a peer kind ([`RelayStage`]): what tells them
//! apart is how their section names the peer ([`PeerKind`]) and their help text.
//!
//! This module never touches the queue; what becomes of the message is
//! `delivery::conclude`'s business.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pepsi_smtp::{
    ClientError, Connection, Credentials, Envelope, OpenOptions, Phase, Protocol, RcptOutcome,
    Target, Timeouts,
};

use crate::delivery::{self, Failure, RcptResult, RetryPolicy};
use crate::keep::{Keeper, Rules};
use crate::mime::{self, Prepared};
use pepsi_conf::config::{Config, ConfigError, Section, StageName};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};

/// The one server a stage relays to, and how to talk to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    pub target: Target,
    pub protocol: Protocol,
    /// The name given in EHLO/LHLO.
    pub hello_name: String,
    pub timeouts: Timeouts,
    /// A kept connection idle longer than this is closed rather than reused; zero closes
    /// the connection after every message.
    pub connection_idle: Duration,
    /// STARTTLS policy and AUTH credentials.
    pub options: OpenOptions,
    /// Credentials read again for each new connection, in place of `options.auth` (the
    /// smarthost's OAuth 2.0 access token).
    pub fresh_auth: Option<FreshAuth>,
}

/// AUTH credentials read again for every new connection rather than once at start: the
/// smarthost's OAuth 2.0 access token, which `pepsi-helper-token-refresh` replaces in its
/// file before it expires. The stage that has them says how they are read; a kept
/// connection, logged in already, serves on with the token it was opened with.
pub trait FreshCredentials: fmt::Debug + Send + Sync {
    /// The credentials for a connection opened now, or why there are none (the token file
    /// unreadable, malformed or expired), naming where they were looked for. No connection
    /// is opened then: every recipient waits, 4.7.0, this text its `last_error`.
    fn read(&self) -> Result<Credentials, String>;

    /// Where the credentials come from, for the `last_error` of a refused AUTH (`the access
    /// token in /var/lib/pepsi/tokens/m365.json`).
    fn source(&self) -> String;
}

/// A [`FreshCredentials`] of a [`Peer`]. Two peers are the same only with the same one,
/// so a kept connection is reused only by the stage section that opened it.
#[derive(Debug, Clone)]
pub struct FreshAuth(pub Arc<dyn FreshCredentials>);

impl PartialEq for FreshAuth {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Peer {
    /// The peer's name when no greeting named it: the host, or the socket path.
    pub fn name(&self) -> String {
        match &self.target {
            Target::Tcp { host, .. } => host.clone(),
            Target::Unix(path) => path.display().to_string(),
        }
    }

    /// A new connection, logged in with the credentials of this moment; the failure is the
    /// recipients' (every one of them waits).
    async fn open(&self) -> Result<Connection, Failure> {
        let fresh;
        let options = match &self.fresh_auth {
            None => &self.options,
            Some(FreshAuth(source)) => {
                let creds = source.read().map_err(|why| {
                    tracing::warn!(target = %self.target, "not connecting: {why}");
                    Failure {
                        // 4.7.0: other or undefined security status
                        phase: Some(Phase::Auth.as_str().to_owned()),
                        ..Failure::new(why, "4.7.0")
                    }
                })?;
                fresh = OpenOptions {
                    auth: Some(creds),
                    ..self.options.clone()
                };
                &fresh
            }
        };
        let conn = Connection::open_with(
            &self.target,
            self.protocol,
            &self.hello_name,
            self.timeouts,
            options,
        )
        .await
        .map_err(|e| self.session_failure(&e))?;
        tracing::debug!(
            target = %self.target,
            remote = conn.remote_mta(),
            tls = %conn.tls().map(|t| t.to_string()).unwrap_or_else(|| "none".into()),
            authenticated = conn.is_authenticated(),
            "connected"
        );
        Ok(conn)
    }

    /// A session that failed before the transaction, as the recipients' failure; a refused
    /// AUTH with fresh credentials names where they came from.
    fn session_failure(&self, e: &ClientError) -> Failure {
        tracing::warn!(target = %self.target, "session failed: {e}");
        let mut failure = Failure::from_client(e, &self.name());
        if let Some(FreshAuth(source)) = &self.fresh_auth
            && e.phase() == Phase::Auth
        {
            failure.diagnostic = format!("{} (AUTH with {})", failure.diagnostic, source.source());
        }
        failure
    }
}

/// `CONNECT_TIMEOUT`, `GREETING_TIMEOUT`, `COMMAND_TIMEOUT` and `DATA_TIMEOUT` of a stage
/// section; an unset or zero value takes the default.
pub fn timeouts(s: &Section<'_>) -> Result<Timeouts, ConfigError> {
    let d = Timeouts::default();
    let positive = |opt: &str, default: Duration| -> Result<Duration, ConfigError> {
        Ok(s.duration_opt(opt)?
            .filter(|v| !v.is_zero())
            .unwrap_or(default))
    };
    Ok(Timeouts {
        connect: positive("CONNECT_TIMEOUT", d.connect)?,
        greeting: positive("GREETING_TIMEOUT", d.greeting)?,
        command: positive("COMMAND_TIMEOUT", d.command)?,
        data: positive("DATA_TIMEOUT", d.data)?,
    })
}

/// `CONNECTION_IDLE` of a stage section, 30 seconds when unset.
pub fn connection_idle(s: &Section<'_>) -> Result<Duration, ConfigError> {
    Ok(s.duration_opt("CONNECTION_IDLE")?
        .unwrap_or(Duration::from_secs(30)))
}

/// The hello name: `option` of the stage section, else `[pepsi] HOSTNAME`, else the
/// system's host name.
pub fn hello_name(cfg: &Config, s: &Section<'_>, option: &str) -> Result<String, ConfigError> {
    cfg.name_option(s, option)
}

/// A kept connection is named by its target in the logs.
impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.target.fmt(f)
    }
}

/// A worker's relay: at most one kept connection ([`Rules::ONE_PEER`]), reused while it is
/// for the same peer, younger than `CONNECTION_IDLE` and answers RSET.
pub struct Relay {
    kept: Keeper<Peer>,
}

impl Default for Relay {
    fn default() -> Self {
        Relay {
            kept: Keeper::new(Rules::ONE_PEER),
        }
    }
}

impl Relay {
    /// A usable connection to `peer`: the kept one if it still serves, else a new one.
    async fn connection(&self, peer: &Peer) -> Result<Connection, Failure> {
        match self.kept.take(peer).await {
            Some(conn) => Ok(conn),
            None => peer.open().await,
        }
    }

    /// The whole pass of a relay stage over the message of `ctx`: one attempt to `peer`
    /// for all its recipients, concluded under `policy` (delivered, bounced, paused).
    ///
    /// With `attempt`, the attempt ends once it has taken that long (a peer slower than
    /// ATTEMPT_TIMEOUT): every step is bounded by the deadline, so a recipient the peer
    /// answered before it keeps its answer (LMTP gives one per recipient after the data)
    /// and the rest wait for their retry, transient, 4.4.2.
    pub async fn pass(
        &self,
        ctx: &StageContext<'_>,
        peer: &Peer,
        policy: &RetryPolicy,
        attempt: Option<Duration>,
    ) -> Result<Terminal, StageError> {
        let message = ctx.raw_message()?;
        let env = delivery::envelope(ctx.mail_from(), ctx.rcpt_to(), ctx.state())?;
        let deadline = attempt.map(|limit| (Instant::now() + limit, limit));
        let results = self.deliver(peer, &env, &message, deadline).await;
        delivery::conclude(ctx, policy, &results)
    }

    /// One delivery attempt of `message` to every recipient of `env` in one transaction:
    /// one result per recipient, in order. `deadline`: when the attempt must end, and the
    /// ATTEMPT_TIMEOUT it comes from (named in the failure).
    pub async fn deliver(
        &self,
        peer: &Peer,
        env: &Envelope,
        message: &[u8],
        deadline: Option<(Instant, Duration)>,
    ) -> Vec<RcptResult> {
        let n = env.recipients.len();
        let over = |limit: Duration| {
            let mut f = Failure::attempt_timed_out(limit);
            f.remote_mta = Some(peer.name());
            vec![RcptResult::Transient(f); n]
        };
        let opened = match deadline {
            None => self.connection(peer).await,
            Some((at, limit)) => {
                let left = at.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, self.connection(peer)).await {
                    Ok(opened) => opened,
                    Err(_) => return over(limit),
                }
            }
        };
        let mut conn = match opened {
            Ok(conn) => conn,
            Err(failure) => return vec![RcptResult::Transient(failure); n],
        };
        conn.set_deadline(deadline.map(|(at, _)| at));
        let remote = conn.remote_mta().to_owned();
        // What the peer can take decides the form of the message (or that it cannot go).
        let outcomes = match mime::prepare_for_peer(env, message, conn.capabilities(), &remote) {
            Prepared::Send { message, .. } => conn.send(env, message).await,
            Prepared::Downgraded(seven_bit) => {
                tracing::info!(%remote, "no 8BITMIME: sending the message as 7-bit MIME");
                conn.send(env, &seven_bit).await
            }
            Prepared::Refuse(failure) => {
                tracing::info!(%remote, "not sent: {}", failure.summary());
                conn.set_deadline(None);
                self.keep(peer, conn).await;
                return vec![RcptResult::Permanent(failure); n];
            }
        };
        conn.set_deadline(None);
        for (rcpt, outcome) in env.recipients.iter().zip(&outcomes) {
            match outcome {
                RcptOutcome::Accepted(reply) => {
                    tracing::info!(rcpt = %rcpt.address, %remote, "delivered: {reply}")
                }
                RcptOutcome::Refused { phase, reply } => {
                    tracing::info!(rcpt = %rcpt.address, %remote, "refused at {}: {reply}", phase.as_str())
                }
                RcptOutcome::Failed(e) => {
                    tracing::warn!(rcpt = %rcpt.address, %remote, "not delivered: {e}")
                }
            }
        }
        self.keep(peer, conn).await;
        outcomes
            .iter()
            .map(|o| RcptResult::from_outcome(o, &remote))
            .collect()
    }

    /// Keeps `conn` for the next message, or closes it when it is broken or reuse is off.
    async fn keep(&self, peer: &Peer, conn: Connection) {
        self.kept
            .put(peer.clone(), conn, peer.connection_idle)
            .await;
    }
}

/// What one relaying stage program is: its name, and how its section names the peer (`LMTP`;
/// `HOST`, `PORT`, TLS and AUTH for a smarthost). The rest of the section — the retry policy
/// and `ATTEMPT_TIMEOUT` — and the pass are [`RelayStage`]'s, the same for every kind.
pub trait PeerKind: 'static {
    /// The binary name operators write as `PROGRAM`.
    const PROGRAM: &'static str;
    /// The peer of `[stage-<stage>]` (`s`).
    fn peer(cfg: &Config, s: &Section<'_>, stage: &str) -> Result<Peer, ConfigError>;
}

/// The `[stage-<name>]` settings of one relaying stage.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayOptions {
    /// Where and how to reach the peer, `CONNECTION_IDLE` included.
    pub peer: Peer,
    pub policy: RetryPolicy,
    /// `ATTEMPT_TIMEOUT`: one delivery attempt, the session included; checked at start
    /// against the MAX_RUNTIME its passes run under. Recipients the peer answered before it
    /// keep their answers.
    pub attempt_timeout: Duration,
}

impl RelayOptions {
    /// Reads `[stage-<stage>]` for a stage of kind `K`.
    pub fn from_config<K: PeerKind>(cfg: &Config, stage: &str) -> Result<Self, ConfigError> {
        let s = cfg.stage_section_named(stage);
        Ok(RelayOptions {
            peer: K::peer(cfg, &s, stage)?,
            policy: RetryPolicy::from_config(cfg, stage)?,
            attempt_timeout: s
                .duration_opt("ATTEMPT_TIMEOUT")?
                .unwrap_or(pepsi_contract::stage::DEFAULT_ATTEMPT_TIMEOUT),
        })
    }
}

/// A relaying stage of kind `K`: every message of a pass goes to the section's peer in one
/// transaction, over the worker's one kept connection.
pub struct RelayStage<K> {
    relay: Relay,
    kind: std::marker::PhantomData<fn() -> K>,
}

impl<K> Default for RelayStage<K> {
    fn default() -> Self {
        RelayStage {
            relay: Relay::default(),
            kind: std::marker::PhantomData,
        }
    }
}

impl<K: PeerKind> Stage for RelayStage<K> {
    const PROGRAM: &'static str = K::PROGRAM;
    const LOAD: Load = Load::Full;
    type Section = RelayOptions;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self::default())
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<RelayOptions> {
        let settings = RelayOptions::from_config::<K>(cfg, name)?;
        pepsi_contract::stage::check_attempt_timeout(cfg, name, settings.attempt_timeout)
            .map_err(anyhow::Error::msg)?;
        Ok(settings)
    }

    async fn process(
        &self,
        options: &RelayOptions,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        self.relay
            .pass(
                ctx,
                &options.peer,
                &options.policy,
                Some(options.attempt_timeout),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_options_table() {
        let cfg = Config::from_str_named(
            "[pepsi]\nHOSTNAME = mx.example.test\n[stage-a]\nDATA_TIMEOUT = 2m\n\
             CONNECT_TIMEOUT = 0\nCONNECTION_IDLE = 0\n[stage-b]\nHELO_NAME = relay.test\n",
            "t.conf",
        )
        .unwrap();
        let a = cfg.section("stage-a");
        let t = timeouts(&a).unwrap();
        assert_eq!(t.data, Duration::from_secs(120));
        assert_eq!(t.connect, Timeouts::default().connect, "zero means default");
        assert!(connection_idle(&a).unwrap().is_zero());
        assert_eq!(
            hello_name(&cfg, &a, "HELO_NAME").unwrap(),
            "mx.example.test"
        );
        let b = cfg.section("stage-b");
        assert_eq!(connection_idle(&b).unwrap(), Duration::from_secs(30));
        assert_eq!(hello_name(&cfg, &b, "HELO_NAME").unwrap(), "relay.test");

        let bare = Config::from_str_named("[stage-c]\nDATA_TIMEOUT = soon\n", "t.conf").unwrap();
        let c = bare.section("stage-c");
        assert!(!hello_name(&bare, &c, "HELO_NAME").unwrap().is_empty());
        let err = timeouts(&c).unwrap_err().to_string();
        assert!(
            err.contains("t.conf:2") && err.contains("DATA_TIMEOUT"),
            "{err}"
        );
    }
}
