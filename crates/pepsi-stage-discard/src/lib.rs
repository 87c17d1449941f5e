//! pepsi-stage-discard: drops the message, or returns it to its sender.
//!
//! Reads: the envelope only (`Load::Metadata`). Writes: `state.bounce` when it returns mail.
//! Terminal helpers: `finish` (drop), or `reroute` to BOUNCE_STAGE when `RETURN_STATUS` is
//! set: then every recipient is reported to the sender as failed with that RFC 3463 status
//! and `RETURN_TEXT`. The default graph sends mail for remote domains here until a relay
//! stage is configured, so nothing vanishes silently. It is also the smallest program on the
//! stage contract.

use std::process::ExitCode;

use pepsi_conf::config::{Config, StageName};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_contract::state::{Bounce, BounceKind};
use serde_json::Map;

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-discard",
        exec: "pepsi-stage-discard",
    };
    pub const PROGRAM: &str = "pepsi-stage-discard";
}

/// The discard stage.
pub struct Discard;

/// `RETURN_STATUS` must be a permanent RFC 3463 code: `5.x.y`.
fn permanent_status(s: &str) -> bool {
    pepsi_smtp::encoding::enhanced_status_class(s) == Some(5)
}

/// One `[stage-<name>]` section: drop, or return to the sender with this status and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscardSection {
    pub returns: Option<(String, String)>,
}

impl Stage for Discard {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Metadata;
    type Section = DiscardSection;

    fn build(_cfg: &Config) -> anyhow::Result<Self> {
        Ok(Discard)
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<DiscardSection> {
        let section = cfg.stage_section_named(name);
        let Some(status) = section.parse_opt("RETURN_STATUS", |v| {
            if permanent_status(v.trim()) {
                Ok(v.trim().to_owned())
            } else {
                Err("a permanent enhanced status code such as 5.4.4".to_owned())
            }
        })?
        else {
            return Ok(DiscardSection { returns: None });
        };
        let text = section
            .string_opt("RETURN_TEXT")?
            .unwrap_or_else(|| "this server does not deliver to that destination".into());
        Ok(DiscardSection {
            returns: Some((status, text)),
        })
    }

    async fn process(
        &self,
        section: &DiscardSection,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        let Some((status, text)) = &section.returns else {
            tracing::info!(id = ctx.id(), from = ctx.mail_from(), rcpt = ?ctx.rcpt_to(), "discarded");
            let entry = ctx.log_entry(
                pepsi_contract::mail_log::Event::Dropped,
                ctx.rcpt_to().to_vec(),
                serde_json::json!({"reason": "discarded by the discard stage"}),
            );
            return Ok(ctx.finish()?.log([entry]));
        };
        let target = ctx
            .options()
            .bounce_stage
            .clone()
            .ok_or_else(|| StageError::NoBounceStage(ctx.options().name.to_string()))?;
        tracing::info!(id = ctx.id(), from = ctx.mail_from(), rcpt = ?ctx.rcpt_to(), %status, "returned to sender");
        let mut merge = Map::new();
        merge.insert(
            "bounce".into(),
            Bounce {
                diagnostic: Some(text.clone()),
                enhanced_status: Some(status.clone()),
                ..Bounce::new(BounceKind::Permanent).stage(&ctx.options().name)
            }
            .to_value(),
        );
        ctx.reroute(&target, merge)
    }
}

const ABOUT: &str = "Pepsi stage that drops every message it is given, or with RETURN_STATUS set returns it \
     to the sender through BOUNCE_STAGE";

/// The command line of `pepsi-stage-discard`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-discard` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<Discard>(&constants::CONFIG_SOURCE, ABOUT, "")
}

#[cfg(test)]
mod tests {
    #[test]
    fn return_status_must_be_permanent() {
        for (s, ok) in [
            ("5.4.4", true),
            ("5.7.1", true),
            ("5.1.10", true),
            ("4.4.4", false),
            ("5.4", false),
            ("5..4", false),
            ("x.1.1", false),
            ("5.1.1234", false),
        ] {
            assert_eq!(super::permanent_status(s), ok, "{s}");
        }
    }
}
