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

use super::{Load, Stage, StageContext, StageError, Terminal};
use crate::config::Config;

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
}

/// A stage built for this worker: the program-wide part and one parsed section per stage
/// (keyed by lower-case stage name) that runs it.
pub(crate) struct Built<S: Stage> {
    pub stage: S,
    pub sections: std::collections::HashMap<String, S::Section>,
}

impl<S: Stage> Built<S> {
    /// Builds `S` and parses every `[stage-*]` section whose PROGRAM is `S::PROGRAM`; the
    /// error names the section that failed.
    pub fn new(cfg: &Config) -> anyhow::Result<Self> {
        Self::from_stage(S::build(cfg)?, cfg)
    }

    /// As `new`, for a program-wide part already built.
    pub fn from_stage(stage: S, cfg: &Config) -> anyhow::Result<Self> {
        let sections = super::sections(&stage, cfg)?;
        Ok(Self { stage, sections })
    }

    fn section_of(&self, stage: &str) -> Result<&S::Section, StageError> {
        self.sections
            .get(&stage.to_ascii_lowercase())
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
        self.section_of(stage)
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
            let section = self.section_of(ctx.stage())?;
            self.stage.process(section, ctx).await
        })
    }
}

/// One program of the registry: its name, its Load, and how to build it.
pub struct Registration {
    pub program: &'static str,
    pub load: Load,
    pub(crate) build: fn(&Config) -> anyhow::Result<Box<dyn DynStage>>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("program", &self.program)
            .field("load", &self.load)
            .finish()
    }
}

fn build_boxed<S: Stage>(cfg: &Config) -> anyhow::Result<Box<dyn DynStage>> {
    Ok(Box::new(Built::<S>::new(cfg)?))
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
