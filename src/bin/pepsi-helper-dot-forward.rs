//! `pepsi-helper-dot-forward`: see the crate behind `pepsi_helper_dot_forward::run`.
fn main() -> std::process::ExitCode {
    pepsi_helper_dot_forward::run()
}
