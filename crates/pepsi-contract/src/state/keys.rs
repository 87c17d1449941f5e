//! The `state` keys one stage, the ingress or the queue's SQL writes for itself, its
//! successors and operators (`docs/state.md`): `auth`, `junk`, `bounce_error`,
//! `dispatch_error`, `dispatch_error_history`, `held`, `srs`, `vacation`, `whitelist`,
//! `language`, `language_block`, `milter`, `crypto`, `keydisc`, `list_approval`,
//! `secure_link`, `secretary`, `auto_pay`, `trace`. Each type reads and writes exactly the JSON its writer stored before the
//! type existed (the table test below pins every shape), so rows already in a queue parse and
//! older readers read what these write.
//! Pure: no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{StateError, null_as_default, parse, read, to_value};
use crate::settings::block_languages::BlockAction;
use crate::telemetry::{SpanId, TraceId};

// ---------------------------------------------------------------------------------------------
// auth

/// `state.auth`: the ingress's verdicts of message authentication, the ones its
/// `Authentication-Results` field carries. Written only by a listener with `VERIFY = yes`.
/// Result names are kept as text (`pass`, `fail`, `softfail`, `neutral`, `none`,
/// `temperror`, `permerror`): the readers that put them into a header field check each
/// value themselves, and drop what is not a result name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auth {
    /// The MAIL FROM verdict (the HELO verdict for the null sender), with `helo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spf: Option<AuthVerdict>,
    /// One entry per signature; empty for an unsigned message.
    #[serde(default, deserialize_with = "null_as_default")]
    pub dkim: Vec<AuthVerdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dmarc: Option<AuthVerdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arc: Option<AuthVerdict>,
}
state_key!(Auth, "auth");

/// One verdict of `state.auth`; a field not given is not written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthVerdict {
    /// The RFC 8601 result name.
    #[serde(default)]
    pub result: String,
    /// SPF: the domain checked; DKIM: `d=` (lower case); DMARC: the From domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// DKIM: `s=`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// DMARC: `reject`, `quarantine` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Why a DKIM, ARC or DMARC verdict is not `pass`, when the library said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// SPF only: the HELO verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helo: Option<Box<AuthVerdict>>,
}

impl AuthVerdict {
    /// A verdict of `result` with nothing else said.
    pub fn new(result: impl Into<String>) -> Self {
        AuthVerdict {
            result: result.into(),
            ..AuthVerdict::default()
        }
    }
}

impl Auth {
    /// Whether these verdicts vouch for the From domain `from_domain`: DMARC passed, or SPF
    /// or a DKIM signature passed for a domain aligned with it ([`domains_align`]). What the
    /// secretary asks before it writes to a sender, and auto-pay before it pays one.
    pub fn vouches_for(&self, from_domain: &str) -> bool {
        let pass = |r: &str| r.eq_ignore_ascii_case("pass");
        if self.dmarc.as_ref().is_some_and(|d| pass(&d.result)) {
            return true;
        }
        let aligned =
            |d: &Option<String>| d.as_deref().is_some_and(|d| domains_align(d, from_domain));
        self.spf
            .as_ref()
            .is_some_and(|s| pass(&s.result) && aligned(&s.domain))
            || self
                .dkim
                .iter()
                .any(|s| pass(&s.result) && aligned(&s.domain))
    }
}

/// Whether `a` and `b` are the same organisational domain, as far as can be told without a
/// public-suffix list: equal, or one a subdomain of the other (DMARC's relaxed alignment
/// for the common cases; two sibling subdomains do not align here).
pub fn domains_align(a: &str, b: &str) -> bool {
    let a = a.trim().trim_end_matches('.').to_ascii_lowercase();
    let b = b.trim().trim_end_matches('.').to_ascii_lowercase();
    if a.is_empty() || b.is_empty() {
        return false;
    }
    a == b || a.ends_with(&format!(".{b}")) || b.ends_with(&format!(".{a}"))
}

