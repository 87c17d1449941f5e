//! The unified binary's program lists agree everywhere they are written: the Makefile's
//! `FOLDED_BINARIES` / `STANDALONE_BINARIES` (authoritative), the `[[bin]]` targets of
//! Cargo.toml and their required features, the names `pepsi` dispatches
//! (`pepsi::programs`), and the one-line mains in `src/bin/`. With `PEPSI_BIN_DIR` set (the
//! unified layout of `make unibin`, as `scripts/test.sh` runs it) the layout itself is
//! checked too: a symlink to `pepsi` per folded name, a real file per standalone one, and
//! `pepsi` running the first and refusing the second.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use pepsi::programs::{self, Invocation};

use crate::support::{self, root};

/// A `[[bin]]` target of the root Cargo.toml.
#[derive(Debug, Default)]
struct Bin {
    name: String,
    path: String,
    required_features: Vec<String>,
}

/// The `[[bin]]` targets of the root Cargo.toml (a line reader: the file keeps each key of a
/// target on one line).
fn cargo_bins() -> Vec<Bin> {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut bins = Vec::new();
    let mut current: Option<Bin> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            bins.extend(current.take());
            if line == "[[bin]]" {
                current = Some(Bin::default());
            }
            continue;
        }
        let (Some(bin), Some((key, value))) = (current.as_mut(), line.split_once('=')) else {
            continue;
        };
        let value = value.trim();
        let unquote = |v: &str| v.trim().trim_matches('"').to_owned();
        match key.trim() {
            "name" => bin.name = unquote(value),
            "path" => bin.path = unquote(value),
            "required-features" => {
                bin.required_features = value
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .split(',')
                    .filter(|v| !v.trim().is_empty())
                    .map(unquote)
                    .collect();
            }
            _ => {}
        }
    }
    bins.extend(current);
    bins
}

fn set(names: &[String]) -> BTreeSet<&str> {
    let set: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(set.len(), names.len(), "a name listed twice: {names:?}");
    set
}

#[test]
fn the_makefile_lists_match_the_cargo_targets() {
    let folded = support::makefile_list("FOLDED_BINARIES");
    let standalone = support::makefile_list("STANDALONE_BINARIES");
    let (f, s) = (set(&folded), set(&standalone));
    assert!(
        f.is_disjoint(&s),
        "folded and standalone both: {:?}",
        f.intersection(&s).collect::<Vec<_>>()
    );
    let bins = cargo_bins();
    let targets: BTreeSet<&str> = bins
        .iter()
        .map(|b| b.name.as_str())
        .filter(|&n| n != programs::UNIFIED)
        .collect();
    let listed: BTreeSet<&str> = f.union(&s).copied().collect();
    assert_eq!(
        listed, targets,
        "the Makefile's two lists together must name every [[bin]] but `pepsi`"
    );
    for bin in &bins {
        let want: &[&str] = if bin.name == programs::UNIFIED {
            &["unibin"]
        } else if f.contains(bin.name.as_str()) {
            &["multibin"]
        } else {
            &[]
        };
        assert_eq!(
            bin.required_features, want,
            "[[bin]] {} in Cargo.toml: required-features",
            bin.name
        );
        assert_eq!(
            bin.path,
            format!("src/bin/{}.rs", bin.name),
            "[[bin]] {}",
            bin.name
        );
    }
}

