//! pepsi-stage-milter: asks a mail filter that speaks the Sendmail milter protocol
//! (version 6: rspamd, OpenDKIM, spamass-milter, anything built on libmilter) about each
//! message, replaying the SMTP session from the stored row, and carries out every answer.
//!
//! Reads: the envelope, the whole message (`Load::Full`), `state.origin` (the client, HELO,
//! TLS and login the filter is told of as macros), `state.dsn`, and `state.milter.<stage>`.
//! Writes: the filter's changes (header fields added, inserted, changed or deleted, the
//! body replaced, the sender changed, recipients added or deleted, with `state.dsn` kept in
//! step), and `state.milter.<stage>`: `{"attempts": n, "reason": reply}` while deferred, `{"quarantine":
//! reason}` on a held message. Terminal helpers: `advance` (or `rewrite_recipients`) for
//! what passes; `hold` for what the filter quarantined (held for an operator as
//! `pepsi-queue hold` holds; `pepsi-queue release` sends it on without asking the filter
//! again); `pause` when the whole message waits; a
//! fan-out (`fan_out_keeping_age`) when the recipients part ways: deferred ones a Retry
//! group at this stage, refused ones a row at BOUNCE_STAGE; `finish` when the filter
//! discarded everything.
//!
//! The packets are `protocol`'s, the conversation `session`'s, the changes `edits`' and the
//! decision `plan`'s; this file is the I/O around them. One connection per message.

pub mod edits;
pub mod plan;
pub mod protocol;
pub mod session;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use pepsi_conf::config::{Config, StageName};
use pepsi_contract::mail_log::Event;
use pepsi_contract::stage::{
    FanGroup, FanRecipients, GroupStatus, Load, Stage, StageContext, StageError, Terminal,
};
use pepsi_contract::state::{
    self, Bounce, BounceKind, Dsn, Milter as MilterState, MilterEntry, Origin,
};
use pepsi_outbound::delivery::RetryPolicy;
use serde_json::{Map, Value, json};

use plan::{Decision, DownAction, Facts};
use protocol::{Family, Step};
use session::{Conversation, Message, Timeouts, Unavailable};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-milter",
        exec: "pepsi-stage-milter",
    };
    pub const PROGRAM: &str = "pepsi-stage-milter";
}

/// Where the filter listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `inet:HOST:PORT`, `inet:PORT@HOST` (Sendmail's way), `inet6:…`, or `HOST:PORT`.
    Tcp(String, u16),
    /// `unix:/path` (or `local:/path`).
    Unix(PathBuf),
}