// ---------------------------------------------------------------------------------------------
// single values: junk, bounce_error, dispatch_error

/// `state.junk`: a spam filter's verdict; the counting stage reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Junk(pub bool);
state_key!(Junk, "junk");

/// `state.bounce_error`: why the bounce stage failed a message it cannot build a DSN for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BounceError(pub String);
state_key!(BounceError, "bounce_error");

/// `state.dispatch_error`: why the dispatcher forced the row to `failed` or `timeout`
/// (written in SQL by the dispatcher's claim).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DispatchError(pub String);
state_key!(DispatchError, "dispatch_error");

// ---------------------------------------------------------------------------------------------
// dispatch_error_history, held (written in SQL by pepsi-queue's procedures)

/// `state.dispatch_error_history`: the `dispatch_error`s `pepsi-queue retry` cleared,
/// oldest first (`pepsi.workqueue_retry`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DispatchErrorHistory(pub Vec<ClearedError>);
state_key!(DispatchErrorHistory, "dispatch_error_history");

/// One entry of `state.dispatch_error_history`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClearedError {
    /// The `dispatch_error` as it was (any JSON: SQL copies the value).
    pub error: Value,
    /// The row's status then: `failed` or `timeout`.
    pub status: String,
    /// When, as PostgreSQL writes a `timestamptz` in JSON.
    pub cleared_at: String,
    /// The database role.
    pub cleared_by: String,
}

/// `state.held`: a row `pepsi-queue hold` parked (`pepsi.workqueue_hold`); removed by
/// `release` and `bounce`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// When, as PostgreSQL writes a `timestamptz` in JSON.
    pub at: String,
    /// The database role.
    pub by: String,
    #[serde(default)]
    pub reason: Option<String>,
    /// The row's status before the hold.
    pub status: String,
    /// The row's timeout before the hold.
    #[serde(default)]
    pub timeout: Option<String>,
}
state_key!(Held, "held");

// ---------------------------------------------------------------------------------------------
// srs, vacation

/// `state.srs`: pepsi-stage-srs (forward mode) rewrote the envelope sender.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Srs {
    /// The envelope sender before the rewrite.
    pub mail_from: String,
}
state_key!(Srs, "srs");

/// `state.vacation`: pepsi-stage-vacation queued automatic replies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vacation {
    /// The owners answered for, lower case.
    #[serde(default, deserialize_with = "null_as_default")]
    pub replied: Vec<String>,
}
state_key!(Vacation, "vacation");

// ---------------------------------------------------------------------------------------------
// list_approval

/// `state.list_approval`: a post a list's moderator approved (`pepsi-list approve`), queued
/// again at the list stage for the list's address alone. Written only by pepsi-list on the
/// row it injects (`pepsi.list_held_approve`, token `list-approve:<held_id>`), never by the
/// ingress: the list stage accepts a row carrying it for its list whatever the posting policy
/// says, after the loop check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListApproval {
    /// The list's address, lower case.
    pub list: String,
    /// The list's `pepsi.mailing_list.list_id`: the approval is for this list only.
    pub list_id: i64,
    /// The `pepsi.list_held_message` row the post was held as (deleted by the approval).
    pub held_id: i64,
    /// Who approved it: the invoking user (`list_moderation_decision.moderator`).
    pub moderator: String,
}
state_key!(ListApproval, "list_approval");

impl ListApproval {
    /// True when this approves posts to the list with id `list_id`.
    pub fn approves(&self, list_id: i64) -> bool {
        self.list_id == list_id
    }
}

// ---------------------------------------------------------------------------------------------
// whitelist, language, language_block

