//! Helpers shared by the root-level tests that run stage programs as processes.

use std::io::Write as _;
use std::path::Path;
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
