//! The Debian packages of `make deb` (packaging/deb.sh, debian/): what they contain and with
//! which modes (dpkg-deb --info / --contents), that the privileges list names exactly the
//! bits and groups of spec 22.2, `make install` into a DESTDIR, and then a real
//! installation: the three packages installed with `dpkg -i` into a throwaway root (an overlay of
//! this machine's root in a private mount and PID namespace, so nothing outside the test's
//! directory changes), where the postinst makes the accounts, sets the bits through
//! dpkg-statoverride, installs the configuration and, with no PostgreSQL on the socket,
//! prints the next step; `systemd-analyze verify` passes the installed units without a word;
//! with a private PostgreSQL of that root's own (peer authentication, as on Debian) the
//! postinst runs `pepsi-setup db` from the tree; and one message sent to the installed
//! ingress (as pepsi-ingress) is delivered by the installed dispatcher (as pepsi) through the
//! setgid stage and the setuid writer into a Maildir, written as the mailbox's owner. The
//! telemetry receiver's package stands alone (no dependency on `pepsi`), makes its account and
//! first token, says what the database needs until `pepsi-setup db` has made its role, and
//! then serves as its own account.
//!
//! The packages are built from the development profile (`make deb PROFILE=dev`: only the
//! root package compiles again for the unified layout, as scripts/test.sh's `make unibin
//! PROFILE=dev` does). Installing needs root (dpkg, mount, chroot), which the test suite's
//! machine has: it installs Debian packages with apt-get.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{self, root};

/// A line of packaging/privileges.txt.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Privilege {
    kind: String,
    path: String,
    owner: String,
    group: String,
    mode: u32,
}

/// The installed file of `p` under `upper` (a program under `libexec`, relative to it) has
/// exactly the list's mode, owner and group, the accounts as that root's own files name them.
fn assert_applied(upper: &Path, libexec: &str, p: &Privilege) {
    let path = match p.kind.as_str() {
        "program" => upper.join(libexec).join(&p.path),
        _ => upper.join(p.path.trim_start_matches('/')),
    };
    let meta = std::fs::metadata(&path)
        .unwrap_or_else(|e| panic!("{} not installed: {e}", path.display()));
    assert_eq!(meta.mode() & 0o7777, p.mode, "{}", path.display());
    assert_eq!(meta.uid(), id_in(upper, "passwd", &p.owner), "{}", p.path);
    assert_eq!(meta.gid(), id_in(upper, "group", &p.group), "{}", p.path);
}

fn privileges() -> Vec<Privilege> {
    let text = std::fs::read_to_string(root().join("packaging/privileges.txt")).unwrap();
    text.lines()
        .filter(|l| l.starts_with("program") || l.starts_with("dir"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 5, "privileges.txt: {l:?}");
            Privilege {
                kind: f[0].into(),
                path: f[1].into(),
                owner: f[2].into(),
                group: f[3].into(),
                mode: u32::from_str_radix(f[4], 8).unwrap(),
            }
        })
        .collect()
}

#[test]
fn the_privileges_list_holds_exactly_the_bits_of_the_spec() {
    let programs: Vec<(String, String, String, u32)> = privileges()
        .into_iter()
        .filter(|p| p.kind == "program")
        .map(|p| (p.path, p.owner, p.group, p.mode))
        .collect();
    let want = [
        (
            "pepsi-helper-maildir-writer",
            "root",
            "pepsi-maildir",
            0o4750,
        ),
        (
            "pepsi-stage-relay-to-maildir",
            "root",
            "pepsi-maildir",
            0o2755,
        ),
        ("pepsi-quota", "root", "pepsi-maildir", 0o2750),
        ("pepsi-helper-dot-forward", "root", "pepsi-forward", 0o4750),
        ("pepsi-stage-dot-forward", "root", "pepsi-forward", 0o2755),
        ("pepsi-helper-auto-pay", "root", "pepsi-auto-pay", 0o4750),
        ("pepsi-stage-auto-pay", "root", "pepsi-auto-pay", 0o2755),
        (
            "pepsi-stage-relay-to-smarthost",
            "root",
            "pepsi-token",
            0o2755,
        ),
        ("pepsi-sendmail", "root", "pepsi-sendmail", 0o2755),
        ("pepsi-whitelist", "pepsi", "root", 0o4755),
        ("pepsi-stage-encrypt", "pepsi-crypto", "pepsi", 0o4750),
        ("pepsi-stage-decrypt", "pepsi-crypto", "pepsi", 0o4750),
    ];
    let want: Vec<(String, String, String, u32)> = want
        .iter()
        .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), *d))
        .collect();
    assert_eq!(programs, want);
    // A bit on the shared `pepsi` would apply to every folded program.
    let standalone = support::standalone_programs();
    for (name, ..) in &programs {
        assert!(
            standalone.contains(name),
            "{name} carries a bit but is not standalone in pepsi::programs"
        );
    }
    // The writer's group is the one its caller is set-group-id to, and no one else's.
    let text = std::fs::read_to_string(root().join("packaging/privileges.txt")).unwrap();
    for group in [
        "pepsi-maildir",
        "pepsi-forward",
        "pepsi-auto-pay",
        "pepsi-sendmail",
        "pepsi-token",
    ] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["group", group]),
            "privileges.txt does not create the group {group}"
        );
    }
}

