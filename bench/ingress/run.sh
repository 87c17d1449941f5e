#!/usr/bin/env bash
# bench/ingress/run.sh: messages accepted per second by pepsi-ingress, next to Postfix's
# smtpd accepting the same load in the same run.
#
# Load: Postfix's smtp-source, N concurrent sessions each sending 4 KiB messages, one
# recipient, one message per session-transaction. Pepsi stores each message with
# workqueue_add in PostgreSQL (synchronous_commit on); Postfix queues each into its hold
# queue (fsync'd queue files, no delivery). Neither side verifies SPF/DKIM (VERIFY = no).
# Also reported: PostgreSQL commits and WAL flushes during the Pepsi run; more commits than
# WAL flushes means concurrent sessions group-committed.
#
#   bench/ingress/run.sh [messages=4000] [sessions=20]
#
# Needs: postfix (smtpd, smtp-source), PostgreSQL (DATABASE_URL, else a private server under
# target/bench-ingress), python3, cargo. Run as root (Postfix's master needs it). Uses
# CARGO_TARGET_DIR if set.
set -euo pipefail
messages="${1:-4000}"
sessions="${2:-20}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/services.sh
target="${CARGO_TARGET_DIR:-$root/target}"
work="$(mktemp -d)"
chmod 755 "$work"  # Postfix daemons run as the postfix user
pf="$work/postfix"
pids=()
cleanup() {
  [ -f "$pf/etc/main.cf" ] && postfix -c "$pf/etc" stop >/dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  stop_services
  rm -rf "$work"
}
trap cleanup EXIT

command -v smtp-source >/dev/null || apt_install postfix
ensure_postgres "$root/target/bench-ingress/pg"

say "== building pepsi-ingress and pepsi-setup (release)"
bin="$target/release"
if ! cargo build --release -q --bin pepsi-ingress --bin pepsi-setup; then
  # Another crate of the root package may be mid-edit; an existing build still measures.
  [ -x "$bin/pepsi-ingress" ] && [ -x "$bin/pepsi-setup" ] || exit 1
  say "build failed; measuring the existing $bin/pepsi-ingress"
fi

db_url="${DATABASE_URL%/*}/pepsi_bench_ingress"
psql "${DATABASE_URL}" -Atqc "DROP DATABASE IF EXISTS pepsi_bench_ingress WITH (FORCE)" >/dev/null
port="$(free_port)"
cat > "$work/pepsi.conf" <<EOF
[database]
URL = $db_url
MAX_CONNECTIONS = $sessions

[pepsi-ingress]
HOSTNAME = bench.example.test
LOCAL_DOMAINS = example.test
MAX_CONNECTIONS_PER_CLIENT = 1000
# Nothing delivers here: the rows stay pending, and inflow control would hold every message
# past the first INFLOW_BACKLOG. This measures acceptance alone.
INFLOW_BACKLOG = 0

[listener-mx]
ROLE = mx
ADDRESS = 127.0.0.1:$port
VERIFY = no
EOF
"$bin/pepsi-setup" db -c "$work/pepsi.conf" >/dev/null
"$bin/pepsi-ingress" -c "$work/pepsi.conf" -L warn 2>"$work/ingress.log" &
pids+=($!)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done

stats() {
  psql "$db_url" -Atqc "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), (SELECT wal_sync FROM pg_stat_wal)"
}

# One smtp-source run; prints elapsed seconds.
load() {
  local target_port="$1" start end
  start=$(date +%s.%N)
  smtp-source -s "$sessions" -m "$messages" -l 4096 -f bob@example.org -t alice@example.test "127.0.0.1:$target_port"
  end=$(date +%s.%N)
  python3 -c "print(f'{$end - $start:.3f}')"
}

say "== warm-up"
smtp-source -s "$sessions" -m 200 -l 4096 -f bob@example.org -t alice@example.test "127.0.0.1:$port"

say "== pepsi-ingress: $messages messages, $sessions sessions"
read -r c0 w0 < <(stats | tr '|' ' ')
pepsi_secs="$(load "$port")"
read -r c1 w1 < <(stats | tr '|' ' ')
stored="$(psql "$db_url" -Atqc "SELECT count(*) FROM pepsi.workqueue")"

say "== Postfix smtpd: $messages messages, $sessions sessions"
mkdir -p "$pf/etc" "$pf/queue" "$pf/data"
chown postfix "$pf/data"
cp /etc/postfix/master.cf "$pf/etc/master.cf"
pfport="$(free_port)"
sed -i "s/^smtp      inet.*/$pfport      inet  n       -       n       -       -       smtpd/" "$pf/etc/master.cf"
cat > "$pf/etc/main.cf" <<EOF
compatibility_level = 3.6
queue_directory = $pf/queue
data_directory = $pf/data
mail_owner = postfix
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
myhostname = ref.example.test
mydestination = example.test
local_recipient_maps =
mynetworks = 127.0.0.0/8
smtpd_end_of_data_restrictions = check_client_access static:HOLD
smtpd_client_connection_count_limit = 0
smtpd_client_connection_rate_limit = 0
default_process_limit = $((sessions * 2))
maillog_file = /dev/stdout
EOF
postfix -c "$pf/etc" check >/dev/null 2>&1 || true
postfix -c "$pf/etc" start >"$work/postfix-start.log" 2>&1 || { cat "$work/postfix-start.log" >&2; exit 1; }
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$pfport") 2>/dev/null && break; sleep 0.1; done
smtp-source -s "$sessions" -m 200 -l 4096 -f bob@example.org -t alice@example.test "127.0.0.1:$pfport"
postfix_secs="$(load "$pfport")"
held="$(find "$pf/queue/hold" -type f | wc -l)"

python3 - "$messages" "$sessions" "$pepsi_secs" "$postfix_secs" "$stored" "$held" "$c0" "$c1" "$w0" "$w1" <<'PY'
import sys
m, s, ps, fs, stored, held, c0, c1, w0, w1 = sys.argv[1:]
m, s, ps, fs = int(m), int(s), float(ps), float(fs)
commits, flushes = int(c1) - int(c0), int(w1) - int(w0)
p_rate, f_rate = m / ps, m / fs
print(f"load: {m} messages of 4 KiB, {s} concurrent sessions (smtp-source)")
print(f"pepsi-ingress : {p_rate:8.0f} msg/s  ({ps:.2f} s; rows stored after warm-up: {int(stored) - 200})")
print(f"postfix smtpd : {f_rate:8.0f} msg/s  ({fs:.2f} s; held queue files: {int(held) - 200})")
print(f"ratio pepsi/postfix: {p_rate / f_rate:.2f}")
print(f"PostgreSQL during the pepsi run: {commits} commits ({commits / ps:.0f}/s), "
      f"{flushes} WAL flushes ({flushes / ps:.0f}/s), {commits / max(flushes, 1):.1f} commits per flush")
PY
