//! `pepsi-stage-discard`: see the crate behind `pepsi_stage_discard::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_discard::run()
}
