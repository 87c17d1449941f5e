//! `pepsi-sendmail`: see the crate behind `pepsi_sendmail::run`.
fn main() -> std::process::ExitCode {
    pepsi_sendmail::run()
}
