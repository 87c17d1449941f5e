//! The bounce stage's options, read from its `[stage-<name>]` section (see `docs/bounce.md`).

use std::time::Duration;

use pepsi_conf::config::{Config, ConfigError, Section};

use crate::request::Ret;

/// `MAX_RETURN_SIZE` when the section sets none: the size above which only the headers of a
/// failed message are returned (Exim's default; Postfix uses 50 000 bytes).
pub const DEFAULT_MAX_RETURN_SIZE: u64 = 100 * 1024;

/// The stage's configuration, built once per pass from its section.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Reporting-MTA and the domain of `MAILER-DAEMON@`.
    pub hostname: String,
    /// What a failure notice returns when the client gave no RET.
    pub default_return: Ret,
    /// Above this (headers + body, in bytes) a failure notice returns only the headers.
    pub max_return_size: u64,
    /// Send delay notices to recipients that gave no NOTIFY.
    pub delay_without_notify: bool,
    /// The delivery stages' MAX_LIFETIME: a delay notice's Will-Retry-Until is arrival plus
    /// this when the state gives no time of its own.
    pub max_lifetime: Option<Duration>,
}

impl Options {
    pub fn from_config(cfg: &Config, section: &Section<'_>) -> Result<Options, ConfigError> {
        let hostname = cfg.name_option(section, "HOSTNAME")?;
        let default_return = match section
            .choice_opt("RETURN", &["headers", "full"])?
            .as_deref()
        {
            Some("full") => Ret::Full,
            _ => Ret::Headers,
        };
        Ok(Options {
            hostname,
            default_return,
            max_return_size: section
                .size_opt("MAX_RETURN_SIZE")?
                .unwrap_or(DEFAULT_MAX_RETURN_SIZE),
            delay_without_notify: section.bool_opt("DELAY_WITHOUT_NOTIFY")?.unwrap_or(true),
            max_lifetime: section.duration_opt("MAX_LIFETIME")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(text: &str) -> Result<Options, ConfigError> {
        let cfg = Config::from_str_named(text, "bounce.conf").unwrap();
        Options::from_config(&cfg, &cfg.section("stage-bounce"))
    }

    #[test]
    fn options_table() {
        let s = settings("[stage-bounce]\nPROGRAM = pepsi-stage-bounce\n").unwrap();
        assert_eq!(s.default_return, Ret::Headers);
        assert_eq!(s.max_return_size, 102_400);
        assert!(s.delay_without_notify);
        assert_eq!(s.max_lifetime, None);
        assert_eq!(s.hostname, pepsi_conf::config::system_hostname());

        let s = settings("[pepsi]\nHOSTNAME = mx.example.test\n[stage-bounce]\nRETURN = Full\nMAX_RETURN_SIZE = 1M\nDELAY_WITHOUT_NOTIFY = no\nMAX_LIFETIME = 5d\n").unwrap();
        assert_eq!(s.hostname, "mx.example.test");
        assert_eq!(s.default_return, Ret::Full);
        assert_eq!(s.max_return_size, 1 << 20);
        assert!(!s.delay_without_notify);
        assert_eq!(s.max_lifetime, Some(Duration::from_secs(5 * 86400)));

        let s = settings(
            "[pepsi]\nHOSTNAME = mx.example.test\n[stage-bounce]\nHOSTNAME = bounce.example.test\n",
        )
        .unwrap();
        assert_eq!(s.hostname, "bounce.example.test");

        let err = settings("[stage-bounce]\nRETURN = body\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("RETURN") && err.contains("body"), "{err}");
    }
}
