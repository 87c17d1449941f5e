//! migadu_counters: the counting service, and counterctl, its command-line client.

pub mod server {
    //! The `migadu_counters` daemon.
    pub fn run() -> std::process::ExitCode {
        eprintln!("migadu_counters: not built yet");
        std::process::ExitCode::from(1)
    }
}

pub mod ctl {
    //! `counterctl`.
    pub fn run() -> std::process::ExitCode {
        eprintln!("counterctl: not built yet");
        std::process::ExitCode::from(1)
    }
}
