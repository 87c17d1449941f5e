//! `pepsi-stage-vacation` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_stage_vacation`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_vacation::main()
}
