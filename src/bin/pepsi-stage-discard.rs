//! `pepsi-stage-discard` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_stage_discard`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_discard::main()
}
