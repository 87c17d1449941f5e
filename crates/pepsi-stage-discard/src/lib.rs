//! pepsi-stage-discard: drops the message.
//!
//! Reads: nothing but the row's id (`Load::Metadata`). Writes: nothing. Terminal helper:
//! `finish`, always. Useful as the end of a graph branch for mail that must vanish, and as
//! the smallest program on the stage contract.

use std::process::ExitCode;

use pepsi_common::stage::{Load, Stage, StageContext, StageError};

pub mod constants {
    use pepsi_common::config::ConfigSource;

    pub const CONFIG_SOURCE: ConfigSource = ConfigSource {
        project: "pepsi",
        component: "stage-discard",
        exec: "pepsi-stage-discard",
    };
    pub const PROGRAM: &str = "pepsi-stage-discard";
}

/// The discard stage.
pub struct Discard;

impl Stage for Discard {
    const PROGRAM: &'static str = constants::PROGRAM;
    const LOAD: Load = Load::Metadata;

    async fn process(&self, ctx: &mut StageContext<'_>) -> Result<(), StageError> {
        tracing::info!(id = ctx.id(), from = ctx.mail_from(), rcpt = ?ctx.rcpt_to(), "discarded");
        ctx.finish()
    }
}

/// Entry point of the `pepsi-stage-discard` binary.
pub fn run() -> ExitCode {
    pepsi_common::stage::main(
        &constants::CONFIG_SOURCE,
        "Pepsi stage that drops every message it is given",
        Discard,
    )
}
