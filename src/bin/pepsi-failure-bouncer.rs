//! `pepsi-failure-bouncer` as its own executable (feature `multibin`); the
//! unified `pepsi` runs the same entry point, `pepsi::programs::pepsi_failure_bouncer`.
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_failure_bouncer::main()
}
