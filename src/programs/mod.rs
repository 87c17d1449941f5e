//! The entry points of the programs the unified binary folds in, one `main` per program
//! (`pepsi::programs::pepsi_stage_route::main`), and the multi-call dispatch on a program
//! name. The per-program executables of a development build (`src/bin/<name>.rs`, feature
//! `multibin`) and the one `pepsi` executable of a release build (`src/bin/pepsi.rs`,
//! feature `unibin`) both call these, so the two builds run the same code.
//!
//! Every program is one row of the table below (`programs!`): its name, whether it is
//! folded into the unified binary or standalone, its entry point, its manual page, its
//! configuration check and, for a stage program, its `Stage` type. The folded and standalone
//! lists, the second names of standalone programs, the fusion registry, the configuration
//! checks, the stages' edges (and the tables of validation made of the two) and the
//! manual's list all come from it; the Makefile reads the lists from the built `pepsi`
//! (`--list`, `--list-standalone`, `--list-links`), and `tests/integration/unibin.rs` keeps
//! the `[[bin]]` targets of Cargo.toml and `src/bin/` in agreement with it.
//!
//! A program is folded only if it may share the executable with every other one: nothing
//! privileged (a setuid/setgid bit on the shared file would apply to every name linked to
//! it) and nothing that drags a large dependency only it uses. The others are
//! [`STANDALONE`]: `pepsi` refuses their names.
//!
//! Never write to stdout here: the name may be a stage worker's, whose stdout belongs to
//! the status protocol. Usage and refusals go to stderr, except `pepsi --help` / `--list` /
//! `--list-standalone` / `--list-links`.

use std::ffi::OsString;
use std::process::ExitCode;

use pepsi_conf::config::ProgramCheck;
use pepsi_contract::stage::check_config;
use pepsi_contract::stage::edges::StageEdges;
use pepsi_stage_validate::Tables;

use crate::checks;
pub mod page;

use page::{
    Page,
    Source::{Clap, Help},
};

/// A program folded into the unified binary.
#[derive(Debug)]
pub struct Program {
    /// The executable name: the `[[bin]]` name, the symlink name, a stage's PROGRAM.
    pub name: &'static str,
    /// Its entry point; it reads its own arguments from the process.
    pub main: fn() -> ExitCode,
}

