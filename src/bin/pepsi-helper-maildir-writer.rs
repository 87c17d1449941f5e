//! `pepsi-helper-maildir-writer`: see the crate behind `pepsi_helper_maildir_writer::run`.
fn main() -> std::process::ExitCode {
    pepsi_helper_maildir_writer::run()
}
