//! `pepsi-telemetry`, its own executable in both builds (its row in
//! `pepsi::programs` says why).
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_telemetry::main()
}
