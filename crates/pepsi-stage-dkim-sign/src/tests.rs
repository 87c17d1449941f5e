use std::path::{Path, PathBuf};

use super::*;

fn openssl_key(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let path = dir.join(name);
    let status = std::process::Command::new("openssl")
        .arg("genpkey")
        .args(args)
        .arg("-out")
        .arg(&path)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    path
}

/// The key files themselves are pepsi_common::keys's test; here, through the
/// configuration: the error names the section, the option and the file.
#[test]
fn key_file_errors_name_the_section_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let cfg = Config::from_str_named(
        &format!(
            "[stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nKEYS = example.test:s1:{}\n",
            missing.display()
        ),
        "test.conf",
    )
    .unwrap();
    let err = format!("{:#}", DkimSign::from_config(&cfg).err().unwrap());
    assert!(err.contains("[stage-dkim] KEYS"), "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");
}

#[test]
fn headers_and_domains() {
    let dir = tempfile::tempdir().unwrap();
    let ed = openssl_key(dir.path(), "ed.pem", &["-algorithm", "ED25519"]);
    let cfg = Config::from_str_named(
        &format!(
            "[stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nKEYS = example.test:s1:{0}\n\
             HEADERS = to, From, Subject, to\nPARENT_DOMAINS = yes\n\
             [stage-plain]\nPROGRAM = pepsi-stage-dkim-sign\nKEYS = example.test:s1:{0}\n",
            ed.display()
        ),
        "test.conf",
    )
    .unwrap();
    let sign = DkimSign::from_config(&cfg).unwrap();
    let dkim = &sign.stages["dkim"];
    assert_eq!(dkim.headers, ["From", "From", "to", "Subject"]);
    assert_eq!(dkim.keys_for("Example.test").unwrap().0, "example.test");
    assert_eq!(dkim.keys_for("a.b.example.test").unwrap().0, "example.test");
    assert!(dkim.keys_for("other.test").is_none());
    let plain = &sign.stages["plain"];
    assert_eq!(&plain.headers[..3], ["From", "From", "Reply-To"]);
    assert!(plain.keys_for("a.example.test").is_none());

    assert_eq!(
        from_domain(b"To: x@y.test\r\nFrom: \"A, B\" <A@Mail.Example.TEST>\r\n").as_deref(),
        Some("mail.example.test")
    );
    assert_eq!(from_domain(b"To: x@y.test\r\n"), None);
}

#[test]
fn section_errors_name_the_option() {
    for (options, want) in [
        ("", "[stage-dkim] KEYS is required"),
        ("KEYS = example.test:sel1\n", "KEYS"),
        (
            "KEYS = example.test:s1:/k.pem\nHEADERS = From, Bad:Name\n",
            "HEADERS",
        ),
        (
            "KEYS = example.test:s1:/k.pem\nPARENT_DOMAINS = maybe\n",
            "PARENT_DOMAINS",
        ),
    ] {
        let cfg = Config::from_str_named(
            &format!("[stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\n{options}"),
            "test.conf",
        )
        .unwrap();
        let err = format!("{:#}", DkimSign::from_config(&cfg).err().unwrap());
        assert!(err.contains(want), "{options:?}: {err}");
    }
    // A section running another program is not read.
    let cfg = Config::from_str_named(
        "[stage-other]\nPROGRAM = pepsi-stage-discard\nKEYS = nonsense\n",
        "test.conf",
    )
    .unwrap();
    assert!(DkimSign::from_config(&cfg).unwrap().stages.is_empty());
}