/// The packages of scripts/apt-packages.txt's sections as scripts/services.sh reads them
/// (`listed_packages`, what `make run` and `make test` install), one per line.
fn listed_packages(sections: &[&str]) -> Vec<String> {
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#". scripts/services.sh && listed_packages . "$@""#)
        .arg("listed_packages")
        .args(sections)
        .current_dir(root())
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "listed_packages {sections:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Guards the one list of Debian packages: debian/control's Build-Depends is exactly the
/// [build] section of scripts/apt-packages.txt, `make run` installs [build] and [run],
/// `make test` every section, and no package is listed twice or outside a section.
#[test]
fn build_depends_is_the_build_section_of_the_one_package_list() {
    let control = std::fs::read_to_string(root().join("debian/control")).unwrap();
    // The field with its continuation lines (deb822: a line starting with a space).
    let mut field = None::<String>;
    for line in control.lines().filter(|l| !l.starts_with('#')) {
        match (&mut field, line.strip_prefix("Build-Depends:")) {
            (None, Some(v)) => field = Some(v.to_owned()),
            (Some(f), None) if line.starts_with([' ', '\t']) => f.push_str(line),
            (Some(_), _) => break,
            _ => {}
        }
    }
    let field = field.expect("debian/control has a Build-Depends field");
    let build_depends: Vec<String> = field
        .split(',')
        .map(|d| d.trim().to_owned())
        .filter(|d| !d.is_empty())
        .collect();
    let build = listed_packages(&["build"]);
    assert!(
        [
            "libclang-dev",
            "nettle-dev",
            "libssl-dev",
            "pkg-config",
            "gcc"
        ]
        .iter()
        .all(|p| build.iter().any(|b| b == p)),
        "the [build] section lacks what the crypto crates compile against: {build:?}"
    );
    assert_eq!(
        build_depends, build,
        "debian/control's Build-Depends and scripts/apt-packages.txt's [build] differ"
    );

    let all = listed_packages(&[]);
    let mut by_section: Vec<String> = ["build", "run", "test"]
        .iter()
        .flat_map(|s| listed_packages(&[s]))
        .collect();
    assert_eq!(
        by_section, all,
        "a package of scripts/apt-packages.txt is outside [build], [run] and [test]"
    );
    by_section.sort();
    by_section.dedup();
    assert_eq!(
        by_section.len(),
        all.len(),
        "a package is listed twice: {all:?}"
    );
    for p in ["postgresql", "swaks", "openssl", "python3"] {
        assert!(
            listed_packages(&["run"]).iter().any(|r| r == p),
            "{p} (used by scripts/run.sh) is not in the [run] section"
        );
    }

    let run_sh = std::fs::read_to_string(root().join("scripts/run.sh")).unwrap();
    assert!(
        run_sh
            .lines()
            .any(|l| l.trim() == r#"install_listed_packages "$root" build run"#),
        "scripts/run.sh does not install the [build] and [run] sections"
    );
    let test_sh = std::fs::read_to_string(root().join("scripts/test.sh")).unwrap();
    assert!(
        test_sh
            .lines()
            .any(|l| l.trim() == r#"install_listed_packages "$root""#),
        "scripts/test.sh does not install every section"
    );
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

/// An entry of `dpkg-deb --contents`.
#[derive(Debug)]
struct Entry {
    mode: String,
    owner: String,
    link: Option<String>,
}

fn contents(deb: &Path) -> BTreeMap<String, Entry> {
    let listing = run(Command::new("dpkg-deb").arg("--contents").arg(deb));
    let mut entries = BTreeMap::new();
    for line in listing.lines() {
        // -rwxr-xr-x root/root   1234 2026-12-01 21:00 ./usr/bin/x -> y
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() >= 6, "dpkg-deb --contents: {line:?}");
        let path = f[5]
            .trim_start_matches('.')
            .trim_end_matches('/')
            .to_owned();
        let link = (f.len() == 8 && f[6] == "->").then(|| f[7].to_owned());
        entries.insert(
            path,
            Entry {
                mode: f[0].into(),
                owner: f[1].into(),
                link,
            },
        );
    }
    entries
}

/// `make ARGS` in the checkout, one at a time: `make unibin` and `make man`, which `install`
/// and `deb` run first, rebuild one shared directory of the build (flock(1) on a file
/// beside it keeps this binary's tests from doing that at once).
fn make(args: &[&str]) -> String {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    std::fs::create_dir_all(&target).unwrap();
    run(Command::new("flock")
        .arg(target.join("package-test.lock"))
        .args(["make", "--no-print-directory"])
        .args(args)
        .current_dir(root()))
}

/// Builds both packages with `make deb PROFILE=dev` into `dir`.
/// Builds the three packages with `make deb PROFILE=dev` into `dir`: pepsi, migadu-counters
/// and pepsi-telemetry.
pub(crate) fn build_debs(dir: &Path, extra: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    let deb_dir = format!("DEB_DIR={}", dir.display());
    let mut args = vec!["deb", "PROFILE=dev", deb_dir.as_str()];
    args.extend_from_slice(extra);
    let out = make(&args);
    let debs: Vec<PathBuf> = out
        .lines()
        .filter(|l| l.ends_with(".deb"))
        .map(PathBuf::from)
        .collect();
    let find = |name: &str| {
        debs.iter()
            .find(|d| {
                d.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{name}_"))
            })
            .unwrap_or_else(|| panic!("make deb made no {name} package: {out}"))
            .clone()
    };
    (
        find("pepsi"),
        find("migadu-counters"),
        find("pepsi-telemetry"),
    )
}

/// The programs of the other packages, which the pepsi package leaves out.
const NOT_PEPSIS: [&str; 3] = ["migadu_counters", "counterctl", "pepsi-telemetry"];

fn check_contents(pepsi: &Path, counters: &Path, telemetry: &Path) {
    let info = run(Command::new("dpkg-deb").arg("--info").arg(pepsi));
    for want in [
        "Package: pepsi",
        "Version: 0.1.0",
        "Depends: libc6 (>= 2.36), libgcc-s1, libssl3, libnettle8, libhogweed6, libgmp10, passwd, openssl",
        " postinst",
        " prerm",
        " postrm",
    ] {
        assert!(
            info.contains(want),
            "pepsi's control lacks {want:?}:\n{info}"
        );
    }
    assert!(
        !info.contains("mail-transport-agent"),
        "the default package claims the MTA role: {info}"
    );
    let c = contents(pepsi);
    let entry = |path: &str| {
        c.get(path)
            .unwrap_or_else(|| panic!("pepsi has no {path}: {:?}", c.keys().collect::<Vec<_>>()))
    };
    let unified = entry("/usr/libexec/pepsi/pepsi");
    assert_eq!(
        (unified.mode.as_str(), unified.owner.as_str()),
        ("-rwxr-xr-x", "root/root")
    );
    for name in support::folded_programs() {
        assert_eq!(
            entry(&format!("/usr/libexec/pepsi/{name}")).link.as_deref(),
            Some("pepsi"),
            "{name} beside pepsi"
        );
        assert_eq!(
            entry(&format!("/usr/bin/{name}")).link.as_deref(),
            Some("../libexec/pepsi/pepsi"),
            "{name} in /usr/bin"
        );
    }
    for name in support::standalone_programs() {
        let path = format!("/usr/libexec/pepsi/{name}");
        if NOT_PEPSIS.contains(&name.as_str()) {
            assert!(
                !c.contains_key(&path) && !c.contains_key(&format!("/usr/bin/{name}")),
                "{name} is another package's, not pepsi's"
            );
            continue;
        }
        // Shipped without a bit: the postinst sets it once the group exists.
        let e = entry(&path);
        assert_eq!(
            (e.mode.as_str(), e.owner.as_str()),
            ("-rwxr-xr-x", "root/root"),
            "{name}"
        );
        assert_eq!(
            entry(&format!("/usr/bin/{name}")).link.as_deref(),
            Some(format!("../libexec/pepsi/{name}").as_str())
        );
    }
    for (path, e) in &c {
        let special = e.mode.contains('s') || e.mode.contains('S');
        assert!(!special, "{path} is set-id in the archive: {}", e.mode);
        assert_eq!(e.owner, "root/root", "{path}");
    }
    for page in pepsi::manual::pages() {
        let path = format!("/usr/share/man/man{}/{}", page.section, page.file_name());
        assert_eq!(
            c.contains_key(&path),
            !NOT_PEPSIS.contains(&page.name),
            "{path}"
        );
    }
    entry("/usr/share/man/man7/pepsi.state.7");
    for unit in [
        "pepsi.target",
        "pepsi-dispatch.service",
        "pepsi-ingress.service",
        "pepsi-httpd.service",
        "pepsi-failure-bouncer.service",
        "pepsi-sendmail-pickup.service",
        "pepsi-list-maintain.service",
        "pepsi-list-maintain.timer",
        "pepsi-secretary-digest.service",
        "pepsi-secretary-digest.timer",
        "pepsi-token-refresh.service",
        "pepsi-token-refresh.timer",
        "pepsi-tlsrpt.service",
        "pepsi-tlsrpt.timer",
        "pepsi-setup-apply.service",
        "pepsi-telemetry-client.service",
    ] {
        assert_eq!(
            entry(&format!("/usr/lib/systemd/system/{unit}")).mode,
            "-rw-r--r--"
        );
    }
    entry("/usr/share/pepsi/privileges.txt");
    entry("/usr/share/pepsi/pepsi.conf");
    entry("/usr/share/doc/pepsi/install.md");
    // The configuration is the postinst's to install (never overwritten); sendmail is
    // optional (INSTALL_SENDMAIL=yes).
    assert!(!c.keys().any(|p| p.starts_with("/etc/pepsi")), "{c:?}");
    assert!(!c.contains_key("/usr/sbin/sendmail"));

    let info = run(Command::new("dpkg-deb").arg("--info").arg(counters));
    assert!(info.contains("Package: migadu-counters"), "{info}");
    let c = contents(counters);
    for path in [
        "/usr/bin/migadu_counters",
        "/usr/bin/counterctl",
        "/usr/lib/systemd/system/migadu_counters.service",
        "/etc/logrotate.d/migadu-counters",
        "/usr/share/man/man8/migadu_counters.8",
        "/usr/share/man/man1/counterctl.1",
        "/usr/share/doc/migadu-counters/config.toml.example",
    ] {
        assert!(c.contains_key(path), "migadu-counters has no {path}");
    }
    assert!(!c.keys().any(|p| p.contains("libexec/pepsi")));

    // The receiver's package stands alone: it runs on a host without Pepsi.
    let info = run(Command::new("dpkg-deb").arg("--info").arg(telemetry));
    for want in [
        "Package: pepsi-telemetry",
        "Version: 0.1.0",
        "Depends: libc6 (>= 2.36), libgcc-s1, passwd\n",
        " postinst",
        " prerm",
        " postrm",
        " conffiles",
    ] {
        assert!(
            info.contains(want),
            "pepsi-telemetry's control lacks {want:?}:\n{info}"
        );
    }
    let depends = info
        .lines()
        .find(|l| l.trim_start().starts_with("Depends:"))
        .unwrap();
    assert!(!depends.contains("pepsi"), "{depends}");
    let c = contents(telemetry);
    let modes: Vec<(&str, &str)> = [
        "/usr/bin/pepsi-telemetry",
        "/usr/lib/systemd/system/pepsi-telemetry.service",
        "/usr/share/man/man8/pepsi-telemetry.8",
        "/etc/pepsi-telemetry/pepsi-telemetry.conf",
        "/usr/share/doc/pepsi-telemetry/telemetry.md",
        "/usr/share/doc/pepsi-telemetry/copyright",
    ]
    .into_iter()
    .map(|path| {
        let e = c
            .get(path)
            .unwrap_or_else(|| panic!("pepsi-telemetry has no {path}: {:?}", c.keys()));
        assert_eq!(e.owner, "root/root", "{path}");
        (path, e.mode.as_str())
    })
    .collect();
    assert_eq!(
        modes.iter().map(|(_, m)| *m).collect::<Vec<_>>(),
        [
            "-rwxr-xr-x",
            "-rw-r--r--",
            "-rw-r--r--",
            "-rw-r--r--",
            "-rw-r--r--",
            "-rw-r--r--"
        ],
        "{modes:?}"
    );
    // Its program, its unit and its page only: no token (the postinst makes one), nothing
    // of the pepsi package.
    assert!(
        !c.keys()
            .any(|p| p.contains("libexec") || p.contains("/etc/pepsi/") || p.ends_with("tokens")),
        "{:?}",
        c.keys()
    );
    let conffiles = run(Command::new("dpkg-deb")
        .arg("--info")
        .arg(telemetry)
        .arg("conffiles"));
    assert_eq!(conffiles, "/etc/pepsi-telemetry/pepsi-telemetry.conf\n");
}

/// What runs inside the throwaway root, as root: install, check, set up, deliver.
const INSIDE: &str = r#"
set -eu
exec 2>&1
say() { echo "== $*"; }
say "dpkg -i"
dpkg -i /debs/pepsi_*.deb /debs/migadu-counters_*.deb /debs/pepsi-telemetry_*.deb
say "statoverrides"
dpkg-statoverride --list '/usr/libexec/pepsi/*' | sort
say "systemd-analyze verify"
systemd-analyze verify --man=yes /usr/lib/systemd/system/pepsi.target \
  /usr/lib/systemd/system/pepsi-*.service /usr/lib/systemd/system/pepsi-*.timer \
  /usr/lib/systemd/system/migadu_counters.service
say "verified"

# A PostgreSQL of this root's own, on its socket (peer authentication, as Debian's), and
# the postinst once more: now it sets the database up itself.
say "PostgreSQL"
bin="$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)")"
install -d -o postgres -g postgres -m 2775 /run/postgresql
install -d -o postgres -g postgres -m 0700 /tmp/pgdata
runuser -u postgres -- "$bin/initdb" -D /tmp/pgdata --auth=peer -U postgres >/dev/null
runuser -u postgres -- "$bin/pg_ctl" -D /tmp/pgdata -w -l /tmp/pg.log \
  -o "-c listen_addresses= -k /run/postgresql -c fsync=off" start >/dev/null
say "postinst configure"
/var/lib/dpkg/info/pepsi.postinst configure 0.1.0

# The receiver's package on the same root: pepsi-setup db made its role, so its postinst now
# finds the database; then it serves as its account, with its packaged configuration.
say "telemetry postinst configure"
/var/lib/dpkg/info/pepsi-telemetry.postinst configure 0.1.0
tconf=/etc/pepsi-telemetry/pepsi-telemetry.conf
tport="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
sed -i "s/^LISTEN = 127.0.0.1:4318\$/LISTEN = 127.0.0.1:$tport/" "$tconf"
runuser -u pepsi-telemetry -- pepsi-telemetry -c "$tconf" >/tmp/telemetry.log 2>&1 &
python3 - "$tport" <<'EOP' || { cat /tmp/telemetry.log; exit 1; }
import sys, time, urllib.request
for _ in range(300):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%s/healthz" % sys.argv[1], timeout=5) as r:
            print("== telemetry healthz: %d %s" % (r.status, r.read().decode()))
            break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("the installed pepsi-telemetry does not answer")
EOP
say "telemetry served"

# The services as their accounts, each its own database role by peer authentication.
conf=/etc/pepsi/pepsi.conf
sed -i "s/^ADDRESS = 127.0.0.1:2525\$/ADDRESS = 127.0.0.1:$SMTP_PORT/" "$conf"
runuser -u pepsi-httpd -- pepsi-settings -c "$conf" account add alice@example.test --no-password
useradd --no-create-home --home-dir /nonexistent alice
install -d -o alice -g alice -m 0700 /var/lib/pepsi/mail/alice \
  /var/lib/pepsi/mail/alice/Maildir /var/lib/pepsi/mail/alice/Maildir/tmp \
  /var/lib/pepsi/mail/alice/Maildir/new /var/lib/pepsi/mail/alice/Maildir/cur
mkdir -p /tmp/logs
runuser -u pepsi -- pepsi-dispatch -c "$conf" >/tmp/logs/dispatch.log 2>&1 &
runuser -u pepsi-ingress -- pepsi-ingress -c "$conf" >/tmp/logs/ingress.log 2>&1 &
logs() { for f in /tmp/logs/*.log /tmp/pg.log; do echo "--- $f"; tail -n 40 "$f"; done; }
say "send"
python3 - "$SMTP_PORT" <<'EOP' || { logs; exit 1; }
import smtplib, sys, time
port = int(sys.argv[1])
for _ in range(300):
    try:
        s = smtplib.SMTP("127.0.0.1", port, timeout=10)
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit("the installed pepsi-ingress does not answer")
s.sendmail("bob@example.test", ["alice@example.test"],
           b"From: bob@example.test\r\nTo: alice@example.test\r\n"
           b"Subject: installed from the package\r\n\r\nHello from the throwaway root.\r\n")
s.quit()
EOP
for _ in $(seq 1 600); do
  if [ -n "$(ls -A /var/lib/pepsi/mail/alice/Maildir/new)" ]; then
    say "delivered"
    ls -ln /var/lib/pepsi/mail/alice/Maildir/new
    # The setuid helpers serve their caller only. A user who runs a setgid stage with a
    # HELPER of their own lends that program the stage's group as its effective gid only:
    # refused. The dispatcher's account, pepsi, is served.
    lib=/usr/libexec/pepsi
    as_nobody() { g="$1"; shift; setpriv --reuid=nobody --rgid=nogroup --egid="$g" --clear-groups "$@"; }
    rc=0; out="$(as_nobody pepsi-forward $lib/pepsi-helper-dot-forward </dev/null 2>&1)" || rc=$?
    say "reader as nobody: $rc $out"
    rc=0; out="$(as_nobody pepsi-maildir $lib/pepsi-helper-maildir-writer --root /var/lib/pepsi/mail </dev/null 2>&1)" || rc=$?
    say "writer as nobody: $rc $out"
    rc=0; out="$(as_nobody pepsi-auto-pay $lib/pepsi-helper-auto-pay </dev/null 2>&1)" || rc=$?
    say "payer as nobody: $rc $out"
    rc=0; out="$(echo 'forward alice' | setpriv --reuid=pepsi --rgid=pepsi --egid=pepsi-forward --clear-groups $lib/pepsi-helper-dot-forward 2>/dev/null)" || rc=$?
    say "reader as pepsi: $rc $out"
    # The smarthost stage is set-group-id pepsi-token (it reads the OAuth token files) and,
    # started through its bit, serves its service account only: nobody is refused.
    say "smarthost stage mode: $(stat -c '%a %U:%G' $lib/pepsi-stage-relay-to-smarthost)"
    rc=0; out="$(setpriv --reuid=nobody --regid=nogroup --clear-groups $lib/pepsi-stage-relay-to-smarthost worker </dev/null 2>&1)" || rc=$?
    say "smarthost stage as nobody: $rc $out"
    say "token directory: $(stat -c '%a %U:%G' /var/lib/pepsi/tokens)"
    # The token refresher's account reads the configuration and secrets.d/ (group pepsi);
    # with no [token-<name>] section it has nothing to do.
    rc=0; out="$(runuser -u pepsi-token -- pepsi-helper-token-refresh -c "$conf" once 2>&1)" || rc=$?
    say "token refresh as pepsi-token: $rc $out|"
    # pepsi-whitelist is setuid pepsi: alice edits her own list through the service
    # account's role (peer authentication), only hers, and only by the system configuration;
    # its scan reads her Maildir as her.
    md=/var/lib/pepsi/mail/alice/Maildir
    install -d -o alice -g alice -m 0700 $md/.Sent $md/.Sent/cur $md/.Sent/new $md/.Sent/tmp
    printf 'From: alice@example.test\r\nTo: Carol <carol@example.net>\r\n\r\nhi\r\n' > "$md/.Sent/cur/1.a.host:2,S"
    chown alice:alice "$md/.Sent/cur/1.a.host:2,S"; chmod 0600 "$md/.Sent/cur/1.a.host:2,S"
    wl() {
      label="$1"; shift; rc=0
      out="$(runuser -u alice -- pepsi-whitelist "$@" 2>&1)" || rc=$?
      say "whitelist $label: $rc $(printf '%s\n' "$out" | tr '\n' '|')"
    }
    wl add add bob@example.org
    wl other --mailbox carol@example.test list
    wl config -c /etc/pepsi/pepsi.conf list
    wl learn learn
    wl list list
    exit 0
  fi
  sleep 0.1
done
say "not delivered"
logs
exit 1
"#;

/// Purges both packages from the throwaway root: what `apt purge` leaves is the operator's.
const PURGE: &str = r#"
set -eu
exec 2>&1
dpkg --purge pepsi migadu-counters pepsi-telemetry
echo "== overrides left:"
dpkg-statoverride --list '/usr/libexec/pepsi/*' || true
echo "== end"
[ -e /etc/pepsi ] || echo "/etc/pepsi removed"
[ -e /usr/libexec/pepsi ] || echo "/usr/libexec/pepsi removed"
[ -e /var/lib/pepsi/mail/alice/Maildir/new ] && echo "the Maildirs kept"
getent passwd pepsi >/dev/null && echo "the accounts kept"
[ -e /etc/pepsi-telemetry ] || echo "/etc/pepsi-telemetry removed"
getent passwd pepsi-telemetry >/dev/null && echo "the receiver's account kept"
"#;

/// Mounts the throwaway root (an overlay of / whose changes land in `dir/upper`, kept from
/// one call to the next) in a private mount and PID namespace and runs `script` there;
/// every process it started ends with the namespace.
fn in_throwaway_root(dir: &Path, debs: &Path, script: &str) -> String {
    in_root_with(dir, &[(debs, "/debs")], &[], script)
}

/// `in_throwaway_root` with directories of this machine bound into it (`binds`: host path,
/// path inside) and extra environment variables for the script.
fn in_root_with(dir: &Path, binds: &[(&Path, &str)], env: &[(&str, &str)], script: &str) -> String {
    let out = root_command(dir, binds, env, script).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "in the throwaway root:\n{text}");
    println!("{text}");
    text
}

/// The command that runs `script` in the throwaway root of `dir`, with `binds` and `env` as
/// `in_root_with` takes them and `SMTP_PORT` a free port. Its network is this machine's, so
/// a server the script starts on loopback is reached from outside. When the command ends,
/// killed or not, so does every process the script started (`--kill-child`, and the
/// namespace's first process takes the others with it).
pub(crate) fn root_command(
    dir: &Path,
    binds: &[(&Path, &str)],
    env: &[(&str, &str)],
    script: &str,
) -> Command {
    let merged = dir.join("root");
    for d in ["upper", "work", "root"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let binds: String = binds
        .iter()
        .map(|(host, inside)| {
            format!(
                "mkdir -p \"$m{inside}\" && mount --bind '{}' \"$m{inside}\"\n",
                host.display()
            )
        })
        .collect();
    let env: String = env.iter().map(|(k, v)| format!(" {k}='{v}'")).collect();
    let outer = format!(
        r#"set -eu
m='{m}'
mount -t overlay overlay -o lowerdir=/,upperdir='{d}/upper',workdir='{d}/work' "$m"
mount -t proc proc "$m/proc"
mount --rbind /dev "$m/dev"
mount -t tmpfs tmpfs "$m/tmp"
# No PostgreSQL socket of the host's: the postinst first finds no server.
mount -t tmpfs tmpfs "$m/run"
{binds}exec chroot "$m" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
  SMTP_PORT='{port}'{env} /bin/sh -c "$INSIDE"
"#,
        m = merged.display(),
        d = dir.display(),
        port = support::free_port(),
    );
    let mut command = Command::new("unshare");
    command
        .args([
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
        ])
        .args(["/bin/sh", "-c", &outer])
        .env("INSIDE", script);
    command
}

/// The numeric id of `name` in the throwaway root's passwd or group file.
pub(crate) fn id_in(upper: &Path, file: &str, name: &str) -> u32 {
    let text = std::fs::read_to_string(upper.join("etc").join(file)).unwrap();
    text.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f[0] == name).then(|| f[2].parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {name} in the installed /etc/{file}"))
}

#[test]
fn the_package_installs_into_a_throwaway_root_and_delivers_a_message() {
    let dir = tempfile::Builder::new()
        .prefix("pepsi-package-")
        .tempdir()
        .unwrap();
    let debs = dir.path().join("deb");
    let (pepsi, counters, telemetry) = build_debs(&debs, &[]);
    check_contents(&pepsi, &counters, &telemetry);

    // INSTALL_SENDMAIL=yes: a package that is this host's MTA.
    let (mta, ..) = build_debs(&dir.path().join("deb-mta"), &["INSTALL_SENDMAIL=yes"]);
    let info = run(Command::new("dpkg-deb").arg("--info").arg(&mta));
    for want in [
        "Provides: mail-transport-agent",
        "Conflicts: mail-transport-agent",
        "Replaces: mail-transport-agent",
    ] {
        assert!(info.contains(want), "{want}: {info}");
    }
    assert_eq!(
        contents(&mta)["/usr/sbin/sendmail"].link.as_deref(),
        Some("/usr/libexec/pepsi/pepsi-sendmail")
    );

    let tree = dir.path().join("tree");
    let log = in_throwaway_root(&tree, &debs, INSIDE);

    // The postinst: first no PostgreSQL on the socket, so it says what to do next; run
    // again with one, it sets the database up (pepsi-setup db from the tree).
    let (first, second) = log
        .split_once("== postinst configure\n")
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        first.contains("no PostgreSQL answers on this host")
            && first.contains("runuser -u postgres -g postgres -G pepsi -- pepsi-setup db"),
        "{first}"
    );
    assert!(
        second.contains("created the database")
            && second.contains("applied patch: pepsi-0001")
            && second.contains("pepsi: the database is set up (pepsi-setup db)."),
        "{second}"
    );
    // That PostgreSQL has peer authentication only, so the postinst says how to let local
    // submission in, with the exact lines of docs/sendmail.md.
    assert!(
        second.contains("local submission (sendmail) cannot reach the database yet")
            && second.contains("local  pepsi  pepsi-sendmail  peer map=pepsi-sendmail")
            && second.contains("pepsi-sendmail  /^(.*)$  pepsi-sendmail"),
        "{second}"
    );
    // systemd-analyze verify exits 0 and has nothing to say about any unit.
    let verify = log
        .split("== systemd-analyze verify\n")
        .nth(1)
        .and_then(|rest| rest.split_once("== verified"))
        .map(|(said, _)| said)
        .unwrap_or_else(|| panic!("systemd-analyze verify did not pass:\n{log}"));
    assert!(verify.trim().is_empty(), "systemd-analyze verify: {verify}");
    assert!(log.contains("== delivered"), "{log}");
    // The setuid helpers refuse a user who only borrows their group, and serve pepsi.
    for (who, helper) in [
        ("reader", "pepsi-helper-dot-forward"),
        ("writer", "pepsi-helper-maildir-writer"),
        ("payer", "pepsi-helper-auto-pay"),
    ] {
        let line = log
            .lines()
            .find(|l| l.starts_with(&format!("== {who} as nobody: ")))
            .unwrap_or_else(|| panic!("no {who} probe:\n{log}"));
        assert!(
            line.starts_with(&format!(
                "== {who} as nobody: 1 {helper}: started by uid 65534"
            )) && line.contains("CALLER pepsi"),
            "{line}"
        );
    }
    assert!(
        log.contains("== reader as pepsi: 0 none no home directory /nonexistent"),
        "{log}"
    );
    // The smarthost stage reads the OAuth token files through its group, and only for its
    // service account.
    for want in [
        "== smarthost stage mode: 2755 root:pepsi-token",
        "== token directory: 750 pepsi-token:pepsi-token",
        "== token refresh as pepsi-token: 0 |",
    ] {
        assert!(log.contains(want), "{want}:\n{log}");
    }
    let line = log
        .lines()
        .find(|l| l.starts_with("== smarthost stage as nobody: "))
        .unwrap_or_else(|| panic!("no smarthost stage probe:\n{log}"));
    assert!(
        line.starts_with(
            "== smarthost stage as nobody: 1 pepsi-stage-relay-to-smarthost: started by uid 65534"
        ) && line.contains("the service account pepsi"),
        "{line}"
    );

    // pepsi-whitelist through its setuid bit, run by alice (docs/whitelist.md).
    for want in [
        "== whitelist add: 0 alice@example.test: bob@example.org added|",
        "== whitelist other: 2 pepsi-whitelist: --mailbox carol@example.test: not a mailbox of alice's",
        "== whitelist config: 2 pepsi-whitelist: -c/--config: started through its setuid bit",
        "== whitelist learn: 0 alice@example.test: 1 learnt, 0 confirmed (1 messages read in \
         /var/lib/pepsi/mail/alice/Maildir, 0 not read)",
        "== whitelist list: 0 alice@example.test: 2 entries|",
    ] {
        assert!(log.contains(want), "{want}:\n{log}");
    }
    let list = log
        .lines()
        .find(|l| l.starts_with("== whitelist list: "))
        .unwrap();
    assert!(
        list.contains("|bob@example.org    owner") && list.contains("|carol@example.net  sent"),
        "{list}"
    );

    // The bits of the list, on the installed files, with the groups the postinst made.
    let upper = tree.join("upper");
    for p in privileges() {
        assert_applied(&upper, "usr/libexec/pepsi", &p);
        if p.kind == "program" {
            let line = format!(
                "{} {} {:o} /usr/libexec/pepsi/{}",
                p.owner, p.group, p.mode, p.path
            );
            assert!(log.contains(&line), "no statoverride {line:?}:\n{log}");
        }
    }
    // The configuration: installed once, readable by all, secrets by group pepsi only.
    let pepsi_gid = id_in(&upper, "group", "pepsi");
    for (path, mode) in [
        ("etc/pepsi/pepsi.conf", 0o644),
        ("etc/pepsi/secrets.d/20-srs.conf", 0o640),
        ("etc/pepsi/keys/example.test.pepsi.pem", 0o640),
    ] {
        let meta = std::fs::metadata(upper.join(path)).unwrap();
        assert_eq!(
            (meta.mode() & 0o7777, meta.uid(), meta.gid()),
            (mode, 0, pepsi_gid),
            "{path}"
        );
    }
    // The service accounts, in group pepsi where they read secrets.d/.
    let group = std::fs::read_to_string(upper.join("etc/group")).unwrap();
    let members = group
        .lines()
        .find(|l| l.starts_with("pepsi:"))
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    for user in [
        "pepsi-ingress",
        "pepsi-httpd",
        "pepsi-config",
        "pepsi-token",
    ] {
        assert!(
            members.split(',').any(|m| m == user),
            "{user} not in pepsi: {members}"
        );
    }
    id_in(&upper, "passwd", "migadu_counters");

    // The message, written by the setuid writer as the mailbox's owner.
    let new = upper.join("var/lib/pepsi/mail/alice/Maildir/new");
    let files: Vec<PathBuf> = std::fs::read_dir(&new)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let meta = std::fs::metadata(&files[0]).unwrap();
    assert_eq!(
        meta.uid(),
        id_in(&upper, "passwd", "alice"),
        "owner of the delivered file"
    );
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        text.contains("Subject: installed from the package"),
        "{text}"
    );
    assert!(text.contains("Hello from the throwaway root."), "{text}");

    // The receiver's package: before PostgreSQL, its postinst says what the database needs;
    // after `pepsi-setup db`, it finds its role there, and the installed service answers as
    // its own account.
    for want in [
        "pepsi-telemetry: a first bearer token is in /etc/pepsi-telemetry/tokens",
        "pepsi-telemetry: the database cannot be used yet:",
        "    local  pepsi  pepsi-telemetry  peer map=pepsi-telemetry",
        "    pepsi-telemetry  pepsi-telemetry  pepsi-telemetry",
        "    hostssl  pepsi  pepsi-telemetry  <this host's address>/32  scram-sha-256",
    ] {
        assert!(first.contains(want), "{want}:\n{first}");
    }
    let telemetry = second
        .split_once("== telemetry postinst configure\n")
        .and_then(|(_, rest)| rest.split_once("== telemetry served"))
        .map(|(said, _)| said)
        .unwrap_or_else(|| panic!("{second}"));
    for want in [
        "pepsi-telemetry: database: pepsi-telemetry@/var/run/postgresql/pepsi answers, with pepsi-0027",
        "== telemetry healthz: 200 {\"status\":\"ok\"}",
    ] {
        assert!(telemetry.contains(want), "{want}:\n{telemetry}");
    }
    assert!(!telemetry.contains("first bearer token"), "{telemetry}");
    let receiver = id_in(&upper, "group", "pepsi-telemetry");
    for (path, mode, gid) in [
        ("etc/pepsi-telemetry/tokens", 0o640, receiver),
        ("etc/pepsi-telemetry/pepsi-telemetry.conf", 0o644, 0),
    ] {
        let meta = std::fs::metadata(upper.join(path)).unwrap();
        assert_eq!(
            (meta.mode() & 0o7777, meta.uid(), meta.gid()),
            (mode, 0, gid),
            "{path}"
        );
    }
    let passwd = std::fs::read_to_string(upper.join("etc/passwd")).unwrap();
    let account = passwd
        .lines()
        .find(|l| l.starts_with("pepsi-telemetry:"))
        .unwrap();
    assert!(
        account.ends_with(":/nonexistent:/usr/sbin/nologin"),
        "{account}"
    );
    assert!(
        !members.split(',').any(|m| m == "pepsi-telemetry"),
        "the receiver's account reads no secret of pepsi's: {members}"
    );

    // Purged: the programs, the configuration and the statoverrides go; mail and accounts
    // stay.
    let purge = in_throwaway_root(&tree, &debs, PURGE);
    let left = purge
        .split_once("== overrides left:\n")
        .and_then(|(_, rest)| rest.split_once("== end"))
        .map(|(left, _)| left)
        .unwrap_or_else(|| panic!("{purge}"));
    assert!(
        left.trim().is_empty(),
        "statoverrides left after purge: {left}"
    );
    for said in [
        "/etc/pepsi removed",
        "/usr/libexec/pepsi removed",
        "the Maildirs kept",
        "the accounts kept",
        "/etc/pepsi-telemetry removed",
        "the receiver's account kept",
    ] {
        assert!(purge.contains(said), "{said}: {purge}");
    }
}

/// The packaged configuration's `postgres:///pepsi` relies on this for peer authentication.
#[test]
fn a_database_url_without_a_user_means_the_account_the_program_runs_as() {
    let account = run(Command::new("id").arg("-un"));
    let options: sqlx::postgres::PgConnectOptions = "postgres:///pepsi".parse().unwrap();
    if std::env::var_os("PGUSER").is_none() {
        assert_eq!(options.get_username(), account.trim());
    }
    let options: sqlx::postgres::PgConnectOptions =
        "postgres://someone@localhost/pepsi".parse().unwrap();
    assert_eq!(options.get_username(), "someone");
}

#[test]
fn make_install_into_destdir_lays_out_the_programs_and_prints_the_modes_it_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("dest");
    let destdir = format!("DESTDIR={}", dest.display());
    let out = make(&[
        "install",
        "PROFILE=dev",
        "PREFIX=/opt/pepsi",
        "INSTALL_SENDMAIL=yes",
        &destdir,
    ]);
    let prefix = dest.join("opt/pepsi");
    let libexec = prefix.join("libexec/pepsi");
    let link = |p: PathBuf| {
        std::fs::read_link(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .to_string_lossy()
            .into_owned()
    };
    assert!(std::fs::metadata(libexec.join("pepsi")).unwrap().is_file());
    for name in support::folded_programs() {
        assert_eq!(link(libexec.join(&name)), "pepsi");
        assert_eq!(
            link(prefix.join("bin").join(&name)),
            "../libexec/pepsi/pepsi"
        );
    }
    for name in support::standalone_programs() {
        let meta = std::fs::symlink_metadata(libexec.join(&name)).unwrap();
        assert!(meta.is_file(), "{name} is its own file");
        // Not root's install (DESTDIR): plain modes, nothing set-id.
        assert_eq!(meta.mode() & 0o7777, 0o755, "{name}");
        assert_eq!(
            link(prefix.join("bin").join(&name)),
            format!("../libexec/pepsi/{name}")
        );
    }
    assert_eq!(
        link(dest.join("usr/sbin/sendmail")),
        "/opt/pepsi/libexec/pepsi/pepsi-sendmail"
    );
    // What a root install would set, from the list, printed rather than applied.
    assert!(out.contains("installed without owners and bits"), "{out}");
    for p in privileges() {
        let path = match p.kind.as_str() {
            "program" => format!("/opt/pepsi/libexec/pepsi/{}", p.path),
            _ => p.path.clone(),
        };
        let line = format!("{:04o} {}:{} {} {}", p.mode, p.owner, p.group, p.kind, path);
        assert!(
            out.contains(&line),
            "make install does not print {line:?}:\n{out}"
        );
    }
    // The configuration, and the pages.
    let conf = dest.join("etc/pepsi/pepsi.conf");
    assert_eq!(
        std::fs::read_to_string(&conf).unwrap(),
        std::fs::read_to_string(root().join("etc/pepsi.conf")).unwrap()
    );
    assert!(dest.join("etc/pepsi/secrets.d").is_dir());
    assert!(prefix.join("share/man/man8/pepsi-dispatch.8").is_file());
    assert!(prefix.join("share/man/man7/pepsi.state.7").is_file());
    assert!(prefix.join("share/pepsi/privileges.txt").is_file());

    // A second install keeps a configuration the operator changed.
    std::fs::write(&conf, "# mine\n").unwrap();
    let out = make(&["install", "PROFILE=dev", "PREFIX=/opt/pepsi", &destdir]);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "# mine\n");
    assert!(out.contains("kept"), "{out}");

    // As root without DESTDIR (in a throwaway root): the accounts of the list are made and
    // its owners, groups and bits applied with chown and chmod.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let folded = support::folded_programs().join(" ");
    let standalone = support::standalone_programs().join(" ");
    let tree = dir.path().join("tree");
    // The layout of `make unibin` is rebuilt by the other tests' make: hold their lock
    // (flock(2), as flock(1) takes it) while it is read.
    let lock = std::fs::File::create(target.join("package-test.lock")).unwrap();
    // SAFETY: flock on a file descriptor this function owns; released when `lock` closes.
    let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    assert_eq!(locked, 0, "flock: {}", std::io::Error::last_os_error());
    let log = in_root_with(
        &tree,
        &[
            (root(), "/src"),
            (&target.join("debug/unibin"), "/unibin"),
            (&target.join("debug/man"), "/man"),
        ],
        &[
            ("PREFIX", "/usr/local"),
            ("UNIBIN_DIR", "/unibin"),
            ("MAN_DIR", "/man"),
            ("FOLDED", &folded),
            ("STANDALONE", &standalone),
        ],
        "set -eu; exec 2>&1; /src/packaging/install.sh; /usr/local/bin/pepsi --list",
    );
    assert!(!log.contains("installed without owners and bits"), "{log}");
    // The installed multi-call binary answers with its programs (whichever comes first).
    assert!(
        log.lines().any(|l| l.trim() == "pepsi-dispatch"),
        "pepsi --list: {log}"
    );
    let upper = tree.join("upper");
    for p in privileges() {
        assert_applied(&upper, "usr/local/libexec/pepsi", &p);
    }
    let conf = std::fs::metadata(upper.join("etc/pepsi/pepsi.conf")).unwrap();
    assert_eq!(conf.gid(), id_in(&upper, "group", "pepsi"));
    drop(lock);
}

/// Security review 2026-12-04 (informational): the configuration `make install` and the
/// package install as /etc/pepsi/pepsi.conf (etc/pepsi.conf itself) does not let a root
/// shell serve pepsi-httpd as root; only `make run`'s PEPSI_ALLOW_ROOT=yes does.
#[test]
fn security_review_info_the_installed_configuration_does_not_serve_httpd_as_root() {
    // SAFETY: a plain getter.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test runs as root");
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pepsi-httpd"))
        .arg("-c")
        .arg(root().join("etc/pepsi.conf"))
        .arg("serve")
        .env_remove("PEPSI_ALLOW_ROOT")
        .env_remove("PEPSI_CONFIG")
        .env("PEPSI_HOME", home.path())
        .env("PEPSI_SECRETS_DIR", home.path().join("secrets.d"))
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/pepsi")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("will not serve as root"), "{err}");
    let run = std::fs::read_to_string(root().join("scripts/run.sh")).unwrap();
    assert!(run.contains("export PEPSI_ALLOW_ROOT=yes"));
}
