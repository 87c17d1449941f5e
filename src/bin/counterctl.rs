//! `counterctl`: see the crate behind `migadu_counters::ctl::run`.
fn main() -> std::process::ExitCode {
    migadu_counters::ctl::run()
}
