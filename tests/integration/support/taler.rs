//! GNU Taler's side of the secretary and auto-pay tests, as test peers: the loopback
//! merchant stand-in (`stage_secretary/merchant.py`: the two endpoints the secretary speaks
//! and one that plays a wallet's payment), the test wallet's path (`stage_secretary/wallet.py`)
//! and a system account made for a test to pay as (useradd, removed when dropped).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::system::Proc;

/// The merchant stand-in's access token.
pub const TOKEN: &str = "secret-token:auto-pay-test";

/// The test wallet, a stand-in for a Taler wallet.
pub fn wallet_program() -> PathBuf {
    super::root().join("tests/integration/stage_secretary/wallet.py")
}

/// One system account made for the test, with its home directory, removed when dropped.
/// Its name is this process's own, so two runs on one machine do not meet.
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub home: PathBuf,
    _dir: tempfile::TempDir,
}

impl Account {
    pub fn create(letter: &str) -> Account {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let name = format!("pap{}{letter}", std::process::id());
        let home = dir.path().join(&name);
        let _ = Command::new("userdel").arg(&name).output();
        let out = Command::new("useradd")
            .args([
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "--home-dir",
            ])
            .arg(&home)
            .arg(&name)
            .output()
            .expect("useradd (the auto-pay test makes a system account: run it as root)");
        assert!(
            out.status.success(),
            "useradd {name} (the auto-pay test makes a system account: run it as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::create_dir(&home).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        let chown = Command::new("chown")
            .arg(format!("{name}:"))
            .arg(&home)
            .status()
            .unwrap();
        assert!(chown.success());
        let uid = pepsi_conf::privilege::account(&name)
            .unwrap()
            .expect("the account just made")
            .uid;
        Account {
            name,
            uid,
            home,
            _dir: dir,
        }
    }

    /// The lines the test wallet wrote: (its uid, the URI).
    pub fn wallet_log(&self) -> Vec<(u32, String)> {
        std::fs::read_to_string(self.home.join("wallet.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let (uid, uri) = l.split_once(' ').unwrap();
                (uid.parse().unwrap(), uri.to_owned())
            })
            .collect()
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// The loopback merchant stand-in, a test peer.
pub struct Merchant {
    _proc: Proc,
    pub port: u16,
    /// Its log: each request as METHOD PATH BODY.
    pub log: PathBuf,
}

impl Merchant {
    /// Started on a free port, its log in `dir`, with the access token [`TOKEN`].
    pub fn start(dir: &Path) -> Merchant {
        let port = super::free_port();
        let log = dir.join("merchant.log");
        let child = Command::new("/usr/bin/python3")
            .arg(super::root().join("tests/integration/stage_secretary/merchant.py"))
            .arg(port.to_string())
            .arg(TOKEN)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("/usr/bin/python3");
        let until = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "the merchant did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Merchant {
            _proc: Proc {
                child,
                name: "merchant.py",
            },
            port,
            log,
        }
    }

    /// A private API call; the answer's JSON text.
    pub fn call(&self, method: &str, path: &str, body: &str) -> String {
        let out = Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(
                "import sys, urllib.request\n\
                 m, url, token, body = sys.argv[1:]\n\
                 r = urllib.request.Request(url, data=body.encode() if m == 'POST' else None, \
                 method=m, headers={'Authorization': 'Bearer ' + token})\n\
                 print(urllib.request.urlopen(r).read().decode())",
            )
            .args([
                method,
                &format!("http://127.0.0.1:{}{path}", self.port),
                TOKEN,
                body,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A new order's pay URI.
    pub fn order(&self) -> (String, String) {
        let made = self.call(
            "POST",
            "/private/orders",
            r#"{"order": {"amount": "KUDOS:0.5", "summary": "postage"}}"#,
        );
        let id = made.split('"').nth(3).unwrap().to_owned();
        let status = self.call("GET", &format!("/private/orders/{id}"), "");
        assert!(status.contains("unpaid"), "{status}");
        (
            id.clone(),
            format!("taler://pay/127.0.0.1:{}/{id}/", self.port),
        )
    }

    pub fn paid(&self, id: &str) -> bool {
        self.call("GET", &format!("/private/orders/{id}"), "")
            .contains("\"paid\"")
    }

    /// What a wallet's payment does: the order is paid (the stand-in's own endpoint).
    pub fn pay(&self, order: &str) {
        let out = Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(format!(
                "import urllib.request; urllib.request.urlopen(urllib.request.Request(\
                 'http://127.0.0.1:{}/test/pay/{order}', data=b'', method='POST'))",
                self.port
            ))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
