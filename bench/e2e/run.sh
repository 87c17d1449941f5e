#!/usr/bin/env bash
# bench/e2e/run.sh: end-to-end messages per second, SMTP in -> Maildir, Pepsi next to
# Postfix delivering the same load to Maildir in the same run.
#
# Load (bench/e2e/e2e.py load): C concurrent SMTP clients, one message per connection, N
# messages of 4 KiB to alice@example.test, each with a unique X-Bench-Seq header; the
# loader records when each message's DATA got 250. A watcher (e2e.py watch, inotify on
# Maildir/new) records when each message's file first appears. Per side:
#   msg/s   = N / (last file appears - first connection opens)
#   latency = file appears - 250 after DATA   (p50, p99)
# Each side gets a warm-up of 200 messages first (delivered before the measured run starts).
#
# Pepsi: the release build's unified layout (`make unibin`: `pepsi` and a symlink to it per
# folded program, docs/unibin.md) on the shipped default graph (etc/pepsi.conf, included with
# @inline@), overriding only the listener's address, VERIFY = no and
# MAX_CONNECTIONS_PER_CLIENT (all clients come from 127.0.0.1); a private database on the
# PostgreSQL server. Postfix: a private instance (own queue_directory, own port, started as
# root) delivering with virtual(8) to a Maildir, all durability defaults left as they are.
# Neither side checks SPF/DKIM.
#
#   bench/e2e/run.sh [messages=2000] [clients=20] [sides=pepsi,postfix]
#
# Environment: E2E_RATE=R starts the measured messages at R per second instead of as fast as
# the clients go (open loop: latency without a queue backlog, when R is below both sides'
# capacity); PEPSI_EXTRA_CONF=FILE appends that file's lines to the Pepsi configuration
# (a second configuration, e.g. other PARALLELISM/QUEUE_LIMIT); E2E_LOG=info runs the Pepsi
# programs at that log level (default warn); E2E_OUT=DIR keeps the raw records there
# (default target/bench-e2e/last); E2E_BUILD=no measures the release binaries already built;
# PEPSI_LAYOUT=multibin runs one release executable per program instead of the unified layout;
# E2E_ALSO="PROGRAM..." starts those programs of the layout too, on the same configuration and
# environment, before the ingress (e.g. pepsi-telemetry-client), counts them in Pepsi's memory
# and CPU, and writes each one's peak resident set (VmHWM, KiB) to $E2E_OUT/pepsi.also.
#
# Needs: postfix, PostgreSQL (DATABASE_URL, else the server on 127.0.0.1:5432, else a
# private one under target/bench-e2e/pg), python3, cargo. Run as root (Postfix's master
# needs it). Uses CARGO_TARGET_DIR if set.
set -euo pipefail
messages="${1:-2000}"
clients="${2:-20}"
sides="${3:-pepsi,postfix}"
warm=200
rate="${E2E_RATE:-0}"
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
out="${E2E_OUT:-$target/bench-e2e/last}"
rm -rf "$out"
mkdir -p "$out"
work="$(mktemp -d)"
chmod 755 "$work"  # Postfix daemons run as the postfix user, virtual(8) as nobody
pf="$work/postfix"
pids=()
cleanup() {
  [ -f "$pf/etc/main.cf" ] && postfix -c "$pf/etc" stop >/dev/null 2>&1 || true
  # The ingress first (no new mail), then the dispatcher, which stops its workers.
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  stop_services
  rm -rf "$work"
}
trap cleanup EXIT

# tree_pids PID...: the pids and every descendant of each.
tree_pids() {
  local p
  for p in "$@"; do
    echo "$p"
    tree_pids $(ps -o pid= --ppid "$p" 2>/dev/null)
  done
}

# pss_kib PID...: the proportional set size of those processes, summed, in KiB (a shared
# page counts once over all processes that map it).
pss_kib() {
  local total=0 p v
  for p in "$@"; do
    v="$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null)"
    total=$(( total + ${v:-0} ))
  done
  echo "$total"
}

wait_port() {
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
  say "nothing answers on 127.0.0.1:$1"; return 1
}

# One pass of the loader against PORT with the watcher on MAILDIR; records under $out/NAME.*
# pass NAME PORT MAILDIR COUNT TAG
pass() {
  local name="$1" port="$2" maildir="$3" count="$4" tag="$5" watcher
  rm -f "$work/ready"
  python3 "$e2e" watch "$maildir" --messages "$count" --tag "$tag" --out "$out/$name.seen" \
    --ready "$work/ready" --timeout 60 &
  watcher=$!
  for _ in $(seq 200); do [ -f "$work/ready" ] && break; sleep 0.05; done
  python3 "$e2e" load 127.0.0.1 "$port" --messages "$count" --clients "$clients" --tag "$tag" \
    --rate "$rate" --out "$out/$name.sent"
  wait "$watcher"
}

