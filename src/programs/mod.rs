//! The entry points of the programs the unified binary folds in, one `main` per program
//! (`pepsi::programs::pepsi_stage_route::main`), and the multi-call dispatch on a program
//! name. The per-program executables of a development build (`src/bin/<name>.rs`, feature
//! `multibin`) and the one `pepsi` executable of a release build (`src/bin/pepsi.rs`,
//! feature `unibin`) both call these, so the two builds run the same code.
//!
//! A program is listed here only if it may share the executable with every other one:
//! nothing privileged (a setuid/setgid bit on the shared file would apply to every name
//! linked to it) and nothing that drags a large dependency only it uses. Those are
//! [`STANDALONE`]: `pepsi` refuses their names. `FOLDED_BINARIES` and `STANDALONE_BINARIES`
//! in the Makefile are the authoritative lists; `tests/integration/unibin.rs` keeps this module, the
//! Makefile and the `[[bin]]` targets of Cargo.toml in agreement.
//!
//! Never write to stdout here: the name may be a stage worker's, whose stdout belongs to
//! the status protocol. Usage and refusals go to stderr, except `pepsi --help` / `--list`.

use std::ffi::OsString;
use std::process::ExitCode;

/// A program folded into the unified binary.
#[derive(Debug)]
pub struct Program {
    /// The executable name: the `[[bin]]` name, the symlink name, a stage's PROGRAM.
    pub name: &'static str,
    /// Its entry point; it reads its own arguments from the process.
    pub main: fn() -> ExitCode,
}

/// Declares each folded program's module (`programs::<module>::main`) and the table the
/// multi-call `pepsi` dispatches on, from one list, so the two cannot disagree.
macro_rules! folded {
    ($($name:literal => $module:ident: $entry:path;)*) => {
        $(
            #[doc = concat!("`", $name, "`")]
            pub mod $module {
                #[doc = concat!("The `", $name, "` program.")]
                pub fn main() -> std::process::ExitCode {
                    $entry()
                }
            }
        )*

        /// Every folded program, by name (the order of the Makefile's `FOLDED_BINARIES`).
        pub const FOLDED: &[Program] = &[$(Program { name: $name, main: $module::main }),*];
    };
}

folded! {
    "pepsi-dispatch" => pepsi_dispatch: ::pepsi_dispatch::run;
    "pepsi-failure-bouncer" => pepsi_failure_bouncer: ::pepsi_failure_bouncer::run;
    "pepsi-ingress" => pepsi_ingress: ::pepsi_ingress::run;
    "pepsi-keydisc" => pepsi_keydisc: ::pepsi_keydisc::run;
    "pepsi-queue" => pepsi_queue: ::pepsi_queue::run;
    "pepsi-settings" => pepsi_settings: ::pepsi_settings::run;
    "pepsi-stage-aliases" => pepsi_stage_aliases: ::pepsi_stage_aliases::run;
    "pepsi-stage-arc" => pepsi_stage_arc: ::pepsi_stage_arc::run;
    "pepsi-stage-autocrypt-learn" => pepsi_stage_autocrypt_learn:
        ::pepsi_stage_autocrypt_learn::run;
    "pepsi-stage-block-language" => pepsi_stage_block_language:
        ::pepsi_stage_block_language::run;
    "pepsi-stage-bounce" => pepsi_stage_bounce: ::pepsi_stage_bounce::run;
    "pepsi-stage-check-whitelist" => pepsi_stage_check_whitelist:
        ::pepsi_stage_check_whitelist::run;
    "pepsi-stage-count" => pepsi_stage_count: ::pepsi_stage_count::run;
    "pepsi-stage-discard" => pepsi_stage_discard: ::pepsi_stage_discard::run;
    "pepsi-stage-dkim-sign" => pepsi_stage_dkim_sign: ::pepsi_stage_dkim_sign::run;
    "pepsi-stage-if" => pepsi_stage_if: ::pepsi_stage_if::run;
    "pepsi-stage-if-headers" => pepsi_stage_if_headers: ::pepsi_stage_if::run_headers;
    "pepsi-stage-milter" => pepsi_stage_milter: ::pepsi_stage_milter::run;
    "pepsi-stage-relay-to-internet" => pepsi_stage_relay_to_internet:
        ::pepsi_stage_relay_to_internet::run;
    "pepsi-stage-relay-to-lmtp" => pepsi_stage_relay_to_lmtp: ::pepsi_stage_relay_to_lmtp::run;
    "pepsi-stage-route" => pepsi_stage_route: ::pepsi_stage_route::run;
    "pepsi-stage-srs" => pepsi_stage_srs: ::pepsi_stage_srs::run;
    "pepsi-stage-vacation" => pepsi_stage_vacation: ::pepsi_stage_vacation::run;
    "pepsi-status" => pepsi_status: ::pepsi_status::run;
}