/// The one table of programs (see [`programs!`]'s rows below): from it come each program's
/// module (`programs::<module>::main`, what its `src/bin/<name>.rs` calls), [`FOLDED`] and
/// [`STANDALONE`], the fusion registry ([`install_fusion`]), [`CONFIG_CHECKS`],
/// [`STAGE_EDGES`], the tables of validation made of those two ([`VALIDATION`],
/// [`GRAPH_VALIDATION`]) and the manual's pages ([`manual_pages`]).
///
/// A row: `"name" module { entry: <fn() -> ExitCode>, man: <section> <page::Source>,
/// [check: <configuration check>,] [stage: <Stage type>,] }`. A stage row's configuration
/// check is `stage::check_config::<Type>` and its edges `Type::edges`; a folded stage row
/// is also registered for fusion. Each generated item names only the rows it needs, so an
/// executable links only what it calls (`pepsi` no standalone program, a standalone program
/// nothing but its own crate).
macro_rules! programs {
    (
        folded {
            $($f_name:literal $f_module:ident {
                entry: $f_entry:expr,
                man: $f_section:literal $f_man:expr,
                $(check: $f_check:expr,)?
                $(stage: $f_stage:ty,)?
            })*
        }
        standalone {
            $($s_name:literal $s_module:ident {
                entry: $s_entry:expr,
                man: $s_section:literal $s_man:expr,
                $(also: $s_also:literal,)?
                $(check: $s_check:expr,)?
                $(stage: $s_stage:ty,)?
            })*
        }
    ) => {
        $(
            #[doc = concat!("`", $f_name, "`")]
            pub mod $f_module {
                #[allow(unused_imports)]
                use super::*;
                #[doc = concat!("The `", $f_name, "` program.")]
                pub fn main() -> std::process::ExitCode {
                    ($f_entry)()
                }
            }
        )*
        $(
            #[doc = concat!("`", $s_name, "` (standalone)")]
            pub mod $s_module {
                #[allow(unused_imports)]
                use super::*;
                #[doc = concat!("The `", $s_name, "` program.")]
                pub fn main() -> std::process::ExitCode {
                    ($s_entry)()
                }
            }
        )*

        /// Every folded program, by name (the order `pepsi --list` prints).
        pub const FOLDED: &[Program] = &[$(Program { name: $f_name, main: $f_module::main }),*];

        /// The programs kept out of the unified binary, each its own executable in both
        /// builds (each row says why; `pepsi --list-standalone` prints them). `pepsi`
        /// refuses these names rather than calling them "unknown", so a wrong symlink is easy
        /// to diagnose.
        pub const STANDALONE: &[&str] = &[$($s_name),*];

        /// Second names of standalone programs, `(name, program)`: a multi-call executable
        /// of its own, a command under the second name (pepsi-detect-language(1)) and its
        /// program under the first. `pepsi --list-links` prints them as `name:program`;
        /// `make unibin` and `make install` link them.
        pub const COMMAND_LINKS: &[(&str, &str)] = &[$($(($s_also, $s_name),)?)*];

        /// Installs the process-global stage registry that fusion (spec §22.5) looks
        /// successors up in: every folded stage. Only the unified binary calls this, first
        /// thing, before it dispatches: a stage is fused into its predecessor's pass only
        /// when both are folded into the same executable, so a per-program development
        /// build, which never calls it, runs without fusion.
        pub fn install_fusion() {
            use pepsi_contract::stage::fusion::{install, register};
            install(vec![$($(register::<$f_stage>(),)?)*]);
        }

        /// Every program's configuration parser (a stage program's covers every section
        /// that runs it): what pepsi-config and pepsi-httpd's configuration API run over a
        /// candidate configuration before storing an override
        /// (`pepsi_conf::config::check_override`).
        pub const CONFIG_CHECKS: &[ProgramCheck] = &[
            $(
                $(ProgramCheck { program: $f_name, check: $f_check },)?
                $(ProgramCheck { program: $f_name, check: check_config::<$f_stage> },)?
            )*
            $(
                $(ProgramCheck { program: $s_name, check: $s_check },)?
                $(ProgramCheck { program: $s_name, check: check_config::<$s_stage> },)?
            )*
        ];

        /// Every stage program's declaration of the stages its sections send messages to
        /// (`Stage::edges`): what pepsi-httpd draws the pipeline graph from.
        pub const STAGE_EDGES: &[StageEdges] = &[
            $($(StageEdges::of::<$f_stage>(),)?)*
            $($(StageEdges::of::<$s_stage>(),)?)*
        ];

        /// What `pepsi_stage_validate::validate` judges a configuration by: every program's
        /// parser and every stage's edges. pepsi-config's `check` and `set` (and so
        /// `pepsi-setup apply`) and pepsi-httpd's configuration API use it.
        pub const VALIDATION: Tables = Tables {
            checks: CONFIG_CHECKS,
            edges: STAGE_EDGES,
        };

        /// The rules of the stage graph alone, which the dispatcher checks at start. Not
        /// the other programs' parsers: they may read files only their own program may read
        /// (keys, token files), and linking them would put every standalone program's
        /// parser into the unified binary; each program runs its own at start.
        pub const GRAPH_VALIDATION: Tables = Tables {
            checks: &[],
            edges: STAGE_EDGES,
        };

        /// The stage type of each stage program, by name: the table tests check each
        /// against its row (`Stage::PROGRAM` is the row's name).
        pub const STAGE_PROGRAMS: &[(&str, &str)] = &[
            $($(($f_name, <$f_stage as pepsi_contract::stage::Stage>::PROGRAM),)?)*
            $($(($s_name, <$s_stage as pepsi_contract::stage::Stage>::PROGRAM),)?)*
        ];

        /// Every program's manual page, in the table's order (`crate::manual::pages` adds
        /// the unified binary's and the second names').
        pub fn manual_pages() -> Vec<Page> {
            vec![
                $(Page { name: $f_name, section: $f_section, source: $f_man },)*
                $(Page { name: $s_name, section: $s_section, source: $s_man },)*
            ]
        }
    };
}

