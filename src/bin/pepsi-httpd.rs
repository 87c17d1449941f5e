//! `pepsi-httpd`: see the crate behind `pepsi_httpd::run`.
fn main() -> std::process::ExitCode {
    pepsi_httpd::run()
}
