#!/usr/bin/env bash
# scripts/run.sh: builds Pepsi and brings the whole system up on the embedded default
# configuration (etc/pepsi.conf): a private PostgreSQL under ./var/pg unless DATABASE_URL
# names a server, the schema, Maildirs for the demo users of example.test under
# ./var/mail, the dispatcher (which starts the stage workers), the SMTP ingress on
# 127.0.0.1:2525 and the administrative API (pepsi-httpd) on 127.0.0.1:8080, whose first
# administrator's password is written to var/httpd-admin.txt, each under a supervisor that starts it again when it dies (after 1 s,
# doubling up to 30 s while it keeps dying, as systemd's Restart=on-failure would). It
# sends one message to show the path end to end, prints where it landed, and keeps running
# until Ctrl-C, which stops everything cleanly. The running pids are in var/run/*.pid.
#
#   scripts/run.sh          # run until Ctrl-C
#   scripts/run.sh --once   # stop after the demonstration message (a smoke test);
#                           # `make run ARGS=--once` is the same
set -euo pipefail
once=no
[ "${1:-}" = "--once" ] && once=yes
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/services.sh

pids=()
stopping=no
shutdown() {
  [ "$stopping" = yes ] && return
  stopping=yes
  say "== stopping"
  # The ingress first (no new mail), then the dispatcher, which stops its workers and
  # returns their rows to pending.
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  stop_services
  say "stopped; the queue and the mail stay under ./var"
}
trap shutdown EXIT
trap 'exit 0' INT TERM

# What compiling and running need (scripts/apt-packages.txt's [build] and [run] sections:
# the C toolchain, libclang, Nettle, OpenSSL, PostgreSQL, swaks...), installed with apt when
# missing; the Rust toolchain is rustup's (docs/install.md).
install_listed_packages "$root" build run
command -v cargo >/dev/null || { say "cargo is not on PATH: install the Rust toolchain (docs/install.md)"; exit 1; }

say "== building"
cargo build --quiet --bins
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
export PATH="$bin:$PATH"

mkdir -p var/log
ensure_postgres "$root/var/pg" 55432 private
# The default configuration reads these four.
export PEPSI_HOME="$root/var"
export DATABASE_URL="${DATABASE_URL%/*}/pepsi"
# The setup pages write their tasks as the pepsi-config role (etc/pepsi.conf, docs/setup.md).
export PEPSI_CONFIG_DATABASE_URL="postgres://pepsi-config@${DATABASE_URL#*@}"
export PEPSI_KEY_DIR="$root/var/keys"
export PEPSI_SECRETS_DIR="$root/var/secrets.d"
# pepsi-httpd serves as whoever runs this, root included ([pepsi-httpd] ALLOW_ROOT of
# etc/pepsi.conf, "no" in an installed system).
export PEPSI_ALLOW_ROOT=yes
cfg="$root/etc/pepsi.conf"

