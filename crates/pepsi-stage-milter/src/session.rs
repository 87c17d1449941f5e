//! One conversation with a filter about one message: negotiation, the SMTP session's steps
//! replayed from the stored row, the filter's answers and changes. The packets are
//! `protocol`'s; this file orders them, honours what negotiation left out, and bounds every
//! wait.
//!
//! What the filter says becomes a [`Conversation`]; a filter that cannot be reached, times
//! out, breaks the protocol or shuts the connection becomes a [`Unavailable`] naming why.

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::time::Instant;

use crate::edits::{Edits, HeaderEdit};
use crate::protocol::{self, Command, Family, ProtocolError, Reply, Step, action, flag};

/// How long each kind of wait may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting to the filter.
    pub connect: Duration,
    /// Each write, and each answer before the end of the message.
    pub command: Duration,
    /// The answer to the end of the message (a progress packet starts the wait again).
    pub content: Duration,
    /// The whole conversation, progress or not.
    pub total: Duration,
}

/// What the filter is told about the message: the SMTP session, replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    pub host: String,
    pub family: Family,
    pub helo: String,
    /// `MAIL FROM` as the filter sees it: `<address>` and ESMTP parameters.
    pub mail: Vec<String>,
    pub rcpt_to: &'a [String],
    pub headers: &'a [u8],
    pub body: &'a [u8],
    /// The macros this side knows, per step (`{rcpt_addr}` is added per recipient).
    pub macros: HashMap<Step, Vec<(String, String)>>,
    /// The largest body the filter may put in place of this one.
    pub max_body: usize,
    /// The most bytes of header edits (names and values) and recipient edits (added and
    /// deleted addresses) together the filter may ask for: `MAX_EDIT_SIZE`.
    pub max_edit_size: usize,
}

/// The most header changes, and the most recipients added or deleted, one conversation
/// takes; a filter that asks for more is treated as failing.
pub const MAX_EDITS: usize = 1000;
/// The longest reply text kept from a filter (libmilter itself sends at most 980 bytes).
pub const MAX_REPLY_TEXT: usize = 512;

/// A filter's reply to the SMTP client, as it would have been sent: `550 5.7.1 text`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpReply {
    pub code: u16,
    pub enhanced: String,
    pub text: String,
}

impl SmtpReply {
    /// The reply a filter's plain reject stands for.
    pub fn rejected() -> SmtpReply {
        SmtpReply {
            code: 550,
            enhanced: "5.7.1".into(),
            text: "rejected by the content filter".into(),
        }
    }

    /// The reply a filter's plain tempfail stands for.
    pub fn tempfailed() -> SmtpReply {
        SmtpReply {
            code: 451,
            enhanced: "4.7.1".into(),
            text: "the content filter asks to try again later".into(),
        }
    }

    /// Parses `550 5.7.1 text` (or a multi-line `550-5.7.1 a\r\n550 5.7.1 b`, whose text
    /// lines are joined). The class (temporary or permanent) is the first character's,
    /// which the protocol checked; a code or enhanced code of another class, or none, is
    /// replaced by the class's default. `%%` (a filter's escaped `%`) reads as `%`, and the
    /// text is cut to [`MAX_REPLY_TEXT`] bytes.
    pub fn parse(reply: &str) -> SmtpReply {
        let temporary = reply.starts_with('4');
        let class = if temporary { '4' } else { '5' };
        let mut code = None;
        let mut enhanced = None;
        let mut texts = Vec::new();
        for line in reply.split(['\r', '\n']).filter(|l| !l.trim().is_empty()) {
            let b = line.as_bytes();
            let coded = b.len() >= 3
                && b[..3].iter().all(u8::is_ascii_digit)
                && matches!(b.get(3), None | Some(b' ' | b'-'));
            let rest = if coded {
                code.get_or_insert_with(|| line[..3].parse::<u16>().unwrap_or(0));
                line.get(4..).unwrap_or("")
            } else {
                line
            };
            let (first, after) = rest.split_once(' ').unwrap_or((rest, ""));
            let is_enhanced = first.split('.').count() == 3
                && first
                    .split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
            if is_enhanced {
                enhanced.get_or_insert_with(|| first.to_owned());
                texts.push(after.trim().to_owned());
            } else {
                texts.push(rest.trim().to_owned());
            }
        }
        let code = code
            .filter(|c| (400..600).contains(c) && c.to_string().starts_with(class))
            .unwrap_or(if temporary { 451 } else { 550 });
        let enhanced = enhanced
            .filter(|e| e.starts_with(class))
            .unwrap_or_else(|| format!("{class}.7.1"));
        let mut text = texts.join(" ").replace("%%", "%");
        if text.len() > MAX_REPLY_TEXT {
            let mut cut = MAX_REPLY_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        SmtpReply {
            code,
            enhanced,
            text,
        }
    }

    pub fn is_temporary(&self) -> bool {
        (400..500).contains(&self.code)
    }
}

impl std::fmt::Display for SmtpReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.code, self.enhanced, self.text)
    }
}

