//! `pepsi-stage-dkim-sign` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_stage_dkim_sign`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_dkim_sign::main()
}
