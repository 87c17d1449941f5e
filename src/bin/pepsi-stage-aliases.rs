//! `pepsi-stage-aliases`: see the crate behind `pepsi_stage_aliases::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_aliases::run()
}
