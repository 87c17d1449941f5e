//! `pepsi-stage-secure-link`: see its row in `pepsi::programs`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_secure_link::main()
}
