//! `pepsi-stage-route`: see the crate behind `pepsi_stage_route::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_route::run()
}
