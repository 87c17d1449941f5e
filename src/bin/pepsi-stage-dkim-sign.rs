//! `pepsi-stage-dkim-sign`: see the crate behind `pepsi_stage_dkim_sign::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_dkim_sign::run()
}
