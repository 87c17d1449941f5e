//! `pepsi-secure-link` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_secure_link::main`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_secure_link::main()
}
