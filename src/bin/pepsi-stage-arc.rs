//! `pepsi-stage-arc`: see the crate behind `pepsi_stage_arc::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_arc::run()
}
