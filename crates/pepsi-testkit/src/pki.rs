//! A test CA and the certificates it issues, made with the `openssl` command (OpenSSL 3):
//! for the S/MIME interop tests and the HTTPS peers of the integration tests. A missing
//! openssl fails the test that asks for it; it never skips it.

use std::path::Path;
use std::process::{Command, Output};

/// Runs openssl in `dir`; panics with its output when it fails.
pub fn openssl(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "these tests need the openssl command (OpenSSL 3) on PATH; running it failed: {e}"
            )
        });
    assert!(
        out.status.success(),
        "openssl {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `ca.pem` and `ca.key` in `dir` (CN "Pepsi Test CA", 30 days), unless they exist.
pub fn ensure_ca(dir: &Path) {
    if dir.join("ca.pem").exists() {
        return;
    }
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "30",
            "-subj",
            "/CN=Pepsi Test CA",
        ],
    );
}

/// `<name>.pem` and `<name>.key` in `dir`: a certificate the test CA issued with the
/// subject `subject` and the extensions `extensions` (an openssl extfile's lines).
pub fn issue(dir: &Path, name: &str, subject: &str, extensions: &str) {
    ensure_ca(dir);
    std::fs::write(dir.join(format!("{name}.ext")), extensions).unwrap();
    let (key, csr, pem, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
        format!("{name}.ext"),
    );
    openssl(
        dir,
        &[
            "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
            subject,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "30",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    );
}

/// An S/MIME certificate for `address` (SAN email, emailProtection, signing and key
/// encipherment) issued by the test CA: `<name>.pem`, `<name>.key`.
pub fn issue_email(dir: &Path, name: &str, address: &str) {
    issue(
        dir,
        name,
        &format!("/CN={address}"),
        &format!(
            "subjectAltName = email:{address}\nextendedKeyUsage = emailProtection\n\
             keyUsage = critical, digitalSignature, keyEncipherment\nbasicConstraints = CA:FALSE\n"
        ),
    );
}
