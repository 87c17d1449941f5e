#!/usr/bin/env bash
# bench/counters/run.sh: /out throughput of migadu_counters next to its limit.
#
# Starts a private redis-server and the release migadu_counters on loopback, drives POST /out
# with wrk (bench/counters/out.lua), then issues the same MULTI/EXEC transactions straight to
# the same Redis from a Rust client with the same concurrency (examples/bench_redis.rs), then
# drives a private nginx answering `return 202` on /out with the same wrk command and script:
# the HTTP floor, what any server costs to parse that request and answer it on this machine.
# Prints the three figures, the service's ratio to each reference, the latency from request to
# counted, and the CPU each side spent per request (from /proc: the service and the Redis it
# counts in, nginx's master and workers).
#
#   bench/counters/run.sh [seconds=10] [connections=32] [workers=connections]
#
# The service gets as many counting workers as wrk has connections and the reference has tasks,
# so both sides keep the same number of transactions in flight. nginx runs in the foreground
# (no daemon; pid, logs and temporary files in the work directory, access log off) with one
# worker process per core, as the service's runtime has one thread per core, and keeps its
# connections open as the service does.
#
# Needs: redis-server, wrk, cdb, nginx (Debian packages redis-server, wrk, tinycdb, nginx),
# python3, curl, cargo. Uses CARGO_TARGET_DIR if set; COUNTERS_BUILD=no measures the release
# binaries already there (migadu_counters and examples/bench_redis) instead of building them.
set -euo pipefail
secs="${1:-10}"
conns="${2:-32}"
workers="${3:-$conns}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
command -v cdb >/dev/null || { echo "cdb is missing: apt-get install tinycdb" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install redis-server" >&2; exit 1; }
nginx_bin="$(command -v nginx || echo /usr/sbin/nginx)"
[ -x "$nginx_bin" ] || { echo "nginx is missing: apt-get install nginx" >&2; exit 1; }

if [ "${COUNTERS_BUILD:-yes}" = no ]; then
  echo "== COUNTERS_BUILD=no: measuring the existing binaries in $target/release" >&2
else
  echo "== building release binaries" >&2
  (cd "$root" && cargo build --release -q -p pepsi --bin migadu_counters && cargo build --release -q -p migadu-counters --example bench_redis)
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rport="$(free_port)"; aport="$(free_port)"; mport="$(free_port)"; nport="$(free_port)"
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >/dev/null &
redis_pid=$!
pids+=("$redis_pid")
# cpu_ticks PID...: user + system clock ticks used so far by those processes (all threads).
cpu_ticks() {
  local t=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] && t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$t"
}
for _ in $(seq 50); do redis-cli -p "$rport" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done

echo "bench.example 4242|A/o=1000000000,D/o=1000000000,O/o=1000000000" >"$work/domains.txt"
cdb -c -m "$work/domains.cdb" "$work/domains.txt"

cat > "$work/config.toml" <<TOML
addr = "127.0.0.1:$aport"
admin_addr = "127.0.0.1:$mport"
auth_token = "bench-token"
domains_cdb = "$work/domains.cdb"
queue_size = 10000000
workers = $workers
[logging]
output = "$work/app.log"
counting_output = "off"
level = "warn"
[redis]
write_addr = "127.0.0.1:$rport"
TOML
"$target/release/migadu_counters" -config "$work/config.toml" 2>"$work/stderr" &
service_pid=$!
pids+=("$service_pid")
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$mport/health" >/dev/null 2>&1 && break; sleep 0.1; done

day="$(date -u +%F)"
key="cnt/A/u@bench.example/d/$day/o"
echo "== wrk: POST /out, ${conns} connections, ${secs}s" >&2
start_ns="$(date +%s%N)"
service_ticks="$(cpu_ticks "$service_pid")"; redis_ticks="$(cpu_ticks "$redis_pid")"
wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$root/bench/counters/out.lua" "http://127.0.0.1:$aport/out" >"$work/wrk.txt"
# counting runs after the 202: wait until the counter stops moving (wrk's figure leaves out the
# requests still in flight when it stops, so the counter itself is the total)
prev=-1; done_ns="$(date +%s%N)"; still=0
while [ "$still" -lt 10 ]; do
  cur="$(redis-cli -p "$rport" get "$key")"
  if [ "$cur" != "$prev" ]; then prev="$cur"; done_ns="$(date +%s%N)"; still=0; else still=$((still + 1)); fi
  sleep 0.05
done
sent="$prev"
service_ticks=$(($(cpu_ticks "$service_pid") - service_ticks)); redis_ticks=$(($(cpu_ticks "$redis_pid") - redis_ticks))
curl -s "http://127.0.0.1:$mport/metrics" >"$work/metrics.txt"

echo "== reference: the same MULTI/EXEC from a Rust client, ${conns} tasks, ${secs}s" >&2
"$target/release/examples/bench_redis" "127.0.0.1:$rport" "$conns" "$secs" >"$work/ref.json"

