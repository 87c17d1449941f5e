//! `pepsi-helper-token-refresh`, its own executable in both builds (its row in
//! `pepsi::programs` says why).
fn main() -> std::process::ExitCode {
    pepsi::programs::pepsi_helper_token_refresh::main()
}