#[test]
fn pepsi_runs_every_folded_name_and_refuses_every_standalone_one() {
    let folded = support::makefile_list("FOLDED_BINARIES");
    let standalone = support::makefile_list("STANDALONE_BINARIES");
    let table: Vec<&str> = programs::FOLDED.iter().map(|p| p.name).collect();
    assert_eq!(
        table, folded,
        "pepsi::programs::FOLDED against FOLDED_BINARIES"
    );
    assert_eq!(
        programs::STANDALONE,
        standalone,
        "pepsi::programs::STANDALONE against STANDALONE_BINARIES"
    );
    for name in &folded {
        let argv = [OsString::from(format!("/usr/bin/{name}")), "-h".into()];
        match programs::invocation(&argv) {
            Invocation::Run(p) => assert_eq!(p.name, name),
            other => panic!("{name}: {other:?}"),
        }
        match programs::invocation(&["pepsi".into(), name.into(), "-h".into()]) {
            Invocation::Exec { program, args } => {
                assert_eq!((program.name, args), (name.as_str(), vec!["-h".into()]))
            }
            other => panic!("pepsi {name}: {other:?}"),
        }
        // The development build's own executable for it calls the same entry point.
        let main = std::fs::read_to_string(root().join(format!("src/bin/{name}.rs"))).unwrap();
        let call = format!("pepsi::programs::{}::main()", name.replace('-', "_"));
        assert!(
            main.contains(&call),
            "src/bin/{name}.rs does not call {call}"
        );
    }
    for name in &standalone {
        match programs::invocation(&[format!("/usr/bin/{name}").into()]) {
            Invocation::Refuse { message } => {
                assert!(message.contains("not part of this binary"), "{message}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// Runs `program args`, returning (exit code, stdout, stderr).
fn run(program: &Path, arg0: Option<&str>, args: &[&str]) -> (Option<i32>, String, String) {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(program);
    if let Some(arg0) = arg0 {
        cmd.arg0(arg0);
    }
    let out = cmd.args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_unified_layout_holds_every_program_in_its_shape() {
    let Some(dir) = pepsi_testkit::programs::bin_dir() else {
        // The development build has no layout; scripts/test.sh runs this with one.
        eprintln!("PEPSI_BIN_DIR is not set: the unified layout is not checked");
        return;
    };
    let pepsi: PathBuf = dir.join(programs::UNIFIED);
    assert!(pepsi.is_file(), "{} is missing", pepsi.display());
    let target = std::fs::canonicalize(&pepsi).unwrap();
    for name in support::makefile_list("FOLDED_BINARIES") {
        let path = dir.join(&name);
        let meta =
            std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            meta.file_type().is_symlink(),
            "{} is not a symlink",
            path.display()
        );
        assert_eq!(std::fs::canonicalize(&path).unwrap(), target, "{name}");
        // Through the symlink and through `pepsi <name>`, the same program answers.
        let direct = run(&path, None, &["--help"]);
        assert_eq!(direct.0, Some(0), "{name} --help: {}", direct.2);
        let via = run(&pepsi, None, &[&name, "--help"]);
        assert_eq!(via, direct, "pepsi {name} --help against {name} --help");
    }
    for name in support::makefile_list("STANDALONE_BINARIES") {
        let path = dir.join(&name);
        let meta =
            std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            meta.is_file(),
            "{} is not its own executable",
            path.display()
        );
        let (code, _, err) = run(&pepsi, None, &[&name]);
        assert_eq!(code, Some(2), "pepsi {name}: {err}");
        assert!(
            err.contains("not part of this binary"),
            "pepsi {name}: {err}"
        );
        let (code, _, err) = run(&pepsi, Some(&name), &[]);
        assert_eq!(code, Some(2), "pepsi as {name}: {err}");
    }
    // A standalone program's second name links to it, and runs it as that name's command.
    for link in support::makefile_list("COMMAND_LINKS") {
        let (name, program) = link.split_once(':').unwrap();
        let path = dir.join(name);
        assert_eq!(
            std::fs::read_link(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
            std::path::Path::new(program)
        );
        let out = std::process::Command::new(&path)
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && help.contains(name),
            "{name} --help: {help}"
        );
    }
    let (code, out, _) = run(&pepsi, None, &["--list"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        support::makefile_list("FOLDED_BINARIES"),
        "pepsi --list"
    );
    let (code, _, err) = run(&pepsi, None, &[]);
    assert_eq!(code, Some(2), "pepsi without a program: {err}");
    assert!(
        err.contains("pepsi-stage-route"),
        "the usage lists the programs: {err}"
    );
}
