//! `pepsi-stage-block-language` as its own executable (feature `multibin`); the unified
//! `pepsi` runs the same entry point, `pepsi::programs::pepsi_stage_block_language`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_block_language::main()
}
