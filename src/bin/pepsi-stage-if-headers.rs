//! `pepsi-stage-if-headers` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_stage_if_headers`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_if_headers::main()
}