impl Address {
    pub fn parse(v: &str) -> Result<Address, String> {
        let v = v.trim();
        let want = "unix:/path, inet:HOST:PORT or inet:PORT@HOST";
        if let Some(path) = v.strip_prefix("unix:").or_else(|| v.strip_prefix("local:")) {
            if !path.starts_with('/') {
                return Err(format!("{want} (a socket path is absolute)"));
            }
            return Ok(Address::Unix(PathBuf::from(path)));
        }
        let rest = v
            .strip_prefix("inet6:")
            .or_else(|| v.strip_prefix("inet:"))
            .unwrap_or(v);
        // Not an address: a milter socket's `PORT@HOST`.
        let (host, port) = match rest.split_once('@') {
            Some((port, host)) => (host, port),
            None => match rest.rsplit_once(':') {
                Some((host, port)) => (host, port),
                None => return Err(want.to_owned()),
            },
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match port.parse::<u16>() {
            Ok(p) if p > 0 && !host.is_empty() => Ok(Address::Tcp(host.to_owned(), p)),
            _ => Err(format!("{want} (a host and a port from 1 to 65535)")),
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp(h, p) if h.contains(':') => write!(f, "inet:[{h}]:{p}"),
            Address::Tcp(h, p) => write!(f, "inet:{h}:{p}"),
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// One `[stage-<name>]` section, read at start.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// `MILTER` (required).
    pub milter: Address,
    /// `CONNECT_TIMEOUT` (10s), `COMMAND_TIMEOUT` (30s), `CONTENT_TIMEOUT` (2m),
    /// `TOTAL_TIMEOUT` (4m, below the stage's MAX_RUNTIME).
    pub timeouts: Timeouts,
    /// `DOWN_ACTION` (tempfail).
    pub down: DownAction,
    /// RETRY_INITIAL, RETRY_FACTOR, RETRY_MAX_INTERVAL, MAX_LIFETIME: the waits of deferred
    /// recipients and when they are given up.
    pub retry: RetryPolicy,
    /// The `j` macro: `HOSTNAME`, else `[pepsi] HOSTNAME`, else the system's name.
    pub hostname: String,
    /// `MAX_EDIT_SIZE` (1M): the most bytes of header and recipient changes one
    /// conversation takes; a filter that asks for more is unavailable.
    pub max_edit_size: usize,
}

impl Options {
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Options> {
        let s = cfg.stage_section_named(stage);
        let file = cfg.file().display().to_string();
        let milter = s.parse_opt("MILTER", Address::parse)?.ok_or_else(|| {
            anyhow::anyhow!(
                "{file}: [stage-{stage}] MILTER is missing: where the filter listens \
                     (e.g. MILTER = inet:127.0.0.1:11332 or unix:/run/opendkim/opendkim.sock)"
            )
        })?;
        let at_least = |opt: &str, default: u64| -> anyhow::Result<Duration> {
            Ok(s.duration_opt(opt)?
                .unwrap_or(Duration::from_secs(default))
                .max(Duration::from_secs(1)))
        };
        let timeouts = Timeouts {
            connect: at_least("CONNECT_TIMEOUT", 10)?,
            command: at_least("COMMAND_TIMEOUT", 30)?,
            content: at_least("CONTENT_TIMEOUT", 120)?,
            total: at_least("TOTAL_TIMEOUT", 240)?,
        };
        let (runtime, governs) = pepsi_contract::stage::governing_max_runtime(cfg, stage)?;
        if timeouts.connect + timeouts.total >= runtime {
            anyhow::bail!(
                "{file}: [stage-{stage}] CONNECT_TIMEOUT + TOTAL_TIMEOUT ({}s) must be below \
                 the MAX_RUNTIME of {governs} ({}s): the dispatcher would stop the worker \
                 before the filter is given up",
                (timeouts.connect + timeouts.total).as_secs(),
                runtime.as_secs()
            );
        }
        Ok(Options {
            milter,
            timeouts,
            down: s
                .parse_opt("DOWN_ACTION", DownAction::parse)?
                .unwrap_or(DownAction::Tempfail),
            retry: RetryPolicy::from_config(cfg, stage)?,
            hostname: cfg.name_option(&s, "HOSTNAME")?,
            max_edit_size: usize::try_from(s.size_opt("MAX_EDIT_SIZE")?.unwrap_or(1 << 20))
                .unwrap_or(usize::MAX),
        })
    }
}

/// The stage: nothing kept between messages but the configuration.
#[derive(Debug, Default)]
pub struct Milter;

/// A connection to a filter, over TCP or a Unix socket.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// A TCP connection that acknowledges what it reads at once. A filter writes its changes
/// and its verdict as separate packets; with Nagle's algorithm on its side, each waits for
/// the acknowledgement of the one before, which this side would otherwise delay (40 ms on
/// Linux) since it has nothing to send until the verdict: a conversation bound by timers,
/// not work.
struct QuickAck(tokio::net::TcpStream);

impl tokio::io::AsyncRead for QuickAck {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        // Quick-ack mode lapses as the connection runs: set it again before each read.
        let _ = socket2::SockRef::from(&self.0).set_tcp_quickack(true);
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for QuickAck {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

async fn connect(address: &Address, wait: Duration) -> Result<Box<dyn Io>, Unavailable> {
    let attempt = async {
        Ok::<Box<dyn Io>, std::io::Error>(match address {
            Address::Tcp(host, port) => {
                let s = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                s.set_nodelay(true)?;
                Box::new(QuickAck(s))
            }
            Address::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
        })
    };
    match tokio::time::timeout(wait, attempt).await {
        Ok(Ok(io)) => Ok(io),
        Ok(Err(e)) => Err(Unavailable(format!("connecting to {address}: {e}"))),
        Err(_) => Err(Unavailable(format!(
            "connecting to {address}: no answer within {}s",
            wait.as_secs()
        ))),
    }
}

/// The SMTP session the message arrived in, as the filter is told of it.
fn message<'a>(options: &Options, ctx: &'a StageContext<'_>) -> Result<Message<'a>, StageError> {
    let origin = Origin::from_state(ctx.state())?.unwrap_or_default();
    let queue_id = ctx.id().to_string();
    let (host, family) = match origin.client_addr {
        Some(ip) => {
            let name = origin
                .iprev
                .as_ref()
                .and_then(|i| i.name.clone())
                .unwrap_or_else(|| format!("[{ip}]"));
            let addr = ip.to_string();
            let family = if ip.is_ipv4() {
                Family::Inet4 { port: 0, addr }
            } else {
                Family::Inet6 { port: 0, addr }
            };
            (name, family)
        }
        None => ("localhost".to_owned(), Family::Unknown),
    };
    let helo = origin
        .helo
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| host.clone());
    let mut mail = vec![format!("<{}>", ctx.mail_from())];
    if let Some(body) = &origin.body {
        mail.push(format!(
            "BODY={}",
            serde_json::to_value(body)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default()
        ));
    }
    if origin.smtputf8 {
        mail.push("SMTPUTF8".into());
    }
    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    let mut connect = vec![
        pair("j", &options.hostname),
        pair(
            "{daemon_name}",
            origin.listener.as_deref().unwrap_or("pepsi"),
        ),
        pair("{if_name}", &options.hostname),
        pair("{client_name}", &host),
        pair("{client_ptr}", &host),
    ];
    if let Some(ip) = origin.client_addr {
        connect.push(pair("_", &format!("{host} [{ip}]")));
        connect.push(pair("{client_addr}", &ip.to_string()));
    }
    let mut helo_macros = Vec::new();
    if let Some(tls) = &origin.tls {
        helo_macros.push(pair("{tls_version}", &tls.version));
        helo_macros.push(pair("{cipher}", &tls.cipher));
    }
    let mut mail_macros = vec![pair("i", &queue_id), pair("{mail_addr}", ctx.mail_from())];
    if let Some(user) = &origin.auth_user {
        mail_macros.push(pair("{auth_authen}", user));
        mail_macros.push(pair("{auth_type}", "PLAIN"));
    }
    let id = vec![pair("i", &queue_id)];
    let macros = HashMap::from([
        (Step::Connect, connect),
        (Step::Helo, helo_macros),
        (Step::Mail, mail_macros),
        (Step::Rcpt, Vec::new()),
        (Step::Data, id.clone()),
        (Step::EndOfHeaders, id.clone()),
        (Step::EndOfMessage, id),
    ]);
    let headers = ctx.headers()?;
    let body = ctx.body()?;
    Ok(Message {
        // A filter may wrap the message (a scanner's report with the original attached),
        // not make it grow without end.
        max_body: 2 * (headers.len() + body.len()) + 1024 * 1024,
        max_edit_size: options.max_edit_size,
        host,
        family,
        helo,
        mail,
        rcpt_to: ctx.rcpt_to(),
        headers,
        body,
        macros,
    })
}

/// This stage's own entry of `state.milter` (`None` when it has none or it does not parse).
/// The other milter stages' entries are theirs: read never, kept as stored.
fn own_entry(state: &Map<String, Value>, stage: &str) -> Option<MilterEntry> {
    state::member(state, MilterState::KEY, stage)
}

/// `state.milter` with this stage's entry set to `entry` (removed when `None`), the other
/// stages' entries as stored.
fn milter_state(state: &Map<String, Value>, stage: &str, entry: Option<MilterEntry>) -> Value {
    state::with_member(state, MilterState::KEY, stage, entry.as_ref())
}

/// How often this stage deferred the message before.
fn attempts(state: &Map<String, Value>, stage: &str) -> u32 {
    match own_entry(state, stage) {
        Some(MilterEntry::Waiting { attempts, .. }) => attempts,
        _ => 0,
    }
}

impl Stage for Milter {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Full;
    type Section = Options;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Milter)
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let filter = options.milter.to_string();
        let name = ctx.options().name.clone();
        // A held message is only ever made pending again by an operator (`pepsi-queue
        // release`): on without asking the filter again.
        let released = matches!(
            own_entry(ctx.state(), &name),
            Some(MilterEntry::Held { .. })
        );
        if released {
            tracing::info!(id = ctx.id(), "released from quarantine");
            let mut state = Map::new();
            state.insert(
                MilterState::KEY.into(),
                milter_state(ctx.state(), &name, None),
            );
            return ctx.advance_with(state);
        }
        let conversation: Conversation = {
            let m = message(options, ctx)?;
            let talked = match connect(&options.milter, options.timeouts.connect).await {
                Ok(mut io) => session::converse(&mut io, &m, options.timeouts).await,
                Err(why) => Err(session::Failed {
                    why,
                    decided: vec![None; ctx.rcpt_to().len()],
                }),
            };
            match talked {
                Ok(c) => c,
                Err(f) => {
                    tracing::warn!(id = ctx.id(), %filter, action = ?options.down, "milter unavailable: {}", f.why);
                    plan::fallback(options.down, &f.decided, &filter, &f.why)
                }
            }
        };
        let facts = Facts {
            age: (chrono::Utc::now() - ctx.received_at())
                .to_std()
                .unwrap_or_default(),
            attempts: attempts(ctx.state(), &name),
        };
        let decision = plan::decide(&conversation, facts, &options.retry, &filter);
        tracing::debug!(id = ctx.id(), ?decision, "milter decision");
        carry_out(ctx, &name, decision, &conversation).await
    }
}

/// One part of a message whose recipients part ways.
enum Part {
    Pass(Vec<usize>),
    Defer(Vec<usize>),
    Refuse(Vec<usize>, Map<String, Value>),
}

impl Part {
    fn indices(&self) -> &[usize] {
        match self {
            Part::Pass(i) | Part::Defer(i) | Part::Refuse(i, _) => i,
        }
    }
}

/// Carries out `d` through the stage contract.
async fn carry_out(
    ctx: &mut StageContext<'_>,
    stage: &str,
    d: Decision,
    conv: &Conversation,
) -> Result<Terminal, StageError> {
    let mut dropped: Vec<String> = d
        .discard
        .iter()
        .map(|&i| ctx.rcpt_to()[i].clone())
        .collect();
    // What passes after the filter deleted and added recipients; nothing left is a discard.
    let passing: Vec<String> = d.pass.iter().map(|&i| ctx.rcpt_to()[i].clone()).collect();
    // An added recipient that the message already has (deferred, refused or discarded
    // here) is not added: it would get the message twice, or get it and a bounce.
    let original = ctx.rcpt_to().to_vec();
    let mut after = edits::apply_recipients(&passing, &conv.edits);
    after.retain(|(r, i)| {
        i.is_some()
            || !original
                .iter()
                .any(|o| edits::bare(o).eq_ignore_ascii_case(r))
    });
    let mut going_on = d.pass.clone();
    if after.is_empty() && !going_on.is_empty() {
        dropped.extend(passing);
        going_on.clear();
    }
    let mut parts = Vec::new();
    if !going_on.is_empty() {
        parts.push(Part::Pass(going_on));
    }
    if !d.defer.is_empty() {
        parts.push(Part::Defer(d.defer.iter().map(|(i, _)| *i).collect()));
    }
    if !d.refuse.is_empty() {
        let mut bounce = Bounce::new(BounceKind::Permanent)
            .stage(stage)
            .with_detail(d.refuse[0].1.to_detail());
        bounce.recipients = d
            .refuse
            .iter()
            .map(|(i, f)| (ctx.rcpt_to()[*i].clone(), f.to_detail()))
            .collect();
        let mut state = Map::new();
        bounce.insert_into(&mut state);
        parts.push(Part::Refuse(
            d.refuse.iter().map(|(i, _)| *i).collect(),
            state,
        ));
    }
    let log = if dropped.is_empty() {
        Vec::new()
    } else {
        tracing::info!(id = ctx.id(), ?dropped, "discarded by the milter");
        vec![ctx.log_entry(
            Event::Dropped,
            dropped,
            json!({ "reason": "discarded by the content filter", "stage": stage }),
        )]
    };
    if parts.is_empty() {
        return Ok(ctx.finish()?.log(log));
    }
    let attempts = attempts(ctx.state(), stage) + 1;
    let reason = d.defer.first().map(|(_, r)| r.to_string());
    let waiting = |state: &Map<String, Value>| {
        let mut m = Map::new();
        let entry = MilterEntry::Waiting {
            attempts,
            reason: reason.clone(),
        };
        m.insert(
            MilterState::KEY.into(),
            milter_state(state, stage, Some(entry)),
        );
        m
    };
    let configured_bounce = ctx.options().bounce_stage.clone();
    let bounce_stage = || {
        configured_bounce
            .clone()
            .ok_or_else(|| StageError::NoBounceStage(stage.to_owned()))
    };
    let keep = parts.remove(0);
    // The row keeps only its own part: with no other part, the recipients dropped here
    // (discarded, or deleted by the filter) still go, in a fan-out without groups.
    if !parts.is_empty() || keep.indices().len() < ctx.rcpt_to().len() {
        let mut siblings = Vec::with_capacity(parts.len());
        for part in &parts {
            let recipients = FanRecipients::Indices(part.indices().to_vec());
            siblings.push(match part {
                Part::Pass(_) => unreachable!("what passes is always the row's own part"),
                Part::Defer(_) => FanGroup {
                    status: GroupStatus::Retry {
                        after: d.retry_after,
                    },
                    state: waiting(ctx.state()),
                    ..FanGroup::new(recipients, stage)
                },
                Part::Refuse(_, state) => FanGroup {
                    state: state.clone(),
                    ..FanGroup::new(recipients, bounce_stage()?)
                },
            });
        }
        ctx.fan_out_keeping_age(keep.indices(), &siblings).await?;
    }
    let terminal = match keep {
        Part::Defer(_) => {
            tracing::info!(id = ctx.id(), after = ?d.retry_after, "deferred by the milter");
            ctx.pause(waiting(ctx.state()), d.retry_after)?
        }
        Part::Refuse(_, state) => ctx.reroute(&bounce_stage()?, state)?,
        Part::Pass(_) => pass(ctx, stage, &d, conv, after)?,
    };
    Ok(terminal.log(log))
}

/// The passing recipients' end: the filter's changes written, then on (or held).
fn pass(
    ctx: &mut StageContext<'_>,
    stage: &str,
    d: &Decision,
    conv: &Conversation,
    recipients: Vec<(String, Option<usize>)>,
) -> Result<Terminal, StageError> {
    let e = &conv.edits;
    if !e.headers.is_empty() {
        let headers = edits::apply_headers(ctx.headers()?, &e.headers, conv.leading_space);
        ctx.set_headers(headers);
    }
    if let Some(body) = &e.body {
        ctx.set_body(edits::crlf_body(body));
    }
    if let Some(from) = &e.mail_from {
        ctx.set_mail_from(from.clone());
    }
    let mut state = Map::new();
    let had_entry = ctx
        .state()
        .get(MilterState::KEY)
        .and_then(Value::as_object)
        .is_some_and(|all| all.contains_key(stage));
    let entry = d.hold.as_ref().map(|r| MilterEntry::Held {
        quarantine: r.clone(),
    });
    if entry.is_some() || had_entry {
        state.insert(
            MilterState::KEY.into(),
            milter_state(ctx.state(), stage, entry),
        );
    }
    let changed_rcpts = e.add_rcpt.len() + e.delete_rcpt.len() > 0
        && recipients
            .iter()
            .map(|(r, _)| r.as_str())
            .ne(ctx.rcpt_to().iter().map(String::as_str));
    if changed_rcpts {
        let dsn = Dsn::from_state(ctx.state())?.unwrap_or_default();
        let rows: Vec<usize> = recipients
            .iter()
            .map(|(_, i)| i.unwrap_or(usize::MAX))
            .collect();
        let dsn = dsn.subset(&rows);
        dsn.insert_into(&mut state);
    }
    if let Some(reason) = &d.hold {
        tracing::info!(id = ctx.id(), %reason, "quarantined by the milter");
        let held = format!("quarantined by the content filter: {reason}");
        if changed_rcpts {
            return ctx.hold_with_recipients(
                &held,
                recipients.into_iter().map(|(r, _)| r).collect(),
                state,
            );
        }
        return ctx.hold(&held, state);
    }
    if changed_rcpts {
        return ctx.rewrite_recipients(recipients.into_iter().map(|(r, _)| r).collect(), state);
    }
    ctx.advance_with(state)
}

const ABOUT: &str = "Ask a mail filter that speaks the Sendmail milter protocol (version 6: \
rspamd, OpenDKIM, spamass-milter, any libmilter filter) about each message and carry out its \
answers: accept, reject (a DSN with the filter's reply), tempfail (the message or a recipient \
waits and is asked about again), discard, quarantine (held for an operator), header fields \
added, inserted, changed or deleted, the body replaced, the sender changed, recipients added \
or deleted. Options of [stage-NAME]: MILTER (inet:HOST:PORT, inet:PORT@HOST or unix:/path; \
required), NEXT_STAGE, BOUNCE_STAGE, DOWN_ACTION (tempfail or pass: what happens while the \
filter cannot be asked), CONNECT_TIMEOUT (10s), COMMAND_TIMEOUT (30s), CONTENT_TIMEOUT (2m), \
TOTAL_TIMEOUT (4m), RETRY_INITIAL, RETRY_FACTOR, RETRY_MAX_INTERVAL, MAX_LIFETIME, HOSTNAME, \
MAX_EDIT_SIZE (1M: the most bytes of header and recipient changes a filter may ask for in one \
message; past it the filter counts as unavailable). See docs/milter.md.";

/// The command line of `pepsi-stage-milter`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-milter` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<Milter>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_reads_and_rewrites_only_its_own_entry_of_state_milter() {
        let state = serde_json::json!({"milter": {
            "spam": {"attempts": 3, "reason": "451 4.7.1 later"},
            "virus": {"quarantine": "infected"},
            "other": {"attempts": "not a number"},
        }});
        let state = state.as_object().unwrap().clone();
        assert_eq!(attempts(&state, "spam"), 3);
        assert_eq!(attempts(&state, "virus"), 0);
        assert_eq!(
            attempts(&state, "other"),
            0,
            "an entry that does not parse counts none"
        );
        assert!(matches!(
            own_entry(&state, "virus"),
            Some(MilterEntry::Held { .. })
        ));
        let after = milter_state(&state, "spam", None);
        assert_eq!(
            after,
            serde_json::json!({
                "virus": {"quarantine": "infected"},
                "other": {"attempts": "not a number"},
            }),
            "the other stages' entries stay as stored, parsed or not"
        );
    }

