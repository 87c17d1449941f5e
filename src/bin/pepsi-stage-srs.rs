//! `pepsi-stage-srs`: see the crate behind `pepsi_stage_srs::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_srs::run()
}