# The signing key of example.test (DKIM and ARC of the remote branch) and the SRS secret,
# made once for this checkout; a packaged installation has its own.
key="$PEPSI_KEY_DIR/example.test.pepsi.pem"
if [ ! -s "$key" ]; then
  mkdir -p "$PEPSI_KEY_DIR"
  (umask 077; openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$key" 2>/dev/null)
  say "made the DKIM/ARC key $key (publish pepsi._domainkey.example.test to verify)"
fi
if [ ! -s "$PEPSI_SECRETS_DIR/20-srs.conf" ]; then
  mkdir -p "$PEPSI_SECRETS_DIR"
  (umask 077; printf '[srs]\nSECRETS = %s\n' "$(openssl rand -hex 16)" >"$PEPSI_SECRETS_DIR/20-srs.conf")
  say "made the SRS secret $PEPSI_SECRETS_DIR/20-srs.conf"
fi

say "== pepsi-setup db -c etc/pepsi.conf"
pepsi-setup db -c "$cfg"

# Mailboxes of the demonstration domain: a Maildir each, and an account (the MX refuses
# mail for an address the account store does not know: CHECK_RECIPIENTS, docs/ingress.md).
for user in alice bob postmaster; do
  mkdir -p "var/mail/$user/Maildir/"{new,cur,tmp}
  psql "$DATABASE_URL" -qc "INSERT INTO pepsi.mailbox_account (address) VALUES ('$user@example.test') ON CONFLICT DO NOTHING"
done

# The demonstration administrator of pepsi-httpd, `admin`: made once, its generated
# password written to var/httpd-admin.txt (mode 0600) and shown nowhere else. When that
# file is gone (a fresh checkout against a kept database), `admin` is made again with a new
# password, its sessions and tokens going with the old account.
if [ ! -s var/httpd-admin.txt ] ||
   [ -z "$(psql "$DATABASE_URL" -tAc "SELECT 1 FROM pepsi.admin_account WHERE name = 'admin'")" ]; then
  rm -f var/httpd-admin.txt
  psql "$DATABASE_URL" -qc "DELETE FROM pepsi.admin_account WHERE name = 'admin'"
  pepsi-httpd -c "$cfg" admin-add admin --output var/httpd-admin.txt
fi

if (exec 3<>/dev/tcp/127.0.0.1/2525) 2>/dev/null; then
  say "127.0.0.1:2525 is taken: is another Pepsi (or another SMTP server) running?"
  exit 1
fi
if (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null; then
  say "127.0.0.1:8080 is taken: is another Pepsi (or another web server) running?"
  exit 1
fi
# supervise NAME CMD...: runs CMD (stderr to var/log/NAME.log, its pid in var/run/NAME.pid)
# and starts it again whenever it exits, until this script stops: after 1 s, doubling up to
# 30 s while it keeps dying within a minute of its start. TERM stops the child, then the
# supervisor.
supervise() {
  local name="$1"
  shift
  (
    child=
    trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; [ -n "$child" ] && wait "$child" 2>/dev/null; exit 0' TERM INT
    delay=1
    while :; do
      started=$(date +%s)
      "$@" 2>>"var/log/$name.log" &
      child=$!
      echo "$child" >"var/run/$name.pid"
      rc=0
      wait "$child" || rc=$?
      if [ $(( $(date +%s) - started )) -ge 60 ]; then delay=1; fi
      say "$name (pid $child) exited with status $rc: starting it again in ${delay}s (log var/log/$name.log)"
      sleep "$delay" & wait $! || true
      delay=$(( delay * 2 > 30 ? 30 : delay * 2 ))
    done
  ) &
}

mkdir -p var/run
# pepsi-sendmail's drop directory (docs/sendmail.md): an installation makes it 1730, owned
# by pepsi and the pepsi-sendmail group; here everything runs as whoever runs make run.
mkdir -p var/spool/sendmail
chmod 1730 var/spool/sendmail
rm -f var/run/dispatch.pid var/run/ingress.pid var/run/httpd.pid var/run/failure-bouncer.pid var/run/sendmail-pickup.pid var/run/list-maintain.pid
supervise dispatch pepsi-dispatch -c "$cfg"
dispatch_supervisor=$!
supervise ingress pepsi-ingress -c "$cfg"
ingress_supervisor=$!
supervise httpd pepsi-httpd -c "$cfg"
httpd_supervisor=$!
# Rows that end failed or timeout are retried, then returned (docs/failure-bouncer.md).
supervise failure-bouncer pepsi-failure-bouncer -c "$cfg"
bouncer_supervisor=$!
# The pickup of mail `pepsi-sendmail` queued while the database was down.
supervise sendmail-pickup pepsi-sendmail -C "$cfg" -q10s
pickup_supervisor=$!
# The mailing lists' periodic work (docs/lists.md, "Periodic work"), a pass every five
# minutes as the timer of an installation runs it; what a pass did goes to its log.
supervise list-maintain sh -c 'trap "kill \$s 2>/dev/null; exit 0" TERM
  while :; do pepsi-list -c "$1" maintain >&2 || exit 1; sleep 300 & s=$!; wait $s; done' \
  list-maintain "$cfg"
maintain_supervisor=$!
# Stopping goes ingress first (no new mail), then the API and the helpers, then the
# dispatcher.
pids=("$ingress_supervisor" "$httpd_supervisor" "$pickup_supervisor" "$maintain_supervisor" "$bouncer_supervisor" "$dispatch_supervisor" "${pids[@]}")
for _ in $(seq 200); do
  (exec 3<>/dev/tcp/127.0.0.1/2525) 2>/dev/null && break
  sleep 0.05
done
(exec 3<>/dev/tcp/127.0.0.1/2525) 2>/dev/null || { tail -n 20 var/log/ingress.log >&2; exit 1; }
for _ in $(seq 200); do
  (exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null && break
  sleep 0.05
done
(exec 3<>/dev/tcp/127.0.0.1/8080) 2>/dev/null || { tail -n 20 var/log/httpd.log >&2; exit 1; }
ingress=$(cat var/run/ingress.pid)
say "started pepsi-dispatch (pid $(cat var/run/dispatch.pid)), log var/log/dispatch.log"
say "started pepsi-ingress (pid $ingress) on 127.0.0.1:2525, log var/log/ingress.log"
say "started pepsi-failure-bouncer and the pepsi-sendmail pickup, logs var/log/failure-bouncer.log, var/log/sendmail-pickup.log"
say "started pepsi-list maintain every 5 minutes, log var/log/list-maintain.log"
say "started pepsi-httpd (pid $(cat var/run/httpd.pid)) at http://127.0.0.1:8080/, log var/log/httpd.log"
say "the administrator's name and password are in var/httpd-admin.txt"
say "database: $DATABASE_URL   mail: var/mail/<user>/Maildir"

say "== sending a message from bob@example.test to alice@example.test"
before=$(ls var/mail/alice/Maildir/new | wc -l)
python3 - <<'PY'
import smtplib
from email.message import EmailMessage
m = EmailMessage()
m["From"] = "bob@example.test"
m["To"] = "alice@example.test"
m["Subject"] = "hello from make run"
m.set_content("Hello Alice,\n\nthis message went through pepsi-ingress, pepsi-dispatch and the stage graph.\n")
with smtplib.SMTP("127.0.0.1", 2525) as s:
    s.send_message(m)
PY
for _ in $(seq 100); do
  [ "$(ls var/mail/alice/Maildir/new | wc -l)" -gt "$before" ] && break
  sleep 0.05
done
# sed reads the whole listing: `head` would leave ls to die of SIGPIPE with a full Maildir.
landed=$(ls -t var/mail/alice/Maildir/new | sed -n 1p)
if [ "$(ls var/mail/alice/Maildir/new | wc -l)" -le "$before" ]; then
  say "the message did not arrive within 5 s; the queue:"
  psql "$DATABASE_URL" -c "SELECT workqueue_id, stage, status, rcpt_to, state->>'last_error' AS last_error, state->>'dispatch_error' AS dispatch_error FROM pepsi.workqueue" >&2
  exit 1
fi
say "delivered: var/mail/alice/Maildir/new/$landed"

if [ "$once" = yes ]; then
  exit 0
fi
cat <<EOF

Pepsi is running. Try:
  swaks --server 127.0.0.1:2525 --from bob@example.test --to alice@example.test
  swaks --server 127.0.0.1:2525 --from bob@example.test --to nobody@example.test   # refused: 550 5.1.1
  printf 'Subject: hi\n\nfrom sendmail\n' | DATABASE_URL=$DATABASE_URL PEPSI_HOME=$PEPSI_HOME $bin/pepsi-sendmail -C etc/pepsi.conf alice@example.test
  ls var/mail/*/Maildir/new
  DATABASE_URL=$DATABASE_URL PEPSI_HOME=$PEPSI_HOME $bin/pepsi-queue -c etc/pepsi.conf list
The live pipeline: http://127.0.0.1:8080/pipeline; one screen of the whole system:
  DATABASE_URL=$DATABASE_URL PEPSI_HOME=$PEPSI_HOME $bin/pepsi-status -c etc/pepsi.conf
The administrative API: http://127.0.0.1:8080/ (docs/api.md, docs/operations.md); log in as
the administrator in var/httpd-admin.txt:
  read -r name pw < var/httpd-admin.txt
  curl -si -H 'Content-Type: application/json' -d "{\"name\":\"\$name\",\"password\":\"\$pw\"}" http://127.0.0.1:8080/api/login
A dispatcher, ingress, pepsi-httpd, failure bouncer, pickup or list maintenance that dies is started again
(var/run/*.pid hold their pids).
Ctrl-C stops everything.
EOF
wait