programs! {
    folded {
        "pepsi-archive" pepsi_archive {
            entry: ::pepsi_archive::run,
            man: 8 Clap(::pepsi_archive::command),
        }
        "pepsi-dispatch" pepsi_dispatch {
            entry: || ::pepsi_dispatch::run(&GRAPH_VALIDATION),
            man: 8 Clap(::pepsi_dispatch::command),
            check: ::pepsi_dispatch::check_config,
        }
        "pepsi-failure-bouncer" pepsi_failure_bouncer {
            entry: ::pepsi_failure_bouncer::run,
            man: 8 Clap(::pepsi_failure_bouncer::command),
            check: checks::failure_bouncer,
        }
        "pepsi-ingress" pepsi_ingress {
            entry: ::pepsi_ingress::run,
            man: 8 Clap(::pepsi_ingress::command),
            check: checks::ingress,
        }
        "pepsi-keydisc" pepsi_keydisc {
            entry: ::pepsi_keydisc::run,
            man: 8 Clap(::pepsi_keydisc::command),
            check: checks::keydisc,
        }
        "pepsi-list" pepsi_list {
            entry: ::pepsi_list::run,
            man: 8 Clap(::pepsi_list::command),
        }
        "pepsi-queue" pepsi_queue {
            entry: ::pepsi_queue::run,
            man: 8 Clap(::pepsi_queue::command),
        }
        "pepsi-secure-link" pepsi_secure_link {
            entry: ::pepsi_secure_link::run,
            man: 8 Clap(::pepsi_secure_link::command),
        }
        "pepsi-settings" pepsi_settings {
            entry: ::pepsi_settings::run,
            man: 8 Clap(::pepsi_settings::command),
        }
        "pepsi-stage-aliases" pepsi_stage_aliases {
            entry: ::pepsi_stage_aliases::run,
            man: 8 Clap(::pepsi_stage_aliases::command),
            stage: ::pepsi_stage_aliases::Aliases,
        }
        "pepsi-stage-arc" pepsi_stage_arc {
            entry: ::pepsi_stage_arc::run,
            man: 8 Clap(::pepsi_stage_arc::command),
            stage: ::pepsi_stage_arc::ArcSealer,
        }
        "pepsi-stage-autocrypt-learn" pepsi_stage_autocrypt_learn {
            entry: ::pepsi_stage_autocrypt_learn::run,
            man: 8 Clap(::pepsi_stage_autocrypt_learn::command),
            stage: ::pepsi_stage_autocrypt_learn::AutocryptLearn,
        }
        "pepsi-stage-block-language" pepsi_stage_block_language {
            entry: ::pepsi_stage_block_language::run,
            man: 8 Clap(::pepsi_stage_block_language::command),
            stage: ::pepsi_stage_block_language::BlockLanguage,
        }
        "pepsi-stage-bounce" pepsi_stage_bounce {
            entry: ::pepsi_stage_bounce::run,
            man: 8 Clap(::pepsi_stage_bounce::command),
            stage: ::pepsi_stage_bounce::Bounce,
        }
        "pepsi-stage-check-whitelist" pepsi_stage_check_whitelist {
            entry: ::pepsi_stage_check_whitelist::run,
            man: 8 Clap(::pepsi_stage_check_whitelist::command),
            stage: ::pepsi_stage_check_whitelist::WhitelistStage,
        }
        "pepsi-stage-count" pepsi_stage_count {
            entry: ::pepsi_stage_count::run,
            man: 8 Clap(::pepsi_stage_count::command),
            stage: ::pepsi_stage_count::Count,
        }
        "pepsi-stage-discard" pepsi_stage_discard {
            entry: ::pepsi_stage_discard::run,
            man: 8 Clap(::pepsi_stage_discard::command),
            stage: ::pepsi_stage_discard::Discard,
        }
        "pepsi-stage-dkim-sign" pepsi_stage_dkim_sign {
            entry: ::pepsi_stage_dkim_sign::run,
            man: 8 Clap(::pepsi_stage_dkim_sign::command),
            stage: ::pepsi_stage_dkim_sign::DkimSign,
        }
        "pepsi-stage-if" pepsi_stage_if {
            entry: ::pepsi_stage_if::run,
            man: 8 Clap(::pepsi_stage_if::command),
            stage: ::pepsi_stage_if::If,
        }
        "pepsi-stage-if-headers" pepsi_stage_if_headers {
            entry: ::pepsi_stage_if::run_headers,
            man: 8 Clap(::pepsi_stage_if::command_headers),
            stage: ::pepsi_stage_if::IfHeaders,
        }
        "pepsi-stage-list" pepsi_stage_list {
            entry: ::pepsi_stage_list::run,
            man: 8 Clap(::pepsi_stage_list::command),
            stage: ::pepsi_stage_list::ListStage,
        }
        "pepsi-stage-milter" pepsi_stage_milter {
            entry: ::pepsi_stage_milter::run,
            man: 8 Clap(::pepsi_stage_milter::command),
            stage: ::pepsi_stage_milter::Milter,
        }
        "pepsi-stage-relay-to-internet" pepsi_stage_relay_to_internet {
            entry: ::pepsi_stage_relay_to_internet::run,
            man: 8 Clap(::pepsi_stage_relay_to_internet::command),
            stage: ::pepsi_stage_relay_to_internet::RelayToInternet,
        }
        "pepsi-stage-relay-to-lmtp" pepsi_stage_relay_to_lmtp {
            entry: ::pepsi_stage_relay_to_peer::lmtp::run,
            man: 8 Clap(::pepsi_stage_relay_to_peer::lmtp::command),
            stage: ::pepsi_stage_relay_to_peer::lmtp::RelayToLmtp,
        }
        "pepsi-stage-route" pepsi_stage_route {
            entry: ::pepsi_stage_route::run,
            man: 8 Clap(::pepsi_stage_route::command),
            stage: ::pepsi_stage_route::Route,
        }
        "pepsi-stage-secretary" pepsi_stage_secretary {
            entry: ::pepsi_stage_secretary::run,
            man: 8 Clap(::pepsi_stage_secretary::command),
            stage: ::pepsi_stage_secretary::SecretaryStage,
        }
        "pepsi-stage-secure-link" pepsi_stage_secure_link {
            entry: ::pepsi_stage_secure_link::run,
            man: 8 Clap(::pepsi_stage_secure_link::command),
            stage: ::pepsi_stage_secure_link::SecureLinkStage,
        }
        "pepsi-stage-srs" pepsi_stage_srs {
            entry: ::pepsi_stage_srs::run,
            man: 8 Clap(::pepsi_stage_srs::command),
            stage: ::pepsi_stage_srs::SrsProgram,
        }
        "pepsi-stage-vacation" pepsi_stage_vacation {
            entry: ::pepsi_stage_vacation::run,
            man: 8 Clap(::pepsi_stage_vacation::command),
            stage: ::pepsi_stage_vacation::VacationStage,
        }
        "pepsi-status" pepsi_status {
            entry: ::pepsi_status::run,
            man: 8 Clap(::pepsi_status::command),
        }
        "pepsi-telemetry-client" pepsi_telemetry_client {
            entry: ::pepsi_telemetry_client::run,
            man: 8 Clap(::pepsi_telemetry_client::command),
            check: ::pepsi_telemetry_client::check_config,
        }
        "pepsi-tlsrpt" pepsi_tlsrpt {
            entry: ::pepsi_tlsrpt::run,
            man: 8 Clap(::pepsi_tlsrpt::command),
        }
    }

    // Standalone: their own executables in both builds.
    // - Privileged (a setuid/setgid bit on the shared file would apply to every program
    //   linked to it): pepsi-helper-maildir-writer (setuid root), its caller
    //   pepsi-stage-relay-to-maildir (setgid), pepsi-stage-relay-to-smarthost (setgid
    //   pepsi-token: reads the OAuth access token files of AUTH_TOKEN_FILE), pepsi-sendmail
    //   (setgid pepsi-sendmail, the group that may write the drop directory; run by every local user as
    //   /usr/sbin/sendmail), pepsi-quota (setgid pepsi-maildir: its recount runs the Maildir
    //   writer), pepsi-helper-dot-forward (setuid root: reads ~/.forward as its account) and
    //   its caller pepsi-stage-dot-forward (setgid pepsi-forward); pepsi-helper-auto-pay
    //   (setuid root: runs a user's own wallet as that user, for the setgid pepsi-auto-pay
    //   stage pepsi-stage-auto-pay); pepsi-whitelist (setuid
    //   pepsi: any local user edits their own mailbox's list through the service account's
    //   database role); pepsi-stage-encrypt and pepsi-stage-decrypt (setuid pepsi-crypto:
    //   that database role alone reads the sealed private keys; docs/crypto.md). pepsi-keys
    //   has no bit but links the whole key store and its crypto libraries, which no running
    //   service but those two needs.
    // - Deployed or invoked separately: pepsi-stage-detect-language (links lingua's language
    //   models, a large dependency nothing else uses; also the pepsi-detect-language(1)
    //   command, its `also` name); pepsi-helper-mailbox-scan (no bit, but execed
    //   by name from pepsi-whitelist as the mailbox's owner, on a Maildir the owner
    //   controls: a small program of its own rather than the whole shared binary under a
    //   user's ids); pepsi-helper-token-refresh (no bit, but run by its timer as its own
    //   account, pepsi-token, the only one that reads the refresh tokens: a small program
    //   linking its crate alone, none of the shared binary's code); pepsi-setup (one-off provisioning, run as root, its own code used by
    //   nothing else); pepsi-config (links every program's configuration parser,
    //   CONFIG_CHECKS, to check an override before it is stored: code no running service
    //   needs); pepsi-httpd (the administrative web surface: started as root to bind, then
    //   drops privileges, and links an HTTP server stack no other program uses);
    //   pepsi-telemetry (the OTLP/HTTP receiver: its own package, service and account, on a
    //   host of its own, with an HTTP server and the OpenTelemetry message types no Pepsi
    //   process needs; no `check:` row, since its configuration is its own file there, not
    //   the Pepsi host's);
    //   migadu_counters and counterctl, the counting service and its client: a product of
    //   their own with their own service, configuration and release cycle, possibly on
    //   another host, whose HTTP/Redis/CDB stack no Pepsi process uses, so folding them in
    //   would only grow every Pepsi process's shared binary.
    standalone {
        "pepsi-setup" pepsi_setup {
            entry: ::pepsi_setup::run,
            man: 8 Clap(::pepsi_setup::command),
        }
        "pepsi-helper-maildir-writer" pepsi_helper_maildir_writer {
            entry: ::pepsi_helper_maildir_writer::run,
            man: 8 Clap(::pepsi_helper_maildir_writer::command),
        }
        "pepsi-stage-relay-to-maildir" pepsi_stage_relay_to_maildir {
            entry: ::pepsi_stage_relay_to_maildir::run,
            man: 8 Clap(::pepsi_stage_relay_to_maildir::command),
            stage: ::pepsi_stage_relay_to_maildir::RelayToMaildir,
        }
        "pepsi-helper-dot-forward" pepsi_helper_dot_forward {
            entry: ::pepsi_helper_dot_forward::run,
            man: 8 Clap(::pepsi_helper_dot_forward::command),
        }
        "pepsi-helper-auto-pay" pepsi_helper_auto_pay {
            entry: ::pepsi_helper_auto_pay::run,
            man: 8 Clap(::pepsi_helper_auto_pay::command),
        }
        "pepsi-helper-token-refresh" pepsi_helper_token_refresh {
            entry: ::pepsi_helper_token_refresh::run,
            man: 8 Clap(::pepsi_helper_token_refresh::command),
        }
        "pepsi-stage-auto-pay" pepsi_stage_auto_pay {
            entry: ::pepsi_stage_auto_pay::run,
            man: 8 Clap(::pepsi_stage_auto_pay::command),
            stage: ::pepsi_stage_auto_pay::AutoPayStage,
        }
        "pepsi-stage-dot-forward" pepsi_stage_dot_forward {
            entry: ::pepsi_stage_dot_forward::run,
            man: 8 Clap(::pepsi_stage_dot_forward::command),
            stage: ::pepsi_stage_dot_forward::DotForwardStage,
        }
        "pepsi-stage-relay-to-smarthost" pepsi_stage_relay_to_smarthost {
            entry: ::pepsi_stage_relay_to_peer::smarthost::run,
            man: 8 Clap(::pepsi_stage_relay_to_peer::smarthost::command),
            stage: ::pepsi_stage_relay_to_peer::smarthost::RelayToSmarthost,
        }
        "pepsi-sendmail" pepsi_sendmail {
            entry: ::pepsi_sendmail::run,
            man: 1 Help {
                about: "the sendmail(1) interface of the Pepsi mail server",
                help: page::sendmail_help,
            },
            check: checks::sendmail,
        }
        "pepsi-quota" pepsi_quota {
            entry: ::pepsi_quota::run,
            man: 8 Clap(::pepsi_quota::command),
        }
        "pepsi-whitelist" pepsi_whitelist {
            entry: ::pepsi_whitelist::run,
            man: 1 Clap(::pepsi_whitelist::command),
        }
        "pepsi-keys" pepsi_keys {
            entry: ::pepsi_keys::run,
            man: 8 Clap(::pepsi_keys::command),
        }
        "pepsi-stage-encrypt" pepsi_stage_encrypt {
            entry: ::pepsi_stage_encrypt::run,
            man: 8 Clap(::pepsi_stage_encrypt::command),
            stage: ::pepsi_stage_encrypt::Encrypt,
        }
        "pepsi-stage-decrypt" pepsi_stage_decrypt {
            entry: ::pepsi_stage_decrypt::run,
            man: 8 Clap(::pepsi_stage_decrypt::command),
            stage: ::pepsi_stage_decrypt::Decrypt,
        }
        "pepsi-helper-mailbox-scan" pepsi_helper_mailbox_scan {
            entry: ::pepsi_helper_mailbox_scan::run,
            man: 8 Clap(::pepsi_helper_mailbox_scan::command),
        }
        "pepsi-stage-detect-language" pepsi_stage_detect_language {
            entry: ::pepsi_stage_detect_language::run,
            man: 8 Clap(::pepsi_stage_detect_language::command),
            also: "pepsi-detect-language",
            stage: ::pepsi_stage_detect_language::DetectLanguage,
        }
        "pepsi-config" pepsi_config {
            entry: || ::pepsi_config::run(&VALIDATION),
            man: 8 Clap(::pepsi_config::command),
        }
        "pepsi-httpd" pepsi_httpd {
            entry: || ::pepsi_httpd::run(CONFIG_CHECKS, STAGE_EDGES),
            man: 8 Clap(::pepsi_httpd::command),
            check: checks::httpd,
        }
        "pepsi-telemetry" pepsi_telemetry {
            entry: ::pepsi_telemetry::run,
            man: 8 Clap(::pepsi_telemetry::command),
        }
        "migadu_counters" migadu_counters {
            entry: ::migadu_counters::server::run,
            man: 8 Clap(::migadu_counters::server::command),
        }
        "counterctl" counterctl {
            entry: ::migadu_counters::ctl::run,
            man: 1 Clap(::migadu_counters::ctl::command),
        }
    }
}

