//! pepsi-stage-if: sends the message to `THEN` when its `CONDITION` holds, else to `ELSE`
//! (default `NEXT_STAGE`).
//!
//! Two programs share this crate, because a stage's `Load` is fixed per program:
//! `pepsi-stage-if` (`Load::Metadata`: envelope and state, batched and fusible like any
//! body-free stage) and `pepsi-stage-if-headers` (`Load::Headers`), which a condition
//! reading `header:<Name>` needs; `pepsi-stage-if` refuses such a condition at start.
//!
//! Reads: the envelope, `state`, the header block (if-headers only) and, for
//! `all_rcpt_local`/`any_rcpt_local`, the local domains (`pepsi_contract::local`).
//! Writes: nothing. Terminal helper: `advance_to`, always.
//!
//! Conditions are parsed once at start (`expr`), for every stage section that names the
//! program; a syntax error stops the worker with the file, line and column.

use std::process::ExitCode;

use anyhow::bail;
use pepsi_conf::config::{Config, StageName};
use pepsi_contract::local::LocalRecipients;
use pepsi_contract::stage::edges::{Declare, NEXT_STAGE};
use pepsi_contract::stage::{Load, Stage, StageContext, StageError, Terminal};

pub mod expr;

use expr::{Expr, Facts};

pub mod constants {
    use pepsi_conf::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-if",
        exec: "pepsi-stage-if",
    };
    pub const PROGRAM: &str = "pepsi-stage-if";

    pub const HEADERS_CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-if-headers",
        exec: "pepsi-stage-if-headers",
    };
    pub const HEADERS_PROGRAM: &str = "pepsi-stage-if-headers";
}

/// One `[stage-<name>]` section: the parsed condition and its two branches.
#[derive(Debug, Clone)]
pub struct Branch {
    pub condition: Expr,
    pub then_stage: String,
    pub else_stage: String,
}

impl Branch {
    /// Reads `CONDITION`, `THEN` and `ELSE` (default `NEXT_STAGE`) of `[stage-<stage>]`;
    /// both branches must name stage sections. `headers`: whether this program loads the
    /// header block.
    pub fn from_config(cfg: &Config, stage: &str, headers: bool) -> anyhow::Result<Self> {
        let section = cfg.stage_section_named(stage);
        let condition = section.parse("CONDITION", |text| {
            expr::parse(text).map_err(|e| format!("a condition ({e})"))
        })?;
        if condition.uses_headers() && !headers {
            bail!(
                "[stage-{stage}] CONDITION reads a header field: the stage needs PROGRAM = {} \
                 ({} loads envelope and state only)",
                constants::HEADERS_PROGRAM,
                constants::PROGRAM
            );
        }
        let then_stage = section.string("THEN")?;
        let else_stage = match section.string_opt("ELSE")?.filter(|s| !s.is_empty()) {
            Some(s) => s,
            None => section
                .string_opt("NEXT_STAGE")?
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    anyhow::anyhow!("[stage-{stage}] needs ELSE or NEXT_STAGE: where the message goes when CONDITION does not hold")
                })?,
        };
        for (option, target) in [("THEN", &then_stage), ("ELSE", &else_stage)] {
            if cfg.stage(target).is_none() {
                bail!("[stage-{stage}] {option} = {target}: there is no [stage-{target}] section");
            }
        }
        Ok(Self {
            condition,
            then_stage,
            else_stage,
        })
    }
}

/// What both condition programs share: the local-domain resolver (each stage's `Branch` is
/// its section).
#[derive(Debug, Clone)]
pub struct Conditions {
    pub local: LocalRecipients,
}

impl Conditions {
    pub fn from_config(cfg: &Config) -> anyhow::Result<Self> {
        Ok(Self {
            local: LocalRecipients::from_config(cfg)?,
        })
    }

    async fn decide(
        &self,
        branch: &Branch,
        ctx: &mut StageContext<'_>,
        headers: bool,
    ) -> Result<Terminal, StageError> {
        let rcpt_local = if branch.condition.uses_locality() {
            self.local
                .recipients_local(ctx.pool(), ctx.rcpt_to())
                .await
                .map_err(StageError::Database)?
        } else {
            Vec::new()
        };
        let holds = {
            let facts = Facts {
                mail_from: ctx.mail_from(),
                rcpt_to: ctx.rcpt_to(),
                auth_user: ctx.auth_user(),
                state: Some(ctx.state()),
                headers: if headers { Some(ctx.headers()?) } else { None },
                rcpt_local,
            };
            branch.condition.eval(&facts)
        };
        let target = if holds {
            &branch.then_stage
        } else {
            &branch.else_stage
        };
        tracing::debug!(id = ctx.id(), holds, to = %target, "condition evaluated");
        ctx.advance_to(target)
    }
}

/// The edges of both programs: THEN, and ELSE (NEXT_STAGE when unset); the CONDITION is
/// shown beside the stage.
fn branch_edges(d: &mut Declare<'_>) {
    let next = d.option(NEXT_STAGE);
    match d.option("CONDITION") {
        Some(c) => d.condition(c),
        None => d.problem("has no CONDITION"),
    }
    match d.option("THEN") {
        Some(t) => d.branch("THEN", t, "then"),
        None => d.problem("has no THEN"),
    }
    match (d.option("ELSE"), next) {
        (Some(t), _) => d.branch("ELSE", t, "else"),
        (None, Some(t)) => d.branch(NEXT_STAGE, t, "else"),
        (None, None) => d.problem("needs ELSE or NEXT_STAGE"),
    }
}

