//! Where a test finds the Pepsi programs it executes: the executables cargo built for this
//! test run (their `CARGO_BIN_EXE_*` paths), or, when `PEPSI_BIN_DIR` is set, that
//! directory, typically the unified layout of `make unibin` (`pepsi` and a symlink to it per
//! folded program). `scripts/test.sh` runs the system and dispatcher tests a second time
//! that way, so they exercise the shape a release installs.

use std::path::{Path, PathBuf};

/// The environment variable naming the directory every program is taken from.
pub const BIN_DIR: &str = "PEPSI_BIN_DIR";

/// `PEPSI_BIN_DIR`, when set and not empty.
pub fn bin_dir() -> Option<PathBuf> {
    std::env::var_os(BIN_DIR)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// The program `name`: `$PEPSI_BIN_DIR/name` when that is set, else `built` (pass
/// `env!("CARGO_BIN_EXE_<name>")`). Panics, naming the directory, when the program is
/// missing from `PEPSI_BIN_DIR`.
pub fn program(name: &str, built: &str) -> PathBuf {
    match bin_dir() {
        Some(dir) => {
            let path = dir.join(name);
            assert!(
                path.is_file(),
                "{BIN_DIR}={} has no {name} (make unibin lays the directory out)",
                dir.display()
            );
            path
        }
        None => Path::new(built).to_path_buf(),
    }
}
