//! `pepsi-helper-mailbox-scan`: see the crate behind `pepsi_helper_mailbox_scan::run`.
fn main() -> std::process::ExitCode {
    pepsi_helper_mailbox_scan::run()
}
