//! The stock keys of the `state` JSONB (`docs/state.md`) as Rust types: `origin`
//! ([`Origin`]), `dsn` ([`Dsn`]), `bounce` ([`Bounce`]) and the delivery stages' retry
//! scratch `attempts` / `last_error` / `delay_sent` ([`DeliveryScratch`]), `failure_bouncer`
//! ([`FailureRecord`]), `dot_forward` ([`DotForward`]), and in `keys` the keys particular
//! stages, the ingress and the queue's SQL write (`auth`, `srs`, `milter`, …). Every writer builds
//! these values and every reader parses them through these types, so a key's shape is written
//! down once.
//!
//! The JSON they read and write is exactly the one stored before they existed: rows already in
//! a live queue parse. Absent keys and `null` read as "not given"; fields a type does not know
//! are accepted (a stage may extend a key), and [`Dsn`] even carries them through a rewrite. A
//! value of the wrong shape is a [`StateError`] naming the key path
//! (`state.dsn.rcpt[2].notify: invalid type: …`), never a panic or a silent default. Pure: no
//! I/O. Whether a value makes sense (a status code's class, a time) is the reader's business.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use serde::de::{DeserializeOwned, Error as _, Unexpected};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// A stored state value that does not have the shape its key requires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct StateError {
    /// Where: `state.dsn.rcpt[2].notify`, `state.bounce.recipients["b@x.test"].smtp_code`.
    pub path: String,
    /// What was wrong, in serde's words: `invalid type: string "x", expected a sequence`.
    pub problem: String,
}

impl From<StateError> for crate::stage::StageError {
    /// A malformed state is the writer's bug: retrying the same row cannot help.
    fn from(e: StateError) -> Self {
        crate::stage::StageError::Invalid(e.to_string())
    }
}

/// Reads `state.<key>` as `T`: `None` when the key is absent or null.
fn read<T: DeserializeOwned>(
    state: &Map<String, Value>,
    key: &str,
) -> Result<Option<T>, StateError> {
    match state.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => parse(v, key).map(Some),
    }
}

/// Parses `v` (the value of `state.<key>`) as `T`, naming the path of whatever is wrong.
fn parse<T: DeserializeOwned>(v: &Value, key: &str) -> Result<T, StateError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let mut path = format!("state.{key}");
        for segment in e.path().iter() {
            use serde_path_to_error::Segment;
            // Writing to a String cannot fail.
            let _ = match segment {
                Segment::Seq { index } => write!(path, "[{index}]"),
                Segment::Map { key }
                    if !key.is_empty()
                        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
                {
                    write!(path, ".{key}")
                }
                Segment::Map { key } => write!(path, "[{key:?}]"),
                Segment::Enum { variant } => write!(path, ".{variant}"),
                Segment::Unknown => write!(path, ".?"),
            };
        }
        StateError {
            path,
            problem: e.into_inner().to_string(),
        }
    })
}

fn to_value<T: Serialize>(v: &T) -> Value {
    // Every type here is plain data with string keys: serialization cannot fail.
    serde_json::to_value(v).expect("state values serialize")
}

/// Member `member` of the object stored as `state.<key>`, parsed as `T`: `None` when the key
/// or the member is absent or does not parse. For a key several stages share (`milter`,
/// `crypto`), where one stage reads its own part and leaves the others' to them.
pub fn member<T: DeserializeOwned>(
    state: &Map<String, Value>,
    key: &str,
    member: &str,
) -> Option<T> {
    let v = state.get(key)?.as_object()?.get(member)?;
    serde_json::from_value(v.clone()).ok()
}

/// The object stored as `state.<key>` with member `member` set to `value` (removed when
/// `None`) and every other member kept exactly as stored, parsed or not: a stage rewrites
/// only its own part of a key other stages also write. A key that is not an object starts
/// afresh.
pub fn with_member<T: Serialize>(
    state: &Map<String, Value>,
    key: &str,
    member: &str,
    value: Option<&T>,
) -> Value {
    let mut all = state
        .get(key)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    match value {
        Some(v) => all.insert(member.to_owned(), to_value(v)),
        None => all.remove(member),
    };
    Value::Object(all)
}

