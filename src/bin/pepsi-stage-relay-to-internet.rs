//! `pepsi-stage-relay-to-internet` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_stage_relay_to_internet`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_relay_to_internet::main()
}
