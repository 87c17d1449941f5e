//! Every program's configuration parser: what pepsi-config (and pepsi-httpd's
//! configuration API) run over a candidate configuration before storing an override
//! (`pepsi_conf::config::check_override`). The table is built from the rows of
//! `crate::programs`; the parsers of the programs that are not stages are here. It lives in
//! the root package because only it links every program.
//!
//! A program that reads a new section or option at start is covered once its parser is in
//! this table; one that reads options only later (per message) is not, and its options are
//! stored with `--force`.

use pepsi_conf::config::Config;

pub(crate) fn ingress(cfg: &Config) -> anyhow::Result<()> {
    pepsi_ingress::config::Options::from_config(cfg).map(drop)
}

pub(crate) fn httpd(cfg: &Config) -> anyhow::Result<()> {
    pepsi_httpd::options::HttpdOptions::from_config(cfg).map(drop)
}

pub(crate) fn failure_bouncer(cfg: &Config) -> anyhow::Result<()> {
    pepsi_failure_bouncer::Options::from_config(cfg).map(drop)
}

pub(crate) fn keydisc(cfg: &Config) -> anyhow::Result<()> {
    pepsi_keydisc::Options::from_config(cfg).map(drop)
}

pub(crate) fn sendmail(cfg: &Config) -> anyhow::Result<()> {
    pepsi_sendmail::section::Options::from_config(cfg).map(drop)
}

/// The parsers, one per program, from the table of programs (`crate::programs`): a stage
/// program's is `stage::check_config::<its Stage type>`, the others' are above.
pub use crate::programs::CONFIG_CHECKS;