# The measured pass, with the CPU sampler and top snapshots every 3 s alongside.
# measure NAME PORT MAILDIR
measure() {
  local name="$1" port="$2" maildir="$3" sampler snapper
  say "== $name: warm-up, $warm messages"
  rate=0 pass "$name-warmup" "$port" "$maildir" "$warm" "w$name" >/dev/null
  if [ "$(wc -l <"$out/$name-warmup.seen")" -lt "$warm" ]; then
    say "$name: only $(wc -l <"$out/$name-warmup.seen") of $warm warm-up messages reached the Maildir"
    tail -n 5 "$out"/*.log 2>/dev/null | cut -c1-400 >&2
  fi
  say "== $name: $messages messages, $clients clients"
  rm -f "$work/stop"
  python3 "$e2e" cpu --out "$out/$name.cpu" --stop "$work/stop" &
  sampler=$!
  (while [ ! -f "$work/stop" ]; do
     # The second frame: top's first one averages since each process started.
     { date +%T.%N; top -b -n 2 -d 0.5 -w 200 | awk '/^top -/ { n++ } n == 2' | head -n 25; echo; } >>"$out/$name.top" || true
     sleep 2.5
   done) &
  snapper=$!
  uptime >"$out/$name.uptime"
  pass "$name" "$port" "$maildir" "$messages" "m$name"
  touch "$work/stop"
  wait "$sampler" "$snapper" || true
  python3 "$e2e" report --name "$name" --sent "$out/$name.sent" --seen "$out/$name.seen" \
    --cpu "$out/$name.cpu" --json "$out/$name.json" | tee "$out/$name.summary" || true
}

run_pepsi() {
  if ! grep -q relay-to-maildir etc/pepsi.conf; then
    say "== pepsi: etc/pepsi.conf has no delivery to Maildir yet; skipped"
    return 0
  fi
  say "== building Pepsi (release, $layout)"
  if [ "${E2E_BUILD:-yes}" = no ]; then
    say "E2E_BUILD=no: measuring the existing binaries in $bin"
  elif ! "${build[@]}"; then
    [ -x "$bin/pepsi-ingress" ] && [ -x "$bin/pepsi-dispatch" ] || exit 1
    say "build failed; measuring the existing binaries in $bin"
  fi
  # The stage programs of the graph (the last PROGRAM of each section wins, as when Pepsi
  # reads it) should all be built: a missing one holds the mail that reaches its stage.
  local line missing=() init_missing=no
  while read -r line; do
    [ -x "$bin/${line#* }" ] && continue
    missing+=("${line#* }")
    [ "${line%% *}" = "[stage-init]" ] && init_missing=yes
  done < <(cat etc/pepsi.conf ${PEPSI_EXTRA_CONF:+"$PEPSI_EXTRA_CONF"} | awk '
      /^[[:space:]]*\[/ { sec = $1 }
      /^[[:space:]]*PROGRAM[[:space:]]*=/ { sub(/^[^=]*=[[:space:]]*/, ""); p[sec] = $0 }
      END { for (s in p) print s, p[s] }')
  if [ "$init_missing" = yes ]; then
    say "== pepsi: the graph's programs are not all built (${missing[*]}); skipped"
    return 0
  fi
  [ ${#missing[@]} -eq 0 ] || say "== pepsi: not built, mail reaching them would wait: ${missing[*]}"
  local db_url port level="${E2E_LOG:-warn}"
  db_url="${DATABASE_URL%/*}/pepsi_bench_e2e"
  psql "$DATABASE_URL" -Atqc "DROP DATABASE IF EXISTS pepsi_bench_e2e WITH (FORCE)" >/dev/null
  port="$(free_port)"
  local home="$work/pepsi"
  mkdir -p "$home/mail/alice/Maildir/"{new,cur,tmp}
  # Owned by nobody like the Postfix side's: the writer runs as root and writes as the owner.
  chown -R nobody:nogroup "$home/mail/alice"
  cat > "$work/pepsi.conf" <<EOF
@inline@ $root/etc/pepsi.conf

# The bench's own home (the environment says the same; naming it here also serves builds
# from before the self-referring PEPSI_HOME of etc/pepsi.conf expanded).
[PATHS]
PEPSI_HOME = $home

[pepsi-ingress]
MAX_CONNECTIONS_PER_CLIENT = 1000

[listener-mx]
ADDRESS = 127.0.0.1:$port
VERIFY = no

# The SRS secret the graph's first stage (SRS reverse) needs; a bench's throwaway one.
[srs]
SECRETS = $(openssl rand -hex 16)
EOF
  [ -n "${PEPSI_EXTRA_CONF:-}" ] && cat "$PEPSI_EXTRA_CONF" >>"$work/pepsi.conf"
  cp "$work/pepsi.conf" "$out/pepsi.conf"
  local penv=(env PEPSI_HOME="$home" DATABASE_URL="$db_url" PATH="$bin:$PATH")
  "${penv[@]}" pepsi-setup db -c "$work/pepsi.conf" >/dev/null
  # alice is a mailbox of the account store (the MX checks recipients, as Postfix checks
  # virtual_mailbox_maps).
  psql "$db_url" -qc "INSERT INTO pepsi.mailbox_account (address) VALUES ('alice@example.test')"
  # The programs reach the server as the shipped default does: its Unix socket, no TLS.
  penv=(env PEPSI_HOME="$home" DATABASE_URL="$(local_db_url "$db_url")" PATH="$bin:$PATH")
  local also=() also_names=() program
  for program in ${E2E_ALSO:-}; do
    "${penv[@]}" "$program" -c "$work/pepsi.conf" -L "$level" 2>"$out/$program.log" &
    also+=("$!")
    also_names+=("$program")
    pids=("$!" "${pids[@]}")
  done
  "${penv[@]}" pepsi-dispatch -c "$work/pepsi.conf" -L "$level" 2>"$out/pepsi-dispatch.log" &
  local dispatch=$!
  "${penv[@]}" pepsi-ingress -c "$work/pepsi.conf" -L "$level" 2>"$out/pepsi-ingress.log" &
  pids=("$!" "$dispatch" "${pids[@]}")
  wait_port "$port" || { tail -n 20 "$out"/pepsi-*.log >&2; exit 1; }
  kill -0 "$dispatch" || { tail -n 20 "$out/pepsi-dispatch.log" >&2; exit 1; }
  local c0 c1
  c0="$(psql "$db_url" -Atqc "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")"
  measure pepsi "$port" "$home/mail/alice/Maildir"
  c1="$(psql "$db_url" -Atqc "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")"
  echo "$(( c1 - c0 ))" >"$out/pepsi.commits"
  # Memory right after the run, the workers still up: Pepsi's processes, and the PostgreSQL
  # backends serving its database (the server's shared buffers are counted in their share).
  local own backends
  own="$(tree_pids "${pids[0]}" "$dispatch" ${also[@]+"${also[@]}"} | sort -u)"
  : >"$out/pepsi.also"
  local i
  for i in "${!also[@]}"; do
    echo "${also_names[$i]} $(awk '/^VmHWM:/ {print $2}' "/proc/${also[$i]}/status" 2>/dev/null)" >>"$out/pepsi.also"
  done
  backends="$(psql "$db_url" -Atqc "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")"
  echo "$(pss_kib $own) $(echo $own | wc -w) $(pss_kib $backends) $(echo $backends | wc -w)" >"$out/pepsi.pss"
  psql "$db_url" -Atqc "SELECT stage, status, count(*) FROM pepsi.workqueue GROUP BY 1, 2" >"$out/pepsi.leftover"
  [ -s "$out/pepsi.leftover" ] && { say "rows left in pepsi.workqueue (stage|status|count):"; cat "$out/pepsi.leftover" >&2; }
  return 0
}

run_postfix() {
  command -v postfix >/dev/null || apt_install postfix
  local mail="$work/postfix-mail" port
  mkdir -p "$pf/etc" "$pf/queue" "$pf/data" "$mail/alice/Maildir/"{new,cur,tmp}
  chown postfix "$pf/data"
  chown -R nobody:nogroup "$mail"
  cp /etc/postfix/master.cf "$pf/etc/master.cf"
  port="$(free_port)"
  sed -i "s/^smtp      inet.*/$port      inet  n       -       n       -       -       smtpd/" "$pf/etc/master.cf"
  # virtual(8) delivers alice@example.test to $mail/alice/Maildir/ as nobody. Durability as
  # shipped: cleanup fsyncs the queue file before smtpd answers 250, virtual fsyncs the
  # Maildir file before linking it into new/, and the queue file is removed afterwards.
  cat > "$pf/etc/main.cf" <<EOF
compatibility_level = 3.6
queue_directory = $pf/queue
data_directory = $pf/data
mail_owner = postfix
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
myhostname = ref.example.test
mydestination =
local_recipient_maps =
virtual_mailbox_domains = example.test
virtual_mailbox_base = $mail
virtual_mailbox_maps = inline:{ alice@example.test=alice/Maildir/ }
virtual_uid_maps = static:$(id -u nobody)
virtual_gid_maps = static:$(id -g nobody)
mynetworks = 127.0.0.0/8
smtpd_client_connection_count_limit = 0
smtpd_client_connection_rate_limit = 0
default_process_limit = $((clients * 2))
maillog_file_prefixes = /var, /dev/stdout, $work
maillog_file = $work/postfix.log
EOF
  postfix -c "$pf/etc" check >/dev/null 2>&1 || true
  postfix -c "$pf/etc" start >"$work/postfix-start.log" 2>&1 || { cat "$work/postfix-start.log" >&2; exit 1; }
  wait_port "$port"
  measure postfix "$port" "$mail/alice/Maildir"
  local master own
  master="$(head -n 1 "$pf/queue/pid/master.pid" 2>/dev/null | tr -d ' ')"
  own="$( [ -n "$master" ] && tree_pids "$master" | sort -u)"
  echo "$(pss_kib $own) $(echo $own | wc -w)" >"$out/postfix.pss"
  postfix -c "$pf/etc" stop >/dev/null 2>&1 || true
  cp "$work/postfix.log" "$out/postfix.log" 2>/dev/null || true
  postconf -c "$pf/etc" -n >"$out/postfix.main.cf"
}

ensure_postgres "$root/target/bench-e2e/pg"
{
  echo "postgresql: $(psql "$DATABASE_URL" -Atqc "SELECT current_setting('server_version') || ', fsync=' || current_setting('fsync') || ', synchronous_commit=' || current_setting('synchronous_commit')")"
  echo "postfix: $(postconf -h mail_version 2>/dev/null || echo missing)"
  echo "machine: $(nproc) cores, $(uptime)"
  echo "pepsi programs: $layout layout, $bin"
} | tee "$out/env" >&2

case ",$sides," in *,pepsi,*) run_pepsi ;; esac
case ",$sides," in *,postfix,*) run_postfix ;; esac

