//! `pepsi-setup apply` carrying out a `tls_acme` task with the real certbot against a real
//! ACME server: pebble on loopback, validating http-01 for real (its names found through a
//! dnsmasq the test starts) against certbot's own web server, its API served with a test
//! CA's certificate the task's `ca_file` trusts. The certificate certbot obtains is named by
//! the listener's `TLS_CERT`, its key readable by `TLS_GROUP`, and its renewal configuration
//! holds `ACME_DEPLOY_HOOK`; a second task keeps it; certbot's own renewal keeps the key the
//! group's and runs the hook; certbot failing, running past `ACME_TIMEOUT`, or a
//! `TLS_GROUP` that does not exist fails the task and leaves `pepsi.conf` as it was.
//!
//! apply runs as root, and so do these tests (as CI does): the key goes to the group
//! `daemon`, which every Debian system has and root is not in.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pepsi_conf::config::Config;
use pepsi_testkit::TestDb;
use serde_json::{Value, json};

use crate::setup_apply::{apply, log_of};
use crate::support::ingress::{Dns, TestCa};
use crate::support::{Run, Running, free_port};

/// The name the certificate is for; the test's dnsmasq says it is 127.0.0.1.
const NAME: &str = "mx.acme.test";

/// The group given the key (`TLS_GROUP`).
const GROUP: &str = "daemon";

/// The file the deploy hook of [`config_dir`] touches.
const DEPLOYED: &str = "deployed";

/// A pebble on free loopback ports: its ACME directory, the CA its API is served with, the
/// port its http-01 validation asks, and its log (which names the issuers it made).
pub(crate) struct Pebble {
    _child: Running,
    pub(crate) directory: String,
    management: u16,
    pub(crate) api_ca: PathBuf,
    pub(crate) http_port: u16,
    pub(crate) log: PathBuf,
}

impl Pebble {
    /// Starts pebble resolving names through `dns`; ports taken between the probe and its
    /// bind are retried on others.
    pub(crate) fn start(dir: &Path, dns: &Dns) -> Pebble {
        let ca = TestCa::new(dir);
        for attempt in 0..5 {
            if let Some(pebble) = Pebble::try_start(dir, dns, &ca, attempt) {
                return pebble;
            }
        }
        panic!("pebble did not start on any of five sets of ports");
    }

