//! `pepsi-stage-detect-language` (and, under that name, `pepsi-detect-language`): see the
//! crate behind `pepsi_stage_detect_language::run`.
fn main() -> std::process::ExitCode {
    pepsi_stage_detect_language::run()
}
