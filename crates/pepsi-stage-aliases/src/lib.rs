//! pepsi-stage-aliases: replaces recipients that are aliases or fall under a catch-all by
//! the addresses they stand for.
//!
//! Reads: the envelope and `state.dsn` (`Load::Metadata`), the stage's alias file
//! (`ALIAS_FILE`, read once at start), the settings layer (`alias` rows for addresses,
//! `catchall` rows for `@domain`) and `pepsi.mailbox_account` (a catch-all does not take
//! mail for an existing mailbox). Writes: `rcpt_to` and `state.dsn.rcpt`, in lockstep.
//! Terminal helpers: `rewrite_recipients` when the recipients change, else `advance`.
//!
//! The expansion itself is pure (`expand`); this file is the I/O around it.

use std::cell::RefCell;
use std::process::ExitCode;

use pepsi_conf::address::{Address, address_key};
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::local::{self, LocalRecipients};
use pepsi_contract::settings::lookup_keys;
use pepsi_contract::stage::{Load, RoundMemo, Stage, StageContext, StageError, Terminal};
use serde_json::Map;

pub mod expand;
/// The alias file format, shared with the ingress's recipient check.
pub use pepsi_contract::alias_file as file;

use expand::{ALIAS_SETTING, Answer, CATCHALL_SETTING, Facts};
use file::AliasFile;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-aliases",
        exec: "pepsi-stage-aliases",
    };
    pub const PROGRAM: &str = "pepsi-stage-aliases";
}

/// Default `MAX_DEPTH`: how many alias hops one recipient may take.
pub const DEFAULT_MAX_DEPTH: usize = 10;

/// One `[stage-<name>]` section of this program, read at start.
#[derive(Debug, Clone)]
pub struct AliasStage {
    pub file: AliasFile,
    pub max_depth: usize,
}

impl AliasStage {
    /// Reads `ALIAS_FILE` (optional) and `MAX_DEPTH` (default 10, at least 1).
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Self> {
        let s = cfg.stage_section_named(stage);
        let file = match s.path_opt("ALIAS_FILE")? {
            Some(path) => AliasFile::load(&path)?,
            None => AliasFile::default(),
        };
        let max_depth = s.parse_opt("MAX_DEPTH", |v| match v.trim().parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => Ok(n),
            _ => Err("a whole number from 1 to 1000".to_owned()),
        })?;
        Ok(Self {
            file,
            max_depth: max_depth.unwrap_or(DEFAULT_MAX_DEPTH),
        })
    }
}

/// The aliases program: `[pepsi]`'s local domains and recipient delimiter (each stage's
/// `AliasStage` is its section).
#[derive(Debug)]
pub struct Aliases {
    pub local: LocalRecipients,
    /// What the passes since the last commit learnt: a round of messages to the same
    /// recipients looks each up once. Forgotten at every commit (`before_commit`) and after
    /// `RoundMemo::MEMORY` in any case, so an answer is never older than one batch round.
    round: RefCell<Round>,
}

/// Answers by (section, address key).
type Round = RoundMemo<(usize, String), Answer>;

impl Aliases {
    pub fn new(local: LocalRecipients) -> Self {
        Self {
            local,
            round: RefCell::default(),
        }
    }
}

impl Aliases {
    /// The facts `expand::resolve` needs about `addresses`: two queries at most, one unless an
    /// alias file names local domains.
    async fn facts(
        &self,
        pool: &sqlx::PgPool,
        stage: &AliasStage,
        addresses: &[String],
    ) -> Result<Facts, sqlx::Error> {
        let mut keys: Vec<String> = Vec::new();
        let mut mailboxes = Vec::new();
        let mut domains = Vec::new();
        for a in addresses {
            let stripped = self.local.mailbox_key(a);
            for k in lookup_keys(a).into_iter().chain(lookup_keys(&stripped)) {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
            mailboxes.push(stripped);
            if let Ok(a) = Address::parse(a) {
                domains.push(a.domain().to_owned());
            }
        }
        let (settings, mailboxes) =
            local::recipient_facts(pool, &keys, &[ALIAS_SETTING, CATCHALL_SETTING], &mailboxes)
                .await?;
        let local_domains = if stage.file.names.is_empty() {
            Default::default()
        } else {
            self.local.local_domains_among(pool, &domains).await?
        };
        Ok(Facts {
            settings,
            mailboxes,
            local_domains,
        })
    }
}

impl Stage for Aliases {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Metadata;
    type Section = AliasStage;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self::new(LocalRecipients::from_config(cfg)?))
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<AliasStage> {
        AliasStage::from_config(cfg, name)
    }

    async fn process(
        &self,
        stage: &AliasStage,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let rcpts = ctx.rcpt_to().to_vec();
        // A section (a scope's variant included) is one value for the worker's life.
        let section = stage as *const AliasStage as usize;
        self.round.borrow_mut().expire();
        let expansion = loop {
            let lookup = |a: &str| {
                self.round
                    .borrow_mut()
                    .get(&(section, address_key(a)))
                    .cloned()
            };
            match expand::expand(&rcpts, stage.max_depth, &lookup) {
                Ok(expansion) => break expansion,
                Err(need) => {
                    let facts = self
                        .facts(ctx.pool(), stage, &need)
                        .await
                        .map_err(StageError::Database)?;
                    let mut round = self.round.borrow_mut();
                    for key in need {
                        let answer = expand::resolve(&key, &stage.file, &self.local, &facts);
                        round.insert((section, key), answer);
                    }
                }
            }
        };
        for member in &expansion.loops {
            tracing::warn!(id = ctx.id(), address = %member, "alias loop: delivered as it is");
        }
        for address in &expansion.too_deep {
            tracing::warn!(
                id = ctx.id(),
                %address,
                max_depth = stage.max_depth,
                "alias expansion deeper than MAX_DEPTH: delivered as it is"
            );
        }
        if expansion.unchanged(&rcpts) {
            return ctx.advance();
        }
        let dsn = pepsi_contract::state::Dsn::from_state(ctx.state())?;
        let dsn = expand::rebuild_dsn(dsn, &rcpts, &expansion).to_value();
        let new: Vec<String> = expansion.recipients.into_iter().map(|(a, _)| a).collect();
        tracing::info!(id = ctx.id(), from = ?rcpts, to = ?new, "aliases expanded");
        let mut merge = Map::new();
        merge.insert("dsn".into(), dsn);
        ctx.rewrite_recipients(new, merge)
    }

    /// The round's answers are forgotten: the next round reads the settings afresh.
    async fn before_commit(&self) -> Result<(), StageError> {
        self.round.borrow_mut().clear();
        Ok(())
    }
}

const ABOUT: &str =
    "Pepsi stage that expands aliases and catch-alls (alias file and settings layer)";

/// The command line of `pepsi-stage-aliases`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-aliases` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<Aliases>(&constants::CONFIG_SOURCE, ABOUT, "")
}
