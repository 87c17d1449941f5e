//! pepsi-stage-block-language: mail in a language a recipient blocks (the `block_languages`
//! setting of the address, or of its domain) is returned to its sender with a DSN (5.7.1) or
//! goes to the recipient's Junk folder, as the setting's `action` says; a sender the
//! recipient's whitelist trusts is never blocked.
//!
//! Reads: `state.language.code` (`pepsi-stage-detect-language`), `state.whitelist.trusted`
//! (`pepsi-stage-check-whitelist`, with `TRUST_WHITELIST`), the recipients' `block_languages`
//! settings (one query per round for the mailboxes it has not seen), `Load::Metadata`. Writes:
//! on a copy it blocks, `state.language_block` (`{"action", "language"}`). Terminal helpers:
//! `advance` when nothing is blocked; otherwise a fan-out (`fan_out_keeping_age`): the passing
//! recipients go on to NEXT_STAGE, the junk ones to JUNK_STAGE, the refused ones to
//! BOUNCE_STAGE, each group a row of its own.
//!
//! The decisions are [`plan`]'s, pure; this file is the I/O around them.

pub mod plan;

use std::cell::RefCell;
use std::process::ExitCode;

use pepsi_conf::config::{Config, StageName};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::settings;
use pepsi_contract::settings::block_languages::{BLOCK_SETTING, BlockAction, LanguageBlock};
use pepsi_contract::stage::edges::Declare;
use pepsi_contract::stage::{
    FanGroup, FanRecipients, Load, RoundMemo, Stage, StageContext, StageError, Terminal,
};
use pepsi_contract::state::{Bounce, BounceKind, Language, LanguageBlocked, Whitelist};
use serde_json::{Map, Value};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-block-language",
        exec: "pepsi-stage-block-language",
    };
    pub const PROGRAM: &str = "pepsi-stage-block-language";
}

/// One `[stage-<name>]` section, read at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `JUNK_STAGE`: where a copy for the Junk folder goes (a Maildir delivery into
    /// `.Junk`); without one, such copies go on as they are.
    pub junk_stage: Option<String>,
    /// `TRUST_WHITELIST` (default yes): a recipient whose whitelist trusts the sender is
    /// never blocked.
    pub trust_whitelist: bool,
}

impl Options {
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Options> {
        let s = cfg.stage_section_named(stage);
        Ok(Options {
            junk_stage: s.string_opt("JUNK_STAGE")?.filter(|j| !j.trim().is_empty()),
            trust_whitelist: s.bool_opt("TRUST_WHITELIST")?.unwrap_or(true),
        })
    }
}

/// The stage: the extension delimiters that make a recipient's mailbox, and the settings
/// the round has read (per mailbox; `None`: no block, or a row that is not a valid setting).
#[derive(Debug)]
pub struct BlockLanguage {
    local: LocalRecipients,
    round: RefCell<RoundMemo<String, Option<LanguageBlock>>>,
}

impl BlockLanguage {
    /// Reads the settings of the mailboxes the round has not seen, in one query.
    async fn learn(&self, ctx: &StageContext<'_>, mailboxes: &[String]) -> Result<(), StageError> {
        settings::learn_round(
            ctx.pool(),
            &self.round,
            mailboxes,
            BLOCK_SETTING,
            true,
            LanguageBlock::from_value,
        )
        .await
        .map_err(StageError::Database)
    }
}

/// The detected language of the message, from `state.language.code`. Another stage's key:
/// one that does not parse is no detection, as an absent one is.
fn language_of(state: &Map<String, Value>) -> Option<String> {
    Language::from_state(state).ok().flatten()?.code
}

/// The mailboxes `state.whitelist.trusted` lists (none when the key does not parse).
fn trusted_of(state: &Map<String, Value>) -> Vec<String> {
    Whitelist::from_state(state)
        .ok()
        .flatten()
        .and_then(|w| w.trusted)
        .unwrap_or_default()
}

