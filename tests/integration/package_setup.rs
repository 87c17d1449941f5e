//! The browser setup of an installed server, end to end: both packages installed with
//! `dpkg -i` into the package test's throwaway root, its own PostgreSQL with peer
//! authentication given exactly the `pg_hba.conf` and `pg_ident.conf` lines the postinst
//! prints, pepsi-httpd running as `pepsi-httpd` and `pepsi-setup apply --follow` as root;
//! then, from outside the root, Chromium opens `/setup`, makes the first administrator and
//! answers the interview with a certificate from a loopback ACME server (pebble, its names
//! found through a dnsmasq of the test's, its API trusted through the task's CA file), and
//! switches the whitelists off, and watches every task end done. The configuration apply wrote is then the one in force: the
//! installed ingress offers pebble's certificate for the host name, and a message to the
//! wizard's mailbox in the wizard's domain is delivered into its Maildir.
//!
//! Installing needs root, as the package test does; the root shares this machine's network,
//! which is how the browser, pebble and certbot reach what runs inside it.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::httpd_setup::first_administrator;
use crate::package::{build_debs, id_in, root_command};
use crate::setup_apply_acme::Pebble;
use crate::support::browser::Browser;
use crate::support::ingress::Dns;
use crate::support::{Running, free_port};

/// The wizard's host name (the MX; the test's dnsmasq says it is 127.0.0.1) and domain.
const HOSTNAME: &str = "mx.mail.test";
const DOMAIN: &str = "mail.test";

const ADMIN_PASSWORD: &str = "the first administrator's password";

