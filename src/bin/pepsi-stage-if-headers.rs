//! `pepsi-stage-if-headers`: see the crate behind `pepsi_stage_if::run_headers`.
fn main() -> std::process::ExitCode {
    pepsi_stage_if::run_headers()
}
