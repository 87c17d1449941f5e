//! `pepsi-stage-relay-to-maildir`, its own executable in both builds (its row in
//! `pepsi::programs` says why).
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_relay_to_maildir::main()
}
