//! The fan-out helpers: they reduce this row's recipients and create sibling rows sharing
//! its headers and body in one `workqueue_split` call, committed at once. The stage still
//! ends the pass with a terminal helper. Because siblings are cloned server-side from the
//! stored row, a pass that already recorded changes is refused rather than losing them; in a
//! fused chain the earlier hops' changes are first written (`StageContext::flush`), so the
//! siblings see them.
//!
//! Also `enqueue_new`, which injects a brand-new message outside the transition.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::StageContext;
use super::StageError;
use super::context::subset_dsn;
use crate::db::with_retry;

const SPLIT: &str = "SELECT pepsi.workqueue_split($1, $2, $3)";
const INJECT: &str = "SELECT pepsi.workqueue_inject($1, $2, $3, $4, $5, $6, $7)";

/// Where a fan-out group's recipients come from.
#[derive(Debug, Clone, PartialEq)]
pub enum FanRecipients {
    /// Recipients of this row, by index.
    Indices(Vec<usize>),
    /// Brand-new addresses (a rewrite, a forward), with their `dsn.rcpt` entries if known.
    New {
        rcpt_to: Vec<String>,
        dsn_rcpt: Option<Vec<Value>>,
    },
}

/// The status a fan-out group is created with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GroupStatus {
    /// Pending at its stage; a new delivery, so its age counts from now.
    Pending,
    /// Paused at its stage, due after the given time; keeps the message's `received_at`.
    Retry { after: Duration },
    /// Failed, for an operator; keeps the message's `received_at`.
    Failed,
}

/// One sibling row of a fan-out.
#[derive(Debug, Clone, PartialEq)]
pub struct FanGroup {
    pub recipients: FanRecipients,
    pub stage: String,
    pub status: GroupStatus,
    /// Merged onto the row's state for this sibling.
    pub state: Map<String, Value>,
    pub mail_from: Option<String>,
}

impl FanGroup {
    pub fn new(recipients: FanRecipients, stage: impl Into<String>) -> Self {
        Self {
            recipients,
            stage: stage.into(),
            status: GroupStatus::Pending,
            state: Map::new(),
            mail_from: None,
        }
    }

    fn to_json(&self, keep_received_at_when_pending: bool) -> Value {
        let mut g = json!({ "stage": self.stage, "state": self.state });
        match &self.recipients {
            FanRecipients::Indices(idx) => g["rcpt_indices"] = json!(idx),
            FanRecipients::New { rcpt_to, dsn_rcpt } => {
                g["rcpt_to"] = json!(rcpt_to);
                if let Some(d) = dsn_rcpt {
                    g["dsn_rcpt"] = json!(d);
                }
            }
        }
        let (status, keep) = match self.status {
            GroupStatus::Pending => ("pending", keep_received_at_when_pending),
            GroupStatus::Retry { after } => {
                g["retry_secs"] = json!(after.as_secs_f64());
                ("paused", true)
            }
            GroupStatus::Failed => ("failed", true),
        };
        g["status"] = json!(status);
        g["keep_received_at"] = json!(keep);
        if let Some(from) = &self.mail_from {
            g["mail_from"] = json!(from);
        }
        g
    }
}

