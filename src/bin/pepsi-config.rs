//! `pepsi-config`: standalone in both builds (it links every program's configuration parser,
//! `pepsi::checks`, to check an override before storing it).
fn main() -> std::process::ExitCode {
    pepsi_config::run(pepsi::checks::CONFIG_CHECKS)
}
