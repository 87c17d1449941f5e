//! pepsi-ingress: the SMTP and submission server (`pepsi_ingress::run`).

fn main() -> std::process::ExitCode {
    pepsi_ingress::run()
}
