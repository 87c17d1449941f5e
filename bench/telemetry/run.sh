#!/usr/bin/env bash
# bench/telemetry/run.sh: what telemetry costs the mail. bench/e2e's Pepsi side (SMTP in ->
# Maildir on the shipped graph, release, unified layout), run in one sitting in three shapes,
# alternating, so the machine's noise falls on all of them alike:
#   off       no [pepsi-telemetry-client] SOCKET: no process builds or sends a span;
#   away      pepsi-telemetry-client running, its receiver stopped: every pass's spans go to
#             the client, which keeps at most MAX_QUEUE of them and drops the rest;
#   receiver  the client exporting to a running pepsi-telemetry (TLS, a token, its own
#             database) that stores every span.
# For each: msg/s, the p50/p99 latency (250 -> Maildir), and the client's peak resident set
# (VmHWM) against its MAX_QUEUE; then msg/s as a ratio to `off`, and with the receiver up the
# spans it stored and those the client counted dropped at the senders (its last report of
# pepsi.telemetry.dropped_spans, reason sender). With several rounds, the medians of each
# shape follow.
#
#   bench/telemetry/run.sh [messages=2000] [clients=20] [rounds=1] [max_queue=10000]
#
# Needs what bench/e2e/run.sh needs, and openssl. Uses CARGO_TARGET_DIR if set; raw records
# under $target/bench-telemetry/<shape>-<round>.
set -euo pipefail
messages="${1:-2000}"
clients="${2:-20}"
rounds="${3:-1}"
max_queue="${4:-10000}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/services.sh
target="${CARGO_TARGET_DIR:-$root/target}"
out="$target/bench-telemetry"
rm -rf "$out"
mkdir -p "$out"
work="$(mktemp -d)"
chmod 755 "$work"
receiver_pid=""
cleanup() {
  [ -n "$receiver_pid" ] && { kill -TERM "$receiver_pid" 2>/dev/null || true; wait "$receiver_pid" 2>/dev/null || true; }
  stop_services
  rm -rf "$work"
}
trap cleanup EXIT

say "== building Pepsi (release, unified layout) and pepsi-telemetry"
make -s --no-print-directory unibin PROFILE=release
cargo build --release -q --bin pepsi-telemetry --bin pepsi-setup
bin="$target/release/unibin"
ensure_postgres "$root/target/bench-e2e/pg"

# The receiver's certificate (a throwaway CA), token and database.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=Bench CA" \
  -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
openssl req -new -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$work/receiver.key" -out "$work/receiver.csr" 2>/dev/null
printf 'subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth\n' >"$work/receiver.ext"
openssl x509 -req -in "$work/receiver.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
  -CAcreateserial -days 2 -extfile "$work/receiver.ext" -out "$work/receiver.pem" 2>/dev/null
openssl rand -hex 24 >"$work/token"
cp "$work/token" "$work/tokens"
rport="$(free_port)"
rdb="${DATABASE_URL%/*}/pepsi_bench_telemetry"
psql "$DATABASE_URL" -Atqc "DROP DATABASE IF EXISTS pepsi_bench_telemetry WITH (FORCE)" >/dev/null
psql "$DATABASE_URL" -Atqc "CREATE DATABASE pepsi_bench_telemetry" >/dev/null
cat >"$work/receiver.conf" <<EOF
[database]
URL = $rdb

[pepsi-telemetry]
LISTEN = 127.0.0.1:$rport
TLS_CERT = $work/receiver.pem
TLS_KEY = $work/receiver.key
TOKEN_FILE = $work/tokens
DATABASE_URL = $rdb
# The bench runs as root, as bench/e2e does.
ALLOW_ROOT = yes
EOF
DATABASE_URL="$rdb" "$target/release/pepsi-setup" db -c "$work/receiver.conf" >/dev/null

cat >"$work/client.conf" <<EOF

[pepsi-telemetry-client]
SOCKET = $work/telemetry.sock
ENDPOINT = https://127.0.0.1:$rport
TOKEN_FILE = $work/token
CA_FILE = $work/ca.pem
MAX_QUEUE = $max_queue
EOF

start_receiver() {
  "$target/release/pepsi-telemetry" -c "$work/receiver.conf" -L warn 2>>"$out/receiver.log" &
  receiver_pid=$!
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$rport") 2>/dev/null && return 0; sleep 0.05; done
  say "pepsi-telemetry does not answer"; tail -n 20 "$out/receiver.log" >&2; exit 1
}

