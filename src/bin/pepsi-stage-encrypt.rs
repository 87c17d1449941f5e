//! `pepsi-stage-encrypt`: see the crate behind `pepsi_stage_encrypt::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_encrypt::run()
}
