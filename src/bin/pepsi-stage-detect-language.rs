//! `pepsi-stage-detect-language`, its own executable in both builds (its row in
//! `pepsi::programs` says why).
//! Under the name `pepsi-detect-language` (a symlink to it) it is that command.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_detect_language::main()
}
