//! The manual pages (`pepsi::manual`, installed by `make install` and the package): every
//! `[[bin]]` of Cargo.toml has exactly one page, under its own name; each page names every
//! option and subcommand its program's command line defines; groff formats each without a
//! warning; and the hand-written pepsi.state(7) names every key docs/state.md documents.

use std::collections::BTreeSet;
use std::process::Stdio;

use pepsi::manual::{self, Page, Source};
use pepsi_conf::cli::Command;

use crate::support::root;

/// The `name = "..."` of every `[[bin]]` target of the root Cargo.toml.
fn bin_names() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut names = BTreeSet::new();
    let mut in_bin = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(value) = line.strip_prefix("name = ") {
            names.insert(value.trim_matches('"').to_owned());
        }
    }
    assert!(names.len() > 20, "read too few [[bin]] targets: {names:?}");
    // A program's second name (`pepsi::programs::COMMAND_LINKS`) is a command with a page too.
    for &(name, program) in pepsi::programs::COMMAND_LINKS {
        assert!(
            names.contains(program),
            "COMMAND_LINKS names {program}, no [[bin]]"
        );
        names.insert(name.to_owned());
    }
    names
}

fn page_text(page: &Page) -> String {
    String::from_utf8(manual::render(page).unwrap()).unwrap()
}

/// How roff source writes an option: hyphens escaped.
fn roff_flag(flag: &str) -> String {
    flag.replace('-', "\\-")
}

/// Every option and subcommand of `cmd` (depth first), as a page must name them.
fn expected_words(cmd: &Command, words: &mut Vec<String>) {
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        if let Some(long) = arg.get_long() {
            words.push(roff_flag(&format!("--{long}")));
        } else if let Some(short) = arg.get_short() {
            words.push(roff_flag(&format!("-{short}")));
        } else {
            // A positional argument is named by its value name.
            let name = arg
                .get_value_names()
                .and_then(|v| v.first().map(|s| s.to_string()))
                .unwrap_or_else(|| arg.get_id().to_string().to_uppercase());
            words.push(roff_flag(&name));
        }
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        words.push(roff_flag(
            &sub.get_bin_name().unwrap_or(sub.get_name()).to_uppercase(),
        ));
        let mut sub = sub.clone();
        sub.build();
        expected_words(&sub, words);
    }
}

#[test]
fn every_program_has_exactly_one_page_under_its_name() {
    let pages = manual::pages();
    let named: Vec<&str> = pages.iter().map(|p| p.name).collect();
    let unique: BTreeSet<String> = named.iter().map(|n| n.to_string()).collect();
    assert_eq!(
        unique.len(),
        named.len(),
        "a program with two pages: {named:?}"
    );
    assert_eq!(
        unique,
        bin_names(),
        "pepsi::manual::pages() and the [[bin]] targets of Cargo.toml differ"
    );
    for page in &pages {
        if let Source::Clap(command) = &page.source {
            assert_eq!(
                command().get_name(),
                page.name,
                "the command line of {} calls itself something else in --help",
                page.name
            );
        }
        assert!(
            [1, 8].contains(&page.section),
            "{}: section {}",
            page.name,
            page.section
        );
    }
}

#[test]
fn each_page_names_the_program_and_every_option_and_subcommand() {
    for page in manual::pages() {
        let text = page_text(&page);
        let title = format!(".TH {}", page.name.to_uppercase());
        assert!(
            text.starts_with(&title) || text.contains(&format!("\n{title}")),
            "{}: no .TH line: {}",
            page.name,
            &text[..200.min(text.len())]
        );
        assert!(text.contains(".SH NAME"), "{}: no NAME section", page.name);
        let mut words = Vec::new();
        match &page.source {
            Source::Clap(command) => {
                let mut cmd = command();
                cmd.build();
                expected_words(&cmd, &mut words);
            }
            Source::Help { .. } if page.name == "pepsi-sendmail" => {
                for flag in [
                    "-t",
                    "-f",
                    "-F",
                    "-i",
                    "-oi",
                    "-bm",
                    "-bs",
                    "-bi",
                    "-N",
                    "-R",
                    "-V",
                    "-q",
                    "--flush",
                    "-v",
                    "--config",
                    "--log-level",
                    "--help",
                    "--version",
                ] {
                    words.push(roff_flag(flag));
                }
                words.push(".SH \"EXIT STATUS (sysexits.h)\"".into());
            }
            Source::Help { .. } => {
                words.push(roff_flag("--list"));
                words.push(roff_flag("--help"));
                for p in pepsi::programs::FOLDED {
                    words.push(roff_flag(p.name));
                }
            }
        }
        assert!(words.len() >= 2, "{}: nothing to look for", page.name);
        for word in words {
            assert!(
                text.contains(&word),
                "the page of {} does not name {word}:\n{text}",
                page.name
            );
        }
    }
}

/// groff's own check: a page with a roff mistake (a line read as an unknown request, an
/// unbalanced font escape) warns with -ww. `-k` reads UTF-8 through preconv, as man(1) does.
fn groff_warnings(text: &[u8]) -> String {
    let mut child = std::process::Command::new("groff")
        .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("groff (Debian groff-base, in scripts/apt-packages.txt)");
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(text).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "groff failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn groff_formats_every_page_without_a_warning() {
    for page in manual::pages() {
        let warnings = groff_warnings(&manual::render(&page).unwrap());
        assert!(warnings.is_empty(), "{}: {warnings}", page.name);
    }
    for (file, text) in manual::HAND_WRITTEN {
        let warnings = groff_warnings(text.as_bytes());
        assert!(warnings.is_empty(), "{file}: {warnings}");
    }
    // The check can fail: an unknown request is reported.
    assert!(!groff_warnings(b".TH X 1\n.SH NAME\n.XYZZY\nx\n").is_empty());
}

#[test]
fn pepsi_state_7_names_every_key_of_docs_state_md() {
    let doc = std::fs::read_to_string(root().join("docs/state.md")).unwrap();
    // The key table: rows `| `key` | written by | read by | shape |`.
    let keys: Vec<String> = doc
        .lines()
        .filter(|l| l.starts_with("| `") && l.matches('|').count() == 5)
        .filter_map(|l| l.split('`').nth(1).map(str::to_owned))
        .filter(|k| !k.contains(' ') && !k.contains(','))
        .collect();
    assert!(
        keys.len() >= 14,
        "read too few keys from docs/state.md: {keys:?}"
    );
    let page = manual::HAND_WRITTEN
        .iter()
        .find(|(f, _)| *f == "pepsi.state.7")
        .unwrap()
        .1;
    for key in keys {
        assert!(
            page.contains(&format!(".B {key}\n")) || page.contains(&format!(".BR {key} ")),
            "pepsi.state(7) does not document the state key {key:?} of docs/state.md"
        );
    }
}

#[test]
fn write_all_lays_out_the_pages_by_section() {
    let dir = tempfile::tempdir().unwrap();
    let written = manual::write_all(dir.path()).unwrap();
    let mut want: BTreeSet<String> = manual::pages()
        .iter()
        .map(|p| format!("man{}/{}", p.section, p.file_name()))
        .collect();
    want.insert("man7/pepsi.state.7".into());
    let got: BTreeSet<String> = written
        .iter()
        .map(|p| {
            p.strip_prefix(dir.path())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(got, want);
    assert!(
        std::fs::read_to_string(dir.path().join("man8/pepsi-ingress.8"))
            .unwrap()
            .contains(".TH PEPSI-INGRESS 8")
    );
}
