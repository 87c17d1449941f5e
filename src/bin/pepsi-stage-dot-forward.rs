//! `pepsi-stage-dot-forward`: see the crate behind `pepsi_stage_dot_forward::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_dot_forward::run()
}