/// What the filter said of one recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RcptAnswer {
    Accepted,
    Refused(SmtpReply),
    Deferred(SmtpReply),
}

/// What the filter said of the message as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Reject(SmtpReply),
    Tempfail(SmtpReply),
    Discard,
}

/// The end of a conversation the filter took part in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// One answer per recipient of the message, in order.
    pub rcpts: Vec<RcptAnswer>,
    /// For the accepted recipients.
    pub verdict: Verdict,
    /// The changes asked for at the end of the message (none unless it got that far).
    pub edits: Edits,
    /// The filter took its header values with their leading space.
    pub leading_space: bool,
}

/// The filter could not be asked: why, for the log and the deferral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

/// A conversation that failed part of the way: why, and the recipients the filter had
/// already refused or deferred at RCPT (by index; `None`: not decided), which keep that
/// answer whatever `DOWN_ACTION` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub why: Unavailable,
    pub decided: Vec<Option<RcptAnswer>>,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<ProtocolError> for Unavailable {
    fn from(e: ProtocolError) -> Self {
        Unavailable(e.to_string())
    }
}

/// What negotiation settled.
struct Agreed {
    actions: u32,
    flags: u32,
    macros: HashMap<Step, Vec<String>>,
}

/// A conversation in progress on `io`.
struct Talk<'s, S> {
    io: &'s mut S,
    buf: Vec<u8>,
    /// Packets not written yet: macros, and the steps the filter does not answer, go out
    /// with the next packet that waits for an answer, in one write.
    out: Vec<u8>,
    /// Recipients refused or deferred at RCPT so far.
    decided: Vec<Option<RcptAnswer>>,
    timeouts: Timeouts,
    deadline: Instant,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Talk<'_, S> {
    fn queue(&mut self, c: &Command) {
        self.out.extend_from_slice(&c.encode());
    }

    /// Writes `c` after what is queued.
    async fn send(&mut self, c: &Command) -> Result<(), Unavailable> {
        self.queue(c);
        let packets = std::mem::take(&mut self.out);
        // A write that carries the content (the header and body a filter does not answer
        // one by one) may take as long as content does.
        let limit = if packets.len() > protocol::CHUNK {
            self.timeouts.command.max(self.timeouts.content)
        } else {
            self.timeouts.command
        };
        let wait = limit.min(self.left());
        match tokio::time::timeout(wait, self.io.write_all(&packets)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Unavailable(format!("writing to the filter: {e}"))),
            Err(_) => Err(Unavailable(format!(
                "the filter took more than {}s to read a command",
                wait.as_secs()
            ))),
        }
    }

    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The next packet, waiting at most `wait` (and never past the conversation's end).
    async fn receive(&mut self, wait: Duration) -> Result<Reply, Unavailable> {
        let wait = wait.min(self.left());
        let until = Instant::now() + wait;
        loop {
            if let Some(p) = protocol::take_packet(&self.buf)? {
                let reply = Reply::decode(p.command, p.data)?;
                let used = p.used;
                self.buf.drain(..used);
                return Ok(reply);
            }
            let mut chunk = [0u8; 16384];
            let n = match tokio::time::timeout_at(until, self.io.read(&mut chunk)).await {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => return Err(Unavailable(format!("reading from the filter: {e}"))),
                Err(_) => {
                    return Err(Unavailable(format!(
                        "the filter did not answer within {}s",
                        wait.as_secs()
                    )));
                }
            };
            if n == 0 {
                return Err(Unavailable("the filter closed the connection".into()));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The answer to a step: progress packets are waited through.
    async fn answer(&mut self, wait: Duration) -> Result<Reply, Unavailable> {
        loop {
            match self.receive(wait).await? {
                Reply::Progress => continue,
                Reply::Shutdown => {
                    return Err(Unavailable("the filter shut the connection down".into()));
                }
                r => return Ok(r),
            }
        }
    }
}

/// A step's answer, as what happens next.
enum Next {
    Go,
    /// The conversation is over with this verdict for the message.
    Stop(Verdict),
}

/// What an answer to a step before the end of the message means.
fn step_answer(r: Reply, step: &str) -> Result<Next, Unavailable> {
    Ok(match r {
        Reply::Continue => Next::Go,
        Reply::Accept => Next::Stop(Verdict::Accept),
        Reply::Reject => Next::Stop(Verdict::Reject(SmtpReply::rejected())),
        Reply::Tempfail => Next::Stop(Verdict::Tempfail(SmtpReply::tempfailed())),
        Reply::Discard => Next::Stop(Verdict::Discard),
        Reply::ReplyCode(text) => {
            let reply = SmtpReply::parse(&text);
            if reply.is_temporary() {
                Next::Stop(Verdict::Tempfail(reply))
            } else {
                Next::Stop(Verdict::Reject(reply))
            }
        }
        other => {
            return Err(Unavailable(format!(
                "the filter answered {step} with {}",
                name(&other)
            )));
        }
    })
}

fn name(r: &Reply) -> &'static str {
    match r {
        Reply::Negotiate { .. } => "a negotiation",
        Reply::Continue => "continue",
        Reply::Accept => "accept",
        Reply::Reject => "reject",
        Reply::Tempfail => "tempfail",
        Reply::Discard => "discard",
        Reply::ReplyCode(_) => "a reply code",
        Reply::Skip => "skip",
        Reply::Progress => "progress",
        Reply::AddHeader { .. } => "add header",
        Reply::InsertHeader { .. } => "insert header",
        Reply::ChangeHeader { .. } => "change header",
        Reply::ReplaceBody(_) => "replace body",
        Reply::ChangeFrom { .. } => "change from",
        Reply::AddRcpt { .. } => "add recipient",
        Reply::DeleteRcpt(_) => "delete recipient",
        Reply::Quarantine(_) => "quarantine",
        Reply::Shutdown => "shutdown",
    }
}

/// Has the conversation with `io` about `message`, bounded by `timeouts`.
pub async fn converse<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    message: &Message<'_>,
    timeouts: Timeouts,
) -> Result<Conversation, Failed> {
    let mut talk = Talk {
        io,
        buf: Vec::new(),
        out: Vec::new(),
        decided: vec![None; message.rcpt_to.len()],
        timeouts,
        deadline: Instant::now() + timeouts.total,
    };
    let result = match negotiate(&mut talk).await {
        Ok(agreed) => steps(&mut talk, &agreed, message).await,
        Err(e) => Err(e),
    };
    // The filter is told the conversation is over either way; a failure to say so changes
    // nothing of what it answered.
    let _ = talk.send(&Command::Quit).await;
    result.map_err(|why| Failed {
        why,
        decided: std::mem::take(&mut talk.decided),
    })
}

async fn negotiate<S: AsyncRead + AsyncWrite + Unpin>(
    talk: &mut Talk<'_, S>,
) -> Result<Agreed, Unavailable> {
    talk.send(&Command::Negotiate {
        version: protocol::VERSION,
        actions: action::ALL,
        flags: flag::ALL,
    })
    .await?;
    let wait = talk.timeouts.command;
    match talk.answer(wait).await? {
        Reply::Negotiate {
            version,
            actions,
            flags,
            macros,
        } => {
            if !(2..=protocol::VERSION).contains(&version) {
                return Err(Unavailable(format!(
                    "the filter speaks milter protocol version {version} (this side: 2 to {})",
                    protocol::VERSION
                )));
            }
            let unknown = flags & !flag::ALL;
            if unknown != 0 {
                return Err(Unavailable(format!(
                    "the filter asks for protocol flags 0x{unknown:x} this side does not offer"
                )));
            }
            Ok(Agreed {
                actions: actions & action::ALL,
                flags,
                macros: macros.into_iter().collect(),
            })
        }
        other => Err(Unavailable(format!(
            "the filter answered the negotiation with {}",
            name(&other)
        ))),
    }
}

/// Sends the macros of `step` the filter wants (all this side knows when it named none).
async fn macros<S: AsyncRead + AsyncWrite + Unpin>(
    talk: &mut Talk<'_, S>,
    agreed: &Agreed,
    step: Step,
    known: &[(String, String)],
) -> Result<(), Unavailable> {
    let pairs: Vec<(String, String)> = match agreed.macros.get(&step) {
        Some(wanted) => known
            .iter()
            .filter(|(k, _)| {
                wanted
                    .iter()
                    .any(|w| w == k || w.trim_matches(['{', '}']) == k.trim_matches(['{', '}']))
            })
            .cloned()
            .collect(),
        None => known.to_vec(),
    };
    if !pairs.is_empty() {
        talk.queue(&Command::Macros { step, pairs });
    }
    Ok(())
}

/// One step: its macros, its command, and its answer unless the filter said it sends none.
async fn step<S: AsyncRead + AsyncWrite + Unpin>(
    talk: &mut Talk<'_, S>,
    agreed: &Agreed,
    step: Step,
    known: &[(String, String)],
    command: Command,
    no_reply: u32,
    what: &str,
) -> Result<Next, Unavailable> {
    macros(talk, agreed, step, known).await?;
    if agreed.flags & no_reply != 0 {
        talk.queue(&command);
        return Ok(Next::Go);
    }
    talk.send(&command).await?;
    let wait = talk.timeouts.command;
    let r = talk.answer(wait).await?;
    step_answer(r, what)
}

/// Every recipient given the same answer (a verdict before the recipients were asked).
fn all(message: &Message<'_>, verdict: Verdict) -> Conversation {
    let answer = match &verdict {
        Verdict::Reject(r) => RcptAnswer::Refused(r.clone()),
        Verdict::Tempfail(r) => RcptAnswer::Deferred(r.clone()),
        Verdict::Accept | Verdict::Discard => RcptAnswer::Accepted,
    };
    Conversation {
        rcpts: vec![answer; message.rcpt_to.len()],
        verdict,
        edits: Edits::default(),
        leading_space: false,
    }
}

async fn steps<S: AsyncRead + AsyncWrite + Unpin>(
    talk: &mut Talk<'_, S>,
    agreed: &Agreed,
    message: &Message<'_>,
) -> Result<Conversation, Unavailable> {
    let known = |s: Step| message.macros.get(&s).cloned().unwrap_or_default();
    let leading_space = agreed.flags & flag::HEADER_LEADING_SPACE != 0;
    // The session: connect, helo, mail.
    let session = [
        (
            Step::Connect,
            flag::NO_CONNECT,
            flag::NO_REPLY_CONNECT,
            Command::Connect {
                host: message.host.clone(),
                family: message.family.clone(),
            },
            "the connection",
        ),
        (
            Step::Helo,
            flag::NO_HELO,
            flag::NO_REPLY_HELO,
            Command::Helo(message.helo.clone()),
            "HELO",
        ),
        (
            Step::Mail,
            flag::NO_MAIL,
            flag::NO_REPLY_MAIL,
            Command::Mail(message.mail.clone()),
            "MAIL FROM",
        ),
    ];
    for (s, skip, no_reply, command, what) in session {
        if agreed.flags & skip != 0 {
            // A step left out still has its macros sent, for the filter to read later.
            macros(talk, agreed, s, &known(s)).await?;
            continue;
        }
        let next = step(talk, agreed, s, &known(s), command, no_reply, what).await?;
        if let Next::Stop(Verdict::Discard) = next
            && s != Step::Mail
        {
            // Discard is about a message, not a connection: as an MTA does, go on.
            tracing::warn!(
                "the filter answered {what} with discard, which is for messages: ignored"
            );
            continue;
        }
        if let Next::Stop(v) = next {
            talk.send(&Command::Abort).await.ok();
            return Ok(all(message, v));
        }
    }
    // The recipients, each answered on its own.
    let mut rcpts = Vec::with_capacity(message.rcpt_to.len());
    let mut early: Option<Verdict> = None;
    for (i, rcpt) in message.rcpt_to.iter().enumerate() {
        if early.is_some() {
            rcpts.push(RcptAnswer::Accepted);
            continue;
        }
        let mut pairs = known(Step::Rcpt);
        pairs.push(("{rcpt_addr}".into(), rcpt.clone()));
        if agreed.flags & flag::NO_RCPT != 0 {
            macros(talk, agreed, Step::Rcpt, &pairs).await?;
            rcpts.push(RcptAnswer::Accepted);
            continue;
        }
        let command = Command::Rcpt(vec![format!("<{rcpt}>")]);
        macros(talk, agreed, Step::Rcpt, &pairs).await?;
        if agreed.flags & flag::NO_REPLY_RCPT != 0 {
            talk.queue(&command);
            rcpts.push(RcptAnswer::Accepted);
            continue;
        }
        talk.send(&command).await?;
        let wait = talk.timeouts.command;
        let answer = talk.answer(wait).await?;
        match step_answer(answer, "RCPT TO")? {
            Next::Go => rcpts.push(RcptAnswer::Accepted),
            Next::Stop(Verdict::Reject(r)) => {
                talk.decided[i] = Some(RcptAnswer::Refused(r.clone()));
                rcpts.push(RcptAnswer::Refused(r));
            }
            Next::Stop(Verdict::Tempfail(r)) => {
                talk.decided[i] = Some(RcptAnswer::Deferred(r.clone()));
                rcpts.push(RcptAnswer::Deferred(r));
            }
            // Accept and discard are about the message: the other recipients go with it.
            Next::Stop(v) => {
                rcpts.push(RcptAnswer::Accepted);
                early = Some(v);
            }
        }
        debug_assert_eq!(rcpts.len(), i + 1);
    }
    let accepted = rcpts.contains(&RcptAnswer::Accepted);
    if let Some(verdict) = early {
        talk.send(&Command::Abort).await.ok();
        return Ok(Conversation {
            rcpts,
            verdict,
            edits: Edits::default(),
            leading_space,
        });
    }
    if !accepted {
        talk.send(&Command::Abort).await.ok();
        return Ok(Conversation {
            rcpts,
            verdict: Verdict::Accept,
            edits: Edits::default(),
            leading_space,
        });
    }
    let stop = |rcpts: Vec<RcptAnswer>, verdict: Verdict| Conversation {
        rcpts,
        verdict,
        edits: Edits::default(),
        leading_space,
    };
    // DATA, the header fields, their end (a step left out still has its macros sent).
    if agreed.flags & flag::NO_DATA != 0 {
        macros(talk, agreed, Step::Data, &known(Step::Data)).await?;
    } else if let Next::Stop(v) = step(
        talk,
        agreed,
        Step::Data,
        &known(Step::Data),
        Command::Data,
        flag::NO_REPLY_DATA,
        "DATA",
    )
    .await?
    {
        talk.send(&Command::Abort).await.ok();
        return Ok(stop(rcpts, v));
    }
    if agreed.flags & flag::NO_HEADERS == 0 {
        for (name, value) in header_fields(message.headers, leading_space) {
            let header = Command::Header { name, value };
            if agreed.flags & flag::NO_REPLY_HEADER != 0 {
                talk.queue(&header);
                continue;
            }
            talk.send(&header).await?;
            let wait = talk.timeouts.command;
            let r = talk.answer(wait).await?;
            if let Next::Stop(v) = step_answer(r, "a header field")? {
                talk.send(&Command::Abort).await.ok();
                return Ok(stop(rcpts, v));
            }
        }
    }
    if agreed.flags & flag::NO_EOH != 0 {
        macros(talk, agreed, Step::EndOfHeaders, &known(Step::EndOfHeaders)).await?;
    } else if let Next::Stop(v) = step(
        talk,
        agreed,
        Step::EndOfHeaders,
        &known(Step::EndOfHeaders),
        Command::EndOfHeaders,
        flag::NO_REPLY_EOH,
        "the end of the header",
    )
    .await?
    {
        talk.send(&Command::Abort).await.ok();
        return Ok(stop(rcpts, v));
    }
    // The body, in chunks; a filter that negotiated SKIP may stop it early.
    if agreed.flags & flag::NO_BODY == 0 {
        for chunk in message.body.chunks(protocol::CHUNK) {
            let body = Command::Body(chunk.to_vec());
            if agreed.flags & flag::NO_REPLY_BODY != 0 {
                talk.queue(&body);
                continue;
            }
            talk.send(&body).await?;
            let wait = talk.timeouts.content;
            match talk.answer(wait).await? {
                // Accepted even unnegotiated, as MTAs do: libmilter sends it regardless.
                Reply::Skip => break,
                r => {
                    if let Next::Stop(v) = step_answer(r, "a body chunk")? {
                        talk.send(&Command::Abort).await.ok();
                        return Ok(stop(rcpts, v));
                    }
                }
            }
        }
    }
    // The end of the message: changes, then the verdict.
    macros(talk, agreed, Step::EndOfMessage, &known(Step::EndOfMessage)).await?;
    talk.send(&Command::EndOfMessage).await?;
    let mut edits = Edits::default();
    // A change the filter did not negotiate is carried out with a warning, as MTAs do.
    let allowed = |needed: u32, what: &str| -> Result<(), Unavailable> {
        if agreed.actions & needed == 0 {
            tracing::warn!("the filter asked to {what} without negotiating it: done anyway");
        }
        Ok(())
    };
    // The bytes of header and recipient edits so far: each is bounded by the packet size,
    // their count by MAX_EDITS, and their sum by this, so a filter cannot make the worker
    // hold (and write into the header block) a thousand values of a mebibyte each.
    let mut edit_size = 0usize;
    let bounded = |edits: &Edits, edit_size: usize| -> Result<(), Unavailable> {
        if edit_size > message.max_edit_size {
            return Err(Unavailable(format!(
                "the filter's header and recipient changes are over {} bytes (MAX_EDIT_SIZE)",
                message.max_edit_size
            )));
        }
        let body = edits.body.as_ref().map_or(0, Vec::len);
        if body > message.max_body {
            return Err(Unavailable(format!(
                "the filter's new body is over {} bytes",
                message.max_body
            )));
        }
        if edits.headers.len() > MAX_EDITS
            || edits.add_rcpt.len() > MAX_EDITS
            || edits.delete_rcpt.len() > MAX_EDITS
        {
            return Err(Unavailable(format!(
                "the filter asked for more than {MAX_EDITS} changes of one kind"
            )));
        }
        Ok(())
    };
    let verdict = loop {
        let wait = talk.timeouts.content;
        let r = talk.answer(wait).await?;
        match r {
            Reply::AddHeader { name, value } => {
                allowed(action::ADD_HEADERS, "add a header field")?;
                edit_size += name.len() + value.len();
                edits.headers.push(HeaderEdit::Add { name, value });
            }
            Reply::InsertHeader { index, name, value } => {
                allowed(action::ADD_HEADERS, "insert a header field")?;
                edit_size += name.len() + value.len();
                edits
                    .headers
                    .push(HeaderEdit::Insert { index, name, value });
            }
            Reply::ChangeHeader { index, name, value } => {
                allowed(action::CHANGE_HEADERS, "change a header field")?;
                edit_size += name.len() + value.len();
                edits
                    .headers
                    .push(HeaderEdit::Change { index, name, value });
            }
            Reply::ReplaceBody(chunk) => {
                allowed(action::CHANGE_BODY, "replace the body")?;
                edits.append_body(&chunk);
            }
            Reply::ChangeFrom { from, .. } => {
                allowed(action::CHANGE_FROM, "change the sender")?;
                let from = crate::edits::bare(&from);
                if crate::edits::valid_address(from, true) {
                    edits.mail_from = Some(from.to_owned());
                } else {
                    tracing::warn!(?from, "the filter's new sender is not an address: ignored");
                }
            }
            Reply::AddRcpt { rcpt, args } => {
                let needed = if args.is_some() {
                    action::ADD_RCPT_ARGS
                } else {
                    action::ADD_RCPT | action::ADD_RCPT_ARGS
                };
                allowed(needed, "add a recipient")?;
                if let Some(args) = &args {
                    tracing::debug!(%rcpt, %args, "the ESMTP arguments of an added recipient are not used");
                }
                let rcpt = crate::edits::bare(&rcpt);
                if crate::edits::valid_address(rcpt, false) {
                    edit_size += rcpt.len();
                    edits.add_rcpt.push(rcpt.to_owned());
                } else {
                    tracing::warn!(
                        ?rcpt,
                        "the filter's added recipient is not an address: ignored"
                    );
                }
            }
            Reply::DeleteRcpt(rcpt) => {
                allowed(action::DELETE_RCPT, "delete a recipient")?;
                let rcpt = crate::edits::bare(&rcpt);
                edit_size += rcpt.len();
                edits.delete_rcpt.push(rcpt.to_owned());
            }
            Reply::Quarantine(reason) => {
                allowed(action::QUARANTINE, "quarantine the message")?;
                edits.quarantine = Some(reason);
            }
            other => match step_answer(other, "the end of the message")? {
                Next::Go => break Verdict::Accept,
                Next::Stop(v) => break v,
            },
        }
        bounded(&edits, edit_size)?;
    };
    Ok(Conversation {
        rcpts,
        verdict,
        edits,
        leading_space,
    })
}

/// The stored header block as the filter sees it: each field's name and value, folded
/// lines joined with LF as an MTA keeps them, without the value's leading space unless the
/// filter asked for it. The fields are `edits::fields`', so the indexes a filter's changes
/// use count the same fields.
pub fn header_fields(headers: &[u8], leading_space: bool) -> Vec<(String, Vec<u8>)> {
    crate::edits::fields(headers)
        .iter()
        .map(|field| {
            let text = field
                .strip_suffix(b"\r\n")
                .or_else(|| field.strip_suffix(b"\n"))
                .unwrap_or(field);
            let colon = text.iter().position(|&b| b == b':').unwrap_or(text.len());
            let name = String::from_utf8_lossy(text[..colon].trim_ascii_end()).into_owned();
            let mut value = text.get(colon + 1..).unwrap_or_default();
            if !leading_space {
                value = value.strip_prefix(b" ").unwrap_or(value);
            }
            let lines: Vec<&[u8]> = value
                .split(|&b| b == b'\n')
                .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                .collect();
            let joined = lines.join(&b"\n"[..]);
            (name, joined)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smtp_replies_parse_as_a_table() {
        let cases = [
            (
                "554 5.7.1 Spam message rejected",
                (554, "5.7.1", "Spam message rejected"),
            ),
            (
                "451 4.7.1 Try again later",
                (451, "4.7.1", "Try again later"),
            ),
            ("550 no enhanced code", (550, "5.7.1", "no enhanced code")),
            ("452 5.2.2 class mismatch", (452, "4.7.1", "class mismatch")),
            (
                "550-5.7.1 first line\r\n550 5.7.1 second line",
                (550, "5.7.1", "first line second line"),
            ),
        ];
        for (text, (code, enhanced, rest)) in cases {
            let r = SmtpReply::parse(text);
            assert_eq!(
                (r.code, r.enhanced.as_str(), r.text.as_str()),
                (code, enhanced, rest),
                "{text}"
            );
        }
        assert!(SmtpReply::parse("421 4.3.0 down").is_temporary());
        assert!(!SmtpReply::parse("554 5.7.1 no").is_temporary());
    }

    #[test]
    fn header_fields_are_sent_unfolded_with_lf_and_without_the_leading_space() {
        let block = b"Subject: hello\r\n  world\r\nX-Empty:\r\nFrom:  two spaces\r\n\r\nbody";
        assert_eq!(
            header_fields(block, false),
            vec![
                ("Subject".to_owned(), b"hello\n  world".to_vec()),
                ("X-Empty".to_owned(), b"".to_vec()),
                ("From".to_owned(), b" two spaces".to_vec()),
            ]
        );
        assert_eq!(header_fields(block, true)[0].1, b" hello\n  world".to_vec());
    }
}
