#!/usr/bin/env bash
# bench/lists/run.sh: one post to a list of M members (default 10,000), from the 250 after
# DATA to the last member's copy at Postfix's smtp-sink on loopback, next to a private Postfix
# relaying one message with the same M recipients to the same sink in the same run.
#
# Pepsi: the release build's unified layout (`make unibin`) on the shipped default graph
# (etc/pepsi.conf, included with @inline@) with its last hop [stage-relay] served by
# pepsi-stage-relay-to-smarthost (the sink, TLS none). The list big@example.test is made with
# `pepsi-list create` and its members user1..userM@relay.example with `pepsi-list import`;
# nonmembers' posts are accepted and dmarc_mitigation is none (no DNS on this machine). The
# post from bob@example.org goes through the list stage, which fans it out to one queue row
# per member with the member's VERP envelope sender (docs/lists.md), each then taking the
# remote branch: aliases -> route -> remote (SRS) -> dkim -> arc -> relay, one SMTP
# transaction per member.
# Postfix: one message to the M recipients (smtpd_recipient_limit raised to M), relayed to
# the sink with its default of 50 recipients per transaction (VERP off, as Postfix ships).
#
# Per side:
#   seconds    = the last recipient's transaction at the sink - the 250 after DATA
#   rcpt/s     = M / seconds
#   CPU ms per recipient (Pepsi's programs and PostgreSQL; Postfix's daemons)
#   commits per member (Pepsi: pg_stat_database.xact_commit of its database, before the post
#              and after the last copy)
#
#   bench/lists/run.sh [members=10000] [runs=1]
#
# Environment: LISTS_OUT=DIR keeps the raw records there (default target/bench-lists/last);
# LISTS_BUILD=no measures the release binaries already built; LISTS_LOG=info runs the Pepsi
# programs at that log level (default warn); PEPSI_EXTRA_CONF=FILE appends that file's lines
# to the Pepsi configuration.
#
# Needs: postfix (smtp-sink, relay), PostgreSQL (DATABASE_URL, else the server on
# 127.0.0.1:5432, else a private one under target/bench-lists/pg), python3, cargo. Run as
# root (Postfix's master needs it). Uses CARGO_TARGET_DIR if set.
set -euo pipefail
members="${1:-10000}"
runs="${2:-1}"
case "$members" in ''|*[!0-9]*) echo "members is a number, not $members" >&2; exit 2 ;; esac
case "$runs" in ''|*[!0-9]*) echo "runs is a number, not $runs" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/services.sh
target="${CARGO_TARGET_DIR:-$root/target}"
bin="$target/release/unibin"
py="$root/bench/lists/lists.py"
e2e="$root/bench/e2e/e2e.py"
out="${LISTS_OUT:-$target/bench-lists/last}"
rm -rf "$out"
mkdir -p "$out"
work="$(mktemp -d)"
chmod 755 "$work"  # Postfix daemons and smtp-sink run as the postfix user
pf="$work/postfix"
sinkdir="$work/sink"
pids=()
cleanup() {
  [ -f "$pf/etc/main.cf" ] && postfix -c "$pf/etc" stop >/dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  stop_services
  rm -rf "$work"
}
trap cleanup EXIT

wait_port() {
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
  say "nothing answers on 127.0.0.1:$1"; return 1
}

command -v smtp-sink >/dev/null || apt_install postfix
ensure_postgres "$root/target/bench-lists/pg"
{
  echo "postgresql: $(psql "$DATABASE_URL" -Atqc "SELECT current_setting('server_version') || ', fsync=' || current_setting('fsync') || ', synchronous_commit=' || current_setting('synchronous_commit')")"
  echo "postfix: $(postconf -h mail_version 2>/dev/null || echo missing)"
  echo "machine: $(nproc) cores, $(uptime)"
  echo "pepsi: $(git -C "$root" rev-parse --short HEAD), unified layout, $bin"
} | tee "$out/env" >&2