impl StageContext<'_> {
    /// Moves the recipients `indices` onto one sibling row pending at `stage`; this row keeps
    /// the others (at least one). Returns the sibling's id.
    pub async fn split_off_recipients(
        &mut self,
        indices: &[usize],
        stage: &str,
    ) -> Result<i64, StageError> {
        let keep = self.complement(indices)?;
        let group = FanGroup::new(FanRecipients::Indices(indices.to_vec()), stage);
        let ids = self
            .split(&keep, &[group], true, "split_off_recipients")
            .await?;
        Ok(ids[0])
    }

    /// Moves each recipient of `indices` onto a row of its own, pending at this stage and
    /// keeping the message's `received_at`; this row keeps the others (at least one).
    /// Returns the new rows' ids in the order of `indices`.
    pub async fn split_off_each(&mut self, indices: &[usize]) -> Result<Vec<i64>, StageError> {
        let keep = self.complement(indices)?;
        let stage = self.row.stage.clone();
        let groups: Vec<FanGroup> = indices
            .iter()
            .map(|&i| FanGroup::new(FanRecipients::Indices(vec![i]), stage.clone()))
            .collect();
        self.split(&keep, &groups, true, "split_off_each").await
    }

    /// Moves recipients 1.. each onto a row of its own at this stage; this row keeps
    /// recipient 0. Returns the new rows' ids in recipient order.
    pub async fn split_to_one_per_row(&mut self) -> Result<Vec<i64>, StageError> {
        let stage = self.row.stage.clone();
        let groups: Vec<FanGroup> = (1..self.row.rcpt_to.len())
            .map(|i| FanGroup::new(FanRecipients::Indices(vec![i]), stage.clone()))
            .collect();
        if groups.is_empty() {
            self.refuse_changes("split_to_one_per_row")?;
            return Ok(Vec::new());
        }
        self.split(&[0], &groups, true, "split_to_one_per_row")
            .await
    }

    /// The general fan-out: this row keeps the recipients `keep` (at least one), and each
    /// group becomes a sibling row. Pending groups are new deliveries whose age counts from
    /// now; Retry and Failed groups keep the message's `received_at`.
    pub async fn fan_out(
        &mut self,
        keep: &[usize],
        groups: &[FanGroup],
    ) -> Result<Vec<i64>, StageError> {
        self.check_groups(groups)?;
        self.split(keep, groups, false, "fan_out").await
    }

    /// As `fan_out`, for copies of the same message sent different ways (a language block's
    /// junk and refused copies): every group keeps the message's `received_at`, so a DSN's
    /// Arrival-Date and MAX_LIFETIME still count from its arrival.
    pub async fn fan_out_keeping_age(
        &mut self,
        keep: &[usize],
        groups: &[FanGroup],
    ) -> Result<Vec<i64>, StageError> {
        self.check_groups(groups)?;
        self.split(keep, groups, true, "fan_out_keeping_age").await
    }

    /// The groups that move recipients of this row name only recipients it has.
    fn check_groups(&self, groups: &[FanGroup]) -> Result<(), StageError> {
        for g in groups {
            if let FanRecipients::Indices(idx) = &g.recipients {
                self.check_indices(idx)?;
            }
        }
        Ok(())
    }

    fn complement(&self, moved: &[usize]) -> Result<Vec<usize>, StageError> {
        self.check_indices(moved)?;
        Ok((0..self.row.rcpt_to.len())
            .filter(|i| !moved.contains(i))
            .collect())
    }

    fn refuse_changes(&self, helper: &'static str) -> Result<(), StageError> {
        let mut changed = self.changes.content();
        if !self.changes.state.is_empty() {
            changed = Some(changed.map_or("state".to_owned(), |c| format!("{c}, state")));
        }
        match changed {
            Some(changed) => Err(StageError::ContentWouldBeLost { helper, changed }),
            None => Ok(()),
        }
    }

    async fn split(
        &mut self,
        keep: &[usize],
        groups: &[FanGroup],
        keep_received_at: bool,
        helper: &'static str,
    ) -> Result<Vec<i64>, StageError> {
        self.refuse_changes(helper)?;
        self.check_indices(keep)?;
        // Siblings are cloned from the stored row: earlier fused hops' writes go first.
        self.flush().await?;
        if keep.is_empty() {
            return Err(StageError::Invalid(format!(
                "{helper} must leave at least one recipient on row {}",
                self.row.id
            )));
        }
        let keep_sql: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
        let groups_json =
            Value::Array(groups.iter().map(|g| g.to_json(keep_received_at)).collect());
        let id = self.row.id;
        let pool = self.pool;
        let ids: Vec<i64> = with_retry(|| {
            sqlx::query_scalar(SPLIT)
                .bind(id)
                .bind(&keep_sql)
                .bind(&groups_json)
                .fetch_one(pool)
        })
        .await?;
        self.created.set(true);
        // Mirror what workqueue_split did to the stored row.
        self.row.rcpt_to = keep.iter().map(|&i| self.row.rcpt_to[i].clone()).collect();
        if let Some(dsn) = subset_dsn(&self.row.state, keep) {
            self.row.state.insert("dsn".into(), dsn);
        }
        Ok(ids)
    }

    /// Injects a brand-new message (an auto-reply, a notice) pending at `stage`. With a
    /// `token` it is created at most once; a repeated token returns `None`.
    pub async fn enqueue_new(
        &self,
        stage: &str,
        mail_from: &str,
        rcpt_to: &[String],
        raw_message: &[u8],
        state: Map<String, Value>,
        token: Option<&str>,
    ) -> Result<Option<i64>, StageError> {
        if rcpt_to.is_empty() {
            return Err(StageError::Invalid(
                "enqueue_new needs at least one recipient".into(),
            ));
        }
        let (headers, body) = crate::message::split(raw_message);
        let state = Value::Object(state);
        let pool = self.pool;
        let id: Option<i64> = with_retry(|| {
            sqlx::query_scalar(INJECT)
                .bind(stage)
                .bind(mail_from)
                .bind(rcpt_to)
                .bind(headers)
                .bind(body)
                .bind(&state)
                .bind(token)
                .fetch_one(pool)
        })
        .await?;
        if id.is_some() {
            self.created.set(true);
        }
        Ok(id)
    }
}
