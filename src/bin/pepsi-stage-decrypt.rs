//! `pepsi-stage-decrypt`: see the crate behind `pepsi_stage_decrypt::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_decrypt::run()
}
