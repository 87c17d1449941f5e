//! `pepsi-telemetry-client` as its own executable (feature `multibin`); the unified `pepsi`
//! runs the same entry point, `pepsi::programs::pepsi_telemetry_client`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_telemetry_client::main()
}
