//! pepsi-stage-srs: the Sender Rewriting Scheme for forwarded mail (`MODE = forward`) and for
//! the bounces that come back to the rewritten senders (`MODE = reverse`).
//!
//! Reads: the envelope (`Load::Metadata`), the local domains (`[pepsi] LOCAL_DOMAINS` and the
//! settings layer), the stage's secrets and SRS domain (read once at start). Writes:
//! forward: `mail_from` and `state.srs`; reverse: `rcpt_to` (one for one, so `state.dsn.rcpt`
//! stays in lockstep) or `state.bounce`. Terminal helpers: `advance`, `rewrite_recipients`,
//! `reroute` to BOUNCE_STAGE; `split_off_recipients` first when a message mixes good and bad
//! SRS recipients. The hashing itself is the module `srs` (pure).

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use pepsi_conf::address::{Address, normalize_domain};
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::{Bounce, BounceDetail, BounceKind};
use serde_json::Map;

use crate::srs::{DEFAULT_MAX_AGE_DAYS, Kind, Srs, SrsError};

pub mod srs;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-srs",
        exec: "pepsi-stage-srs",
    };
    pub const PROGRAM: &str = "pepsi-stage-srs";
}

/// The section whose `SECRETS` every SRS stage falls back to, so the forward and the reverse
/// stage share one list.
pub const SHARED_SECTION: &str = "srs";

/// What a stage does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Rewrite a foreign envelope sender to an SRS address at our SRS domain.
    Forward,
    /// Rewrite recipients that are SRS addresses at our SRS domain back to the originals.
    Reverse,
}

/// One `[stage-<name>]` section of this program, read at start.
#[derive(Debug, Clone)]
pub struct SrsStage {
    pub mode: Mode,
    /// The SRS domain, normalized.
    pub domain: String,
    pub engine: Srs,
}

impl SrsStage {
    /// Reads `MODE`, `SRS_DOMAIN`, `SECRETS` and `MAX_AGE` of `[stage-<stage>]`.
    pub fn from_config(cfg: &Config, stage: &str) -> anyhow::Result<Self> {
        let name = pepsi_conf::config::stage_section_name(stage);
        let s = cfg.section(&name);
        let mode = match s.choice_opt("MODE", &["forward", "reverse"])?.as_deref() {
            Some("reverse") => Mode::Reverse,
            _ => Mode::Forward,
        };
        let domain = cfg.name_option(&s, "SRS_DOMAIN")?;
        let domain = normalize_domain(&domain)
            .with_context(|| format!("[{name}] SRS_DOMAIN: {domain:?} is not a domain name"))?;
        let secrets = match s.list_opt("SECRETS")? {
            Some(list) if !list.is_empty() => list,
            _ => cfg
                .section(SHARED_SECTION)
                .list_opt("SECRETS")?
                .unwrap_or_default(),
        };
        if secrets.is_empty() {
            bail!(
                "[{name}] SECRETS (or [{SHARED_SECTION}] SECRETS) is not set: the SRS stage needs at \
                 least one secret; put it in a secrets.d/ fragment"
            );
        }
        let max_age = s.parse_opt("MAX_AGE", |v| match v.trim().parse::<u32>() {
            Ok(n) if (1..1024).contains(&n) => Ok(n),
            _ => Err("a number of days from 1 to 1023".to_owned()),
        })?;
        let engine = Srs::new(&secrets, max_age.unwrap_or(DEFAULT_MAX_AGE_DAYS))
            .map_err(|e| anyhow::anyhow!("[{name}] {e}"))?;
        Ok(Self {
            mode,
            domain,
            engine,
        })
    }

    /// True when `address` is an SRS address (SRS0 or SRS1) at this stage's SRS domain.
    pub fn is_ours(&self, address: &str) -> bool {
        Address::parse(address)
            .is_ok_and(|a| a.domain() == self.domain && srs::kind(a.local()) != Kind::Plain)
    }
}

