use super::*;

#[test]
fn keys_spec_table() {
    let good = parse_keys(
        "Example.Test.:sel1:/etc/pepsi/dkim/a.pem, example.test:ed1:/k/b:c.pem\n other.test:s_2:k.pem",
    )
    .unwrap();
    assert_eq!(
        good,
        vec![
            KeySpec {
                domain: "example.test".into(),
                selector: "sel1".into(),
                path: "/etc/pepsi/dkim/a.pem".into()
            },
            KeySpec {
                domain: "example.test".into(),
                selector: "ed1".into(),
                path: "/k/b:c.pem".into()
            },
            KeySpec {
                domain: "other.test".into(),
                selector: "s_2".into(),
                path: "k.pem".into()
            },
        ]
    );
    for (bad, why) in [
        ("", "at least one"),
        ("example.test:sel1", "missing field"),
        ("example.test", "missing field"),
        ("example.test:sel1:", "no key file"),
        ("localhost:sel1:/k.pem", "not a domain"),
        ("exa mple.test:sel1:/k.pem", "not a domain"),
        ("example.test::/k.pem", "not a selector"),
        ("example.test:s el:/k.pem", "not a selector"),
        ("example.test:s1:/a.pem, EXAMPLE.test:s1:/b.pem", "twice"),
    ] {
        let err = parse_keys(bad).unwrap_err();
        assert!(err.contains(why), "{bad:?}: {err}");
    }
}

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

#[test]
fn key_files_load_or_are_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let rsa = openssl_key(
        dir.path(),
        "rsa.pem",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    );
    let ed = openssl_key(dir.path(), "ed.pem", &["-algorithm", "ED25519"]);
    let ec = openssl_key(
        dir.path(),
        "ec.pem",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    assert!(matches!(load_key(&rsa).unwrap(), DkimKey::Rsa(_)));
    assert!(matches!(load_key(&ed).unwrap(), DkimKey::Ed25519(_)));

    let missing = dir.path().join("missing.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a key\n").unwrap();
    for (path, why) in [
        (&missing, "cannot read"),
        (&garbage, "not a usable private key"),
        (&ec, "not a usable private key"),
    ] {
        let err = format!("{:#}", load_key(path).err().unwrap());
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains(why), "{err}");
    }

    // Through the configuration: the error names the section and the file.
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