echo "== HTTP floor: nginx \`return 202\` on /out, the same wrk command, ${secs}s" >&2
mkdir -p "$work/nginx"
cat > "$work/nginx/nginx.conf" <<NGINX
daemon off;
worker_processes $(nproc);
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  # the service never closes a kept-alive connection between requests; neither does this
  keepalive_requests 1000000000;
  keepalive_timeout 60s;
  server {
    listen 127.0.0.1:$nport;
    location /out { return 202; }
  }
}
NGINX
"$nginx_bin" -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" &
nginx_pid=$!
pids+=("$nginx_pid")
nginx_up=no
for _ in $(seq 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$nport/out")" = 202 ] && { nginx_up=yes; break; }
  sleep 0.1
done
[ "$nginx_up" = yes ] || { echo "nginx does not answer on 127.0.0.1:$nport:" >&2; cat "$work/nginx/error.log" >&2; exit 1; }
nginx_procs=("$nginx_pid" $(pgrep -P "$nginx_pid"))
nginx_ticks="$(cpu_ticks "${nginx_procs[@]}")"
wrk -t2 -c"$conns" -d"${secs}s" --latency -s "$root/bench/counters/out.lua" "http://127.0.0.1:$nport/out" >"$work/nginx-wrk.txt"
nginx_ticks=$(($(cpu_ticks "${nginx_procs[@]}") - nginx_ticks))
kill "$nginx_pid" 2>/dev/null || true
wait "$nginx_pid" 2>/dev/null || true

python3 - "$work/wrk.txt" "$work/metrics.txt" "$work/ref.json" "$sent" "$start_ns" "$done_ns" "$conns" "$secs" "$workers" "$work/nginx-wrk.txt" "$service_ticks" "$redis_ticks" "$nginx_ticks" "$(getconf CLK_TCK)" <<'PY'
import json, re, sys
wrk, metrics, ref = (open(p).read() for p in sys.argv[1:4])
sent, start, done, conns, secs, workers = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8], sys.argv[9]
nginx = open(sys.argv[10]).read()
service_ticks, redis_ticks, nginx_ticks, hz = (int(a) for a in sys.argv[11:15])
nginx_requests = int(re.search(r"(\d+) requests in", nginx).group(1))
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", wrk).group(1))
m = re.search(r"Non-2xx or 3xx responses: (\d+)", wrk)
bad = int(m.group(1)) if m else 0
def ms(s):
    v, u = re.match(r"([\d.]+)(us|ms|s)", s).groups()
    return float(v) * {"us": 0.001, "ms": 1, "s": 1000}[u]
p99_http = ms(re.search(r"99%\s+(\S+)", wrk).group(1))
nginx_rps = float(re.search(r"Requests/sec:\s+([\d.]+)", nginx).group(1))
m = re.search(r"Non-2xx or 3xx responses: (\d+)", nginx)
nginx_bad = int(m.group(1)) if m else 0
nginx_p99 = ms(re.search(r"99%\s+(\S+)", nginx).group(1))
# p99 of the count delay (202 -> EXEC reply) from the histogram, interpolated in its bucket
b = [(float(le), float(n)) for le, n in re.findall(r'count_delay_seconds_bucket\{le="([^"+]+)"\} (\S+)', metrics)]
total = float(re.search(r"count_delay_seconds_count (\S+)", metrics).group(1))
target, lo, prev = 0.99 * total, 0.0, 0.0
p99_queue = b[-1][0] * 1000
for le, n in b:
    if n >= target:
        p99_queue = (lo + (le - lo) * (target - prev) / max(n - prev, 1)) * 1000
        break
    lo, prev = le, n
r = json.loads(ref)
counted = sent / ((done - start) / 1e9)
print(f"service  /out accepted (202): {rps:,.0f} req/s   counted: {counted:,.0f} /s   "
      f"p99 request->202 {p99_http:.2f} ms   p99 202->counted {p99_queue:.2f} ms")
print(f"reference MULTI/EXEC direct:  {r['per_second']:,.0f} tx/s   p99 {r['p99_ms']:.2f} ms")
print(f"ratio service/reference: accepted {rps / r['per_second']:.2f}   counted {counted / r['per_second']:.2f}")
print(f"reference nginx `return 202`: {nginx_rps:,.0f} req/s   p99 {nginx_p99:.2f} ms   (non-2xx answers: {nginx_bad})")
print(f"ratio service/nginx: accepted {rps / nginx_rps:.2f}   counted {counted / nginx_rps:.2f}")
us = lambda ticks, n: ticks / hz * 1e6 / max(n, 1)
print(f"CPU per request: service {us(service_ticks, sent):.1f} us + its redis {us(redis_ticks, sent):.1f} us;   "
      f"nginx {us(nginx_ticks, nginx_requests):.1f} us   (service/nginx {us(service_ticks, sent) / max(us(nginx_ticks, nginx_requests), 1e-9):.2f})")
print(f"(connections {conns}, workers {workers}, {secs}s each, {sent} requests counted, non-2xx answers: {bad})")
PY