impl Stage for BlockLanguage {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Metadata;
    type Section = Options;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self {
            local: LocalRecipients::from_config(cfg)?,
            round: RefCell::default(),
        })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Options> {
        Options::from_config(cfg, name)
    }

    /// NEXT_STAGE, and JUNK_STAGE for a message in a blocked language.
    fn edges(d: &mut Declare<'_>) {
        d.next();
        if let Some(t) = d.option("JUNK_STAGE") {
            d.branch("JUNK_STAGE", t, "junk");
        }
    }

    async fn process(
        &self,
        options: &Options,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let Some(code) = language_of(ctx.state()) else {
            return ctx.advance();
        };
        let mailboxes: Vec<String> = ctx
            .rcpt_to()
            .iter()
            .map(|r| self.local.mailbox_key(r))
            .collect();
        self.learn(ctx, &mailboxes).await?;
        let trusted = if options.trust_whitelist {
            trusted_of(ctx.state())
        } else {
            Vec::new()
        };
        let blocks: Vec<Option<LanguageBlock>> = {
            let mut round = self.round.borrow_mut();
            mailboxes
                .iter()
                .map(|m| round.get(m.as_str()).cloned().flatten())
                .collect()
        };
        let lookup = |m: &str| {
            mailboxes
                .iter()
                .position(|k| k == m)
                .and_then(|i| blocks[i].clone())
        };
        let verdicts = plan::decide(Some(&code), &mailboxes, &trusted, &lookup);
        let groups = plan::group(&verdicts, options.junk_stage.is_some());
        if groups.junk.is_empty() && groups.refuse.is_empty() {
            return ctx.advance();
        }
        let id = ctx.id();
        tracing::info!(
            id,
            language = %code,
            refused = ?groups.refuse.iter().map(|&i| &ctx.rcpt_to()[i]).collect::<Vec<_>>(),
            junk = ?groups.junk.iter().map(|&i| &ctx.rcpt_to()[i]).collect::<Vec<_>>(),
            "language blocked"
        );
        let name = ctx.options().name.clone();
        let record = |action: BlockAction| {
            let mut state = Map::new();
            LanguageBlocked {
                action,
                language: code.clone(),
            }
            .insert_into(&mut state);
            state
        };
        let mut refuse_state = record(BlockAction::Refuse);
        Bounce {
            diagnostic: Some(format!(
                "the recipient does not accept mail in this language ({code})"
            )),
            enhanced_status: Some("5.7.1".into()),
            ..Bounce::new(BounceKind::Permanent).stage(&name)
        }
        .insert_into(&mut refuse_state);
        let bounce_stage = || {
            ctx.options()
                .bounce_stage
                .clone()
                .ok_or_else(|| StageError::NoBounceStage(name.to_string()))
        };
        let next_stage = || {
            ctx.options()
                .next_stage
                .clone()
                .ok_or_else(|| StageError::NoNextStage(name.to_string()))
        };
        // Every group but the first becomes a sibling row; the row itself keeps the first.
        let mut parts: Vec<(Vec<usize>, String, Map<String, Value>)> = Vec::new();
        if !groups.pass.is_empty() {
            parts.push((groups.pass.clone(), next_stage()?, Map::new()));
        }
        if let Some(junk) = &options.junk_stage
            && !groups.junk.is_empty()
        {
            parts.push((groups.junk.clone(), junk.clone(), record(BlockAction::Junk)));
        }
        if !groups.refuse.is_empty() {
            parts.push((groups.refuse.clone(), bounce_stage()?, refuse_state));
        }
        let (keep, keep_stage, keep_state) = parts.remove(0);
        if !parts.is_empty() {
            let siblings: Vec<FanGroup> = parts
                .into_iter()
                .map(|(indices, stage, state)| FanGroup {
                    state,
                    ..FanGroup::new(FanRecipients::Indices(indices), stage)
                })
                .collect();
            ctx.fan_out_keeping_age(&keep, &siblings).await?;
        }
        ctx.reroute(&keep_stage, keep_state)
    }

    /// The round's settings are forgotten: the next round reads them afresh.
    async fn before_commit(&self) -> Result<(), StageError> {
        self.round.borrow_mut().clear();
        Ok(())
    }
}

const ABOUT: &str = "Return to its sender (5.7.1), or send to the Junk folder, mail in a \
language the recipient blocks (the block_languages setting; state.language from \
pepsi-stage-detect-language); a sender the recipient's whitelist trusts passes. Options of \
[stage-NAME]: NEXT_STAGE, BOUNCE_STAGE, JUNK_STAGE, TRUST_WHITELIST (yes). See \
docs/language.md.";

/// The command line of `pepsi-stage-block-language`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-block-language` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<BlockLanguage>(&constants::CONFIG_SOURCE, ABOUT, "")
}
