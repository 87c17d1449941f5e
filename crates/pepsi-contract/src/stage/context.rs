//! `StageContext`: one loaded message, the content changes a stage records on it, and the
//! terminal helpers that make the pass's outcome. A terminal helper changes nothing: it
//! returns a [`Terminal`] value, `process` returns it, and the worker loop applies and
//! commits it (see `commit`), so a stage body never runs SQL for its transition and a pass
//! has exactly one outcome by construction.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};
use sqlx::{PgPool, Row as _};

use super::{Load, StageError, StageOptions};
use crate::mail_log::{Entry, Event};
use crate::state::{Bounce, BounceKind};
use pepsi_conf::config::{Config, Section};

// The body of one running row, sent only when it is within the caller's limit.
const FETCH_BODY: &str = "SELECT CASE WHEN octet_length(b.body) <= $2 THEN b.body END AS body \
     FROM pepsi.workqueue w JOIN pepsi.workqueue_body b USING (body_id) \
     WHERE w.workqueue_id = $1 AND w.status = 'running'";

/// The row as loaded for one stage pass.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub id: i64,
    pub stage: String,
    pub mail_from: String,
    pub rcpt_to: Vec<String>,
    pub state: Map<String, Value>,
    pub received_at: DateTime<Utc>,
    pub auth_user: Option<String>,
    pub headers: Option<Vec<u8>>,
    pub body: Option<Vec<u8>>,
}

/// Content changes recorded by the setters, folded into the commit.
#[derive(Debug, Default, Clone)]
pub(crate) struct Changes {
    pub headers: bool,
    pub body: bool,
    pub mail_from: bool,
    pub rcpt_to: bool,
    /// Top-level keys merged into state (`state || merge`), or, with `state_replaced`, the
    /// whole new state.
    pub state: Map<String, Value>,
    /// `replace_state` was called: the commit writes `state = $n`, not `state || $n`.
    pub state_replaced: bool,
    /// `reset_received_at` was called: the commit writes `received_at = now()`.
    pub received_now: bool,
}

impl Changes {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.content().is_none() && self.state.is_empty()
    }

    /// Folds `later` (the next fused hop's changes) on top of these.
    pub fn absorb(&mut self, later: Changes) {
        self.headers |= later.headers;
        self.body |= later.body;
        self.mail_from |= later.mail_from;
        self.rcpt_to |= later.rcpt_to;
        self.received_now |= later.received_now;
        if later.state_replaced {
            self.state = later.state;
            self.state_replaced = true;
        } else {
            self.state.extend(later.state);
        }
    }

    /// The content columns changed, other than state, for error messages.
    pub fn content(&self) -> Option<String> {
        let names: Vec<&str> = [
            (self.headers, "headers"),
            (self.body, "body"),
            (self.mail_from, "mail_from"),
            (self.rcpt_to, "rcpt_to"),
            (self.state_replaced, "state (replaced)"),
            (self.received_now, "received_at"),
        ]
        .into_iter()
        .filter_map(|(changed, name)| changed.then_some(name))
        .collect();
        (!names.is_empty()).then(|| names.join(", "))
    }
}

/// A side copy of the current message spawned by `pause_with` or `finish_with`: same headers
/// and body, a recipient subset, state merged on top. With a token it is created at most
/// once, however often the stage is re-run.
#[derive(Debug, Clone, PartialEq)]
pub struct CloneSpec {
    pub token: Option<String>,
    pub stage: String,
    pub state: Map<String, Value>,
    /// Indices into the recipients as the stage saw them; `None` = all.
    pub rcpt_indices: Option<Vec<usize>>,
    pub mail_from: Option<String>,
}

impl CloneSpec {
    /// A clone of all recipients at `stage`.
    pub fn new(stage: impl Into<String>) -> Self {
        Self {
            token: None,
            stage: stage.into(),
            state: Map::new(),
            rcpt_indices: None,
            mail_from: None,
        }
    }

    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn state(mut self, state: Map<String, Value>) -> Self {
        self.state = state;
        self
    }

    pub fn recipients(mut self, indices: Vec<usize>) -> Self {
        self.rcpt_indices = Some(indices);
        self
    }

    pub fn mail_from(mut self, mail_from: impl Into<String>) -> Self {
        self.mail_from = Some(mail_from.into());
        self
    }

