//! `pepsi-stage-count`: see the crate behind `pepsi_stage_count::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_count::run()
}
