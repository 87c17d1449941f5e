//! migadu_counters: the real-time mail counting service (`server`), and `counterctl` (`ctl`),
//! its command-line client. Pure rules live in `address`, `validate`, `counting` and
//! `domains`; the I/O edges are `store` (Redis), `http`, `notify`, `logging` and `txlog`.

pub mod address;
pub mod config;
pub mod counting;
pub mod ctl;
pub mod domains;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod redis_conn;
pub mod resp;
pub mod server;
pub mod store;
pub mod txlog;
pub mod validate;

/// `<version> (commit <c>, built <date>)`, fixed at build time.
pub fn version_line() -> String {
    format!(
        "{} (commit {}, built {})",
        env!("MIGADU_COUNTERS_BUILD_VERSION"),
        env!("MIGADU_COUNTERS_BUILD_COMMIT"),
        env!("MIGADU_COUNTERS_BUILD_DATE")
    )
}

/// Go's flag package accepts `-name` as well as `--name`; clap only the latter. Rewrites the
/// single-dash spelling of the given long flags (also `-name=value`); values stay untouched.
pub fn normalize_args(args: impl IntoIterator<Item = String>, long: &[&str]) -> Vec<String> {
    args.into_iter()
        .map(|a| {
            let Some(rest) = a.strip_prefix('-').filter(|r| !r.starts_with('-')) else {
                return a;
            };
            let name = rest.split_once('=').map_or(rest, |(n, _)| n);
            if long.contains(&name) {
                format!("-{a}")
            } else {
                a
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn single_dash_long_flags() {
        let got = super::normalize_args(
            [
                "prog",
                "-config",
                "/x",
                "-date=2026-01-01",
                "--json",
                "-h",
                "-x",
                "-address",
            ]
            .map(String::from),
            &["config", "date", "json", "address"],
        );
        assert_eq!(
            got,
            [
                "prog",
                "--config",
                "/x",
                "--date=2026-01-01",
                "--json",
                "-h",
                "-x",
                "--address"
            ]
        );
    }
}