/// `state.whitelist`, written by pepsi-stage-check-whitelist on every pass. `sender`,
/// `trusted` and `all` are there together, or not at all (no usable `From:` address);
/// `learned` only when the pass taught the sending mailbox's list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Whitelist {
    /// The `From:` address, lower case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    /// The recipients' mailboxes whose list holds the sender, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted: Option<Vec<String>>,
    /// Every recipient trusts the sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<bool>,
    /// How many of the recipients the sending mailbox's list gained or confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<usize>,
}
state_key!(Whitelist, "whitelist");

/// `state.language`, written by pepsi-stage-detect-language on every pass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Language {
    /// ISO 639-1 code of the most likely language; null when the text has too few letters
    /// or no language is likely enough.
    #[serde(default)]
    pub code: Option<String>,
    /// Its English name; absent with a null `code`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// lingua's confidence in the most likely language, 0 to 1.
    #[serde(default)]
    pub confidence: f64,
    /// The letters judged.
    #[serde(default)]
    pub letters: usize,
}
state_key!(Language, "language");

/// `state.language_block`: pepsi-stage-block-language refused this copy or sent it to the
/// Junk folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LanguageBlocked {
    pub action: BlockAction,
    /// The ISO 639-1 code of the language blocked.
    pub language: String,
}
state_key!(LanguageBlocked, "language_block");

// ---------------------------------------------------------------------------------------------
// milter

/// `state.milter`: pepsi-stage-milter's entry per stage name (a message may pass several
/// milter stages), while the message waits or is held.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Milter(pub BTreeMap<String, MilterEntry>);
state_key!(Milter, "milter");

/// One stage's entry of `state.milter`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MilterEntry {
    /// The filter's reason for holding the message for an operator: once an operator makes
    /// it pending again, the stage lets it on without asking the filter.
    Held { quarantine: String },
    /// The message waits: how often the stage deferred it, and the last reply that deferred
    /// it (or why the filter could not be asked); `reason` is written null when unknown.
    Waiting {
        attempts: u32,
        #[serde(default)]
        reason: Option<String>,
    },
}

impl Milter {
    /// How often stage `stage` deferred the message (0 without a waiting entry).
    pub fn attempts(&self, stage: &str) -> u32 {
        match self.0.get(stage) {
            Some(MilterEntry::Waiting { attempts, .. }) => *attempts,
            _ => 0,
        }
    }

    /// True when stage `stage` held the message.
    pub fn is_held(&self, stage: &str) -> bool {
        matches!(self.0.get(stage), Some(MilterEntry::Held { .. }))
    }

    /// This value with `stage`'s entry set to `entry` (removed when `None`); the other
    /// stages' entries stay.
    pub fn with(mut self, stage: &str, entry: Option<MilterEntry>) -> Self {
        match entry {
            Some(e) => self.0.insert(stage.to_owned(), e),
            None => self.0.remove(stage),
        };
        self
    }
}

// ---------------------------------------------------------------------------------------------
// crypto, keydisc

/// `state.crypto`: what pepsi-stage-encrypt (`encrypted`) and pepsi-stage-decrypt
/// (`decrypted`) did. Each stage sets its own field and keeps the other's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Crypto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<Encrypted>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decrypted: Option<Decryption>,
    /// Fields this type does not know, kept through a rewrite.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}
state_key!(Crypto, "crypto");

/// `state.crypto.encrypted`. Every field is written (null when not given).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encrypted {
    /// The stage that encrypted.
    #[serde(default)]
    pub stage: String,
    /// `openpgp` or `smime`.
    #[serde(default)]
    pub scheme: String,
    /// How many recipients the message was encrypted to.
    #[serde(default)]
    pub recipients: usize,
    /// The fingerprint of the author's key it was signed with.
    #[serde(default)]
    pub signed_by: Option<String>,
    /// Why it could not be signed, when signing was due and failed.
    #[serde(default)]
    pub sign_error: Option<String>,
}