# ---- the sink: one smtp-sink for both sides, one file per transaction under $sinkdir/cur
mkdir -p "$sinkdir"
chown postfix "$sinkdir"
sink_port="$(free_port)"
smtp-sink -u postfix -d "$sinkdir/cur/%H%M%S." "127.0.0.1:$sink_port" 256 2>"$out/smtp-sink.log" &
pids+=($!)
wait_port "$sink_port"

# ---- Pepsi
say "== building Pepsi (release, unified layout)"
if [ "${LISTS_BUILD:-yes}" = no ]; then
  say "LISTS_BUILD=no: measuring the existing binaries in $bin"
elif ! make -s --no-print-directory unibin PROFILE=release; then
  [ -x "$bin/pepsi-stage-list" ] || exit 1
  say "build failed; measuring the existing binaries in $bin"
fi
db_url="${DATABASE_URL%/*}/pepsi_bench_lists"
psql "$DATABASE_URL" -Atqc "DROP DATABASE IF EXISTS pepsi_bench_lists WITH (FORCE)" >/dev/null
pepsi_port="$(free_port)"
home="$work/pepsi"
mkdir -p "$home/mail"
cat > "$work/pepsi.conf" <<CONF
@inline@ $root/etc/pepsi.conf

[PATHS]
PEPSI_HOME = $home

[pepsi-ingress]
MAX_CONNECTIONS_PER_CLIENT = 1000

[listener-mx]
ADDRESS = 127.0.0.1:$pepsi_port
VERIFY = no

[srs]
SECRETS = $(openssl rand -hex 16)

[stage-relay]
PROGRAM = pepsi-stage-relay-to-smarthost
HOST = 127.0.0.1
PORT = $sink_port
TLS = none
HELO_NAME = pepsi.example.test
PARALLELISM = 4
QUEUE_LIMIT = 8
CONF
[ -n "${PEPSI_EXTRA_CONF:-}" ] && cat "$PEPSI_EXTRA_CONF" >>"$work/pepsi.conf"
cp "$work/pepsi.conf" "$out/pepsi.conf"
level="${LISTS_LOG:-warn}"
mkdir -p "$work/keys"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$work/keys/example.test.pepsi.pem" 2>/dev/null
penv=(env PEPSI_HOME="$home" PEPSI_KEY_DIR="$work/keys" DATABASE_URL="$db_url" PATH="$bin:$PATH")
"${penv[@]}" pepsi-setup db -c "$work/pepsi.conf" >/dev/null
"${penv[@]}" pepsi-list -c "$work/pepsi.conf" create big@example.test --display-name "Bench" >/dev/null
"${penv[@]}" pepsi-list -c "$work/pepsi.conf" configure big@example.test \
  nonmember_action=accept dmarc_mitigation=none >/dev/null
python3 - "$members" >"$work/members.csv" <<'PY'
import sys
print("email,display_name")
for i in range(1, int(sys.argv[1]) + 1):
    print(f"user{i}@relay.example,User {i}")
PY
"${penv[@]}" pepsi-list -c "$work/pepsi.conf" import big@example.test "$work/members.csv" >&2
penv=(env PEPSI_HOME="$home" PEPSI_KEY_DIR="$work/keys" DATABASE_URL="$(local_db_url "$db_url")" PATH="$bin:$PATH")
"${penv[@]}" pepsi-dispatch -c "$work/pepsi.conf" -L "$level" 2>"$out/pepsi-dispatch.log" &
dispatch=$!
"${penv[@]}" pepsi-ingress -c "$work/pepsi.conf" -L "$level" 2>"$out/pepsi-ingress.log" &
pids=("$!" "$dispatch" "${pids[@]}")
wait_port "$pepsi_port" || { tail -n 20 "$out"/pepsi-*.log >&2; exit 1; }

