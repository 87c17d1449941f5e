//! The shape of the test targets, where a test could otherwise be silently left out: with
//! `autotests = false` a file under `tests/` that is not a module of
//! `tests/integration/main.rs` would never be compiled, and with `test = false` on the
//! `[[bin]]` targets a test in `src/bin/` would never run.

use std::collections::BTreeSet;
use std::path::Path;

use crate::support::root;

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

#[test]
fn every_file_under_tests_is_a_module_of_the_one_harness() {
    let tests = root().join("tests");
    assert_eq!(
        names(&tests),
        BTreeSet::from(["integration".to_owned()]),
        "tests/ holds only the harness: a new test file goes into tests/integration/"
    );
    let main = std::fs::read_to_string(tests.join("integration/main.rs")).unwrap();
    let declared: BTreeSet<String> = main
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_owned)
        .collect();
    let files: BTreeSet<String> = names(&tests.join("integration"))
        .into_iter()
        .filter(|n| n != "main.rs")
        .map(|n| n.strip_suffix(".rs").unwrap_or(&n).to_owned())
        .collect();
    assert_eq!(
        files, declared,
        "every file of tests/integration/ is a `mod` of main.rs, and every `mod` a file"
    );
}

/// The `[[bin]]` targets build no test executable (`test = false`), so a test written in
/// `src/bin/` would never run: the programs' code and tests belong to their crates.
#[test]
fn the_program_entry_points_hold_no_test() {
    let bin = root().join("src/bin");
    for name in names(&bin) {
        let text = std::fs::read_to_string(bin.join(&name)).unwrap();
        assert!(
            !text.contains("#[test]") && !text.contains("::test]"),
            "src/bin/{name} holds a test, which no test executable would run"
        );
    }
}
