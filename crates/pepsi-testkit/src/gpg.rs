//! A private GnuPG home for tests that check interop with the real GnuPG (2.2,
//! `/usr/bin/gpg`): unattended options, key generation and export. A missing gpg fails the
//! test that asks for one; it never skips it.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The GnuPG every interop test runs.
pub const GPG: &str = "/usr/bin/gpg";

/// A private GnuPG home; its agent is stopped when the test ends.
pub struct Gpg {
    pub home: tempfile::TempDir,
}

impl Default for Gpg {
    fn default() -> Self {
        Self::new()
    }
}

impl Gpg {
    pub fn new() -> Gpg {
        let version = Command::new(GPG).arg("--version").output();
        match version {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!(
                "{GPG} --version failed ({}): GnuPG 2.2 is required for these tests",
                o.status
            ),
            Err(e) => panic!("cannot run {GPG} ({e}): GnuPG 2.2 is required for these tests"),
        }
        let home = tempfile::Builder::new()
            .prefix("gpg")
            .tempdir()
            .expect("a temporary GNUPGHOME");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        Gpg { home }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.home.path().join(name)
    }

    pub fn write(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, data).unwrap();
        p
    }

    /// Runs gpg with the unattended options; status lines go to stdout.
    pub fn run(&self, args: &[&str]) -> Output {
        let out = Command::new(GPG)
            .arg("--homedir")
            .arg(self.home.path())
            .args([
                "--batch",
                "--no-tty",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                "--trust-model",
                "always",
                "--status-fd",
                "1",
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("gpg runs");
        assert!(
            out.status.success(),
            "gpg {args:?} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    pub fn import(&self, name: &str, key: &[u8]) {
        let p = self.write(name, key);
        self.run(&["--import", p.to_str().unwrap()]);
    }

    /// A new gpg key: ed25519 signing primary, with a cv25519 encryption subkey when
    /// `encrypt`. Returns its fingerprint.
    pub fn generate(&self, uid: &str, encrypt: bool) -> String {
        self.run(&["--quick-gen-key", uid, "ed25519", "sign", "never"]);
        let listing = self.run(&["--with-colons", "--list-keys", uid]);
        let fpr = String::from_utf8_lossy(&listing.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("fpr:"))
            .map(|rest| rest.trim_matches(':').to_owned())
            .expect("a fingerprint in the key listing");
        if encrypt {
            self.run(&["--quick-add-key", &fpr, "cv25519", "encr", "never"]);
        }
        fpr
    }

    pub fn export(&self, what: &str, uid: &str) -> Vec<u8> {
        let file = self.path("export");
        let _ = std::fs::remove_file(&file);
        self.run(&["--output", file.to_str().unwrap(), what, uid]);
        let out = std::fs::read(&file).unwrap();
        assert!(!out.is_empty(), "gpg {what} {uid} exported nothing");
        out
    }
}

impl Drop for Gpg {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--kill", "gpg-agent"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
