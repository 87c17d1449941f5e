#!/usr/bin/env bash
# bench/counters/latency.sh: latency from request to counted, below saturation.
#
#   bench/counters/latency.sh [seconds=20] [saturation=measured] [percent ...=25 50]
#
# Measures the saturation rate first with bench/counters/run.sh (its "counted" figure, 10 s, 32
# connections) unless given, then for each percentage starts a private redis-server and the
# release migadu_counters (32 workers, counting log off) and runs
# crates/migadu-counters/examples/bench_latency.rs: a paced open-loop loader sending POST /out
# at that fixed rate over 32 keep-alive connections, every request for a new address, and a
# watcher subscribed to Redis keyspace notifications (__keyevent@0__:incr*) that timestamps each
# fresh A key's increment. Latency = increment seen - the request's scheduled send time.
#
# Needs: redis-server, redis-cli, cdb (tinycdb), python3, curl, cargo; wrk for the saturation run.
# COUNTERS_BUILD=no measures the release binaries already in CARGO_TARGET_DIR (migadu_counters,
# examples/bench_latency) instead of building them.
set -euo pipefail
secs="${1:-20}"
sat="${2:-}"
shift $(( $# > 2 ? 2 : $# ))
pcts=("$@")
[ ${#pcts[@]} -gt 0 ] || pcts=(25 50)
conns=32
root="$(cd "$(dirname "$0")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"

if [ -z "$sat" ]; then
  echo "== saturation: bench/counters/run.sh 10 $conns" >&2
  out="$("$root/bench/counters/run.sh" 10 "$conns")"
  echo "$out" >&2
  sat="$(echo "$out" | sed -n 's/.*counted: \([0-9,]*\) \/s.*/\1/p' | tr -d ,)"
  [ -n "$sat" ] || { echo "cannot read the counted rate" >&2; exit 1; }
fi

if [ "${COUNTERS_BUILD:-yes}" = no ]; then
  echo "== COUNTERS_BUILD=no: measuring the existing binaries in $target/release" >&2
else
  echo "== building release binaries" >&2
  (cd "$root" && cargo build --release -q -p pepsi --bin migadu_counters && cargo build --release -q -p migadu-counters --example bench_latency)
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run_one() { # <rate> <tag>
  local rate="$1" tag="$2" work pids=() rport aport mport
  work="$(mktemp -d)"
  rport="$(free_port)"; aport="$(free_port)"; mport="$(free_port)"
  redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
  pids+=($!)
  for _ in $(seq 50); do redis-cli -p "$rport" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  echo "bench.example 4242|A/o=1000000000,D/o=1000000000,O/o=1000000000" >"$work/domains.txt"
  cdb -c -m "$work/domains.cdb" "$work/domains.txt"
  cat > "$work/config.toml" <<TOML
addr = "127.0.0.1:$aport"
admin_addr = "127.0.0.1:$mport"
auth_token = "bench-token"
domains_cdb = "$work/domains.cdb"
queue_size = 10000000
workers = $conns
[logging]
output = "$work/app.log"
counting_output = "off"
level = "warn"
[redis]
write_addr = "127.0.0.1:$rport"
TOML
  "$target/release/migadu_counters" -config "$work/config.toml" 2>"$work/stderr" &
  pids+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$mport/health" >/dev/null 2>&1 && break; sleep 0.1; done
  "$target/release/examples/bench_latency" "127.0.0.1:$aport" bench-token "127.0.0.1:$rport" "$rate" "$secs" "$tag" "$conns" || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
  rm -rf "$work"
}

echo "saturation (counted): $sat /s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for pct in "${pcts[@]}"; do
  rate=$(( sat * pct / 100 ))
  echo "== ${pct}% of saturation: ${rate} req/s for ${secs}s" >&2
  json="$(run_one "$rate" "p$pct")"
  python3 - "$pct" "$json" <<'PY'
import json, sys
pct, r = sys.argv[1], json.loads(sys.argv[2])
print(f"{pct:>3}% {r['rate']:>7,.0f} req/s  sent {r['sent']:,} ({r['sent_per_second']:,.0f}/s, at most "
      f"{r['max_behind_schedule_ms']:.1f} ms behind schedule)  non-202 {r['non_202']}  counted {r['seen']:,}  "
      f"missing {r['missing']}  request->counted p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  max {r['max_ms']:.2f} ms")
PY
done
