//! `pepsi-keys`: see the crate behind `pepsi_keys::run`.
fn main() -> std::process::ExitCode {
    pepsi_keys::run()
}