    fn try_start(dir: &Path, dns: &Dns, ca: &TestCa, attempt: u32) -> Option<Pebble> {
        let (api, management, http_port, tls_port) =
            (free_port(), free_port(), free_port(), free_port());
        let config = dir.join(format!("pebble-{attempt}.json"));
        let text = json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{api}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": ca.cert,
            "privateKey": ca.key,
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
        }});
        std::fs::write(&config, text.to_string()).unwrap();
        let log = dir.join(format!("pebble-{attempt}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("pebble")
            .arg("-config")
            .arg(&config)
            .arg("-dnsserver")
            .arg(format!("127.0.0.1:{}", dns.port))
            // Real validation, without pebble's random waits and refused nonces.
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_VA_ALWAYS_VALID", "0")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("pebble is installed (pebble in scripts/apt-packages.txt)");
        let mut child = Running(child);
        for _ in 0..400 {
            if child.try_wait().unwrap().is_some() {
                return None;
            }
            let up = |port| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            if up(api) && up(management) {
                std::thread::sleep(Duration::from_millis(50));
                if child.try_wait().unwrap().is_some() {
                    return None;
                }
                return Some(Pebble {
                    _child: child,
                    directory: format!("https://127.0.0.1:{api}/dir"),
                    management,
                    api_ca: ca.ca.clone(),
                    http_port,
                    log,
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!(
            "pebble did not listen on 127.0.0.1:{api}:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// The root this pebble made at its start (a new one each start), as PEM.
    pub(crate) async fn root(&self) -> String {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let client = reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(&std::fs::read(&self.api_ca).unwrap()).unwrap(),
            )
            .build()
            .unwrap();
        let response = client
            .get(format!("https://127.0.0.1:{}/roots/0", self.management))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{response:?}");
        response.text().await.unwrap()
    }

    /// How many certificates pebble has issued so far (it logs each).
    pub(crate) fn issued(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("Issued certificate serial"))
            .count()
    }
}

/// A configuration directory for apply, as `setup_apply`'s: `pepsi.conf` naming the test
/// database, with certbot's directories in the temporary directory and its challenge
/// server on `http_port`, the key given to [`GROUP`], a deploy hook that touches
/// [`DEPLOYED`] there (never the default, which would restart a real ingress), and `extra`
/// at the end of `[pepsi-setup]`.
fn config_dir(db: &TestDb, http_port: u16, extra: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pepsi.conf");
    let d = dir.path().display();
    let text = format!(
        "# the operator's comment stays\n[database]\nURL = {url}\n\
         [pepsi]\nHOSTNAME = {NAME}\nLOCAL_DOMAINS = acme.test\n\
         [pepsi-setup]\nRELOAD_COMMAND =\nSECRETS_GROUP = root\n\
         ACME_HTTP_PORT = {http_port}\nACME_CONFIG_DIR = {d}/letsencrypt\n\
         ACME_WORK_DIR = {d}/letsencrypt-work\nACME_LOGS_DIR = {d}/letsencrypt-logs\n\
         TLS_GROUP = {GROUP}\nACME_DEPLOY_HOOK = touch {d}/{DEPLOYED}\n{extra}\
         [listener-mx]\nROLE = mx\nADDRESS = 127.0.0.1:2525\n\
         [stage-init]\nPROGRAM = pepsi-stage-discard\n\
         [stage-dkim]\nPROGRAM = pepsi-stage-dkim-sign\nDATABASE_KEYS = yes\nNEXT_STAGE = relay\n\
         [stage-relay]\nPROGRAM = pepsi-stage-relay-to-internet\n\
         [stage-local]\nPROGRAM = pepsi-stage-relay-to-maildir\nMAILDIR_ROOT = {d}/mail\n",
        url = db.url,
    );
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, path)
}

/// Adds a task as the configuration role; its id.
async fn add_task(db: &TestDb, kind: &str, params: Value) -> i64 {
    crate::setup_apply::add_task(db, "pepsi-config", kind, params).await
}

/// status and outcome of a task.
async fn task(db: &TestDb, id: i64) -> (String, String) {
    let (status, outcome, _) = crate::setup_apply::task(db, id).await;
    (status, outcome)
}

fn openssl(args: &[&str]) -> String {
    let out = Command::new("openssl").args(args).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openssl {args:?}: {text}");
    text
}

/// The gid and permission bits of `path` itself (not of what a link names).
fn group_and_mode(path: &Path) -> (u32, u32) {
    let meta = std::fs::symlink_metadata(path).unwrap();
    (meta.gid(), meta.permissions().mode() & 0o7777)
}

/// Each directory on the way to the lineage's key is the group's, 0750, and each of `keys`
/// in `archive/pepsi/` 0640.
fn assert_key_is_the_groups(dir: &Path, keys: &[&str]) {
    let gid = pepsi_conf::privilege::group_id(GROUP).unwrap().unwrap();
    let le = dir.join("letsencrypt");
    for sub in ["live", "live/pepsi", "archive", "archive/pepsi"] {
        assert_eq!(group_and_mode(&le.join(sub)), (gid, 0o750), "{sub}");
    }
    for key in keys {
        let path = le.join("archive/pepsi").join(key);
        assert_eq!(group_and_mode(&path), (gid, 0o640), "{}", path.display());
    }
    // Only the lineage's own: the ACME account's key stays root's alone.
    assert_eq!(group_and_mode(&le.join("accounts")).1, 0o700);
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_tls_acme_task_obtains_a_certificate_from_pebble_and_a_second_keeps_it() {
    let db = TestDb::new().await;
    let dns = Dns::start(&[format!("--host-record={NAME},127.0.0.1")]);
    let pebble_dir = tempfile::tempdir().unwrap();
    let pebble = Pebble::start(pebble_dir.path(), &dns);
    let (dir, conf) = config_dir(&db, pebble.http_port, "");
    let params = json!({"domains": [NAME], "email": "postmaster@acme.test",
                        "directory": pebble.directory, "ca_file": pebble.api_ca});
    let id = add_task(&db, "tls_acme", params.clone()).await;

    let run = apply(&conf);
    let log = log_of(&db, id).await;
    let pebble_log = || std::fs::read_to_string(&pebble.log).unwrap();
    assert_eq!(run.code, 0, "{run:?}\n{log}\n{}", pebble_log());
    let (status, outcome) = task(&db, id).await;
    assert_eq!(status, "done", "{outcome}\n{log}");
    // certbot's own lines, as it printed them, between the applier's steps.
    assert!(log.contains("step: running certbot certonly"), "{log}");
    assert!(
        log.contains("output: Successfully received certificate."),
        "{log}"
    );
    assert!(log.contains("[listener-mx] TLS_CERT"), "{log}");
    assert_eq!(pebble.issued(), 1, "{}", pebble_log());

    // The key is the ingress's group's, each change a step line; certbot keeps the hook in
    // the lineage's renewal configuration, and ran it for this first certificate too.
    assert_key_is_the_groups(dir.path(), &["privkey1.pem"]);
    assert!(
        log.contains(&format!(
            "privkey1.pem: group {GROUP}, mode 0640 (was gid 0, mode 0600)"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "live: group {GROUP}, mode 0750 (was gid 0, mode 0700)"
        )),
        "{log}"
    );
    let hook = format!("touch {}/{DEPLOYED}", dir.path().display());
    assert!(log.contains(&format!("'--deploy-hook={hook}'")), "{log}");
    let renewal =
        std::fs::read_to_string(dir.path().join("letsencrypt/renewal/pepsi.conf")).unwrap();
    assert!(
        renewal.lines().any(|l| l == format!("renew_hook = {hook}")),
        "{renewal}"
    );
    let deployed = dir.path().join(DEPLOYED);
    std::fs::remove_file(&deployed).expect("the hook ran for the first certificate");

    // pepsi.conf names certbot's lineage, and the certificate there is for the name, from
    // this pebble's root.
    let live = dir.path().join("letsencrypt/live/pepsi");
    let cfg = Config::load(&conf).unwrap();
    let cert = cfg.section("listener-mx").path("TLS_CERT").unwrap();
    let key = cfg.section("listener-mx").path("TLS_KEY").unwrap();
    assert_eq!(cert, live.join("fullchain.pem"));
    assert_eq!(key, live.join("privkey.pem"));
    let cert_text = cert.to_str().unwrap();
    let san = openssl(&["x509", "-in", cert_text, "-noout", "-ext", "subjectAltName"]);
    assert!(san.contains(&format!("DNS:{NAME}")), "{san}");
    let root = pebble_dir.path().join("pebble-root.pem");
    std::fs::write(&root, pebble.root().await).unwrap();
    let verified = openssl(&[
        "verify",
        "-CAfile",
        root.to_str().unwrap(),
        "-untrusted",
        live.join("chain.pem").to_str().unwrap(),
        live.join("cert.pem").to_str().unwrap(),
    ]);
    assert!(verified.contains(": OK"), "{verified}");
    assert!(
        std::fs::read_to_string(&conf)
            .unwrap()
            .starts_with("# the operator's comment stays\n")
    );
    let first = std::fs::read(&cert).unwrap();

    // Carried out again: certbot keeps the certificate (not due for renewal), pebble issues
    // nothing, and the configuration already says so.
    let again = add_task(&db, "tls_acme", params).await;
    let run = apply(&conf);
    let log = log_of(&db, again).await;
    assert_eq!(run.code, 0, "{run:?}\n{log}");
    let (status, outcome) = task(&db, again).await;
    assert_eq!(status, "done", "{outcome}\n{log}");
    assert!(outcome.contains("already said so"), "{outcome}");
    assert!(
        log.contains("output: Certificate not yet due for renewal"),
        "{log}"
    );
    assert_eq!(pebble.issued(), 1, "{}", pebble_log());
    assert_eq!(std::fs::read(&cert).unwrap(), first);
    assert_eq!(
        names_in(&dir.path().join("letsencrypt/archive/pepsi")),
        ["cert1.pem", "chain1.pem", "fullchain1.pem", "privkey1.pem"]
    );
    assert!(
        log.contains(&format!("were already group {GROUP}'s")),
        "{log}"
    );
    assert!(!deployed.exists(), "no certificate, no hook");

    // certbot's own renewal, as its timer runs it, from what the lineage's renewal
    // configuration holds: a new key, still the group's and 0640, and the hook run.
    let le = dir.path().join("letsencrypt");
    let renew = Command::new("certbot")
        .args([
            "renew",
            "--cert-name=pepsi",
            "--force-renewal",
            "--non-interactive",
            "--no-random-sleep-on-renew",
        ])
        .arg(format!("--config-dir={}", le.display()))
        .arg(format!(
            "--work-dir={}/letsencrypt-work",
            dir.path().display()
        ))
        .arg(format!(
            "--logs-dir={}/letsencrypt-logs",
            dir.path().display()
        ))
        .env("REQUESTS_CA_BUNDLE", &pebble.api_ca)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let renew = Run::of(renew);
    assert_eq!(renew.code, 0, "{renew:?}\n{}", pebble_log());
    assert_eq!(pebble.issued(), 2, "{}", pebble_log());
    assert_eq!(
        names_in(&le.join("archive/pepsi")),
        [
            "cert1.pem",
            "cert2.pem",
            "chain1.pem",
            "chain2.pem",
            "fullchain1.pem",
            "fullchain2.pem",
            "privkey1.pem",
            "privkey2.pem"
        ]
    );
    assert_ne!(
        std::fs::read(le.join("archive/pepsi/privkey2.pem")).unwrap(),
        std::fs::read(le.join("archive/pepsi/privkey1.pem")).unwrap(),
        "a new key"
    );
    assert_eq!(
        std::fs::canonicalize(&key).unwrap(),
        std::fs::canonicalize(le.join("archive/pepsi/privkey2.pem")).unwrap()
    );
    assert_key_is_the_groups(dir.path(), &["privkey1.pem", "privkey2.pem"]);
    assert!(
        deployed.exists(),
        "certbot ran the deploy hook after renewing"
    );
}

#[tokio::test]
async fn a_tls_group_that_does_not_exist_fails_the_task_before_certbot_runs() {
    let db = TestDb::new().await;
    let (dir, conf) = config_dir(&db, free_port(), "");
    let text = std::fs::read_to_string(&conf).unwrap();
    let text = text.replace(
        &format!("TLS_GROUP = {GROUP}\n"),
        "TLS_GROUP = pepsi-no-such-group\n",
    );
    std::fs::write(&conf, &text).unwrap();
    let id = add_task(
        &db,
        "tls_acme",
        json!({"domains": [NAME], "email": "postmaster@acme.test",
               "directory": format!("https://127.0.0.1:{}/dir", free_port())}),
    )
    .await;
    let run = apply(&conf);
    let log = log_of(&db, id).await;
    assert_eq!(run.code, 1, "{run:?}\n{log}");
    let (status, outcome) = task(&db, id).await;
    assert_eq!(status, "failed", "{outcome}\n{log}");
    assert!(
        outcome.contains("the group pepsi-no-such-group (TLS_GROUP)")
            && outcome.contains("does not exist"),
        "{outcome}"
    );
    assert!(!log.contains("running certbot"), "{log}");
    assert!(!dir.path().join("letsencrypt").exists());
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), text);
}

#[tokio::test]
async fn certbot_failing_fails_the_task_with_its_reason_and_changes_nothing() {
    let db = TestDb::new().await;
    let (dir, conf) = config_dir(&db, free_port(), "");
    let before = std::fs::read(&conf).unwrap();
    // Nothing listens there.
    let id = add_task(
        &db,
        "tls_acme",
        json!({"domains": [NAME], "email": "postmaster@acme.test",
               "directory": format!("https://127.0.0.1:{}/dir", free_port())}),
    )
    .await;
    let run = apply(&conf);
    let log = log_of(&db, id).await;
    assert_eq!(run.code, 1, "{run:?}\n{log}");
    let (status, outcome) = task(&db, id).await;
    assert_eq!(status, "failed", "{outcome}\n{log}");
    assert!(outcome.contains("certbot failed"), "{outcome}");
    assert!(outcome.contains("Connection refused"), "{outcome}");
    assert!(log.contains("output: "), "{log}");
    assert_eq!(std::fs::read(&conf).unwrap(), before);
    assert!(
        !names_in(dir.path()).iter().any(|n| n.contains(".bak-")),
        "{:?}",
        names_in(dir.path())
    );
}

#[tokio::test]
async fn certbot_past_acme_timeout_is_stopped_and_the_task_fails_naming_the_limit() {
    let db = TestDb::new().await;
    // An ACME server that takes the connection and never answers: certbot would wait for it
    // far longer than the limit.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let (_dir, conf) = config_dir(&db, free_port(), "ACME_TIMEOUT = 3s\n");
    let before = std::fs::read(&conf).unwrap();
    let id = add_task(
        &db,
        "tls_acme",
        json!({"domains": [NAME], "email": "postmaster@acme.test",
               "directory": format!("https://127.0.0.1:{port}/dir")}),
    )
    .await;
    let started = Instant::now();
    let run = apply(&conf);
    let took = started.elapsed();
    let log = log_of(&db, id).await;
    assert_eq!(run.code, 1, "{run:?}\n{log}");
    let (status, outcome) = task(&db, id).await;
    assert_eq!(status, "failed", "{outcome}\n{log}");
    assert!(
        outcome.contains("certbot did not finish within ACME_TIMEOUT (3s) and was stopped"),
        "{outcome}"
    );
    assert!(took < Duration::from_secs(30), "apply took {took:?}");
    assert_eq!(std::fs::read(&conf).unwrap(), before);
    drop(silent);
}
