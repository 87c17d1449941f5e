//! Helpers shared by the root-level tests that run stage programs as processes.
#![allow(dead_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `program worker -c config`, feeds it `input` and returns its stdout lines; the
/// worker must exit 0 at end of input.
pub fn stage_worker(program: &str, config: &Path, input: &str) -> Vec<String> {
    let mut child = Command::new(program)
        .args(["worker", "-c"])
        .arg(config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "worker exited {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The test stage example, built by `cargo test` beside the test binaries.
pub fn test_stage() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("examples").join("pepsi-test-stage");
    assert!(
        path.is_file(),
        "{} is missing: cargo test builds the examples",
        path.display()
    );
    path
}
