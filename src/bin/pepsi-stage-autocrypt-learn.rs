//! `pepsi-stage-autocrypt-learn` as its own executable (feature `multibin`); the unified `pepsi`
//! runs the same entry point, `pepsi::programs::pepsi_stage_autocrypt_learn`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_stage_autocrypt_learn::main()
}
