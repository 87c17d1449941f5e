//! `pepsi-quota`: see the crate behind `pepsi_quota::run`.
fn main() -> std::process::ExitCode {
    pepsi_quota::run()
}
