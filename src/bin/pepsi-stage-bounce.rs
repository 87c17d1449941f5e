//! `pepsi-stage-bounce`: see the crate behind `pepsi_stage_bounce::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_bounce::run()
}
