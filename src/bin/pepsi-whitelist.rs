//! `pepsi-whitelist`: see the crate behind `pepsi_whitelist::run`.
fn main() -> std::process::ExitCode {
    pepsi_whitelist::run()
}
