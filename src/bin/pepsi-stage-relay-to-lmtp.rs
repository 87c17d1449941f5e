//! `pepsi-stage-relay-to-lmtp` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_stage_relay_to_lmtp`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_relay_to_lmtp::main()
}