const NO_PROGRAM: &str = "no program named: run it under one of the names below (a symlink), \
                          or as `pepsi <program> [args]`";

/// The name the unified executable itself is installed under.
pub const UNIFIED: &str = "pepsi";

/// The folded program called `name`.
pub fn find(name: &str) -> Option<&'static Program> {
    FOLDED.iter().find(|p| p.name == name)
}

/// What the multi-call binary does with its command line.
#[derive(Debug)]
pub enum Invocation {
    /// Invoked under a folded program's name: run it here.
    Run(&'static Program),
    /// `pepsi <program> args...`: run `program` with `args`, under its own name.
    Exec {
        program: &'static Program,
        args: Vec<OsString>,
    },
    /// `pepsi --help`: the usage on stdout, exit 0.
    Help,
    /// `pepsi --list`: the folded names on stdout, one a line, exit 0.
    List,
    /// `pepsi --list-standalone`: the standalone names on stdout, one a line, exit 0.
    ListStandalone,
    /// `pepsi --list-links`: the [`COMMAND_LINKS`] as `name:program` lines, exit 0.
    ListLinks,
    /// A name it does not run: `message` and the usage on stderr, exit 2.
    Refuse { message: String },
}

/// Decides what `pepsi` does with `argv`: by the file name of argv[0] first, and when that
/// is `pepsi` itself (or a renamed copy of it), by the first argument.
pub fn invocation(argv: &[OsString]) -> Invocation {
    let invoked = argv
        .first()
        .map(std::path::Path::new)
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let renamed = invoked != UNIFIED;
    if renamed {
        if let Some(program) = find(&invoked) {
            return Invocation::Run(program);
        }
        // A standalone program's name linked to this file is a mistake to report as such.
        if STANDALONE.contains(&invoked.as_str()) || argv.len() < 2 {
            return refuse(&invoked);
        }
    }
    let Some(first) = argv.get(1) else {
        return refuse("");
    };
    let first = first.to_string_lossy();
    match first.as_ref() {
        "-h" | "--help" | "help" => Invocation::Help,
        "--list" => Invocation::List,
        "--list-standalone" => Invocation::ListStandalone,
        "--list-links" => Invocation::ListLinks,
        name => match find(name) {
            Some(program) => Invocation::Exec {
                program,
                args: argv[2..].to_vec(),
            },
            // `pepsi bogus` names `bogus`; `/x/misnamed worker` names `misnamed`, not `worker`.
            None if renamed => refuse(&invoked),
            None => refuse(name),
        },
    }
}

/// The unified binary's dispatch: runs the program `invocation` names, in this process when
/// argv[0] names it, else by executing this same file again under the program's name (the
/// programs read their arguments from the process, argv[0] included).
pub fn multicall() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    match invocation(&argv) {
        Invocation::Run(program) => (program.main)(),
        Invocation::Exec { program, args } => {
            use std::os::unix::process::CommandExt as _;
            let exe = match std::env::current_exe() {
                Ok(exe) => exe,
                Err(e) => {
                    eprintln!(
                        "{UNIFIED}: cannot find its own executable to run {}: {e}",
                        program.name
                    );
                    return ExitCode::from(1);
                }
            };
            let e = std::process::Command::new(&exe)
                .arg0(program.name)
                .args(args)
                .exec();
            eprintln!(
                "{UNIFIED}: cannot execute {} as {}: {e}",
                exe.display(),
                program.name
            );
            ExitCode::from(1)
        }
        Invocation::Help => {
            print!("{}", usage());
            ExitCode::SUCCESS
        }
        Invocation::List => {
            for p in FOLDED {
                println!("{}", p.name);
            }
            ExitCode::SUCCESS
        }
        Invocation::ListStandalone => {
            for name in STANDALONE {
                println!("{name}");
            }
            ExitCode::SUCCESS
        }
        Invocation::ListLinks => {
            for (name, program) in COMMAND_LINKS {
                println!("{name}:{program}");
            }
            ExitCode::SUCCESS
        }
        Invocation::Refuse { message } => {
            eprintln!("{UNIFIED}: {message}\n\n{}", usage());
            ExitCode::from(2)
        }
    }
}

