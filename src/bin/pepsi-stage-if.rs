//! `pepsi-stage-if`: see the crate behind `pepsi_stage_if::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_if::run()
}
