//! `pepsi-httpd`: see the crate behind `pepsi_httpd::run`. It passes every program's
//! configuration parser (`pepsi::checks`), which the configuration API checks an override
//! with; the pepsi-httpd crate itself links no program.
fn main() -> std::process::ExitCode {
    pepsi_httpd::run(pepsi::checks::CONFIG_CHECKS)
}
