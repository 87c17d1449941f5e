//! The table of programs (`pepsi::programs`, which the Makefile reads through `pepsi --list`
//! and `--list-standalone`) agrees with what Cargo needs beside it: the `[[bin]]` targets of
//! Cargo.toml and their required features, and the one-line mains in `src/bin/`; each stage
//! row names its own program and has a check and edges. With `PEPSI_BIN_DIR` set (the
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
fn the_cargo_targets_and_src_bin_match_the_table_of_programs() {
    let folded = support::folded_programs();
    let standalone = support::standalone_programs();
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
        "the table's two lists together must name every [[bin]] but `pepsi`"
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
    // src/bin holds the targets and nothing else, each a shim calling its row's entry point.
    let mut files: Vec<String> = std::fs::read_dir(root().join("src/bin"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut want: Vec<String> = bins.iter().map(|b| format!("{}.rs", b.name)).collect();
    want.sort();
    assert_eq!(files, want, "src/bin against the [[bin]] targets");
    for name in f.union(&s) {
        let main = std::fs::read_to_string(root().join(format!("src/bin/{name}.rs"))).unwrap();
        let call = format!("pepsi::programs::{}::main()", name.replace('-', "_"));
        assert!(
            main.contains(&call),
            "src/bin/{name}.rs does not call {call}"
        );
    }
}

#[test]
fn every_stage_row_names_its_own_program_and_has_a_check_and_edges() {
    let names: BTreeSet<&str> = programs::FOLDED
        .iter()
        .map(|p| p.name)
        .chain(programs::STANDALONE.iter().copied())
        .collect();
    for (row, program) in programs::STAGE_PROGRAMS {
        assert_eq!(row, program, "the row's name against its Stage::PROGRAM");
        assert!(
            programs::CONFIG_CHECKS.iter().any(|c| c.program == *row),
            "{row}: no configuration check"
        );
        assert!(
            programs::STAGE_EDGES.iter().any(|e| e.program == *row),
            "{row}: no edges"
        );
    }
    assert_eq!(programs::STAGE_EDGES.len(), programs::STAGE_PROGRAMS.len());
    let mut checked: Vec<&str> = programs::CONFIG_CHECKS.iter().map(|c| c.program).collect();
    checked.sort_unstable();
    let before = checked.len();
    checked.dedup();
    assert_eq!(
        checked.len(),
        before,
        "a program checked twice: {checked:?}"
    );
    for program in checked {
        assert!(
            names.contains(program),
            "{program} is checked but has no row"
        );
    }
    // Every stage program is a row with its Stage type: a stage program's name without one
    // would be checked by no parser and drawn by the default edges only.
    for name in &names {
        if name.starts_with("pepsi-stage-") {
            assert!(
                programs::STAGE_PROGRAMS.iter().any(|(n, _)| n == name),
                "{name} has no Stage type in its row"
            );
        }
    }
}

#[test]
fn pepsi_runs_every_folded_name_and_refuses_every_standalone_one() {
    for name in &support::folded_programs() {
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
    }
    for name in &support::standalone_programs() {
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
    for name in support::folded_programs() {
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
    for name in support::standalone_programs() {
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
    for &(name, program) in pepsi::programs::COMMAND_LINKS {
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
        support::folded_programs(),
        "pepsi --list"
    );
    // What the Makefile lays out and installs the standalone programs by.
    let (code, out, _) = run(&pepsi, None, &["--list-standalone"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        support::standalone_programs(),
        "pepsi --list-standalone"
    );
    // ... and links the second names by.
    let (code, out, _) = run(&pepsi, None, &["--list-links"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["pepsi-detect-language:pepsi-stage-detect-language"],
        "pepsi --list-links"
    );
    let (code, _, err) = run(&pepsi, None, &[]);
    assert_eq!(code, Some(2), "pepsi without a program: {err}");
    assert!(
        err.contains("pepsi-stage-route"),
        "the usage lists the programs: {err}"
    );
}