# ---- Postfix
mkdir -p "$pf/etc" "$pf/queue" "$pf/data"
chown postfix "$pf/data"
cp /etc/postfix/master.cf "$pf/etc/master.cf"
postfix_port="$(free_port)"
sed -i "s/^smtp      inet.*/$postfix_port      inet  n       -       n       -       -       smtpd/" "$pf/etc/master.cf"
cat > "$pf/etc/main.cf" <<CONF
compatibility_level = 3.6
queue_directory = $pf/queue
data_directory = $pf/data
mail_owner = postfix
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
myhostname = ref.example.test
mydestination =
local_recipient_maps =
mynetworks = 127.0.0.254/32
relay_domains = relay.example
relay_recipient_maps =
relayhost = [127.0.0.1]:$sink_port
smtp_tls_security_level = none
smtpd_recipient_limit = $members
maillog_file_prefixes = /var, /dev/stdout, $work
maillog_file = $work/postfix.log
CONF
postfix -c "$pf/etc" check >/dev/null 2>&1 || true
postfix -c "$pf/etc" start >"$work/postfix-start.log" 2>&1 || { cat "$work/postfix-start.log" >&2; exit 1; }
wait_port "$postfix_port"

commits() { psql "$db_url" -Atqc "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"; }

# measure NAME SIDE
measure() {
  local name="$1" side="$2" before=-1 after commits_n=-1 sampler
  rm -rf "$sinkdir/cur" "$work/stop"
  say "== $name: one post to $members recipients"
  python3 "$e2e" cpu --out "$out/$name.cpu" --stop "$work/stop" &
  sampler=$!
  uptime >"$out/$name.uptime"
  if [ "$side" = pepsi ]; then
    before="$(commits)"
    python3 "$py" post 127.0.0.1 "$pepsi_port" --sender bob@example.org --to big@example.test \
      --out "$out/$name.sent"
  else
    python3 "$py" post 127.0.0.1 "$postfix_port" --sender bob@example.org --to big@example.test \
      --rcpts "$members" --out "$out/$name.sent"
  fi
  python3 "$py" wait "$sinkdir/cur" --recipients "$members" --timeout 120 --out "$out/$name.seen" || true
  touch "$work/stop"
  wait "$sampler" || true
  if [ "$side" = pepsi ]; then
    after="$(commits)"
    commits_n=$((after - before))
  fi
  mv "$sinkdir/cur" "$out/$name.dump" 2>/dev/null || true
  python3 "$py" report --name "$name" --sent "$out/$name.sent" --seen "$out/$name.seen" \
    --cpu "$out/$name.cpu" --commits "$commits_n" --members "$members" --json "$out/$name.json" \
    | tee -a "$out/table"
}

printf '%-8s | %13s | %6s | %8s | %8s | %7s | %s\n' side delivered trans seconds 'rcpt/s' 'CPU ms' 'commits/member' >"$out/table"
for r in $(seq "$runs"); do
  measure "pepsi-$r" pepsi
  measure "postfix-$r" postfix
done
psql "$db_url" -Atqc "SELECT stage, status, count(*) FROM pepsi.workqueue GROUP BY 1, 2" >"$out/pepsi.leftover"
[ -s "$out/pepsi.leftover" ] && { say "rows left in pepsi.workqueue (stage|status|count):"; cat "$out/pepsi.leftover" >&2; }
postfix -c "$pf/etc" stop >/dev/null 2>&1 || true
cp "$work/postfix.log" "$out/postfix.log" 2>/dev/null || true

echo
echo "one post to a list of $members members (Pepsi) / one message to $members recipients (Postfix), relayed to smtp-sink"
cat "$out/table"
python3 - "$out" "$runs" <<'PY'
import json, os, sys
out, runs = sys.argv[1], int(sys.argv[2])
for r in range(1, runs + 1):
    p, q = (os.path.join(out, f"{s}-{r}.json") for s in ("pepsi", "postfix"))
    if os.path.exists(p) and os.path.exists(q):
        a, b = json.load(open(p)), json.load(open(q))
        print(f"run {r}: ratio pepsi/postfix recipients per second: "
              f"{a['recipients_per_s'] / b['recipients_per_s']:.2f}")
print(f"raw records: {out}")
PY
