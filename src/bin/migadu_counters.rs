//! `migadu_counters`: see the crate behind `migadu_counters::server::run`.
fn main() -> std::process::ExitCode {
    migadu_counters::server::run()
}