    #[test]
    fn filter_addresses_as_a_table() {
        let ok = [
            (
                "inet:127.0.0.1:11332",
                Address::Tcp("127.0.0.1".into(), 11332),
            ),
            (
                "inet:8891@localhost",
                Address::Tcp("localhost".into(), 8891),
            ),
            ("inet6:[::1]:8891", Address::Tcp("::1".into(), 8891)),
            ("localhost:25", Address::Tcp("localhost".into(), 25)),
            (
                "unix:/run/opendkim/opendkim.sock",
                Address::Unix("/run/opendkim/opendkim.sock".into()),
            ),
            ("local:/tmp/m.sock", Address::Unix("/tmp/m.sock".into())),
        ];
        for (text, want) in ok {
            assert_eq!(Address::parse(text), Ok(want), "{text}");
        }
        for bad in [
            "unix:relative.sock",
            "inet:host",
            "inet:host:0",
            "inet::25",
            "inet:h:99999",
        ] {
            assert!(Address::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Address::Tcp("::1".into(), 25).to_string(), "inet:[::1]:25");
    }

    #[test]
    fn the_stage_entry_of_state_milter_is_set_and_removed_alone() {
        let mut state = Map::new();
        state.insert(
            "milter".into(),
            json!({ "dkim": { "attempts": 2, "reason": "451 4.7.1 later" },
                    "sign": { "quarantine": "held" } }),
        );
        assert_eq!(attempts(&state, "dkim"), 2);
        assert_eq!(attempts(&state, "spam"), 0);
        assert_eq!(attempts(&state, "sign"), 0);
        let spam = MilterEntry::Waiting {
            attempts: 1,
            reason: None,
        };
        assert_eq!(
            milter_state(&state, "spam", Some(spam)),
            json!({ "dkim": { "attempts": 2, "reason": "451 4.7.1 later" },
                    "sign": { "quarantine": "held" },
                    "spam": { "attempts": 1, "reason": null } })
        );
        assert_eq!(
            milter_state(&state, "dkim", None),
            json!({ "sign": { "quarantine": "held" } })
        );
        // a value of another shape is started afresh, as a missing one
        state.insert("milter".into(), json!(["x"]));
        assert_eq!(attempts(&state, "dkim"), 0);
        assert_eq!(milter_state(&state, "dkim", None), json!({}));
    }
}