/// What runs inside the throwaway root, as root: install, let pepsi-httpd write tasks,
/// serve the pages, wait for the browser's answers to be carried out, then run the mail
/// system on the configuration apply wrote and deliver one message.
const INSIDE: &str = r#"
set -eu
exec 2>&1
say() { echo "== $*"; }
wait_port() {
  python3 - "$1" <<'EOP'
import socket, sys, time
for _ in range(600):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit("nothing listens on port %s" % sys.argv[1])
EOP
}
mkdir -p /tmp/logs
logs() { for f in /tmp/logs/*.log /tmp/pg.log; do echo "--- $f"; tail -n 60 "$f"; done; }
dpkg -i /debs/pepsi_*.deb /debs/migadu-counters_*.deb >/tmp/logs/dpkg.log

say "PostgreSQL"
bin="$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)")"
install -d -o postgres -g postgres -m 2775 /run/postgresql
install -d -o postgres -g postgres -m 0700 /tmp/pgdata
runuser -u postgres -- "$bin/initdb" -D /tmp/pgdata --auth=peer -U postgres >/dev/null
runuser -u postgres -- "$bin/pg_ctl" -D /tmp/pgdata -w -l /tmp/pg.log \
  -o "-c listen_addresses= -k /run/postgresql -c fsync=off" start >/dev/null
say "postinst configure"
/var/lib/dpkg/info/pepsi.postinst configure 0.1.0 >/tmp/postinst.out 2>&1
cat /tmp/postinst.out

# What the postinst says to add for the setup pages, added as it says: the pg_hba.conf line
# before the "local all all peer" one, the pg_ident.conf lines at the end.
sed -n '/the setup pages cannot write setup tasks yet/,/systemctl reload postgresql/p' \
  /tmp/postinst.out >/tmp/access.txt
grep -E '^ +local +pepsi +pepsi-config ' /tmp/access.txt | sed 's/^ *//' >/tmp/hba.add
grep -E '^ +pepsi-config +[a-z-]+ +pepsi-config$' /tmp/access.txt | sed 's/^ *//' \
  >>/tmp/pgdata/pg_ident.conf
[ -s /tmp/hba.add ] || { say "the postinst printed no pg_hba.conf line"; exit 1; }
cat /tmp/hba.add /tmp/pgdata/pg_hba.conf >/tmp/hba.new
cat /tmp/hba.new >/tmp/pgdata/pg_hba.conf
runuser -u postgres -- "$bin/pg_ctl" -D /tmp/pgdata reload >/dev/null
say "pepsi-httpd connects as: $(runuser -u pepsi-httpd -- psql -XAtqc 'SELECT current_user' 'dbname=pepsi user=pepsi-config')"
rc=0; runuser -u pepsi-ingress -- psql -XAtqc 'SELECT 1' 'dbname=pepsi user=pepsi-config' >/dev/null 2>&1 || rc=$?
say "pepsi-ingress as pepsi-config: $rc"

# The ports of this run, and what systemd would do here: no reload (the services start
# after the setup), no deploy hook; certbot answers http-01 on pebble's port.
conf=/etc/pepsi/pepsi.conf
sed -i "s/^ADDRESS = 127.0.0.1:2525\$/ADDRESS = 127.0.0.1:$SMTP_PORT/" "$conf"
sed -i "s/^ADDRESS = 127.0.0.1:8080\$/ADDRESS = 127.0.0.1:$HTTPD_PORT/" "$conf"
cat >>"$conf" <<EOC

[pepsi-setup]
RELOAD_COMMAND =
ACME_DEPLOY_HOOK =
ACME_HTTP_PORT = $ACME_HTTP_PORT
EOC

runuser -u pepsi-httpd -- pepsi-httpd -c "$conf" >/tmp/logs/httpd.log 2>&1 &
pepsi-setup -c "$conf" apply --follow >/tmp/logs/apply.log 2>&1 &
wait_port "$HTTPD_PORT" || { logs; exit 1; }
say "ready"
touch /ctl/ready

# The browser answers the wizard and watches the tasks; then it says go.
i=0
while [ ! -e /ctl/go ]; do
  i=$((i + 1))
  [ "$i" -lt 6000 ] || { say "never told to go on"; logs; exit 1; }
  sleep 0.1
done
say "apply's log"
cat /tmp/logs/apply.log

# The mailbox's account and Maildir (docs/setup.md), then the mail system on what apply
# wrote.
useradd --no-create-home --home-dir /nonexistent alice
md=/var/lib/pepsi/mail/alice/Maildir
install -d -o alice -g alice -m 0700 /var/lib/pepsi/mail/alice $md $md/tmp $md/new $md/cur
runuser -u pepsi -- pepsi-dispatch -c "$conf" >/tmp/logs/dispatch.log 2>&1 &
runuser -u pepsi-ingress -- pepsi-ingress -c "$conf" >/tmp/logs/ingress.log 2>&1 &
wait_port "$SMTP_PORT" || { logs; exit 1; }
say "send"
python3 - "$SMTP_PORT" <<'EOP' || { logs; exit 1; }
import smtplib, ssl, sys
s = smtplib.SMTP("127.0.0.1", int(sys.argv[1]), timeout=30)
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
s.starttls(context=context)
open("/tmp/peer.der", "wb").write(s.sock.getpeercert(binary_form=True))
s.sendmail("bob@example.test", ["alice@mail.test"],
           b"From: bob@example.test\r\nTo: alice@mail.test\r\n"
           b"Subject: set up from the browser\r\n\r\nHello through the wizard's server.\r\n")
s.quit()
EOP
say "the ingress's certificate: $(openssl x509 -inform der -in /tmp/peer.der -noout -issuer -ext subjectAltName | tr '\n' ' ')"
i=0
while [ -z "$(ls -A $md/new)" ]; do
  i=$((i + 1))
  [ "$i" -lt 600 ] || { say "not delivered"; logs; exit 1; }
  sleep 0.1
done
say "delivered"
"#;

#[tokio::test]
async fn the_installed_server_is_set_up_in_the_browser_and_delivers_a_message() {
    let dir = tempfile::Builder::new()
        .prefix("pepsi-package-setup-")
        .tempdir()
        .unwrap();
    let debs = dir.path().join("deb");
    build_debs(&debs, &[]);
    let dns = Dns::start(&[format!("--host-record={HOSTNAME},127.0.0.1")]);
    // Bound into the root: the task's CA file must be readable there.
    let pebble_dir = dir.path().join("pebble");
    std::fs::create_dir_all(&pebble_dir).unwrap();
    let pebble = Pebble::start(&pebble_dir, &dns);
    let ca_inside = Path::new("/pebble").join(pebble.api_ca.strip_prefix(&pebble_dir).unwrap());
    let ctl = dir.path().join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();

    let httpd_port = free_port().to_string();
    let acme_port = pebble.http_port.to_string();
    let tree = dir.path().join("tree");
    let log_path = dir.path().join("root.log");
    let log_file = std::fs::File::create(&log_path).unwrap();
    let mut command = root_command(
        &tree,
        &[(&debs, "/debs"), (&ctl, "/ctl"), (&pebble_dir, "/pebble")],
        &[("HTTPD_PORT", &httpd_port), ("ACME_HTTP_PORT", &acme_port)],
        INSIDE,
    );
    command
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file);
    let mut root = Running(command.spawn().unwrap());
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    let end = Instant::now() + Duration::from_secs(600);
    while !ctl.join("ready").exists() {
        if let Some(status) = root.try_wait().unwrap() {
            panic!(
                "the throwaway root ended ({status}) before it served:\n{}",
                log()
            );
        }
        assert!(Instant::now() < end, "never ready:\n{}", log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The postinst said how to let pepsi-httpd write tasks, and that is all it takes.
    let said = log();
    assert!(
        said.contains("== pepsi-httpd connects as: pepsi-config"),
        "{said}"
    );
    assert!(
        said.contains("== pepsi-ingress as pepsi-config: 2"),
        "{said}"
    );

    let b = Browser::start().await;
    first_administrator(
        &b,
        &format!("http://127.0.0.1:{httpd_port}/setup"),
        ADMIN_PASSWORD,
    )
    .await;
    b.until(
        "the interview, writable",
        "const f = document.getElementById('setup-submit'); return f !== null && !f.disabled",
    )
    .await;
    b.type_into("#hostname", HOSTNAME).await;
    b.type_into("#domains", DOMAIN).await;
    b.click("input[name=certificate][value=acme]").await;
    b.type_into("#acme-email", &format!("postmaster@{DOMAIN}"))
        .await;
    b.js(&format!(
        "document.getElementById('acme-directory').value = {}; return true",
        serde_json::to_string(&pebble.directory).unwrap()
    ))
    .await;
    b.type_into("#acme-ca-file", ca_inside.to_str().unwrap())
        .await;
    b.click("input[name=relay][value=direct]").await;
    b.click("input[name=delivery][value=maildir]").await;
    // Whitelists off: the whitelist stage leaves the path, the mail still arrives.
    b.click("#feature-whitelist").await;
    b.type_into("#mailbox-address", &format!("alice@{DOMAIN}"))
        .await;
    b.type_into("#mailbox-password", "alice's own password")
        .await;
    b.click("#setup-submit").await;
    b.until(
        "the written tasks",
        "return document.querySelectorAll('#tasks tbody tr').length > 0",
    )
    .await;
    // Every task ends, certbot's included; none may fail or be refused.
    let end = Instant::now() + Duration::from_secs(300);
    let finished = loop {
        let state = b
            .js(
                "const rows = Array.from(document.querySelectorAll('#tasks tbody tr')); \
                 return rows.map(r => r.children[1].textContent + ' ' + r.className).join(', ');",
            )
            .await;
        let state = state.as_str().unwrap_or_default().to_owned();
        let settled = !state.is_empty()
            && state
                .split(", ")
                .all(|t| t.ends_with(" done") || t.ends_with(" failed") || t.ends_with(" refused"));
        if settled {
            break state;
        }
        assert!(
            Instant::now() < end,
            "the tasks did not finish: {state}\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let page_log = b
        .js("return document.getElementById('task-logs').textContent")
        .await;
    let kinds: Vec<&str> = finished.split(", ").collect();
    assert!(
        kinds.iter().all(|t| t.ends_with(" done")),
        "{finished}\n{page_log}\n{}",
        log()
    );
    for kind in [
        "database",
        "hostname",
        "mail_domains",
        "tls_acme",
        "dkim_key",
        "relay_direct",
        "local_delivery",
        "features",
        "mailbox",
    ] {
        assert!(
            kinds.contains(&format!("{kind} done").as_str()),
            "{kind}: {finished}"
        );
    }
    assert_eq!(pebble.issued(), 1);
    let page_log = page_log.as_str().unwrap().to_owned();
    assert!(
        page_log.contains("Successfully received certificate."),
        "{page_log}"
    );

    std::fs::write(ctl.join("go"), "").unwrap();
    let end = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = root.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < end, "the root did not finish:\n{}", log());
        std::thread::sleep(Duration::from_millis(200));
    };
    let said = log();
    assert!(status.success(), "{said}");
    assert!(said.contains("== delivered"), "{said}");
    // The ingress serves the certificate pebble issued for the wizard's host name.
    let cert = said
        .lines()
        .find(|l| l.starts_with("== the ingress's certificate: "))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        cert.contains("Pebble") && cert.contains(&format!("DNS:{HOSTNAME}")),
        "{cert}"
    );

    // The configuration in force is the wizard's, and the message is alice's.
    let upper = tree.join("upper");
    let conf = std::fs::read_to_string(upper.join("etc/pepsi/pepsi.conf")).unwrap();
    for line in [
        format!("HOSTNAME = {HOSTNAME}"),
        format!("LOCAL_DOMAINS = {DOMAIN}"),
        "TLS_CERT = /etc/letsencrypt/live/pepsi/fullchain.pem".to_owned(),
    ] {
        assert!(conf.lines().any(|l| l == line), "{line}:\n{conf}");
    }
    let aliases = conf
        .split("\n[")
        .find(|s| s.starts_with("stage-aliases]"))
        .unwrap();
    assert!(
        aliases.lines().any(|l| l == "NEXT_STAGE = route"),
        "{aliases}"
    );
    let new = upper.join("var/lib/pepsi/mail/alice/Maildir/new");
    let files: Vec<_> = std::fs::read_dir(&new)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(
        std::fs::metadata(&files[0]).unwrap().uid(),
        id_in(&upper, "passwd", "alice")
    );
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(text.contains("Subject: set up from the browser"), "{text}");
}
