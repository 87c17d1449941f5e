//! `pepsi-stage-secretary`: see its row in `pepsi::programs`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_secretary::main()
}
