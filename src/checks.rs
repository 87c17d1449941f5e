//! Every program's configuration parser, as one table: what pepsi-config (and pepsi-httpd's
//! configuration API) run over a candidate configuration before storing an override
//! (`pepsi_common::config::check_override`). It lives here because only the root package
//! links every program.
//!
//! A program that reads a new section or option at start is covered once its parser is in
//! this table; one that reads options only later (per message) is not, and its options are
//! stored with `--force`.

use pepsi_common::config::{Config, ProgramCheck};
use pepsi_common::stage::check_config as stage;

fn ingress(cfg: &Config) -> anyhow::Result<()> {
    pepsi_ingress::config::Settings::from_config(cfg).map(drop)
}

fn httpd(cfg: &Config) -> anyhow::Result<()> {
    pepsi_httpd::settings::HttpdSettings::from_config(cfg).map(drop)
}

fn failure_bouncer(cfg: &Config) -> anyhow::Result<()> {
    pepsi_failure_bouncer::Settings::from_config(cfg).map(drop)
}

fn keydisc(cfg: &Config) -> anyhow::Result<()> {
    pepsi_keydisc::Settings::from_config(cfg).map(drop)
}

fn sendmail(cfg: &Config) -> anyhow::Result<()> {
    pepsi_sendmail::settings::Settings::from_config(cfg).map(drop)
}

/// The parsers, one per program (a stage program's covers every section that runs it).
pub const CONFIG_CHECKS: &[ProgramCheck] = &[
    ProgramCheck {
        program: "pepsi-dispatch",
        check: pepsi_dispatch::check_config,
    },
    ProgramCheck {
        program: "pepsi-ingress",
        check: ingress,
    },
    ProgramCheck {
        program: "pepsi-httpd",
        check: httpd,
    },
    ProgramCheck {
        program: "pepsi-failure-bouncer",
        check: failure_bouncer,
    },
    ProgramCheck {
        program: "pepsi-sendmail",
        check: sendmail,
    },
    ProgramCheck {
        program: "pepsi-stage-aliases",
        check: stage::<pepsi_stage_aliases::Aliases>,
    },
    ProgramCheck {
        program: "pepsi-stage-arc",
        check: stage::<pepsi_stage_arc::ArcSealer>,
    },
    ProgramCheck {
        program: "pepsi-stage-block-language",
        check: stage::<pepsi_stage_block_language::BlockLanguage>,
    },
    ProgramCheck {
        program: "pepsi-stage-milter",
        check: stage::<pepsi_stage_milter::Milter>,
    },
    ProgramCheck {
        program: "pepsi-keydisc",
        check: keydisc,
    },
    ProgramCheck {
        program: "pepsi-stage-encrypt",
        check: stage::<pepsi_stage_encrypt::Encrypt>,
    },
    ProgramCheck {
        program: "pepsi-stage-decrypt",
        check: stage::<pepsi_stage_decrypt::Decrypt>,
    },
    ProgramCheck {
        program: "pepsi-stage-autocrypt-learn",
        check: stage::<pepsi_stage_autocrypt_learn::AutocryptLearn>,
    },
    ProgramCheck {
        program: "pepsi-stage-bounce",
        check: stage::<pepsi_stage_bounce::Bounce>,
    },
    ProgramCheck {
        program: "pepsi-stage-check-whitelist",
        check: stage::<pepsi_stage_check_whitelist::WhitelistStage>,
    },
    ProgramCheck {
        program: "pepsi-stage-count",
        check: stage::<pepsi_stage_count::Count>,
    },
    ProgramCheck {
        program: "pepsi-stage-detect-language",
        check: stage::<pepsi_stage_detect_language::DetectLanguage>,
    },
    ProgramCheck {
        program: "pepsi-stage-discard",
        check: stage::<pepsi_stage_discard::Discard>,
    },
    ProgramCheck {
        program: "pepsi-stage-dkim-sign",
        check: stage::<pepsi_stage_dkim_sign::DkimSign>,
    },
    ProgramCheck {
        program: "pepsi-stage-if",
        check: stage::<pepsi_stage_if::If>,
    },
    ProgramCheck {
        program: "pepsi-stage-dot-forward",
        check: stage::<pepsi_stage_dot_forward::DotForwardStage>,
    },
    ProgramCheck {
        program: "pepsi-stage-if-headers",
        check: stage::<pepsi_stage_if::IfHeaders>,
    },
    ProgramCheck {
        program: "pepsi-stage-relay-to-internet",
        check: stage::<pepsi_stage_relay_to_internet::RelayToInternet>,
    },
    ProgramCheck {
        program: "pepsi-stage-relay-to-lmtp",
        check: stage::<pepsi_stage_relay_to_lmtp::RelayToLmtp>,
    },
    ProgramCheck {
        program: "pepsi-stage-relay-to-maildir",
        check: stage::<pepsi_stage_relay_to_maildir::RelayToMaildir>,
    },
    ProgramCheck {
        program: "pepsi-stage-relay-to-smarthost",
        check: stage::<pepsi_stage_relay_to_smarthost::RelayToSmarthost>,
    },
    ProgramCheck {
        program: "pepsi-stage-route",
        check: stage::<pepsi_stage_route::Route>,
    },
    ProgramCheck {
        program: "pepsi-stage-srs",
        check: stage::<pepsi_stage_srs::SrsProgram>,
    },
    ProgramCheck {
        program: "pepsi-stage-vacation",
        check: stage::<pepsi_stage_vacation::VacationStage>,
    },
];