/// `state.crypto.decrypted`, by its `result`: `decrypted`, `no-key` or `failed`. Fields a
/// reader needs are read with defaults (a row decrypted before `original_headers` was
/// recorded has none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Decryption {
    /// The row now holds the plaintext.
    Decrypted {
        #[serde(default)]
        stage: String,
        #[serde(default)]
        scheme: String,
        /// The fingerprint of our key that opened it.
        #[serde(default)]
        key: String,
        /// `none`, `good`, `unverified`, `bad` or `mismatch`.
        #[serde(default)]
        signature: String,
        #[serde(default)]
        signer: Option<String>,
        #[serde(default, deserialize_with = "null_as_default")]
        signer_addresses: Vec<String>,
        #[serde(default)]
        detail: Option<String>,
        /// The header block the encrypted message arrived with: what a notification about
        /// it may return.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        original_headers: Option<String>,
    },
    /// No opted-in recipient has a private key of this scheme.
    NoKey {
        #[serde(default)]
        stage: String,
        #[serde(default)]
        scheme: String,
        #[serde(default)]
        why: String,
    },
    /// Decryption was tried and failed; the message stays encrypted.
    Failed {
        #[serde(default)]
        stage: String,
        #[serde(default)]
        scheme: String,
        #[serde(default)]
        why: String,
    },
}

impl Crypto {
    /// The message was decrypted here (`decrypted.result` is `decrypted`).
    pub fn plaintext(&self) -> bool {
        matches!(self.decrypted, Some(Decryption::Decrypted { .. }))
    }
}

/// `state.keydisc`: pepsi-stage-encrypt parked the message until key discovery settles for
/// `waiting`. Written null once the message leaves the stage any other way
/// ([`Keydisc::clear`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keydisc {
    /// The recipients whose keys are being looked for.
    pub waiting: Vec<String>,
    /// When the message was first parked, RFC 3339.
    pub since: String,
    /// The stage that parked it.
    pub stage: String,
}
state_key!(Keydisc, "keydisc");

impl Keydisc {
    /// The merge that clears `state.keydisc` when `state` has one (nothing otherwise).
    pub fn clear(state: &Map<String, Value>) -> Map<String, Value> {
        let mut m = Map::new();
        if state.get(Self::KEY).is_some_and(|v| !v.is_null()) {
            m.insert(Self::KEY.into(), Value::Null);
        }
        m
    }
}

// ---------------------------------------------------------------------------------------------
// secure_link

/// `state.secure_link`: the secure-link stage's marks (docs/secure-link.md, "The stage").
/// On a row to be kept behind links, `reason` says why (the encrypt stage's fallback, or a
/// decision the secure-link stage took and split the row for); on a notice or receipt that
/// stage queued, `made` says which, and no stage secures or holds it to required encryption
/// again. Never written by the ingress, so mail cannot set it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecureLink {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<SecureLinkReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<SecureLinkMade>,
}
state_key!(SecureLink, "secure_link");

/// `state.secretary`: the secretary stage's marks (docs/secretary.md). While a row waits
/// at the stage, `held` says why (`challenged`, `unauthenticated`, `automated`, `limited`)
/// and `mailbox` for whom; a row the stage let go after a wait has `released` (how: `link`,
/// `reply`, `postage`, `owner:<who>`, ...); a challenge or a digest the secretary queued has
/// `made` (`challenge`, `digest`), and no secretary holds it. Never written by the ingress,
/// so mail cannot set it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secretary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mailbox: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<String>,
}
state_key!(Secretary, "secretary");

/// `state.auto_pay`: what pepsi-stage-auto-pay did with a challenge carrying a postage
/// request (docs/auto-pay.md): `paid` the amount it paid, or `refused` why not; `made:
/// "notice"` on the notice of a refusal it queued for the user, which it never reads as a
/// challenge. Never written by the ingress, so mail cannot set it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoPay {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<String>,
}
state_key!(AutoPay, "auto_pay");

