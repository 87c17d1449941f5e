//! `pepsi-stage-check-whitelist` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_stage_check_whitelist`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_check_whitelist::main()
}