/// The SRS program: the local domains (each stage's `SrsStage` is its section).
#[derive(Debug, Clone)]
pub struct SrsProgram {
    pub local: LocalRecipients,
}

impl SrsProgram {
    async fn forward(
        &self,
        stage: &SrsStage,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let from = ctx.mail_from().to_owned();
        if from.is_empty() || stage.is_ours(&from) {
            return ctx.advance();
        }
        let Ok((_, domain)) = Address::parse(&from).map(Address::into_parts) else {
            tracing::warn!(
                id = ctx.id(),
                from,
                "sender is not an address; left as it is"
            );
            return ctx.advance();
        };
        if self
            .local
            .is_local_domain(ctx.pool(), &domain)
            .await
            .map_err(StageError::Database)?
        {
            return ctx.advance();
        }
        let today = srs::day_number(std::time::SystemTime::now());
        let rewritten = stage
            .engine
            .forward(&from, &stage.domain, today)
            .map_err(|e| StageError::Permanent(format!("SRS rewrite of {from:?}: {e}")))?;
        tracing::info!(id = ctx.id(), from, to = rewritten, "sender rewritten");
        ctx.set_mail_from(rewritten);
        let record = pepsi_contract::state::Srs { mail_from: from };
        ctx.set_state(pepsi_contract::state::Srs::KEY, record.to_value());
        ctx.advance()
    }

    /// For each recipient: `None` when it is not ours, else the reversal.
    fn reversals(
        stage: &SrsStage,
        rcpt: &[String],
        today: u64,
    ) -> Vec<Option<Result<String, SrsError>>> {
        rcpt.iter()
            .map(|r| stage.is_ours(r).then(|| stage.engine.reverse(r, today)))
            .collect()
    }

    async fn reverse(
        &self,
        stage: &SrsStage,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let today = srs::day_number(std::time::SystemTime::now());
        let mut results = Self::reversals(stage, ctx.rcpt_to(), today);
        let bad: Vec<usize> = (0..results.len())
            .filter(|&i| matches!(results[i], Some(Err(_))))
            .collect();
        if !bad.is_empty() && bad.len() < results.len() {
            // The bad ones go on a sibling at this same stage, where they are all bad and
            // bounce together; this row keeps the rest.
            let here = ctx.stage().to_owned();
            ctx.split_off_recipients(&bad, &here).await?;
            results = Self::reversals(stage, ctx.rcpt_to(), today);
        }
        if results.iter().all(|r| matches!(r, Some(Err(_)))) {
            return self.bounce(ctx, results);
        }
        if results.iter().all(Option::is_none) {
            return ctx.advance();
        }
        let rcpt: Vec<String> = ctx
            .rcpt_to()
            .iter()
            .zip(results)
            .map(|(r, res)| match res {
                Some(Ok(original)) => original,
                _ => r.clone(),
            })
            .collect();
        tracing::info!(id = ctx.id(), from = ?ctx.rcpt_to(), to = ?rcpt, "SRS recipients reversed");
        // One for one: `state.dsn.rcpt` keeps its order and length.
        ctx.rewrite_recipients(rcpt, Map::new())
    }

    fn bounce(
        &self,
        ctx: &mut StageContext<'_>,
        results: Vec<Option<Result<String, SrsError>>>,
    ) -> Result<Terminal, StageError> {
        let target = ctx
            .options()
            .bounce_stage
            .clone()
            .ok_or_else(|| StageError::NoBounceStage(ctx.options().name.to_string()))?;
        let mut per = BTreeMap::new();
        let mut first = String::new();
        for (r, res) in ctx.rcpt_to().iter().zip(results) {
            if let Some(Err(e)) = res {
                let why = diagnostic(&e);
                if first.is_empty() {
                    first = why.clone();
                }
                let own = BounceDetail {
                    diagnostic: Some(why),
                    ..BounceDetail::default()
                };
                per.insert(r.clone(), own);
            }
        }
        tracing::info!(id = ctx.id(), rcpt = ?ctx.rcpt_to(), why = first, "invalid SRS recipients bounced");
        let mut merge = Map::new();
        merge.insert(
            "bounce".into(),
            Bounce {
                enhanced_status: Some("5.1.1".into()),
                diagnostic: Some(first),
                recipients: per,
                ..Bounce::new(BounceKind::Permanent).stage(&ctx.options().name)
            }
            .to_value(),
        );
        ctx.reroute(&target, merge)
    }
}