/// Why a row's recipients are to be reached by secure link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SecureLinkReason {
    /// pepsi-stage-encrypt: encryption is required, no key was found, and the secure-link
    /// policy allows a link instead of a 5.7.5 bounce.
    EncryptFallback,
    /// The authenticated sender asked (a header or a subject tag).
    Asked,
    /// A domain's secure-link policy says `always`.
    Policy,
}

impl SecureLinkReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SecureLinkReason::EncryptFallback => "encrypt-fallback",
            SecureLinkReason::Asked => "asked",
            SecureLinkReason::Policy => "policy",
        }
    }
}

/// What the secure-link stage made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecureLinkMade {
    /// The notice with the link, to a recipient.
    Notice,
    /// The receipt with the manage links, to the sender.
    Receipt,
}

impl SecureLink {
    /// The mark of a row to be secured for `reason`.
    pub fn to_secure(reason: SecureLinkReason) -> Self {
        SecureLink {
            reason: Some(reason),
            made: None,
        }
    }

    /// The mark of a mail the secure-link stage made.
    pub fn made(made: SecureLinkMade) -> Self {
        SecureLink {
            reason: None,
            made: Some(made),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// trace

/// `state.trace`: the message's trace context, seeded by the ingress: the trace every span of
/// the message joins (`trace_id`) and the ingress's own span (`span_id`), under which each
/// stage pass hangs. The rest of the state carries it into every row split off the message,
/// so they stay in its trace; a row without it (a bounce, local submission) is traced under
/// `TraceId::of_row`. Written once, never changed; nothing of it identifies a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trace {
    pub trace_id: TraceId,
    pub span_id: SpanId,
}
state_key!(Trace, "trace");

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Reads `text` as `state.<key>` and writes it back: the JSON text after the round trip.
    fn round_trip(key: &str, text: &str) -> Result<String, StateError> {
        let v: Value = serde_json::from_str(text).expect("JSON");
        let mut st = Map::new();
        st.insert(key.into(), v);
        // Through a `Value`, as a stage stores it: object keys sorted, as JSONB keeps them.
        fn again<T: Serialize>(t: Option<T>) -> String {
            to_value(&t.expect("present")).to_string()
        }
        Ok(match key {
            "auth" => again(Auth::from_state(&st)?),
            "junk" => again(Junk::from_state(&st)?),
            "bounce_error" => again(BounceError::from_state(&st)?),
            "dispatch_error" => again(DispatchError::from_state(&st)?),
            "dispatch_error_history" => again(DispatchErrorHistory::from_state(&st)?),
            "held" => again(Held::from_state(&st)?),
            "srs" => again(Srs::from_state(&st)?),
            "vacation" => again(Vacation::from_state(&st)?),
            "whitelist" => again(Whitelist::from_state(&st)?),
            "language" => again(Language::from_state(&st)?),
            "language_block" => again(LanguageBlocked::from_state(&st)?),
            "milter" => again(Milter::from_state(&st)?),
            "crypto" => again(Crypto::from_state(&st)?),
            "keydisc" => again(Keydisc::from_state(&st)?),
            "list_approval" => again(ListApproval::from_state(&st)?),
            "secure_link" => again(SecureLink::from_state(&st)?),
            "secretary" => again(Secretary::from_state(&st)?),
            "auto_pay" => again(AutoPay::from_state(&st)?),
            "trace" => again(Trace::from_state(&st)?),
            other => panic!("no type for {other}"),
        })
    }

    /// (key, the JSON text a writer stores): read as the key's type and written back, the
    /// text is the same. Object keys are in sorted order, as serde_json and JSONB keep them.
    #[test]
    fn alignment_table() {
        for (a, b, want) in [
            ("remote.test", "remote.test", true),
            ("Remote.Test.", "remote.test", true),
            ("mail.remote.test", "remote.test", true),
            ("remote.test", "news.remote.test", true),
            ("evilremote.test", "remote.test", false),
            ("a.remote.test", "b.remote.test", false),
            ("", "remote.test", false),
        ] {
            assert_eq!(domains_align(a, b), want, "{a} {b}");
        }
        let verdict = |result: &str, domain: &str| AuthVerdict {
            domain: Some(domain.into()),
            ..AuthVerdict::new(result)
        };
        let auth =
            |spf: Option<AuthVerdict>, dkim: Vec<AuthVerdict>, dmarc: Option<AuthVerdict>| Auth {
                spf,
                dkim,
                dmarc,
                arc: None,
            };
        let cases = [
            ("no verdicts", None, false),
            (
                "DKIM pass aligned",
                Some(auth(None, vec![verdict("pass", "remote.test")], None)),
                true,
            ),
            (
                "DKIM pass for another domain",
                Some(auth(None, vec![verdict("pass", "bulk.test")], None)),
                false,
            ),
            (
                "DKIM fail",
                Some(auth(None, vec![verdict("fail", "remote.test")], None)),
                false,
            ),
            (
                "SPF pass aligned",
                Some(auth(
                    Some(verdict("pass", "mail.remote.test")),
                    vec![],
                    None,
                )),
                true,
            ),
            (
                "SPF fail",
                Some(auth(Some(verdict("fail", "remote.test")), vec![], None)),
                false,
            ),
            (
                "SPF softfail",
                Some(auth(Some(verdict("softfail", "remote.test")), vec![], None)),
                false,
            ),
            (
                "DMARC pass",
                Some(auth(None, vec![], Some(verdict("pass", "remote.test")))),
                true,
            ),
        ];
        for (what, a, want) in cases {
            assert_eq!(
                a.is_some_and(|a| a.vouches_for("remote.test")),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn stored_shapes_round_trip() {
        let cases: &[(&str, &str)] = &[
            // the ingress: an unsigned message before the DKIM/DMARC checks ran …
            (
                "auth",
                r#"{"arc":{"result":"none"},"dkim":[],"dmarc":{"result":"none"},"spf":{"domain":"example.org","helo":{"domain":"mail.example.org","result":"pass"},"result":"pass"}}"#,
            ),
            // … and one with every verdict, reasons and all
            (
                "auth",
                r#"{"arc":{"reason":"no chain","result":"fail"},"dkim":[{"domain":"example.org","result":"pass","selector":"sel"},{"reason":"bad sig","result":"neutral"}],"dmarc":{"domain":"example.org","policy":"reject","reason":"not aligned","result":"fail"},"spf":{"domain":"example.org","helo":{"domain":"h","result":"temperror"},"result":"softfail"}}"#,
            ),
            ("junk", "true"),
            ("junk", "false"),
            ("bounce_error", r#""state.bounce: missing field `kind`""#),
            (
                "dispatch_error",
                r#""worker pepsi-stage-x (pid 7) of stage relay was killed by signal 6 while handling the message""#,
            ),
            (
                "dispatch_error_history",
                r#"[{"cleared_at":"2026-10-20T12:00:00.123456+00:00","cleared_by":"pepsi","error":"stage relay: refused","status":"failed"}]"#,
            ),
            (
                "held",
                r#"{"at":"2026-10-20T12:00:00.5+00:00","by":"pepsi","reason":"abuse report","status":"failed","timeout":null}"#,
            ),
            (
                "held",
                r#"{"at":"2026-10-20T12:00:00+00:00","by":"ops","reason":null,"status":"paused","timeout":"2026-10-21T00:00:00+00:00"}"#,
            ),
            ("srs", r#"{"mail_from":"alice@example.org"}"#),
            (
                "vacation",
                r#"{"replied":["alice@example.test","bob@example.test"]}"#,
            ),
            (
                "whitelist",
                r#"{"all":false,"learned":2,"sender":"bob@example.org","trusted":["alice@example.test"]}"#,
            ),
            (
                "whitelist",
                r#"{"all":true,"sender":"bob@example.org","trusted":["a@x.test"]}"#,
            ),
            ("whitelist", r#"{"learned":1}"#),
            ("whitelist", "{}"),
            (
                "language",
                r#"{"code":"de","confidence":0.87,"letters":161,"name":"German"}"#,
            ),
            ("language", r#"{"code":null,"confidence":0.0,"letters":3}"#),
            ("language_block", r#"{"action":"refuse","language":"ru"}"#),
            ("language_block", r#"{"action":"junk","language":"zh"}"#),
            (
                "milter",
                r#"{"sign":{"quarantine":"held for review"},"spam":{"attempts":2,"reason":"451 4.7.1 greylisted"}}"#,
            ),
            ("milter", r#"{"spam":{"attempts":1,"reason":null}}"#),
            ("milter", "{}"),
            (
                "crypto",
                r#"{"encrypted":{"recipients":2,"scheme":"openpgp","sign_error":null,"signed_by":"ABCD","stage":"encrypt"}}"#,
            ),
            (
                "crypto",
                r#"{"decrypted":{"detail":"signed by bob@example.org","key":"F00D","original_headers":"Subject: x\r\n","result":"decrypted","scheme":"smime","signature":"good","signer":"CN=bob","signer_addresses":["bob@example.org"],"stage":"decrypt"},"encrypted":{"recipients":1,"scheme":"smime","sign_error":"no key","signed_by":null,"stage":"enc"}}"#,
            ),
            // a row decrypted before original_headers was recorded
            (
                "crypto",
                r#"{"decrypted":{"detail":null,"key":"F00D","result":"decrypted","scheme":"openpgp","signature":"none","signer":null,"signer_addresses":[],"stage":"decrypt"}}"#,
            ),
            (
                "crypto",
                r#"{"decrypted":{"result":"no-key","scheme":"openpgp","stage":"decrypt","why":"no opted-in recipient has a private key of this scheme"}}"#,
            ),
            (
                "crypto",
                r#"{"decrypted":{"result":"failed","scheme":"smime","stage":"decrypt","why":"bad data"},"x-other":1}"#,
            ),
            (
                "keydisc",
                r#"{"since":"2026-12-04T10:00:00+00:00","stage":"encrypt","waiting":["bob@example.org"]}"#,
            ),
            // pepsi-list approve
            (
                "list_approval",
                r#"{"held_id":7,"list":"team@example.org","list_id":3,"moderator":"ops"}"#,
            ),
            // pepsi-stage-encrypt's fallback, pepsi-stage-secure-link's split and its mail
            ("secure_link", r#"{"reason":"encrypt-fallback"}"#),
            ("secure_link", r#"{"reason":"asked"}"#),
            ("secure_link", r#"{"reason":"policy"}"#),
            ("secure_link", r#"{"made":"notice"}"#),
            ("secure_link", r#"{"made":"receipt"}"#),
            // pepsi-stage-secretary: a held row, a released one, its challenge
            (
                "secretary",
                r#"{"held":"challenged","mailbox":"alice@example.org"}"#,
            ),
            (
                "secretary",
                r#"{"mailbox":"alice@example.org","released":"link"}"#,
            ),
            ("secretary", r#"{"made":"challenge"}"#),
            // pepsi-stage-auto-pay
            ("auto_pay", r#"{"paid":"KUDOS:0.5"}"#),
            ("auto_pay", r#"{"refused":"over the monthly limit"}"#),
            ("auto_pay", r#"{"made":"notice"}"#),
            // pepsi-ingress
            (
                "trace",
                r#"{"span_id":"b7ad6b7169203331","trace_id":"0af7651916cd43dd8448eb211c80319c"}"#,
            ),
        ];
        for (key, text) in cases {
            let got = round_trip(key, text).unwrap_or_else(|e| panic!("{key} {text}: {e}"));
            assert_eq!(&got, text, "{key}");
        }
    }

    /// (key, stored JSON, the start of the error).
    #[test]
    fn malformed_values_name_the_key() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "junk",
                r#""yes""#,
                "state.junk: invalid type: string \"yes\"",
            ),
            ("srs", "{}", "state.srs: missing field `mail_from`"),
            (
                "vacation",
                r#"{"replied":"a@x"}"#,
                "state.vacation.replied: invalid type: string",
            ),
            (
                "whitelist",
                r#"{"all":"no"}"#,
                "state.whitelist.all: invalid type: string",
            ),
            (
                "language",
                r#"{"code":7}"#,
                "state.language.code: invalid type: integer",
            ),
            (
                "language_block",
                r#"{"action":"drop","language":"ru"}"#,
                "state.language_block.action: unknown variant `drop`",
            ),
            (
                "milter",
                r#"{"spam":{"attempts":"2"}}"#,
                "state.milter.spam: data did not match",
            ),
            (
                "keydisc",
                r#"{"waiting":[],"stage":"e"}"#,
                "state.keydisc: missing field `since`",
            ),
            (
                "crypto",
                r#"{"decrypted":{"result":"maybe"}}"#,
                "state.crypto.decrypted.result: unknown variant `maybe`",
            ),
            ("held", r#"{"at":"x"}"#, "state.held: missing field `by`"),
            (
                "list_approval",
                r#"{"list":"team@example.org","list_id":3,"moderator":"ops"}"#,
                "state.list_approval: missing field `held_id`",
            ),
            (
                "list_approval",
                r#"{"held_id":"7","list":"t@x","list_id":3,"moderator":"ops"}"#,
                "state.list_approval.held_id: invalid type: string",
            ),
            (
                "secure_link",
                r#"{"reason":"because"}"#,
                "state.secure_link.reason: unknown variant `because`",
            ),
        ];
        for (key, text, want) in cases {
            let err = round_trip(key, text).expect_err("malformed").to_string();
            assert!(
                err.starts_with(want),
                "{key} = {text}:\n  {err}\nshould start\n  {want}"
            );
        }
    }

    #[test]
    fn readers_see_what_the_fields_say() {
        let m = Milter::from_value(&json!({"spam": {"attempts": 2, "reason": null},
                                           "sign": {"quarantine": "why"}}))
        .unwrap();
        assert_eq!(
            (m.attempts("spam"), m.attempts("sign"), m.attempts("x")),
            (2, 0, 0)
        );
        assert!(m.is_held("sign") && !m.is_held("spam"));
        let m = m.with("spam", None).with(
            "dkim",
            Some(MilterEntry::Waiting {
                attempts: 1,
                reason: None,
            }),
        );
        assert_eq!(
            m.to_value(),
            json!({"sign": {"quarantine": "why"}, "dkim": {"attempts": 1, "reason": null}})
        );

        // a decrypted entry with only its result (older rows, hand-made tests) still reads
        let c = Crypto::from_value(&json!({"decrypted": {"result": "decrypted"}})).unwrap();
        assert!(c.plaintext());
        let c = Crypto::from_value(&json!({"decrypted": {"result": "failed"}})).unwrap();
        assert!(!c.plaintext());

        let st = json!({"keydisc": {"waiting": [], "since": "x", "stage": "e"}});
        assert_eq!(
            Value::Object(Keydisc::clear(st.as_object().unwrap())),
            json!({"keydisc": null})
        );
        let st = json!({"keydisc": null});
        assert!(Keydisc::clear(st.as_object().unwrap()).is_empty());
        assert!(
            Keydisc::from_state(st.as_object().unwrap())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn an_approval_is_for_its_own_list_only() {
        let mut st = Map::new();
        ListApproval {
            list: "team@example.org".into(),
            list_id: 3,
            held_id: 7,
            moderator: "ops".into(),
        }
        .insert_into(&mut st);
        let a = ListApproval::from_state(&st).unwrap().unwrap();
        assert!(a.approves(3) && !a.approves(4));
        assert_eq!(ListApproval::from_state(&Map::new()).unwrap(), None);
    }
}