/// The programs kept out of the unified binary, each its own executable in both builds
/// (the reasons are beside `STANDALONE_BINARIES` in the Makefile). `pepsi` refuses these
/// names rather than calling them "unknown", so a wrong symlink is easy to diagnose.
pub const STANDALONE: &[&str] = &[
    "pepsi-setup",
    "pepsi-helper-maildir-writer",
    "pepsi-stage-relay-to-maildir",
    "pepsi-helper-dot-forward",
    "pepsi-stage-dot-forward",
    "pepsi-stage-relay-to-smarthost",
    "pepsi-sendmail",
    "pepsi-quota",
    "pepsi-whitelist",
    "pepsi-keys",
    "pepsi-stage-encrypt",
    "pepsi-stage-decrypt",
    "pepsi-helper-mailbox-scan",
    "pepsi-stage-detect-language",
    "pepsi-config",
    "pepsi-httpd",
    "migadu_counters",
    "counterctl",
];

const NO_PROGRAM: &str = "no program named: run it under one of the names below (a symlink), \
                          or as `pepsi <program> [args]`";

/// The name the unified executable itself is installed under.
pub const UNIFIED: &str = "pepsi";

/// Installs the process-global stage registry that fusion (spec §22.5) looks successors up
/// in. Only the unified binary calls this, first thing, before it dispatches: a stage is
/// fused into its predecessor's pass only when both are folded into the same executable,
/// so a per-program development build, which never calls it, runs without fusion.
pub fn install_fusion() {
    use pepsi_common::stage::fusion::{install, register};
    // Every folded stage program; the privileged ones (relay-to-maildir, relay-to-smarthost)
    // run in executables of their own and so are never fused into.
    install(vec![
        register::<::pepsi_stage_aliases::Aliases>(),
        register::<::pepsi_stage_arc::ArcSealer>(),
        register::<::pepsi_stage_autocrypt_learn::AutocryptLearn>(),
        register::<::pepsi_stage_block_language::BlockLanguage>(),
        register::<::pepsi_stage_bounce::Bounce>(),
        register::<::pepsi_stage_check_whitelist::WhitelistStage>(),
        register::<::pepsi_stage_count::Count>(),
        register::<::pepsi_stage_discard::Discard>(),
        register::<::pepsi_stage_dkim_sign::DkimSign>(),
        register::<::pepsi_stage_if::If>(),
        register::<::pepsi_stage_if::IfHeaders>(),
        register::<::pepsi_stage_milter::Milter>(),
        register::<::pepsi_stage_relay_to_internet::RelayToInternet>(),
        register::<::pepsi_stage_relay_to_lmtp::RelayToLmtp>(),
        register::<::pepsi_stage_route::Route>(),
        register::<::pepsi_stage_srs::SrsProgram>(),
        register::<::pepsi_stage_vacation::VacationStage>(),
    ]);
}

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
         {UNIFIED} <program> [args...]\n       {UNIFIED} --list | --help\n\n\
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