stop_receiver() {
  [ -n "$receiver_pid" ] || return 0
  kill -TERM "$receiver_pid" 2>/dev/null || true
  wait "$receiver_pid" 2>/dev/null || true
  receiver_pid=""
}

# shape NAME ROUND: one bench/e2e Pepsi run in that shape.
shape() {
  local name="$1" round="$2" spans0 spans1 metric0
  case "$name" in
    off) unset PEPSI_EXTRA_CONF E2E_ALSO ;;
    away) export PEPSI_EXTRA_CONF="$work/client.conf" E2E_ALSO=pepsi-telemetry-client ;;
    receiver) export PEPSI_EXTRA_CONF="$work/client.conf" E2E_ALSO=pepsi-telemetry-client; start_receiver ;;
  esac
  spans0="$(psql "$rdb" -Atqc "SELECT count(*) FROM pepsi.telemetry_span")"
  metric0="$(psql "$rdb" -Atqc "SELECT coalesce(max(metric_id), 0) FROM pepsi.telemetry_metric")"
  E2E_BUILD=no E2E_OUT="$out/$name-$round" bench/e2e/run.sh "$messages" "$clients" pepsi \
    >"$out/$name-$round.txt" 2>&1 || { tail -n 30 "$out/$name-$round.txt" >&2; exit 1; }
  stop_receiver
  spans1="$(psql "$rdb" -Atqc "SELECT count(*) FROM pepsi.telemetry_span")"
  echo "$(( spans1 - spans0 ))" >"$out/$name-$round/spans.stored"
  psql "$rdb" -Atqc "SELECT coalesce(max(value), 0)::bigint FROM pepsi.telemetry_metric \
    WHERE metric_id > $metric0 AND name = 'pepsi.telemetry.dropped_spans' \
    AND attributes->>'pepsi.reason' = 'sender'" >"$out/$name-$round/spans.dropped"
  say "$name ($round): $(grep -E '^pepsi +\|' "$out/$name-$round.txt" || echo 'no figures')"
}

for round in $(seq "$rounds"); do
  for name in off away receiver; do shape "$name" "$round"; done
done

python3 - "$out" "$rounds" "$max_queue" "$messages" <<'PY'
import json, os, sys
out, rounds, max_queue, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
shapes = ("off", "away", "receiver")
print(f"\n{n} messages per run, {rounds} round(s), client MAX_QUEUE {max_queue}")
print(f"{'shape':9} | {'round':>5} | {'msg/s':>6} | {'vs off':>6} | {'p50 ms':>6} | {'p99 ms':>6} | {'client peak RSS':>15} | spans stored | dropped at senders")
seen = {s: [] for s in shapes}
for r in range(1, rounds + 1):
    rates = {}
    for s in shapes:
        d = os.path.join(out, f"{s}-{r}")
        try:
            res = json.load(open(os.path.join(d, "pepsi.json")))
        except OSError:
            print(f"{s:9} | {r:5} | no result")
            continue
        rates[s] = res["msg_per_s"]
        rss = "-"
        also = os.path.join(d, "pepsi.also")
        if os.path.exists(also):
            for line in open(also):
                parts = line.split()
                if len(parts) == 2 and parts[0] == "pepsi-telemetry-client":
                    rss = f"{int(parts[1]) / 1024:.1f} MiB"
        stored = open(os.path.join(d, "spans.stored")).read().strip()
        dropped = open(os.path.join(d, "spans.dropped")).read().strip() if s == "receiver" else "-"
        ratio = f"{rates[s] / rates['off']:.2f}" if "off" in rates else "-"
        if "off" in rates:
            seen[s].append((rates[s] / rates["off"], res["msg_per_s"], res["p50_ms"], res["p99_ms"]))
        print(f"{s:9} | {r:5} | {res['msg_per_s']:6.0f} | {ratio:>6} | {res['p50_ms']:6.0f} | {res['p99_ms']:6.0f} | {rss:>15} | {stored:>12} | {dropped}")
if rounds > 1:
    from statistics import median
    print(f"\nmedians over {rounds} rounds")
    print(f"{'shape':9} | {'msg/s':>6} | {'vs off':>6} | {'p50 ms':>6} | {'p99 ms':>6}")
    for s in shapes:
        if seen[s]:
            cols = list(zip(*seen[s]))
            print(f"{s:9} | {median(cols[1]):6.0f} | {median(cols[0]):6.2f} | {median(cols[2]):6.0f} | {median(cols[3]):6.0f}")
print(f"raw records: {out}")
PY