    pub(crate) fn to_json(&self, extra_state: &Map<String, Value>) -> Value {
        let mut state = extra_state.clone();
        state.extend(self.state.clone());
        let mut v = json!({ "stage": self.stage, "state": state });
        if let Some(token) = &self.token {
            v["token"] = json!(token);
        }
        if let Some(idx) = &self.rcpt_indices {
            v["rcpt_indices"] = json!(idx);
        }
        if let Some(from) = &self.mail_from {
            v["mail_from"] = json!(from);
        }
        v
    }
}

/// The transition a terminal helper recorded.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// pending (or, handed forward, running) at `stage` (advance, advance_to, reroute,
    /// rewrite_recipients).
    Advance { stage: String },
    /// paused until now + secs.
    Pause { secs: f64 },
    /// workqueue_pause: subset, clones, pause.
    PauseWith {
        secs: f64,
        keep: Option<Vec<usize>>,
        clones: Vec<CloneSpec>,
    },
    /// failed, left for an operator.
    Fail,
    /// deleted.
    Finish,
    /// deleted, clones spawned.
    FinishWith { clones: Vec<CloneSpec> },
}

impl Outcome {
    pub fn helper(&self) -> &'static str {
        match self {
            Outcome::Advance { .. } => "advance",
            Outcome::Pause { .. } => "pause",
            Outcome::PauseWith { .. } => "pause_with",
            Outcome::Fail => "fail",
            Outcome::Finish => "finish",
            Outcome::FinishWith { .. } => "finish_with",
        }
    }
}

/// The outcome of one pass, made by a terminal helper and returned by `Stage::process`:
/// the transition plus what it writes on the way (state merged, recipients replaced).
#[must_use = "a stage's process returns its Terminal; dropping one does nothing"]
#[derive(Debug, Clone)]
pub struct Terminal {
    pub(crate) outcome: Outcome,
    pub(crate) merge: Map<String, Value>,
    pub(crate) rcpt_to: Option<Vec<String>>,
    /// Final outcomes to record in `pepsi.mail_log` with the commit.
    pub(crate) log: Vec<Entry>,
}

impl Terminal {
    fn new(outcome: Outcome) -> Self {
        Self {
            outcome,
            merge: Map::new(),
            rcpt_to: None,
            log: Vec::new(),
        }
    }

    /// This outcome with the row's recipients replaced by `rcpt_to`, which may not be
    /// empty (`helper` names the caller in the error).
    fn replacing_recipients(
        mut self,
        rcpt_to: Vec<String>,
        helper: &str,
    ) -> Result<Self, StageError> {
        if rcpt_to.is_empty() {
            return Err(StageError::Invalid(format!(
                "{helper} needs at least one recipient"
            )));
        }
        self.rcpt_to = Some(rcpt_to);
        Ok(self)
    }

    /// Records `entries` (made by `StageContext::log_entry`) in the mail log, in the same
    /// statement that commits this outcome; dropped when the stage's MAIL_LOG is off.
    pub fn log(mut self, entries: impl IntoIterator<Item = Entry>) -> Self {
        self.log.extend(entries);
        self
    }

    /// The mail log entries it carries, for tests.
    pub fn log_entries(&self) -> &[Entry] {
        &self.log
    }

    fn merging(mut self, merge: Map<String, Value>) -> Self {
        self.merge = merge;
        self
    }

    /// The helper that made it (`advance`, `pause`, `finish`, …), for logs and tests.
    pub fn helper(&self) -> &'static str {
        self.outcome.helper()
    }

    /// The stage it sets the row pending at, for an advance.
    pub fn advance_target(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Advance { stage } => Some(stage),
            _ => None,
        }
    }
}

/// One message in the hands of a stage.
pub struct StageContext<'a> {
    pub(crate) pool: &'a PgPool,
    pub(crate) cfg: &'a Config,
    pub(crate) load: Load,
    pub(crate) options: StageOptions,
    pub(crate) row: Row,
    /// This hop's changes.
    pub(crate) changes: Changes,
    /// Changes of earlier hops of a fused chain, not yet written.
    pub(crate) carried: Changes,
    /// The stage the row is at in the database (the chain's first stage, or the stage a
    /// flush last wrote).
    pub(crate) stored_stage: String,
    /// Mail log entries of the chain's terminals, written with the commit.
    pub(crate) mail_log: Vec<Entry>,
    /// The pass made rows of its own (siblings split off, a new message enqueued): the
    /// dispatcher must look for pending rows after it.
    pub(crate) created: std::cell::Cell<bool>,
    /// The stages an advance hands its row forward to (lower-cased; empty unless the
    /// dispatcher asked for it, see `HAND_FORWARD_ENV`).
    pub(crate) handable: std::rc::Rc<std::collections::HashSet<String>>,
}

