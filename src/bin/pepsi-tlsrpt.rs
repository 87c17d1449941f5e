//! `pepsi-tlsrpt` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_tlsrpt`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_tlsrpt::main()
}
