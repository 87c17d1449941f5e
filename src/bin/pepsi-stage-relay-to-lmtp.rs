//! `pepsi-stage-relay-to-lmtp`: see the crate behind `pepsi_stage_relay_to_lmtp::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_relay_to_lmtp::run()
}
