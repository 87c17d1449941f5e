#!/usr/bin/env bash
# bench/relay/run.sh: end-to-end messages per second relayed to a smarthost, SMTP in ->
# Pepsi (pepsi-ingress -> dispatcher -> stages -> pepsi-stage-relay-to-smarthost) -> Postfix's
# smtp-sink on loopback, next to a private Postfix relaying the same load to the same sink
# (relayhost = [127.0.0.1]:<sink port>) in the same run, with 1 and with 10 recipients per
# message.
#
# Load (bench/e2e/e2e.py load): C concurrent SMTP clients, one message per connection, N
# messages of 4 KiB from bob@example.org to user@relay.example (or user1..user10@), each with
# a unique X-Bench-Seq header; the loader records when each message's DATA got 250. The sink
# (smtp-sink -d) writes one file per transaction; its modification time is when the sink had
# the whole message (bench/relay/sink.py). Per side and recipient count:
#   msg/s   = N / (last message at the sink - first connection opens)
#   latency = message at the sink - 250 after DATA   (p50, p99)
# Each side gets a warm-up of 200 messages first (relayed before the measured run starts).
#
# Pepsi: the release build's unified layout (`make unibin`: `pepsi` and a symlink to it per
# folded program, docs/unibin.md) on the shipped default graph (etc/pepsi.conf, included with
# @inline@) with its last hop [stage-relay] served by pepsi-stage-relay-to-smarthost (HOST
# 127.0.0.1, the sink's port, TLS none, PARALLELISM 4, QUEUE_LIMIT 8), so every message takes
# the whole remote branch: init (SRS reverse) -> aliases -> route -> remote (SRS forward: the
# sender bob@example.org is rewritten) -> dkim (no key for example.org: unsigned) -> arc
# (VERIFY = no, nothing to seal) -> relay. The ingress accepts relay.example as Postfix's
# relay_domains would (its own LOCAL_DOMAINS), while [pepsi] LOCAL_DOMAINS stays
# example.test, so the route stage sends the mail to `remote`.
# Overridden besides: the listener's address, VERIFY = no, MAX_CONNECTIONS_PER_CLIENT. Own
# database on the PostgreSQL server. Postfix: a private instance (own queue_directory, own
# port, started as root), relay_domains = relay.example, relayhost = [127.0.0.1]:<sink>,
# every durability default as shipped. Neither side checks SPF/DKIM.
#
#   bench/relay/run.sh [messages=2000] [clients=20] [recipient-counts=1,10]
#
# Environment: RELAY_RATE=R starts the measured messages at R per second instead of as fast as
# the clients go (open loop: latency without a queue backlog, when R is below both sides'
# capacity); RELAY_OUT=DIR keeps the raw records there (default target/bench-relay/last);
# RELAY_BUILD=no measures the release binaries already built; RELAY_LOG=info runs the Pepsi
# programs at that log level (default warn); PEPSI_LAYOUT=multibin runs one release
# executable per program instead of the unified layout; PEPSI_EXTRA_CONF=FILE appends that
# file's lines to the Pepsi configuration (as bench/e2e/run.sh).
#
# Needs: postfix (smtp-sink, relay), PostgreSQL (DATABASE_URL, else the server on
# 127.0.0.1:5432, else a private one under target/bench-relay/pg), python3, cargo. Run as root
# (Postfix's master needs it). Uses CARGO_TARGET_DIR if set.
set -euo pipefail
messages="${1:-2000}"
clients="${2:-20}"
counts="${3:-1,10}"
warm=200
rate="${RELAY_RATE:-0}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/services.sh
target="${CARGO_TARGET_DIR:-$root/target}"
# The release build as it is installed: the unified layout (make unibin); PEPSI_LAYOUT=multibin
# measures the development shape instead, one executable per program.
layout="${PEPSI_LAYOUT:-unibin}"
case "$layout" in
  unibin) bin="$target/release/unibin"; build=(make -s --no-print-directory unibin PROFILE=release) ;;
  multibin) bin="$target/release"; build=(cargo build --release -q --bins) ;;
  *) echo "PEPSI_LAYOUT is unibin or multibin, not $layout" >&2; exit 2 ;;
