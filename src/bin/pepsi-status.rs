//! `pepsi-status` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_status`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_status::main()
}