/// `null` reads as the default (an empty list, `false`), as an absent field does.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The inherent `KEY`, `from_state`, `from_value`, `to_value` and `insert_into` of a type
/// stored as one state key.
macro_rules! state_key {
    ($ty:ty, $key:literal) => {
        impl $ty {
            /// The state key this type is stored under.
            pub const KEY: &'static str = $key;

            #[doc = concat!("Reads `state.", $key, "`: `None` when it is absent or null.")]
            pub fn from_state(state: &Map<String, Value>) -> Result<Option<Self>, StateError> {
                read(state, $key)
            }

            #[doc = concat!("Parses a value stored as `state.", $key, "`.")]
            pub fn from_value(v: &Value) -> Result<Self, StateError> {
                parse(v, $key)
            }

            /// The JSON to store.
            pub fn to_value(&self) -> Value {
                to_value(self)
            }

            #[doc = concat!("Sets `state.", $key, "` in `state` (a merge map or a whole state).")]
            pub fn insert_into(&self, state: &mut Map<String, Value>) {
                state.insert($key.into(), self.to_value());
            }
        }
    };
}

mod keys;
pub use keys::*;

// ---------------------------------------------------------------------------------------------
// origin

/// `state.origin`: where the message came from, seeded by the ingress. Every field is written
/// (null when unknown), as the ingress always has.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The SMTP client's address.
    #[serde(default)]
    pub client_addr: Option<IpAddr>,
    /// The HELO/EHLO name as the client gave it (empty when it gave none).
    #[serde(default)]
    pub helo: Option<String>,
    /// The client greeted with EHLO.
    #[serde(default)]
    pub esmtp: bool,
    /// MAIL FROM declared SMTPUTF8.
    #[serde(default)]
    pub smtputf8: bool,
    /// MAIL FROM's `BODY=`; None when not declared.
    #[serde(default)]
    pub body: Option<BodyType>,
    /// The session's TLS parameters; None for a plaintext session.
    #[serde(default)]
    pub tls: Option<OriginTls>,
    /// The name of the ingress listener that took the message.
    #[serde(default)]
    pub listener: Option<String>,
    /// The reverse-DNS check; None when the listener does not verify.
    #[serde(default)]
    pub iprev: Option<Iprev>,
    /// The authserv-id the ingress issued `Authentication-Results` under.
    #[serde(default)]
    pub authserv_id: Option<String>,
    /// The authenticated mailbox (lower-case); None when the client did not authenticate.
    #[serde(default)]
    pub auth_user: Option<String>,
    /// A local submission through pepsi-sendmail (written by `pepsi.sendmail_submit`, never
    /// by the ingress, whose origins leave the key out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalSubmission>,
}
state_key!(Origin, "origin");

/// `state.origin.local`: who handed the message to pepsi-sendmail on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalSubmission {
    /// `pepsi-sendmail`.
    pub program: String,
    /// The submitting user's uid: the real uid of the pepsi-sendmail process, or the owner
    /// of the drop-directory file the pickup inserted.
    pub uid: u32,
    /// That user's login name, when the system knows one.
    #[serde(default)]
    pub user: Option<String>,
    pub via: SubmissionVia,
    /// The identity the database's own authentication established (PostgreSQL 16 and later,
    /// `system_user`, e.g. `peer:alice`); None when it cannot tell.
    #[serde(default)]
    pub authn_id: Option<String>,
}

/// How a local submission reached the queue: `origin.local.via`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubmissionVia {
    /// pepsi-sendmail reached the database itself.
    Direct,
    /// It left the message in the drop directory, and the pickup inserted it.
    Spool,
}

impl SubmissionVia {
    /// The name stored in `origin.local.via` (and passed to `pepsi.sendmail_submit`).
    pub fn as_str(self) -> &'static str {
        match self {
            SubmissionVia::Direct => "direct",
            SubmissionVia::Spool => "spool",
        }
    }
}

/// `BODY=` of MAIL FROM (RFC 6152).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BodyType {
    #[serde(rename = "7BIT")]
    SevenBit,
    #[serde(rename = "8BITMIME")]
    EightBitMime,
}

/// `state.origin.tls`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginTls {
    /// `TLSv1.3`.
    pub version: String,
    /// `TLS13_AES_256_GCM_SHA384`.
    pub cipher: String,
}

/// `state.origin.iprev` (RFC 8601 §3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Iprev {
    /// `pass`, `fail`, `temperror`, `permerror`.
    pub result: String,
    /// The verified name; None unless `result` is `pass`.
    #[serde(default)]
    pub name: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// dsn

/// `state.dsn`: the RFC 3461 parameters. `rcpt` has one entry per `rcpt_to` entry, in the same
/// order; every stage keeps them in lockstep. `ret` and `envid` are written as null when the
/// client gave none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dsn {
    #[serde(default)]
    pub ret: Option<Ret>,
    /// ENVID, xtext-decoded.
    #[serde(default)]
    pub envid: Option<String>,
    /// A `null` entry (written by older code for a recipient without parameters) reads as
    /// an entry without NOTIFY or ORCPT.
    #[serde(default, deserialize_with = "rcpt_entries")]
    pub rcpt: Vec<DsnRcpt>,
    /// Fields this type does not know, kept through a rewrite.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}