esac
e2e="$root/bench/e2e/e2e.py"
sinkpy="$root/bench/relay/sink.py"
out="${RELAY_OUT:-$target/bench-relay/last}"
rm -rf "$out"
mkdir -p "$out"
work="$(mktemp -d)"
chmod 755 "$work"  # Postfix daemons and smtp-sink run as the postfix user
pf="$work/postfix"
sinkdir="$work/sink"
pids=()
cleanup() {
  [ -f "$pf/etc/main.cf" ] && postfix -c "$pf/etc" stop >/dev/null 2>&1 || true
  # The ingress first (no new mail), then the dispatcher, which stops its workers; the sink.
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
ensure_postgres "$root/target/bench-relay/pg"
{
  echo "postgresql: $(psql "$DATABASE_URL" -Atqc "SELECT current_setting('server_version') || ', fsync=' || current_setting('fsync') || ', synchronous_commit=' || current_setting('synchronous_commit')")"
  echo "postfix: $(postconf -h mail_version 2>/dev/null || echo missing)"
  echo "machine: $(nproc) cores, $(uptime)"
  echo "pepsi programs: $layout layout, $bin"
} | tee "$out/env" >&2

# ---- the sink: one smtp-sink for both sides, one file per transaction under $sinkdir/cur
mkdir -p "$sinkdir"
chown postfix "$sinkdir"
sink_port="$(free_port)"
smtp-sink -u postfix -d "$sinkdir/cur/%H%M%S." "127.0.0.1:$sink_port" 256 2>"$out/smtp-sink.log" &
pids+=($!)
wait_port "$sink_port"

# ---- Pepsi
say "== building Pepsi (release, $layout)"
if [ "${RELAY_BUILD:-yes}" = no ]; then
  say "RELAY_BUILD=no: measuring the existing binaries in $bin"
elif ! "${build[@]}"; then
  [ -x "$bin/pepsi-stage-relay-to-smarthost" ] || exit 1
  say "build failed; measuring the existing binaries in $bin"
fi
db_url="${DATABASE_URL%/*}/pepsi_bench_relay"
psql "$DATABASE_URL" -Atqc "DROP DATABASE IF EXISTS pepsi_bench_relay WITH (FORCE)" >/dev/null
pepsi_port="$(free_port)"
home="$work/pepsi"
mkdir -p "$home/mail"
cat > "$work/pepsi.conf" <<CONF
@inline@ $root/etc/pepsi.conf

[PATHS]
PEPSI_HOME = $home

[pepsi-ingress]
MAX_CONNECTIONS_PER_CLIENT = 1000
# Accepted from anyone, like Postfix's relay_domains; not local, so routed to \`remote\`.
LOCAL_DOMAINS = example.test relay.example
# Any local-part, like relay_domains without relay_recipient_maps.
CHECK_RECIPIENTS = no

[listener-mx]
ADDRESS = 127.0.0.1:$pepsi_port
VERIFY = no

# The SRS secret the graph's first stage (SRS reverse) needs; a bench's throwaway one.
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
level="${RELAY_LOG:-warn}"
# The graph's signing key (dkim and arc stages start only with one).
mkdir -p "$work/keys"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$work/keys/example.test.pepsi.pem" 2>/dev/null
penv=(env PEPSI_HOME="$home" PEPSI_KEY_DIR="$work/keys" DATABASE_URL="$db_url" PATH="$bin:$PATH")
"${penv[@]}" pepsi-setup db -c "$work/pepsi.conf" >/dev/null
# The programs reach the server as the shipped default does: its Unix socket, no TLS.
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
smtpd_client_connection_count_limit = 0
smtpd_client_connection_rate_limit = 0
default_process_limit = $((clients * 2))
maillog_file_prefixes = /var, /dev/stdout, $work
maillog_file = $work/postfix.log
CONF
postfix -c "$pf/etc" check >/dev/null 2>&1 || true
postfix -c "$pf/etc" start >"$work/postfix-start.log" 2>&1 || { cat "$work/postfix-start.log" >&2; exit 1; }
wait_port "$postfix_port"

# One pass of the loader against PORT; the sink's files go to $out/NAME.dump.
# pass NAME PORT COUNT TAG RCPTS
pass() {
  local name="$1" port="$2" count="$3" tag="$4" rcpts="$5" ok=0
  rm -rf "$sinkdir/cur"
  python3 "$e2e" load 127.0.0.1 "$port" --messages "$count" --clients "$clients" --tag "$tag" \
    --rcpt user@relay.example --rcpt-count "$rcpts" --rate "$rate" --out "$out/$name.sent"
  python3 "$sinkpy" wait "$sinkdir/cur" --messages "$count" --timeout 60 || ok=1
  sleep 0.5  # the last transactions' final writes
  mv "$sinkdir/cur" "$out/$name.dump" 2>/dev/null || mkdir -p "$out/$name.dump"
  python3 "$sinkpy" seen "$out/$name.dump" --tag "$tag" --out "$out/$name.seen"
  return $ok
}

# measure SIDE PORT RCPTS
measure() {
  local side="$1" port="$2" rcpts="$3" name="$1-$3rcpt" sampler
  say "== $name: warm-up, $warm messages"
  rate=0 pass "$name-warmup" "$port" "$warm" "w$name" "$rcpts" >/dev/null || true
  say "== $name: $messages messages, $clients clients, $rcpts recipient(s) each"
  rm -f "$work/stop"
  python3 "$e2e" cpu --out "$out/$name.cpu" --stop "$work/stop" &
  sampler=$!
  uptime >"$out/$name.uptime"
  pass "$name" "$port" "$messages" "m$name" "$rcpts" || true
  touch "$work/stop"
  wait "$sampler" || true
  python3 "$e2e" report --name "$name" --sent "$out/$name.sent" --seen "$out/$name.seen" \
    --cpu "$out/$name.cpu" --json "$out/$name.json" | sed 's/Maildir/sink/g' | tee "$out/$name.summary" || true
}

IFS=, read -r -a rcpt_counts <<<"$counts"
for k in "${rcpt_counts[@]}"; do
  measure pepsi "$pepsi_port" "$k"
  measure postfix "$postfix_port" "$k"
done
psql "$db_url" -Atqc "SELECT stage, status, count(*) FROM pepsi.workqueue GROUP BY 1, 2" >"$out/pepsi.leftover"
[ -s "$out/pepsi.leftover" ] && { say "rows left in pepsi.workqueue (stage|status|count):"; cat "$out/pepsi.leftover" >&2; }
postfix -c "$pf/etc" stop >/dev/null 2>&1 || true
cp "$work/postfix.log" "$out/postfix.log" 2>/dev/null || true

python3 - "$out" "$messages" "$clients" "$counts" <<'PY'
import json, os, sys
out, n, c, counts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
rate = float(os.environ.get("RELAY_RATE") or 0)
print(f"\nload: {n} messages of 4 KiB relayed to smtp-sink, {c} concurrent SMTP clients, one message per connection"
      + (f", started at {rate:g}/s" if rate else ", as fast as they go"))
print(f"{'side':8} | {'rcpts':>5} | {'msg/s':>7} | {'p50 ms':>7} | {'p99 ms':>7} | delivered | CPU ms/msg")
postfix_procs = {"master", "smtpd", "cleanup", "qmgr", "smtp", "trivial-rewrite",
                 "postlogd", "anvil", "proxymap", "scache", "tlsmgr", "pickup", "bounce"}
res = {}
for k in counts:
    for side in ("pepsi", "postfix"):
        p = os.path.join(out, f"{side}-{k}rcpt.json")
        if not os.path.exists(p):
            continue
        r = res[(side, k)] = json.load(open(p))
        cpu = r.get("cpu", {}).get("cpu", {})
        if side == "pepsi":
            own = {x: v for x, v in cpu.items() if x.startswith("pepsi-") or x == "postgres"}
        else:
            own = {x: v for x, v in cpu.items() if x in postfix_procs}
        print(f"{side:8} | {k:>5} | {r['msg_per_s']:7.0f} | {r['p50_ms']:7.0f} | {r['p99_ms']:7.0f} | "
              f"{r['delivered']}/{r['sent']} | {sum(own.values()) / n * 1000:.2f}")
for k in counts:
    if ("pepsi", k) in res and ("postfix", k) in res:
        print(f"ratio pepsi/postfix msg/s, {k} recipient(s): "
              f"{res[('pepsi', k)]['msg_per_s'] / res[('postfix', k)]['msg_per_s']:.2f}")
print(f"raw records: {out}")
PY