fn refuse(name: &str) -> Invocation {
    let message = if STANDALONE.contains(&name) {
        format!("{name} is not part of this binary: it is installed as its own executable")
    } else if name.is_empty() {
        NO_PROGRAM.to_owned()
    } else {
        format!("unknown program {name:?}")
    };
    Invocation::Refuse { message }
}

/// The usage text: how to call it and the programs it contains.
pub fn usage() -> String {
    let mut text = format!(
        "Usage: <program> [args...]   (argv[0] names the program: a symlink to {UNIFIED})\n       \
         {UNIFIED} <program> [args...]\n       {UNIFIED} --list | --list-standalone | --list-links | --help\n\n\
         Pepsi's unified binary. Programs it contains:\n"
    );
    for p in FOLDED {
        text.push_str("  ");
        text.push_str(p.name);
        text.push('\n');
    }
    text.push_str("\nInstalled as their own executables, not contained:\n");
    for name in STANDALONE {
        text.push_str("  ");
        text.push_str(name);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(argv: &[&str], want: &str) {
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        let got = match invocation(&argv) {
            Invocation::Run(p) => format!("run {}", p.name),
            Invocation::Exec { program, args } => format!(
                "exec {} {}",
                program.name,
                args.iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Invocation::Help => "help".into(),
            Invocation::List => "list".into(),
            Invocation::ListStandalone => "list-standalone".into(),
            Invocation::ListLinks => "list-links".into(),
            Invocation::Refuse { message } => format!("refuse {message}"),
        };
        // A refusal's expectation may stop early: its start says which refusal it is.
        if want.starts_with("refuse ") {
            assert!(got.starts_with(want), "argv {argv:?}: {got}");
        } else {
            assert_eq!(got.trim_end(), want, "argv {argv:?}");
        }
    }

    #[test]
    fn dispatch_on_argv0_then_first_argument() {
        check(
            &["/usr/bin/pepsi-stage-route", "worker"],
            "run pepsi-stage-route",
        );
        check(&["pepsi-dispatch"], "run pepsi-dispatch");
        check(
            &["pepsi-stage-if-headers", "-c", "x"],
            "run pepsi-stage-if-headers",
        );
        check(
            &["/opt/pepsi", "pepsi-queue", "list", "--json"],
            "exec pepsi-queue list --json",
        );
        check(&["pepsi", "pepsi-ingress"], "exec pepsi-ingress");
        check(
            &["./pepsi-1.2", "pepsi-queue", "list"],
            "exec pepsi-queue list",
        );
        check(&["pepsi", "--help"], "help");
        check(&["pepsi", "-h"], "help");
        check(&["pepsi", "--list"], "list");
        check(&["pepsi", "--list-standalone"], "list-standalone");
        check(&["pepsi", "--list-links"], "list-links");
        check(&["pepsi"], "refuse no program named:");
        check(&["pepsi", "pepsi"], "refuse unknown program \"pepsi\"");
        check(
            &["pepsi", "pepsi-nothing"],
            "refuse unknown program \"pepsi-nothing\"",
        );
        check(
            &["/x/pepsi-nothing"],
            "refuse unknown program \"pepsi-nothing\"",
        );
        check(&[], "refuse no program named:");
        check(
            &["/x/misnamed", "worker"],
            "refuse unknown program \"misnamed\"",
        );
        check(&["/x/misnamed", "--list"], "list");
        check(
            &["/usr/bin/pepsi-stage-relay-to-maildir", "worker"],
            "refuse pepsi-stage-relay-to-maildir is not part of this binary",
        );
        check(
            &["pepsi", "pepsi-setup", "db"],
            "refuse pepsi-setup is not part of this binary",
        );
    }

    #[test]
    fn no_name_is_both_folded_and_standalone() {
        for name in STANDALONE {
            assert!(find(name).is_none(), "{name} is in both lists");
        }
        let mut names: Vec<&str> = FOLDED.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FOLDED.len(), "a folded name twice");
    }

    /// The configuration the package installs starts the dispatcher.
    #[test]
    fn the_shipped_configuration_has_a_whole_stage_graph() {
        let text = include_str!("../../etc/pepsi.conf");
        let cfg = pepsi_conf::config::Config::from_str_named(text, "etc/pepsi.conf").unwrap();
        let report = pepsi_stage_validate::validate(&cfg, &GRAPH_VALIDATION);
        assert!(report.stages() > 5, "{}", report.summary());
        // Warnings allowed: [stage-discard] is there for messages moved by hand.
        assert!(report.is_ok(), "{report}");
    }

    #[test]
    fn usage_lists_every_program() {
        let text = usage();
        for name in FOLDED
            .iter()
            .map(|p| p.name)
            .chain(STANDALONE.iter().copied())
        {
            assert!(
                text.contains(&format!("  {name}\n")),
                "{name} missing: {text}"
            );
        }
    }
}
