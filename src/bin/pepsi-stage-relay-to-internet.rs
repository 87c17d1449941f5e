//! `pepsi-stage-relay-to-internet`: see the crate behind `pepsi_stage_relay_to_internet::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_relay_to_internet::run()
}
