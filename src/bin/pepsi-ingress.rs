//! `pepsi-ingress` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_ingress`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_ingress::main()
}