python3 - "$out" "$messages" "$clients" <<'PY'
import json, os, sys
out, n, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
res = {}
for side in ("pepsi", "postfix"):
    p = os.path.join(out, side + ".json")
    if os.path.exists(p):
        res[side] = json.load(open(p))
rate = float(os.environ.get("E2E_RATE") or 0)
print(f"\nload: {n} messages of 4 KiB to one Maildir, {c} concurrent SMTP clients, one message per connection"
      + (f", started at {rate:g}/s" if rate else ", as fast as they go"))
print(f"{'side':8} | {'msg/s':>7} | {'p50 ms':>7} | {'p99 ms':>7} | delivered")
for side, r in res.items():
    print(f"{side:8} | {r['msg_per_s']:7.0f} | {r['p50_ms']:7.0f} | {r['p99_ms']:7.0f} | {r['delivered']}/{r['sent']}")
if len(res) == 2:
    print(f"ratio pepsi/postfix msg/s: {res['pepsi']['msg_per_s'] / res['postfix']['msg_per_s']:.2f}")
commits = os.path.join(out, "pepsi.commits")
if os.path.exists(commits) and "pepsi" in res:
    k = int(open(commits).read())
    print(f"PostgreSQL commits during the pepsi warm-up and run: {k} ({k / (n + 200):.1f} per message)")
