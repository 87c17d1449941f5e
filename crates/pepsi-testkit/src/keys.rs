//! Private keys made by the `openssl` command for the tests of key loading, DKIM signing
//! and ARC sealing: a real key of each kind, in the PEM files an operator would give.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `openssl genpkey` arguments for a 2048-bit RSA key.
pub const RSA: &[&str] = &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"];
/// `openssl genpkey` arguments for an Ed25519 key.
pub const ED25519: &[&str] = &["-algorithm", "ED25519"];
/// `openssl genpkey` arguments for a P-256 EC key.
pub const EC_P256: &[&str] = &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];

/// Writes `openssl genpkey <args>` to `dir/name` (PEM) and returns its path.
pub fn openssl_key(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let path = dir.join(name);
    let status = Command::new("openssl")
        .arg("genpkey")
        .args(args)
        .arg("-out")
        .arg(&path)
        .stderr(Stdio::null())
        .status()
        .expect("openssl must be installed");
    assert!(status.success(), "openssl genpkey {args:?}");
    path
}
