//! `pepsi-dispatch`: see the crate behind `pepsi_dispatch::run`.
fn main() -> std::process::ExitCode {
    pepsi_dispatch::run()
}