# CPU seconds per message of each side's own processes (PostgreSQL counts for Pepsi; it is
# the shared server, so other databases' work on it is included).
postfix_procs = {"master", "smtpd", "cleanup", "qmgr", "virtual", "trivial-rewrite",
                 "postlogd", "anvil", "proxymap", "scache", "tlsmgr", "pickup"}
for side, r in res.items():
    cpu = r.get("cpu", {}).get("cpu", {})
    if side == "pepsi":
        own = {k: v for k, v in cpu.items() if k.startswith("pepsi-") or k == "postgres"}
    else:
        own = {k: v for k, v in cpu.items() if k in postfix_procs}
    total = sum(own.values())
    parts = ", ".join(f"{k} {v / n * 1000:.2f}" for k, v in sorted(own.items(), key=lambda kv: -kv[1])[:7])
    print(f"{side} CPU per message: {total / n * 1000:.2f} ms ({parts})")
pss = {}
for side in ("pepsi", "postfix"):
    p = os.path.join(out, side + ".pss")
    if os.path.exists(p):
        pss[side] = [int(x) for x in open(p).read().split()]
if "pepsi" in pss:
    kib, procs, pg_kib, pg_procs = pss["pepsi"]
    print(f"pepsi memory after the run (PSS): {kib / 1024:.1f} MiB in {procs} processes, "
          f"+ {pg_kib / 1024:.1f} MiB in its {pg_procs} PostgreSQL backends")
if "postfix" in pss:
    kib, procs = pss["postfix"]
    print(f"postfix memory after the run (PSS): {kib / 1024:.1f} MiB in {procs} processes")
print(f"raw records: {out}")
PY
