//! `pepsi-stage-relay-to-maildir`: see the crate behind `pepsi_stage_relay_to_maildir::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_relay_to_maildir::run()
}