state_key!(Dsn, "dsn");

/// One entry of `state.dsn.rcpt`. Both fields are written, null when not given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DsnRcpt {
    /// `["NEVER"]` or some of `SUCCESS`, `FAILURE`, `DELAY` (upper-case as written; read
    /// without regard to case); None when the client gave no NOTIFY.
    #[serde(default)]
    pub notify: Option<Vec<String>>,
    /// ORCPT, `addr-type;address`, xtext-decoded.
    #[serde(default)]
    pub orcpt: Option<String>,
    /// Fields this type does not know, kept through a rewrite.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn rcpt_entries<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<DsnRcpt>, D::Error> {
    let entries: Option<Vec<Option<DsnRcpt>>> = Option::deserialize(d)?;
    Ok(entries
        .unwrap_or_default()
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect())
}

impl DsnRcpt {
    /// True when NOTIFY lists `what` (`SUCCESS`, `FAILURE`, `DELAY`, `NEVER`), in any case.
    pub fn notify_includes(&self, what: &str) -> bool {
        self.notify
            .as_ref()
            .is_some_and(|n| n.iter().any(|k| k.eq_ignore_ascii_case(what)))
    }
}

impl Dsn {
    /// Recipient `i`'s entry, if the list has one.
    pub fn rcpt(&self, i: usize) -> Option<&DsnRcpt> {
        self.rcpt.get(i)
    }

    /// This `dsn` for the recipients at `indices` (in that order): what a recipient subset
    /// carries. An index past the list gets an entry without parameters.
    pub fn subset(&self, indices: &[usize]) -> Dsn {
        Dsn {
            rcpt: indices
                .iter()
                .map(|&i| self.rcpt.get(i).cloned().unwrap_or_default())
                .collect(),
            ..self.clone()
        }
    }
}

/// RET of MAIL FROM (RFC 3461 §4.3), stored as `"FULL"` / `"HDRS"` and read in any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ret {
    Full,
    Headers,
}

impl Ret {
    /// The keyword as written in MAIL FROM and in the state.
    pub fn as_str(self) -> &'static str {
        match self {
            Ret::Full => "FULL",
            Ret::Headers => "HDRS",
        }
    }
}

impl Serialize for Ret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Ret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.eq_ignore_ascii_case("FULL") {
            Ok(Ret::Full)
        } else if s.eq_ignore_ascii_case("HDRS") {
            Ok(Ret::Headers)
        } else {
            Err(D::Error::invalid_value(
                Unexpected::Str(&s),
                &"\"FULL\", \"HDRS\" or null",
            ))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// dot_forward

/// `state.dot_forward`: what recipients' `.forward` files did to this message, written by
/// pepsi-stage-dot-forward.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DotForward {
    /// The recipients whose `.forward` sent this copy on, in order, as they were written.
    #[serde(default, deserialize_with = "null_as_default")]
    pub forwarded: Vec<String>,
    /// The copies a `\name` entry kept: delivered where they are, not forwarded again while
    /// the message has come no further.
    #[serde(default, deserialize_with = "null_as_default")]
    pub kept: Vec<KeptCopy>,
}
state_key!(DotForward, "dot_forward");

/// One entry of `state.dot_forward.kept`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptCopy {
    /// The address the copy was kept for.
    pub address: String,
    /// How many `Delivered-To` fields the message had once it was kept: a copy that comes
    /// back with more has been forwarded on since, and is checked for a loop like any other.
    pub hops: usize,
}

// ---------------------------------------------------------------------------------------------
// bounce

/// `state.bounce`: what the bounce stage is asked to report. Only `kind` is required; a field
/// left out is not written. The top-level fields apply to every recipient; `recipients`
/// overrides them per recipient, keyed by the `rcpt_to` address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounce {
    pub kind: BounceKind,
    /// The stage that routed the message here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enhanced_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smtp_code: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_mta: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub will_retry_until: Option<String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub recipients: BTreeMap<String, BounceDetail>,
}
state_key!(Bounce, "bounce");

/// The per-recipient fields of `state.bounce` (the top level's, less `kind` and `stage`): one
/// entry of `bounce.recipients`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BounceDetail {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enhanced_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smtp_code: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_mta: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub will_retry_until: Option<String>,
}