/// `pepsi-stage-if`: envelope and state conditions.
#[derive(Debug, Clone)]
pub struct If(pub Conditions);

impl Stage for If {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Metadata;
    type Section = Branch;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(If(Conditions::from_config(cfg)?))
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Branch> {
        Branch::from_config(cfg, name, false)
    }

    fn edges(d: &mut Declare<'_>) {
        branch_edges(d);
    }

    async fn process(
        &self,
        branch: &Branch,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        self.0.decide(branch, ctx, false).await
    }
}

/// `pepsi-stage-if-headers`: conditions that may also read header fields.
#[derive(Debug, Clone)]
pub struct IfHeaders(pub Conditions);

impl Stage for IfHeaders {
    const PROGRAM: &'static str = constants::HEADERS_PROGRAM;
    const LOAD: Load = Load::Headers;
    // A header test is local work, as the body-free variant's: its passes batch.
    const BATCH: bool = true;
    type Section = Branch;

    fn build(cfg: &Config) -> anyhow::Result<Self> {
        Ok(IfHeaders(Conditions::from_config(cfg)?))
    }

    fn section(&self, cfg: &Config, name: &StageName) -> anyhow::Result<Branch> {
        Branch::from_config(cfg, name, true)
    }

    fn edges(d: &mut Declare<'_>) {
        branch_edges(d);
    }

    async fn process(
        &self,
        branch: &Branch,
        ctx: &mut StageContext<'_>,
    ) -> Result<Terminal, StageError> {
        self.0.decide(branch, ctx, true).await
    }
}

const ABOUT: &str =
    "Pepsi stage that sends a message to THEN or ELSE by a CONDITION on envelope and state";

const HEADERS_ABOUT: &str =
    "Pepsi stage that sends a message to THEN or ELSE by a CONDITION that may read header fields";

/// The command line of `pepsi-stage-if`: its `--help` and its manual page.
pub fn command() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// Entry point of the `pepsi-stage-if` binary.
pub fn run() -> ExitCode {
    pepsi_contract::stage::main::<If>(&constants::CONFIG_SOURCE, ABOUT, "")
}

/// The command line of `pepsi-stage-if-headers`: its `--help` and its manual page.
pub fn command_headers() -> pepsi_conf::cli::Command {
    pepsi_contract::stage::command(&constants::HEADERS_CONFIG_SOURCE, HEADERS_ABOUT, "")
}

/// Entry point of the `pepsi-stage-if-headers` binary.
pub fn run_headers() -> ExitCode {
    pepsi_contract::stage::main::<IfHeaders>(&constants::HEADERS_CONFIG_SOURCE, HEADERS_ABOUT, "")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_str_named(text, "test.conf").unwrap()
    }

    /// The sections a worker of `program` parses at start.
    fn branches(cfg: &Config, program: &str) -> anyhow::Result<HashMap<String, Branch>> {
        let local = Conditions::from_config(cfg)?;
        if program == constants::PROGRAM {
            pepsi_contract::stage::sections(&If(local), cfg)
        } else {
            pepsi_contract::stage::sections(&IfHeaders(local), cfg)
        }
    }

    #[test]
    fn sections_are_checked_at_start() {
        let base = "[stage-a]\nPROGRAM = pepsi-stage-if\n[stage-yes]\nPROGRAM = x\n[stage-no]\nPROGRAM = x\n[stage-b]\nPROGRAM = pepsi-stage-if-headers\nCONDITION = header:Subject == 'x'\nTHEN = yes\nELSE = no\n";
        let check = |extra: &str, program: &str, headers: bool, needle: &str| {
            assert_eq!(headers, program == constants::HEADERS_PROGRAM);
            let err = branches(&cfg(&format!("{base}[stage-a]\n{extra}")), program).unwrap_err();
            let text = format!("{err:#}");
            assert!(text.contains(needle), "{extra:?}: {text}");
        };
        check(
            "CONDITION = state.a ==\nTHEN = yes\nELSE = no\n",
            constants::PROGRAM,
            false,
            "test.conf:13: [stage-a] CONDITION = \"state.a ==\": expected a condition (at column 11: expected an operand, found the end)",
        );
        check(
            "CONDITION = header:X == 'y'\nTHEN = yes\nELSE = no\n",
            constants::PROGRAM,
            false,
            "PROGRAM = pepsi-stage-if-headers",
        );
        check(
            "CONDITION = state.a\nTHEN = maybe\nELSE = no\n",
            constants::PROGRAM,
            false,
            "THEN = maybe: there is no [stage-maybe] section",
        );
        check(
            "CONDITION = state.a\nTHEN = yes\n",
            constants::PROGRAM,
            false,
            "needs ELSE or NEXT_STAGE",
        );
        let ok = branches(
            &cfg(&format!(
                "{base}[stage-a]\nCONDITION = state.a\nTHEN = yes\nNEXT_STAGE = no\n"
            )),
            constants::PROGRAM,
        )
        .unwrap();
        assert_eq!(ok["a"].else_stage, "no");
        assert_eq!(ok.len(), 1, "only the sections of this program");
        let h = branches(&cfg(base), constants::HEADERS_PROGRAM).unwrap();
        assert_eq!(h["b"].then_stage, "yes");
    }
}
