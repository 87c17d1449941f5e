//! pepsi-stage-vacation: answers mail for addresses whose owner set an automatic reply
//! (`vacation` in the settings layer), once per sender per period, after RFC 3834.
//!
//! Reads: the envelope, the header block (`Load::Headers`) and the `vacation` settings rows
//! of the message's recipients (one lookup per recipient per round: the answers are shared
//! by a round's passes and forgotten at its commit). Writes: `state.vacation.replied`, the
//! owners answered for. Side effects: `pepsi.autoreply_claim` (the durable once-per-sender
//! record) and `enqueue_new` of the reply, with a null envelope sender, at `REPLY_STAGE`
//! (default `init`), so it is routed, signed and relayed like any mail from here. Terminal
//! helper: `advance`; the message itself always goes on.
//!
//! The decisions (who is never answered, the reply's fields) are the module `autoreply`'s (pure;
//! the setting's shape and check are `pepsi_contract::settings::vacation`, shared with `admin`);
//! this file is the I/O around them. A worker killed between the claim and the enqueue runs
//! the pass again as the same row: the claim is granted again to the same row and the token
//! `vacation:<id>:<owner>` keeps the reply single.

use std::cell::RefCell;
use std::process::ExitCode;

use chrono::Utc;
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::settings;
use pepsi_contract::settings::vacation::{VACATION_SETTING, Vacation};
use pepsi_contract::stage::edges::Declare;
use pepsi_contract::stage::{Load, RoundMemo, Stage, StageContext, StageError, Terminal};
use serde_json::Map;

use crate::autoreply::{Incoming, Reply, Skip};

pub mod autoreply;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-vacation",
        exec: "pepsi-stage-vacation",
    };
    pub const PROGRAM: &str = "pepsi-stage-vacation";
}

/// Where replies enter the graph unless `REPLY_STAGE` says otherwise.
pub const DEFAULT_REPLY_STAGE: &str = "init";

/// One `[stage-<name>]` section, read at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `REPLY_STAGE`: the stage a reply starts at.
    pub reply_stage: String,
    /// `HOSTNAME` (else `[pepsi] HOSTNAME`, else the system's): the domain of replies'
    /// Message-IDs.
    pub hostname: String,
}

impl Options {
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Options> {
        let s = cfg.stage_section_named(stage);
        let reply_stage = cfg
            .stage_target(stage, "REPLY_STAGE", Some(DEFAULT_REPLY_STAGE))?
            .unwrap_or_default();
        Ok(Options {
            reply_stage,
            hostname: cfg.name_option(&s, "HOSTNAME")?,
        })
    }
}

/// Per lower-case recipient, its setting as the round read it (`None`: no reply set, or a
/// row that is not a valid setting).
type Round = RoundMemo<String, Option<Vacation>>;

/// The stage: the round's settings answers.
#[derive(Default)]
pub struct VacationStage {
    round: RefCell<Round>,
}

impl VacationStage {
    /// The `vacation` settings of `owners` not yet known this round, in one query.
    async fn learn(&self, ctx: &StageContext<'_>, owners: &[String]) -> Result<(), StageError> {
        settings::learn_round(
            ctx.pool(),
            &self.round,
            owners,
            VACATION_SETTING,
            false,
            Vacation::from_value,
        )
        .await
        .map_err(StageError::Database)
    }
}

/// The recipients of a message, lower-case, each once.
fn owners(rcpt_to: &[String]) -> Vec<String> {
    pepsi_contract::local::distinct_lowercase(rcpt_to)
}

