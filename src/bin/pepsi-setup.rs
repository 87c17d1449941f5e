//! `pepsi-setup`: see the crate behind `pepsi_setup::run`.
fn main() -> std::process::ExitCode {
    pepsi_setup::run()
}