impl<'a> StageContext<'a> {
    /// Whether an advance to `stage` leaves the row running there for the dispatcher to
    /// hand on, rather than pending for its next claim.
    pub(crate) fn hands_to(&self, stage: &str) -> bool {
        !self.handable.is_empty() && self.handable.contains(&stage.to_ascii_lowercase())
    }

    /// The status an advance to `stage` leaves the row in.
    pub(crate) fn advanced_status(&self, stage: &str) -> &'static str {
        if self.hands_to(stage) {
            "running"
        } else {
            "pending"
        }
    }

    // ----- reading -----

    pub fn id(&self) -> i64 {
        self.row.id
    }

    /// The stage the message is at (this pass's `[stage-<name>]`).
    pub fn stage(&self) -> &str {
        &self.row.stage
    }

    pub fn options(&self) -> &StageOptions {
        &self.options
    }

    /// This stage's configuration section.
    pub fn section(&self) -> Section<'a> {
        self.cfg.stage_section(&self.options.name)
    }

    pub fn config(&self) -> &'a Config {
        self.cfg
    }

    pub fn pool(&self) -> &'a PgPool {
        self.pool
    }

    /// Records that this pass made queue rows through a stored function of its own (the
    /// list stage's fan-out), as `enqueue_new` and the fan-out helpers record theirs: the
    /// pass is then never reported settled, so the dispatcher looks for the new rows.
    pub fn note_rows_created(&self) {
        self.created.set(true);
    }

    pub fn mail_from(&self) -> &str {
        &self.row.mail_from
    }

    pub fn rcpt_to(&self) -> &[String] {
        &self.row.rcpt_to
    }

    /// The state as it will be committed: the loaded state with this pass's merges applied.
    pub fn state(&self) -> &Map<String, Value> {
        &self.row.state
    }

    pub fn received_at(&self) -> DateTime<Utc> {
        self.row.received_at
    }

    /// The authenticated submitter, if any.
    pub fn auth_user(&self) -> Option<&str> {
        self.row.auth_user.as_deref()
    }

    /// The header block; an error unless the stage declared `Load::Headers` or more.
    pub fn headers(&self) -> Result<&[u8], StageError> {
        self.row
            .headers
            .as_deref()
            .ok_or(StageError::UnderDeclared {
                wanted: "headers",
                declared: self.load,
            })
    }

    /// The body; an error unless the stage declared `Load::Full`.
    pub fn body(&self) -> Result<&[u8], StageError> {
        self.row.body.as_deref().ok_or(StageError::UnderDeclared {
            wanted: "body",
            declared: self.load,
        })
    }

    /// headers || CRLF || body; an error unless the stage declared `Load::Full`.
    pub fn raw_message(&self) -> Result<Vec<u8>, StageError> {
        Ok(crate::message::join(self.headers()?, self.body()?))
    }

    /// The body for a stage that declared less than `Load::Full` and needs it only now and
    /// then (the bounce stage returning a message with RET=FULL): one SELECT of this row's
    /// body, transferred only when it is at most `max_len` bytes. `None` when it is larger.
    /// Once fetched, `body()` and `raw_message()` work as under `Load::Full`.
    pub async fn fetch_body(&mut self, max_len: u64) -> Result<Option<&[u8]>, StageError> {
        if self.row.body.is_none() {
            let max = i64::try_from(max_len).unwrap_or(i64::MAX);
            let rec = sqlx::query(FETCH_BODY)
                .bind(self.row.id)
                .bind(max)
                .fetch_optional(self.pool)
                .await?
                .ok_or_else(|| StageError::NotRunning {
                    id: self.row.id,
                    status: "gone or no longer running".into(),
                })?;
            match rec.try_get::<Option<Vec<u8>>, _>("body")? {
                Some(body) => self.row.body = Some(body),
                None => return Ok(None),
            }
        }
        Ok(self
            .row
            .body
            .as_deref()
            .filter(|b| b.len() as u64 <= max_len))
    }

    /// A mail log entry for `rcpt_to` at this stage, with the envelope sender as it is now
    /// (attach it to the pass's `Terminal` with `Terminal::log`).
    pub fn log_entry(&self, event: Event, rcpt_to: Vec<String>, detail: Value) -> Entry {
        Entry {
            stage: self.options.name.to_string(),
            mail_from: self.row.mail_from.clone(),
            event,
            rcpt_to,
            detail,
        }
    }

    // ----- content setters: folded into the commit -----

    /// Replaces the header block (must end with CRLF, without the empty line).
    pub fn set_headers(&mut self, headers: Vec<u8>) {
        self.row.headers = Some(headers);
        self.changes.headers = true;
    }

    /// Replaces the body. The message gets a body row of its own (copy-on-write), so rows
    /// split off the same message keep theirs.
    pub fn set_body(&mut self, body: Vec<u8>) {
        self.row.body = Some(body);
        self.changes.body = true;
    }

    pub fn set_mail_from(&mut self, mail_from: impl Into<String>) {
        self.row.mail_from = mail_from.into();
        self.changes.mail_from = true;
    }

    /// Merges top-level keys into state (a key set here replaces the stored key).
    pub fn merge_state(&mut self, merge: Map<String, Value>) {
        for (k, v) in merge {
            self.row.state.insert(k.clone(), v.clone());
            self.changes.state.insert(k, v);
        }
    }

    /// Replaces the whole state instead of merging into it: the commit writes exactly
    /// `state` (later `merge_state` calls add to it). For a stage whose output is a new
    /// message rather than this one carried on (the bounce stage: a DSN is a new null-sender
    /// message and must not inherit the original's `dsn`, `bounce` or delivery scratch).
    /// Only the terminals that commit with one UPDATE accept it (`advance`, `advance_to`,
    /// `reroute`, `rewrite_recipients`, `fail`, `finish`); the clone-spawning and fan-out
    /// helpers refuse it like a content change.
    pub fn replace_state(&mut self, state: Map<String, Value>) {
        self.row.state = state.clone();
        self.changes.state = state;
        self.changes.state_replaced = true;
    }

    /// The message counts as received now: the commit sets `received_at = now()`, so a
    /// lifetime measured from arrival (`MAX_LIFETIME`) starts again. For a stage that turns
    /// the row into a new message (a DSN must not inherit the age of the message it reports
    /// on). Refused by the same helpers as `replace_state`.
    pub fn reset_received_at(&mut self) {
        self.row.received_at = Utc::now();
        self.changes.received_now = true;
    }

    /// Sets one top-level state key.
    pub fn set_state(&mut self, key: &str, value: Value) {
        let mut m = Map::new();
        m.insert(key.to_owned(), value);
        self.merge_state(m);
    }

    // ----- terminal helpers: each makes the pass's one outcome -----

    fn refuse_content(&self, helper: &'static str) -> Result<(), StageError> {
        match self.changes.content() {
            Some(changed) => Err(StageError::ContentWouldBeLost { helper, changed }),
            None => Ok(()),
        }
    }

    /// Pending at NEXT_STAGE.
    pub fn advance(&self) -> Result<Terminal, StageError> {
        let next = self
            .options
            .next_stage
            .clone()
            .ok_or_else(|| StageError::NoNextStage(self.options.name.to_string()))?;
        Ok(Terminal::new(Outcome::Advance { stage: next }))
    }

    /// Pending at NEXT_STAGE with `state` merged.
    pub fn advance_with(&self, state: Map<String, Value>) -> Result<Terminal, StageError> {
        Ok(self.advance()?.merging(state))
    }

    /// Pending at `stage`.
    pub fn advance_to(&self, stage: &str) -> Result<Terminal, StageError> {
        Ok(Terminal::new(Outcome::Advance {
            stage: stage.to_owned(),
        }))
    }

    /// Pending at `stage` with `state` merged: how a message reaches a bounce stage.
    pub fn reroute(&self, stage: &str, state: Map<String, Value>) -> Result<Terminal, StageError> {
        Ok(Terminal::new(Outcome::Advance {
            stage: stage.to_owned(),
        })
        .merging(state))
    }

    /// Paused, due again after `after`, with `state` merged. Refuses content changes.
    pub fn pause(
        &self,
        state: Map<String, Value>,
        after: Duration,
    ) -> Result<Terminal, StageError> {
        self.refuse_content("pause")?;
        Ok(Terminal::new(Outcome::Pause {
            secs: after.as_secs_f64(),
        })
        .merging(state))
    }

    /// The richer pause: keeps only the recipients `keep` (None: all) and spawns `clones`
    /// (a delay DSN, success DSNs), committing together. Refuses content changes.
    pub fn pause_with(
        &self,
        state: Map<String, Value>,
        after: Duration,
        keep: Option<Vec<usize>>,
        clones: Vec<CloneSpec>,
    ) -> Result<Terminal, StageError> {
        self.refuse_content("pause_with")?;
        if let Some(keep) = &keep {
            self.check_indices(keep)?;
            if keep.is_empty() {
                return Err(StageError::Invalid(
                    "pause_with must keep at least one recipient".into(),
                ));
            }
        }
        for clone in &clones {
            self.check_indices(clone.rcpt_indices.as_deref().unwrap_or(&[]))?;
        }
        Ok(Terminal::new(Outcome::PauseWith {
            secs: after.as_secs_f64(),
            keep,
            clones,
        })
        .merging(state))
    }

    /// Held for an operator, as `pepsi-queue hold` holds a row: paused until
    /// `pepsi.workqueue_hold_until()` with `state.held` set (`by` this stage's program,
    /// `reason`), so neither the dispatcher nor the failure bouncer takes it up again; only
    /// `pepsi-queue release` (or delete, or bounce) does. Keeps the pass's content changes:
    /// what is held is the message as the stage left it.
    pub fn hold(
        &self,
        reason: &str,
        mut state: Map<String, Value>,
    ) -> Result<Terminal, StageError> {
        let until = chrono::NaiveDate::from_ymd_opt(9999, 12, 31)
            .and_then(|d| d.and_hms_opt(0, 0, 0))
            .map(|d| d.and_utc())
            .expect("a valid date");
        let secs = (until - Utc::now()).num_seconds().max(0) as f64;
        crate::state::Held {
            at: Utc::now().to_rfc3339(),
            by: self.options.program.to_string(),
            reason: Some(reason.to_owned()),
            status: "running".into(),
            timeout: None,
        }
        .insert_into(&mut state);
        Ok(Terminal::new(Outcome::Pause { secs }).merging(state))
    }

    /// Failed, left for an operator, with `state` merged.
    pub fn fail(&self, state: Map<String, Value>) -> Result<Terminal, StageError> {
        Ok(Terminal::new(Outcome::Fail).merging(state))
    }

    /// As `hold`, with the recipients replaced by `rcpt_to` and `state` merged (which should
    /// carry the rebuilt `dsn.rcpt`): a filter's quarantine of a message whose recipients
    /// it changed.
    pub fn hold_with_recipients(
        &self,
        reason: &str,
        rcpt_to: Vec<String>,
        state: Map<String, Value>,
    ) -> Result<Terminal, StageError> {
        self.hold(reason, state)?
            .replacing_recipients(rcpt_to, "hold_with_recipients")
    }

    /// Deletes the row: delivered or dropped.
    pub fn finish(&self) -> Result<Terminal, StageError> {
        Ok(Terminal::new(Outcome::Finish))
    }

    /// Deletes the row and spawns `clones` (per-recipient bounces, success DSNs) in one
    /// transaction. Refuses content changes, which the clones would not see; state merged
    /// in this pass is merged into every clone.
    pub fn finish_with(&self, clones: Vec<CloneSpec>) -> Result<Terminal, StageError> {
        self.refuse_content("finish_with")?;
        for clone in &clones {
            self.check_indices(clone.rcpt_indices.as_deref().unwrap_or(&[]))?;
        }
        Ok(Terminal::new(Outcome::FinishWith { clones }))
    }

    /// The delivery stages' end: NEXT_STAGE when there is one, else finish.
    pub fn advance_or_finish(&self) -> Result<Terminal, StageError> {
        Ok(Terminal::new(match self.options.next_stage.clone() {
            Some(next) => Outcome::Advance { stage: next },
            None => Outcome::Finish,
        }))
    }

    /// The success-DSN gate after a delivery of the recipients `delivered`: when
    /// ORIGINATE_SUCCESS_DSN is on and some of them asked for NOTIFY=SUCCESS, the message is
    /// rerouted to BOUNCE_STAGE for those recipients with `bounce.kind = "success"`;
    /// otherwise `advance_or_finish`.
    pub fn complete_success(&self, delivered: &[usize]) -> Result<Terminal, StageError> {
        self.check_indices(delivered)?;
        let wanted: Vec<usize> = if self.options.originate_success_dsn {
            delivered
                .iter()
                .copied()
                .filter(|&i| notify_includes(&self.row.state, i, "SUCCESS"))
                .collect()
        } else {
            Vec::new()
        };
        if wanted.is_empty() {
            return self.advance_or_finish();
        }
        let bounce = self
            .options
            .bounce_stage
            .clone()
            .ok_or_else(|| StageError::NoBounceStage(self.options.name.to_string()))?;
        let rcpt: Vec<String> = wanted
            .iter()
            .map(|&i| self.row.rcpt_to[i].clone())
            .collect();
        let mut merge = Map::new();
        if let Some(dsn) = subset_dsn(&self.row.state, &wanted) {
            merge.insert("dsn".into(), dsn);
        }
        Bounce::new(BounceKind::Success)
            .stage(self.options.name.as_str())
            .insert_into(&mut merge);
        let mut t = Terminal::new(Outcome::Advance { stage: bounce }).merging(merge);
        t.rcpt_to = Some(rcpt);
        Ok(t)
    }

    /// Replaces the recipients and merges `state` (which should carry the rebuilt
    /// `dsn.rcpt`, one entry per new recipient), then advances: one commit.
    pub fn rewrite_recipients(
        &self,
        rcpt_to: Vec<String>,
        state: Map<String, Value>,
    ) -> Result<Terminal, StageError> {
        self.advance()?
            .merging(state)
            .replacing_recipients(rcpt_to, "rewrite_recipients")
    }

    /// Replaces the recipients, merges `state` (with the rebuilt `dsn.rcpt`) and moves the
    /// message to `stage`, pending there: one commit. A forward's end, where the new
    /// recipients start again at an earlier stage of the graph.
    pub fn reroute_recipients(
        &self,
        stage: &str,
        rcpt_to: Vec<String>,
        state: Map<String, Value>,
    ) -> Result<Terminal, StageError> {
        self.reroute(stage, state)?
            .replacing_recipients(rcpt_to, "reroute_recipients")
    }

    // ----- the scaffolding's side: applying an outcome, entering a fused hop -----

    /// Folds what `terminal` writes into this pass's changes; returns the transition.
    pub(crate) fn apply(&mut self, terminal: Terminal) -> Outcome {
        if self.options.mail_log {
            self.mail_log.extend(terminal.log);
        }
        if !terminal.merge.is_empty() {
            self.merge_state(terminal.merge);
        }
        if let Some(rcpt) = terminal.rcpt_to {
            self.row.rcpt_to = rcpt;
            self.changes.rcpt_to = true;
        }
        terminal.outcome
    }

    /// Moves the message on to `options`' stage inside this pass (a fused hop): the changes
    /// so far are carried, to be written with the chain's one commit.
    pub(crate) fn enter(&mut self, options: StageOptions) {
        let hop = std::mem::take(&mut self.changes);
        self.carried.absorb(hop);
        self.row.stage = options.name.to_string();
        self.options = options;
    }

    /// All changes of the chain so far, carried and this hop's.
    pub(crate) fn all_changes(&self) -> Changes {
        let mut all = self.carried.clone();
        all.absorb(self.changes.clone());
        all
    }

    /// Earlier hops' writes are pending, or the row moved stage in memory: a statement that
    /// works on the stored row (a fan-out, a clone-spawning terminal) must flush first.
    pub(crate) fn needs_flush(&self) -> bool {
        !self.carried.is_empty() || !self.row.stage.eq_ignore_ascii_case(&self.stored_stage)
    }

    pub(crate) fn check_indices(&self, indices: &[usize]) -> Result<(), StageError> {
        let count = self.row.rcpt_to.len();
        match indices.iter().find(|&&i| i >= count) {
            Some(&index) => Err(StageError::BadRecipientIndex { index, count }),
            None => Ok(()),
        }
    }
}

/// True when recipient `i`'s `state.dsn.rcpt[i].notify` lists `what`. A `dsn` that does not
/// parse counts as no NOTIFY (the bounce stage reports it); the gates using this only decide
/// whether a success notice is due.
pub fn notify_includes(state: &Map<String, Value>, i: usize, what: &str) -> bool {
    crate::state::Dsn::from_state(state)
        .ok()
        .flatten()
        .and_then(|d| d.rcpt(i).map(|r| r.notify_includes(what)))
        .unwrap_or(false)
}

/// `state.dsn` with `rcpt` reduced to `indices` (None when the state has no dsn, or one that
/// does not parse: that is left as it is, for the bounce stage to report).
pub(crate) fn subset_dsn(state: &Map<String, Value>, indices: &[usize]) -> Option<Value> {
    let dsn = crate::state::Dsn::from_state(state).ok()??;
    Some(dsn.subset(indices).to_value())
}