impl Stage for VacationStage {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Headers;
    // Local work (a lookup, a claim, a queued reply): its passes batch.
    const BATCH: bool = true;
    type Section = Options;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self::default())
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    /// NEXT_STAGE for the message itself, and REPLY_STAGE (default `init`) where a reply
    /// enters the graph.
    fn edges(d: &mut Declare<'_>) {
        d.next();
        let reply = d
            .option("REPLY_STAGE")
            .unwrap_or_else(|| DEFAULT_REPLY_STAGE.to_owned());
        d.branch("REPLY_STAGE", reply, "reply");
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let sender = ctx.mail_from().to_owned();
        let headers = ctx.headers()?.to_vec();
        let incoming = Incoming {
            mail_from: &sender,
            headers: &headers,
        };
        // What rules out a reply whoever the owner is costs no lookup (bounces, lists, bulk).
        if let Err(skip) = autoreply::decide(&incoming, &[])
            && skip != Skip::NotAddressed
        {
            return ctx.advance();
        }
        let owners = owners(ctx.rcpt_to());
        self.learn(ctx, &owners).await?;
        let today = Utc::now().date_naive();
        let id = ctx.id();
        let mut replied = Vec::new();
        for owner in owners {
            let Some(vacation) = self.round.borrow_mut().get(&owner).cloned().flatten() else {
                continue;
            };
            if replied.len() >= autoreply::MAX_REPLIES_PER_MESSAGE {
                tracing::warn!(id, %owner, "no automatic reply: {} owners answered for this message already", replied.len());
                continue;
            }
            if !autoreply::active_on(&vacation, today) {
                continue;
            }
            if let Err(skip) =
                autoreply::decide(&incoming, &autoreply::owner_addresses(&vacation, &owner))
            {
                tracing::debug!(id, %owner, "no automatic reply: {}", skip.reason());
                continue;
            }
            let granted: Option<bool> = sqlx::query_scalar(
                "SELECT pepsi.autoreply_claim($1, $2, $3, make_interval(days => $4))",
            )
            .bind(&owner)
            .bind(&sender)
            .bind(id)
            .bind(vacation.days as i32)
            .fetch_one(ctx.pool())
            .await?;
            if granted != Some(true) {
                tracing::debug!(id, %owner, %sender, "already answered within {} days", vacation.days);
                continue;
            }
            let now = Utc::now();
            let message_id = format!(
                "{}.{id}.vacation@{}",
                now.timestamp_micros(),
                options.hostname
            );
            let raw = autoreply::compose(
                &Reply {
                    from: &owner,
                    to: &sender,
                    subject: vacation.subject.as_deref(),
                    text: &vacation.text,
                    now,
                    message_id: &message_id,
                },
                &headers,
            );
            let token = format!("vacation:{id}:{owner}");
            let reply = ctx
                .enqueue_new(
                    &options.reply_stage,
                    "",
                    std::slice::from_ref(&sender),
                    &raw,
                    Map::new(),
                    Some(&token),
                )
                .await?;
            tracing::info!(id, %owner, to = %sender, reply = ?reply, "automatic reply queued");
            replied.push(owner);
        }
        if !replied.is_empty() {
            let mut merge = Map::new();
            pepsi_contract::state::Vacation { replied }.insert_into(&mut merge);
            ctx.merge_state(merge);
        }
        ctx.advance()
    }

    /// The round's answers are forgotten: the next round reads the settings afresh.
    async fn before_commit(&self) -> Result<(), StageError> {
        self.round.borrow_mut().clear();
        Ok(())
    }
}

const ABOUT: &str = "\
Pepsi stage that answers mail automatically for addresses whose owner set a reply (vacation)

For each recipient with a `vacation` setting (pepsi-settings set ADDRESS vacation JSON) that \
is active today, the stage replies to the envelope sender unless RFC 3834 says not to: never \
to a null sender, a program's address (MAILER-DAEMON, owner-..., ...-request, noreply, ...), \
the owner, a message with Auto-Submitted other than no, Precedence bulk, junk or list, a \
List-* field or X-Auto-Response-Suppress, nor when no address of the owner is in To, Cc, \
Resent-To or Resent-Cc. A sender hears at most once per `days` of the setting (default 7), \
recorded in pepsi.autoreply_sent, so a restart or a second worker never answers twice. The \
reply carries Auto-Submitted: auto-replied, In-Reply-To and References, the owner's subject \
(or Auto: and the original's) and text, and is queued with a null envelope sender at \
REPLY_STAGE, where it is routed, signed and relayed like any mail. The message itself goes on \
to NEXT_STAGE unchanged.

Options of [stage-<name>]:
  REPLY_STAGE   init     the stage replies start at
  HOSTNAME      the domain of replies' Message-IDs (default [pepsi] HOSTNAME, else the
                system host name)
  NEXT_STAGE    as for every stage

The setting, a JSON object: {\"text\": \"...\", \"subject\": \"...\", \"start\": \"YYYY-MM-DD\", \
\"end\": \"YYYY-MM-DD\", \"days\": 7, \"addresses\": [\"other@example.org\"]}; only text is \
required. See docs/vacation.md.";

/// The command line of `pepsi-stage-vacation`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-vacation` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<VacationStage>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_table() {
        let cfg = |t: &str| Config::from_str_named(t, "v.conf").unwrap();
        let s = Options::from_config(
            &cfg("[pepsi]\nHOSTNAME = mx.example.test\n[stage-init]\nPROGRAM = x\n[stage-vacation]\n"),
            "vacation",
        )
        .unwrap();
        assert_eq!(
            s,
            Options {
                reply_stage: "init".into(),
                hostname: "mx.example.test".into()
            }
        );
        let s = Options::from_config(
            // A quoted target with spaces is the stage the graph draws (`Declare::option` trims).
            &cfg("[stage-in]\nPROGRAM = x\n[stage-vacation]\nREPLY_STAGE = \" in \"\nHOSTNAME = v.example.test\n"),
            "vacation",
        )
        .unwrap();
        assert_eq!(
            (s.reply_stage.as_str(), s.hostname.as_str()),
            ("in", "v.example.test")
        );
        let e = Options::from_config(
            &cfg("[stage-vacation]\nREPLY_STAGE = nowhere\n"),
            "vacation",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("v.conf")
                && e.contains("REPLY_STAGE = nowhere")
                && e.contains("no [stage-nowhere]"),
            "{e}"
        );
    }

    #[test]
    fn owners_are_each_recipient_once_in_lower_case() {
        assert_eq!(
            owners(&[
                "Alice@Example.test".into(),
                "bob@example.test".into(),
                "alice@example.test".into()
            ]),
            ["alice@example.test", "bob@example.test"]
        );
    }
}