/// The bounce text for an SRS address that does not reverse.
pub fn diagnostic(e: &SrsError) -> String {
    match e {
        SrsError::BadHash => "invalid SRS address: the hash does not verify (forged?)".into(),
        SrsError::Expired => "invalid SRS address: the timestamp has expired".into(),
        SrsError::Malformed(m) => format!("invalid SRS address: {m}"),
        SrsError::Config(m) => format!("SRS configuration: {m}"),
    }
}

impl Stage for SrsProgram {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Metadata;
    type Section = SrsStage;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self {
            local: LocalRecipients::from_config(cfg)?,
        })
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<SrsStage> {
        SrsStage::from_config(cfg, name)
    }

    async fn process(
        &self,
        stage: &SrsStage,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        match stage.mode {
            Mode::Forward => self.forward(stage, ctx).await,
            Mode::Reverse => self.reverse(stage, ctx).await,
        }
    }
}

const ABOUT: &str = "Pepsi stage for the Sender Rewriting Scheme: MODE=forward rewrites a forwarded \
     message's foreign envelope sender to an SRS address at SRS_DOMAIN; MODE=reverse turns \
     SRS recipients at SRS_DOMAIN (returning bounces) back into the original addresses and \
     bounces forged or expired ones. Needs SECRETS (in a secrets.d/ fragment). See \
     docs/srs.md";

/// The command line of `pepsi-stage-srs`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-srs` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<SrsProgram>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_str_named(text, "test.conf").unwrap()
    }

    /// What a worker builds at start: one `SrsStage` per section.
    fn stages(c: &Config) -> anyhow::Result<HashMap<String, SrsStage>> {
        pepsi_contract::stage::sections(&SrsProgram::build(c)?, c)
    }

    #[test]
    fn options_and_defaults() {
        let c = cfg(
            "[pepsi]\nHOSTNAME = MX.Example.net\n[srs]\nSECRETS = one two\n\
                     [stage-srs]\nPROGRAM = pepsi-stage-srs\n\
                     [stage-unsrs]\nPROGRAM = pepsi-stage-srs\nMODE = reverse\n\
                     SRS_DOMAIN = srs.example.net\nMAX_AGE = 7\nSECRETS = three\n",
        );
        let p = stages(&c).unwrap();
        let f = &p["srs"];
        assert_eq!(f.mode, Mode::Forward);
        assert_eq!(f.domain, "mx.example.net");
        let r = &p["unsrs"];
        assert_eq!(r.mode, Mode::Reverse);
        assert_eq!(r.domain, "srs.example.net");
        // The forward stage signs with [srs]'s first secret; the reverse one only knows its own.
        let a = f
            .engine
            .forward("a@b.test", "srs.example.net", 100)
            .unwrap();
        assert!(r.engine.reverse(&a, 100).is_err());
        assert!(f.is_ours(&a.replace("srs.example.net", "MX.example.NET")));
        assert!(!f.is_ours("alice@mx.example.net"));
    }

    #[test]
    fn refuses_to_start_without_secrets() {
        let c = cfg("[stage-srs]\nPROGRAM = pepsi-stage-srs\nSRS_DOMAIN = x.test\n");
        let e = format!("{:#}", stages(&c).unwrap_err());
        assert!(e.contains("SECRETS"), "{e}");
        let c = cfg("[stage-srs]\nPROGRAM = pepsi-stage-srs\nSECRETS = s\nMAX_AGE = 0\n");
        assert!(stages(&c).is_err());
        let c = cfg("[stage-srs]\nPROGRAM = pepsi-stage-srs\nSECRETS = s\nMODE = sideways\n");
        assert!(stages(&c).is_err());
    }
}