impl Bounce {
    /// A bounce of `kind` with nothing else said.
    pub fn new(kind: BounceKind) -> Self {
        Bounce {
            kind,
            stage: None,
            diagnostic: None,
            enhanced_status: None,
            smtp_code: None,
            reply_text: None,
            remote_mta: None,
            phase: None,
            action: None,
            will_retry_until: None,
            recipients: BTreeMap::new(),
        }
    }

    /// Sets `stage`.
    pub fn stage(mut self, stage: impl Into<String>) -> Self {
        self.stage = Some(stage.into());
        self
    }

    /// Sets the top-level fields from `detail`.
    pub fn with_detail(mut self, detail: BounceDetail) -> Self {
        let BounceDetail {
            diagnostic,
            enhanced_status,
            smtp_code,
            reply_text,
            remote_mta,
            phase,
            action,
            will_retry_until,
        } = detail;
        self.diagnostic = diagnostic;
        self.enhanced_status = enhanced_status;
        self.smtp_code = smtp_code;
        self.reply_text = reply_text;
        self.remote_mta = remote_mta;
        self.phase = phase;
        self.action = action;
        self.will_retry_until = will_retry_until;
        self
    }

    /// The top-level fields, as a recipient without an override of its own sees them.
    pub fn detail(&self) -> BounceDetail {
        BounceDetail {
            diagnostic: self.diagnostic.clone(),
            enhanced_status: self.enhanced_status.clone(),
            smtp_code: self.smtp_code,
            reply_text: self.reply_text.clone(),
            remote_mta: self.remote_mta.clone(),
            phase: self.phase.clone(),
            action: self.action.clone(),
            will_retry_until: self.will_retry_until.clone(),
        }
    }

    /// The override for `address` under `recipients`: the exact key, else one equal in any
    /// letter case. Returns the key as stored with it.
    pub fn recipient(&self, address: &str) -> Option<(&str, &BounceDetail)> {
        self.recipients
            .get_key_value(address)
            .or_else(|| {
                self.recipients
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(address))
            })
            .map(|(k, v)| (k.as_str(), v))
    }
}

/// `bounce.kind`: what the notification reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BounceKind {
    /// Delivery failed for good (`Action: failed`).
    Permanent,
    /// Delivery has not succeeded yet and is being retried (`Action: delayed`).
    Delay,
    /// Delivered (`Action: delivered`, or `relayed`/`expanded` when the state says so).
    Success,
}

impl BounceKind {
    /// The name stored in `bounce.kind`.
    pub fn name(self) -> &'static str {
        match self {
            BounceKind::Permanent => "permanent",
            BounceKind::Delay => "delay",
            BounceKind::Success => "success",
        }
    }

    /// The RFC 3463 class digit a Status of this kind must have.
    pub fn class(self) -> char {
        match self {
            BounceKind::Permanent => '5',
            BounceKind::Delay => '4',
            BounceKind::Success => '2',
        }
    }

    /// The RFC 3464 Action when the state names none.
    pub fn action(self) -> &'static str {
        match self {
            BounceKind::Permanent => "failed",
            BounceKind::Delay => "delayed",
            BounceKind::Success => "delivered",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// attempts / last_error / delay_sent

/// The delivery stages' retry scratch, three top-level keys: `attempts` (delivery attempts so
/// far), `last_error` (the last transient failure, one line) and `delay_sent` (the delay
/// notice went out). A key left `None` is neither read nor written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryScratch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_sent: Option<bool>,
}

impl DeliveryScratch {
    /// Reads the three keys; an absent or null one is `None`.
    pub fn from_state(state: &Map<String, Value>) -> Result<Self, StateError> {
        Ok(DeliveryScratch {
            attempts: read(state, "attempts")?,
            last_error: read(state, "last_error")?,
            delay_sent: read(state, "delay_sent")?,
        })
    }

    /// Only `state.last_error`, for a reader that needs nothing else (the bounce stage's delay
    /// diagnostic): a malformed `attempts` is not its business.
    pub fn read_last_error(state: &Map<String, Value>) -> Result<Option<String>, StateError> {
        read(state, "last_error")
    }

