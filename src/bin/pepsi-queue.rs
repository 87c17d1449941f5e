//! `pepsi-queue`: see the crate behind `pepsi_queue::run`.
fn main() -> std::process::ExitCode {
    pepsi_queue::run()
}
