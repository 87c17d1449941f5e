//! `pepsi-stage-relay-to-smarthost`: see the crate behind `pepsi_stage_relay_to_smarthost::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_relay_to_smarthost::run()
}