    /// The keys that are set, to merge into the state.
    pub fn to_state(&self) -> Map<String, Value> {
        match to_value(self) {
            Value::Object(m) => m,
            _ => unreachable!("a struct serializes to an object"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// failure_bouncer

/// `state.failure_bouncer`: what pepsi-failure-bouncer did about a row that ended `failed` or
/// `timeout`, written with each of its steps (`docs/failure-bouncer.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The stage `retries` and `failures` count at; a failure at another stage starts a
    /// fresh count (the message got past the stage that failed before).
    #[serde(default)]
    pub stage: String,
    /// Retries made at `stage`.
    #[serde(default)]
    pub retries: u32,
    /// Each failure seen at `stage`, oldest first.
    #[serde(default, deserialize_with = "null_as_default")]
    pub failures: Vec<FailureSeen>,
    /// When the bouncer returned the message to its sender: it is never returned twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bounced: Option<FailureBounced>,
    /// Why the bouncer gave the row up (left failed for an operator); it is not considered
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given_up: Option<String>,
}
state_key!(FailureRecord, "failure_bouncer");

/// One entry of `failure_bouncer.failures`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureSeen {
    /// The row's status.
    pub status: FailedStatus,
    pub kind: FailureKind,
    /// The dispatcher's `dispatch_error`, cut to 300 characters.
    #[serde(default)]
    pub error: Option<String>,
    /// RFC 3339.
    pub at: String,
}

/// `failure_bouncer.failures[].status`: how the row ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailedStatus {
    Failed,
    Timeout,
}

impl FailedStatus {
    /// The status of a row whose `status` column is `status` (`timeout`, else `failed`: the
    /// failure bouncer only reads rows that ended one of the two ways).
    pub fn of_row(status: &str) -> Self {
        if status == "timeout" {
            FailedStatus::Timeout
        } else {
            FailedStatus::Failed
        }
    }
}

/// `failure_bouncer.failures[].kind`: how a failure came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureKind {
    /// The worker died while handling the message.
    Crash,
    /// It did not answer within MAX_RUNTIME.
    Timeout,
    /// The stage reported an error.
    Error,
}

impl FailureKind {
    /// The name stored in `kind` (and logged).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Crash => "crash",
            FailureKind::Timeout => "timeout",
            FailureKind::Error => "error",
        }
    }
}

