//! `pepsi-stage-list` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_stage_list`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_list::main()
}
