//! Fusion (§22.5): the process-global registry of the stages folded into this executable,
//! and the object-safe form of a built stage the worker chains through.
//!
//! The unified `pepsi` binary installs the registry before it dispatches; a per-program
//! build never does, so fusion is inert there. With `[pepsi] ALLOW_FUSION` on (the
//! default), a pass that advances to a stage whose program is registered, whose Load is no
//! greater than what the pass has loaded and whose `can_fuse` agrees, runs that stage in the
//! same pass; the worker commits the whole chain once.
//!
//! Never does: I/O. Building a registered stage happens in the worker, lazily, the first
//! time a pass advances to it.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

use super::scope::{ScopedOverrides, message_scopes};
use super::{Load, Stage, StageContext, StageError, Terminal};
use pepsi_conf::config::Config;

/// A built stage, as the worker's chain sees it.
pub(crate) trait DynStage {
    fn program(&self) -> &'static str;
    fn load(&self) -> Load;
    /// `Stage::BATCH`.
    fn batches(&self) -> bool;
    /// Whether the pass in `ctx` may go on into `stage` (a section of this program) fused.
    fn can_fuse(&self, stage: &str, ctx: &StageContext<'_>) -> bool;
    fn process<'a, 'c>(
        &'a self,
        ctx: &'a mut StageContext<'c>,
    ) -> Pin<Box<dyn Future<Output = Result<Terminal, StageError>> + 'a>>
    where
        'c: 'a;
    /// `Stage::before_commit`.
    fn before_commit(&self) -> Pin<Box<dyn Future<Output = Result<(), StageError>> + '_>>;
}

/// A stage built for this worker: the program-wide part, one parsed section per stage
/// (keyed by lower-case stage name) that runs it, and the variants of those sections for
/// the domains and addresses with overrides of their own (`scope`).
pub(crate) struct Built<S: Stage> {
    pub stage: S,
    pub sections: std::collections::HashMap<String, S::Section>,
    /// (lower-case stage name, scope as stored) → the section as that scope sees it.
    pub scoped: std::collections::HashMap<(String, String), S::Section>,
}

impl<S: Stage> Built<S> {
    /// Builds `S` and parses every `[stage-*]` section whose PROGRAM is `S::PROGRAM`, for
    /// every scope of `scoped` too; the error names the section (and scope) that failed.
    pub fn new(cfg: &Config, scoped: &ScopedOverrides) -> anyhow::Result<Self> {
        Self::from_stage(S::build(cfg)?, cfg, scoped)
    }

    /// As `new`, for a program-wide part already built.
    pub fn from_stage(stage: S, cfg: &Config, scoped: &ScopedOverrides) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let sections = super::sections(&stage, cfg)?;
        let names = super::StageOptions::stages_of(cfg, S::PROGRAM);
        let mut variants = std::collections::HashMap::new();
        for scope in scoped.scopes_touching(&names) {
            let Some(scope_cfg) = scoped.config_for(&scope) else {
                continue;
            };
            for name in &names {
                let section = stage
                    .section(&scope_cfg, name)
                    .with_context(|| format!("[stage-{name}] for scope {scope}"))?;
                variants.insert((name.to_ascii_lowercase(), scope.to_db_string()), section);
            }
        }
        Ok(Self {
            stage,
            sections,
            scoped: variants,
        })
    }

    /// The section of `stage` as the message of `ctx` sees it: the variant of its scope
    /// when there is one, else the global section.
    fn section_for(&self, stage: &str, ctx: &StageContext<'_>) -> Result<&S::Section, StageError> {
        let lower = stage.to_ascii_lowercase();
        if !self.scoped.is_empty() {
            for key in message_scopes(ctx.rcpt_to()) {
                if let Some(section) = self.scoped.get(&(lower.clone(), key)) {
                    return Ok(section);
                }
            }
        }
        self.sections
            .get(&lower)
            .ok_or_else(|| StageError::NotBuilt(stage.to_owned()))
    }
}

impl<S: Stage> DynStage for Built<S> {
    fn program(&self) -> &'static str {
        S::PROGRAM
    }

    fn load(&self) -> Load {
        S::LOAD
    }

    fn batches(&self) -> bool {
        S::BATCH
    }

    fn can_fuse(&self, stage: &str, ctx: &StageContext<'_>) -> bool {
        self.section_for(stage, ctx)
            .is_ok_and(|section| self.stage.can_fuse(section, ctx))
    }

    fn process<'a, 'c>(
        &'a self,
        ctx: &'a mut StageContext<'c>,
    ) -> Pin<Box<dyn Future<Output = Result<Terminal, StageError>> + 'a>>
    where
        'c: 'a,
    {
        Box::pin(async move {
            let section = self.section_for(ctx.stage(), ctx)?;
            self.stage.process(section, ctx).await
        })
    }

    fn before_commit(&self) -> Pin<Box<dyn Future<Output = Result<(), StageError>> + '_>> {
        Box::pin(self.stage.before_commit())
    }
}

/// One program of the registry: its name, its Load, and how to build it.
pub struct Registration {
    pub program: &'static str,
    pub load: Load,
    pub(crate) build: fn(&Config, &ScopedOverrides) -> anyhow::Result<Box<dyn DynStage>>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("program", &self.program)
            .field("load", &self.load)
            .finish()
    }
}

fn build_boxed<S: Stage>(
    cfg: &Config,
    scoped: &ScopedOverrides,
) -> anyhow::Result<Box<dyn DynStage>> {
    Ok(Box::new(Built::<S>::new(cfg, scoped)?))
}

/// The registration of stage `S`.
pub fn register<S: Stage>() -> Registration {
    Registration {
        program: S::PROGRAM,
        load: S::LOAD,
        build: build_boxed::<S>,
    }
}

static REGISTRY: OnceLock<Vec<Registration>> = OnceLock::new();

/// Installs the registry: the unified binary calls this once, before it runs a program.
/// A second call is ignored (the first list stays).
pub fn install(stages: Vec<Registration>) {
    let _ = REGISTRY.set(stages);
}

/// The installed registry (empty in a per-program build).
pub fn installed() -> &'static [Registration] {
    REGISTRY.get().map(Vec::as_slice).unwrap_or(&[])
}