/// `failure_bouncer.bounced`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureBounced {
    /// The stage the message failed at.
    pub stage: String,
    /// RFC 3339.
    pub at: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state(v: Value) -> Map<String, Value> {
        v.as_object().expect("an object").clone()
    }

    #[test]
    fn a_shared_key_is_rewritten_member_by_member_keeping_the_others_as_stored() {
        // (stored state, member, new value, the key afterwards)
        let cases = [
            // Another stage's member that no type of ours parses stays byte for byte.
            (
                json!({"crypto": {"decrypted": {"result": "from-a-newer-version", "x": 1}}}),
                "encrypted",
                Some(json!({"stage": "encrypt"})),
                json!({"decrypted": {"result": "from-a-newer-version", "x": 1}, "encrypted": {"stage": "encrypt"}}),
            ),
            (
                json!({"milter": {"spam": {"attempts": "three"}, "virus": {"attempts": 2, "reason": null}}}),
                "virus",
                None,
                json!({"spam": {"attempts": "three"}}),
            ),
            (
                json!({}),
                "spam",
                Some(json!({"quarantine": "q"})),
                json!({"spam": {"quarantine": "q"}}),
            ),
            // A key that is not an object starts afresh.
            (
                json!({"milter": "junk"}),
                "spam",
                Some(json!(1)),
                json!({"spam": 1}),
            ),
        ];
        for (stored, member_name, value, want) in cases {
            let key = stored
                .as_object()
                .and_then(|o| o.keys().next().cloned())
                .unwrap_or_else(|| "milter".into());
            let got = with_member(&state(stored.clone()), &key, member_name, value.as_ref());
            assert_eq!(got, want, "{stored} {member_name}");
        }
        let s = state(
            json!({"milter": {"spam": {"attempts": 2, "reason": "451"}, "virus": {"attempts": "x"}}}),
        );
        assert_eq!(
            member::<Value>(&s, "milter", "spam"),
            Some(json!({"attempts": 2, "reason": "451"}))
        );
        assert_eq!(
            member::<u32>(&s, "milter", "virus"),
            None,
            "does not parse: absent"
        );
        assert_eq!(member::<Value>(&s, "milter", "none"), None);
        assert_eq!(member::<Value>(&s, "crypto", "spam"), None);
    }

    /// Each value parses and writes back exactly as stored: (key, stored JSON).
    #[test]
    fn stored_shapes_round_trip() {
        let cases: Vec<(&str, Value)> = vec![
            // what the ingress writes (docs/state.md), a verified TLS session …
            (
                "origin",
                json!({ "client_addr": "192.0.2.7", "helo": "mail.example.org", "esmtp": true,
                        "smtputf8": false, "body": "8BITMIME",
                        "tls": {"version": "TLSv1.3", "cipher": "TLS13_AES_256_GCM_SHA384"},
                        "listener": "mx", "iprev": {"result": "pass", "name": "mail.example.org"},
                        "authserv_id": "mx.example.test", "auth_user": null }),
            ),
            // … and a plaintext, unverified, authenticated submission over IPv6
            (
                "origin",
                json!({ "client_addr": "2001:db8::1", "helo": "", "esmtp": false,
                        "smtputf8": true, "body": "7BIT", "tls": null, "listener": "submission",
                        "iprev": null, "authserv_id": "mx.example.test",
                        "auth_user": "alice@example.test" }),
            ),
            (
                "origin",
                json!({ "client_addr": "192.0.2.7", "helo": "x", "esmtp": true,
                        "smtputf8": false, "body": null, "tls": null, "listener": "mx",
                        "iprev": {"result": "fail", "name": null}, "authserv_id": "h",
                        "auth_user": null }),
            ),
            // the ingress's dsn, with and without parameters
            (
                "dsn",
                json!({"ret": "HDRS", "envid": "id+1", "rcpt": [
                    {"notify": ["SUCCESS", "FAILURE"], "orcpt": "rfc822;a@example.test"},
                    {"notify": ["NEVER"], "orcpt": null},
                    {"notify": null, "orcpt": null}]}),
            ),
            ("dsn", json!({"ret": null, "envid": null, "rcpt": []})),
            // a field another stage added survives
            (
                "dsn",
                json!({"ret": "FULL", "envid": null, "x-note": 1,
                       "rcpt": [{"notify": null, "orcpt": "utf-8;ü@x.test", "x": true}]}),
            ),
            // a delivery stage's bounce clone (delivery::conclude)
            (
                "bounce",
                json!({"kind": "permanent", "stage": "relay", "diagnostic": "no such user",
                       "enhanced_status": "5.1.1", "smtp_code": 550,
                       "reply_text": "550 5.1.1 <b@x> no such user", "remote_mta": "mx.example.org",
                       "phase": "RCPT",
                       "recipients": {"b@x": {"diagnostic": "no such user",
                           "enhanced_status": "5.1.1", "smtp_code": 550,
                           "reply_text": "550 5.1.1 <b@x> no such user",
                           "remote_mta": "mx.example.org", "phase": "RCPT"}}}),
            ),
            (
                "bounce",
                json!({"kind": "delay", "stage": "maildir", "diagnostic": "disk full",
                       "enhanced_status": "4.3.1", "phase": "delivery",
                       "will_retry_until": "2030-01-07T03:04:05+00:00",
                       "recipients": {"a@x": {"diagnostic": "disk full",
                           "enhanced_status": "4.3.1", "phase": "delivery"}}}),
            ),
            // complete_success, pepsi-queue bounce, the discard stage
            ("bounce", json!({"kind": "success", "stage": "lmtp"})),
            (
                "bounce",
                json!({"kind": "permanent", "diagnostic": "spam run", "enhanced_status": "5.0.0",
                       "stage": "relay"}),
            ),
            ("bounce", json!({"kind": "success", "action": "relayed"})),
            // pepsi.sendmail_submit's origin, both ways in
            (
                "origin",
                json!({ "client_addr": null, "helo": null, "esmtp": false, "smtputf8": false,
                        "body": null, "tls": null, "listener": null, "iprev": null,
                        "authserv_id": null, "auth_user": null,
                        "local": {"program": "pepsi-sendmail", "uid": 1000, "user": "alice",
                                  "via": "direct", "authn_id": "peer:alice"} }),
            ),
            (
                "origin",
                json!({ "client_addr": null, "helo": null, "esmtp": false, "smtputf8": true,
                        "body": null, "tls": null, "listener": null, "iprev": null,
                        "authserv_id": null, "auth_user": null,
                        "local": {"program": "pepsi-sendmail", "uid": 0, "user": null,
                                  "via": "spool", "authn_id": null} }),
            ),
            // the failure bouncer's record, every kind of failure seen
            (
                "failure_bouncer",
                json!({"stage": "relay", "retries": 2, "failures": [
                    {"status": "failed", "kind": "crash", "error": "worker x while handling the message",
                     "at": "2029-01-01T00:00:00Z"},
                    {"status": "timeout", "kind": "timeout", "error": null, "at": "2029-01-01T00:05:00Z"},
                    {"status": "failed", "kind": "error", "error": "stage relay: no", "at": "2029-01-01T00:10:00Z"}],
                    "bounced": {"stage": "relay", "at": "2029-01-01T00:15:00Z"},
                    "given_up": "failed 4 times at its own bounce stage bounce"}),
            ),
            (
                "failure_bouncer",
                json!({"stage": "x", "retries": 0, "failures": []}),
            ),
        ];
        for (key, stored) in cases {
            let st = state(json!({ key: stored.clone() }));
            let written = match key {
                "origin" => Origin::from_state(&st).unwrap().unwrap().to_value(),
                "dsn" => Dsn::from_state(&st).unwrap().unwrap().to_value(),
                "bounce" => Bounce::from_state(&st).unwrap().unwrap().to_value(),
                "failure_bouncer" => FailureRecord::from_state(&st).unwrap().unwrap().to_value(),
                _ => unreachable!(),
            };
            assert_eq!(written, stored, "{key}");
        }
    }

    #[test]
    fn scratch_round_trips_and_writes_only_what_is_set() {
        let st = state(
            json!({"attempts": 3, "last_error": "451 4.3.0 try later (from mx)",
                              "delay_sent": true, "dsn": {}}),
        );
        let s = DeliveryScratch::from_state(&st).unwrap();
        assert_eq!(
            s,
            DeliveryScratch {
                attempts: Some(3),
                last_error: Some("451 4.3.0 try later (from mx)".into()),
                delay_sent: Some(true),
            }
        );
        assert_eq!(
            Value::Object(s.to_state()),
            json!({"attempts": 3, "last_error": "451 4.3.0 try later (from mx)",
                   "delay_sent": true})
        );
        let first = DeliveryScratch {
            attempts: Some(1),
            last_error: Some("x".into()),
            delay_sent: None,
        };
        assert_eq!(
            Value::Object(first.to_state()),
            json!({"attempts": 1, "last_error": "x"})
        );
        assert_eq!(
            DeliveryScratch::from_state(&Map::new()).unwrap(),
            DeliveryScratch::default()
        );
        let odd = state(json!({"attempts": "many", "last_error": "x"}));
        assert_eq!(
            DeliveryScratch::read_last_error(&odd).unwrap().as_deref(),
            Some("x")
        );
        assert!(DeliveryScratch::from_state(&odd).is_err());
    }

    /// Absent, null and older shapes read as "not given".
    #[test]
    fn missing_and_null_read_as_not_given() {
        let empty = Map::new();
        assert_eq!(Origin::from_state(&empty).unwrap(), None);
        assert_eq!(Dsn::from_state(&empty).unwrap(), None);
        assert_eq!(Bounce::from_state(&empty).unwrap(), None);
        let nulls = state(json!({"origin": null, "dsn": null, "bounce": null,
                                 "attempts": null, "last_error": null, "delay_sent": null}));
        assert_eq!(Dsn::from_state(&nulls).unwrap(), None);
        assert_eq!(
            DeliveryScratch::from_state(&nulls).unwrap(),
            DeliveryScratch::default()
        );

        let o = Origin::from_value(&json!({"auth_user": "x@example.com"})).unwrap();
        assert_eq!(o.auth_user.as_deref(), Some("x@example.com"));
        assert!(!o.smtputf8 && o.client_addr.is_none());

        // a null recipient entry (older aliases stage), a missing or null list
        let d = Dsn::from_value(&json!({"rcpt": [null, {"notify": ["delay"]}]})).unwrap();
        assert_eq!(d.rcpt.len(), 2);
        assert_eq!(d.rcpt[0], DsnRcpt::default());
        assert!(d.rcpt[1].notify_includes("DELAY"));
        assert_eq!(Dsn::from_value(&json!({})).unwrap(), Dsn::default());
        assert_eq!(
            Dsn::from_value(&json!({"rcpt": null})).unwrap(),
            Dsn::default()
        );
        assert_eq!(
            Dsn::from_value(&json!({"ret": "full"})).unwrap().ret,
            Some(Ret::Full)
        );
        let b = Bounce::from_value(&json!({"kind": "delay", "recipients": null,
                                           "smtp_code": null, "failed_recipient": "a@x"}))
        .unwrap();
        assert_eq!(b, Bounce::new(BounceKind::Delay));
    }

    /// (key, stored value, the start of the error).
    #[test]
    fn malformed_values_name_the_key() {
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "dsn",
                json!("FULL"),
                "state.dsn: invalid type: string \"FULL\"",
            ),
            (
                "dsn",
                json!({"ret": "BODY"}),
                "state.dsn.ret: invalid value: string \"BODY\"",
            ),
            (
                "dsn",
                json!({"envid": 7}),
                "state.dsn.envid: invalid type: integer `7`",
            ),
            (
                "dsn",
                json!({"rcpt": {"notify": null}}),
                "state.dsn.rcpt: invalid type: map",
            ),
            (
                "dsn",
                json!({"rcpt": [{}, {}, {"notify": "SUCCESS"}]}),
                "state.dsn.rcpt[2].notify: invalid type: string \"SUCCESS\", expected a sequence",
            ),
            (
                "dsn",
                json!({"rcpt": [{"notify": ["SUCCESS", 1]}]}),
                "state.dsn.rcpt[0].notify[1]: invalid type: integer `1`, expected a string",
            ),
            (
                "dsn",
                json!({"rcpt": [7]}),
                "state.dsn.rcpt[0]: invalid type: integer `7`",
            ),
            ("bounce", json!({}), "state.bounce: missing field `kind`"),
            ("bounce", json!([]), "state.bounce: invalid length 0"),
            (
                "bounce",
                json!({"kind": "soft"}),
                "state.bounce.kind: unknown variant `soft`, expected one of `permanent`, `delay`, `success`",
            ),
            (
                "bounce",
                json!({"kind": "permanent", "smtp_code": "550"}),
                "state.bounce.smtp_code: invalid type: string \"550\"",
            ),
            (
                "bounce",
                json!({"kind": "permanent", "smtp_code": 70000}),
                "state.bounce.smtp_code: invalid value: integer `70000`",
            ),
            (
                "bounce",
                json!({"kind": "permanent", "recipients": {"b@example.org": {"smtp_code": "x"}}}),
                "state.bounce.recipients[\"b@example.org\"].smtp_code: invalid type: string",
            ),
            (
                "bounce",
                json!({"kind": "permanent", "recipients": ["b@example.org"]}),
                "state.bounce.recipients: invalid type: sequence",
            ),
            (
                "origin",
                json!({"smtputf8": "yes"}),
                "state.origin.smtputf8: invalid type: string",
            ),
            (
                "origin",
                json!({"client_addr": "localhost"}),
                "state.origin.client_addr: invalid IP address syntax",
            ),
            (
                "origin",
                json!({"body": "BINARYMIME"}),
                "state.origin.body: unknown variant",
            ),
            (
                "origin",
                json!({"iprev": {"name": "x"}}),
                "state.origin.iprev: missing field `result`",
            ),
            (
                "origin",
                json!({"tls": "TLSv1.3"}),
                "state.origin.tls: invalid type: string",
            ),
            (
                "attempts",
                json!("3"),
                "state.attempts: invalid type: string \"3\"",
            ),
            (
                "attempts",
                json!(-1),
                "state.attempts: invalid value: integer `-1`",
            ),
            (
                "last_error",
                json!({"x": 1}),
                "state.last_error: invalid type: map",
            ),
            (
                "delay_sent",
                json!("true"),
                "state.delay_sent: invalid type: string",
            ),
        ];
        for (key, stored, want) in cases {
            let st = state(json!({ key: stored.clone() }));
            let err = match key {
                "origin" => Origin::from_state(&st).map(|_| ()),
                "dsn" => Dsn::from_state(&st).map(|_| ()),
                "bounce" => Bounce::from_state(&st).map(|_| ()),
                _ => DeliveryScratch::from_state(&st).map(|_| ()),
            }
            .expect_err("malformed")
            .to_string();
            assert!(
                err.starts_with(want),
                "{key} = {stored}:\n  {err}\nshould start\n  {want}"
            );
        }
    }

    #[test]
    fn subset_follows_the_indices_and_keeps_the_rest() {
        let d = Dsn::from_value(&json!({"ret": "HDRS", "envid": "E1", "x": 1, "rcpt": [
            {"notify": ["FAILURE"], "orcpt": "rfc822;a@x"},
            {"notify": ["SUCCESS"], "orcpt": "rfc822;b@x"}]}))
        .unwrap();
        assert_eq!(
            d.subset(&[1, 5]).to_value(),
            json!({"ret": "HDRS", "envid": "E1", "x": 1, "rcpt": [
                {"notify": ["SUCCESS"], "orcpt": "rfc822;b@x"},
                {"notify": null, "orcpt": null}]})
        );
        assert!(d.rcpt(1).is_some_and(|r| r.notify_includes("success")));
        assert!(!d.rcpt(0).is_some_and(|r| r.notify_includes("SUCCESS")));
    }

    #[test]
    fn bounce_recipient_lookup_ignores_letter_case() {
        let b = Bounce::from_value(&json!({"kind": "permanent", "diagnostic": "top",
            "recipients": {"C@example.org": {"smtp_code": 552}}}))
        .unwrap();
        let (key, own) = b.recipient("c@example.org").unwrap();
        assert_eq!((key, own.smtp_code), ("C@example.org", Some(552)));
        assert!(b.recipient("d@example.org").is_none());
        assert_eq!(b.detail().diagnostic.as_deref(), Some("top"));
    }
}
