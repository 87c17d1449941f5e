//! RFC 3834's rules for automatic answers: whether a message may be answered at all by a
//! program acting for its recipient (an out-of-office reply, a secretary's challenge).
//! Pure: no I/O. Shared by `pepsi-stage-vacation` and `pepsi-stage-secretary`.
//!
//! A message is never answered when (`decide`, first reason wins):
//! - its envelope sender is null, or its local part names a program rather than a person
//!   (`MAILER-DAEMON`, `postmaster`, `owner-…`, `…-request`, `…-bounces`, `noreply`, …:
//!   [`AUTOMATED_LOCAL_PARTS`], [`AUTOMATED_PREFIXES`], [`AUTOMATED_SUFFIXES`]);
//! - the sender is the owner (one of the addresses answered for);
//! - `Auto-Submitted` is present with any value but `no` (RFC 3834 §5);
//! - `Precedence` is `bulk`, `junk` or `list`;
//! - it carries a `List-*` field (RFC 2369, RFC 2919's `List-Id`): mailing-list traffic;
//! - `X-Auto-Response-Suppress` asks for no automatic reply (`All`, `OOF`, `AutoReply`);
//! - none of the owner's addresses is in To, Cc, Resent-To or Resent-Cc (the owner got it
//!   as a Bcc, through a list, or by a forward: RFC 3834 §3.1.1).

use crate::message::field_values;

/// Local parts (any letter case) of senders that are programs.
pub const AUTOMATED_LOCAL_PARTS: &[&str] = &[
    "mailer-daemon",
    "mailer",
    "postmaster",
    "listserv",
    "majordomo",
    "noreply",
    "no-reply",
    "donotreply",
    "do-not-reply",
    "bounce",
    "bounces",
];
/// Local-part prefixes of senders that are programs (list owners, VERP bounce addresses).
pub const AUTOMATED_PREFIXES: &[&str] = &["owner-", "bounce-", "bounces-"];
/// Local-part suffixes of senders that are programs (list request and bounce addresses).
pub const AUTOMATED_SUFFIXES: &[&str] = &["-request", "-owner", "-bounces", "-bounce"];

/// Why a message gets no automatic reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// The envelope sender is `<>` (a bounce or another automatic message).
    NullSender,
    /// The envelope sender's local part names a program.
    AutomatedSender(String),
    /// The sender is one of the addresses answered for.
    OwnAddress,
    /// `Auto-Submitted` with this value (anything but `no`).
    AutoSubmitted(String),
    /// `Precedence: bulk`, `junk` or `list`.
    Precedence(String),
    /// A `List-*` field, named.
    ListMessage(String),
    /// `X-Auto-Response-Suppress` with this value.
    Suppressed(String),
    /// None of the owner's addresses is a visible recipient.
    NotAddressed,
}

impl Skip {
    /// A short reason for the log and `state`.
    pub fn reason(&self) -> String {
        match self {
            Skip::NullSender => "null envelope sender".into(),
            Skip::AutomatedSender(s) => format!("sender {s} is automated"),
            Skip::OwnAddress => "sender is the owner".into(),
            Skip::AutoSubmitted(v) => format!("Auto-Submitted: {v}"),
            Skip::Precedence(v) => format!("Precedence: {v}"),
            Skip::ListMessage(f) => format!("mailing-list message ({f})"),
            Skip::Suppressed(v) => format!("X-Auto-Response-Suppress: {v}"),
            Skip::NotAddressed => "owner not in To or Cc".into(),
        }
    }
}

/// The message as the rules see it.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    /// The envelope sender, `""` for `<>`.
    pub mail_from: &'a str,
    /// The header block (CRLF lines).
    pub headers: &'a [u8],
}

/// Whether `message` may be answered on behalf of the owner of `addresses` (the recipient
/// address and any others the owner configured as theirs; compared without letter case).
pub fn decide(message: &Incoming<'_>, addresses: &[String]) -> Result<(), Skip> {
    let sender = message.mail_from.trim();
    if sender.is_empty() {
        return Err(Skip::NullSender);
    }
    if is_automated(sender) {
        return Err(Skip::AutomatedSender(sender.to_owned()));
    }
    if addresses.iter().any(|a| a.eq_ignore_ascii_case(sender)) {
        return Err(Skip::OwnAddress);
    }
    let h = message.headers;
    for value in field_values(h, "Auto-Submitted") {
        let keyword = first_token(&value);
        if !keyword.eq_ignore_ascii_case("no") {
            return Err(Skip::AutoSubmitted(keyword));
        }
    }
    for value in field_values(h, "Precedence") {
        let keyword = first_token(&value).to_ascii_lowercase();
        if matches!(keyword.as_str(), "bulk" | "junk" | "list") {
            return Err(Skip::Precedence(keyword));
        }
    }
    if let Some(name) = crate::message::field_names(h)
        .into_iter()
        .find(|n| n.len() > 5 && n[..5].eq_ignore_ascii_case("list-"))
    {
        return Err(Skip::ListMessage(name));
    }
    for value in field_values(h, "X-Auto-Response-Suppress") {
        if value.split(',').map(str::trim).any(|v| {
            ["all", "oof", "autoreply"]
                .iter()
                .any(|k| v.eq_ignore_ascii_case(k))
        }) {
            return Err(Skip::Suppressed(value));
        }
    }
    let visible = crate::message::visible_recipient_addresses(h);
    if !visible
        .iter()
        .any(|v| addresses.iter().any(|a| a.eq_ignore_ascii_case(v)))
    {
        return Err(Skip::NotAddressed);
    }
    Ok(())
}

/// Whether an address's local part names a program (see the module's list).
pub fn is_automated(address: &str) -> bool {
    let local = pepsi_conf::address::local_part(address);
    let local = local.to_ascii_lowercase();
    AUTOMATED_LOCAL_PARTS.contains(&local.as_str())
        || AUTOMATED_PREFIXES.iter().any(|p| local.starts_with(p))
        || AUTOMATED_SUFFIXES.iter().any(|s| local.ends_with(s))
}

/// The first token of a structured value: up to `;`, white space or a comment, trimmed.
fn first_token(value: &str) -> String {
    value
        .split(|c: char| c == ';' || c == '(' || c.is_whitespace())
        .find(|t| !t.is_empty())
        .unwrap_or("")
        .to_owned()
}
