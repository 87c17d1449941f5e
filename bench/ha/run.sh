#!/usr/bin/env bash
# bench/ha/run.sh: rows per second through a chain of three no-op stages with one dispatcher
# (MODE single) and with three dispatchers sharing the database (MODE shared, as on three
# hosts; here all on this machine), side by side in the same run (docs/ha.md, docs/perf.md).
#
# ROWS rows are preloaded from 50 senders, one of them sending half. Stages: init -> b -> c
# (examples/pepsi-test-stage: advance, advance, finish), PARALLELISM 2 and QUEUE_LIMIT 8 each.
# Cases: one dispatcher; three in MODE shared with PARALLELISM per host (three times the
# workers); three with PARALLELISM_SCOPE = global (the single dispatcher's worker count,
# shared). Each case ends when the queue is empty; its figure is rows/s and the ratio to the
# single dispatcher. A case with a kill -9 of one shared dispatcher at a third of the rows
# checks that the totals still come out exact (every row finished, none left behind).
#
# Usage: bench/ha/run.sh [ROWS]   (needs DATABASE_URL or the server on 127.0.0.1:5432)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/services.sh
trap stop_services EXIT
rows="${1:-100000}"
ensure_postgres "$root/target/bench-services/pg"
cargo build --quiet --release --bin pepsi-dispatch --bin pepsi-setup --example pepsi-test-stage
rel="${CARGO_TARGET_DIR:-$root/target}/release"
db="pepsi_bench_ha"
url="${DATABASE_URL%/*}/$db"
psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
"$rel/pepsi-setup" db --database-url "$url" >/dev/null
work="$(mktemp -d)"

config() { # mode scope
  cat > "$work/pepsi.conf" <<CONF
[database]
URL = $url
MAX_CONNECTIONS = 4
[pepsi-dispatch]
POLL_INTERVAL = 1s
MODE = $1
PARALLELISM_SCOPE = $2
[stage-init]
PROGRAM = $rel/examples/pepsi-test-stage
NEXT_STAGE = b
PARALLELISM = 2
QUEUE_LIMIT = 8
MAX_MESSAGES = 0
[stage-b]
PROGRAM = $rel/examples/pepsi-test-stage
NEXT_STAGE = c
PARALLELISM = 2
QUEUE_LIMIT = 8
MAX_MESSAGES = 0
[stage-c]
PROGRAM = $rel/examples/pepsi-test-stage
ACTION = finish
PARALLELISM = 2
QUEUE_LIMIT = 8
MAX_MESSAGES = 0
CONF
}

sql() { psql "$url" -Atqc "$1"; }
now() { date +%s.%N; }
load() {
  sql "TRUNCATE pepsi.workqueue, pepsi.workqueue_body, pepsi.stage_stats, pepsi.dispatcher" >/dev/null
  sql "SELECT count(pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], convert_to(E'Subject: x\r\n', 'UTF8'), convert_to(E'y\r\n', 'UTF8'), '{}', CASE WHEN g % 2 = 0 THEN 'heavy' ELSE 's' || (g % 49) END)) FROM generate_series(1, $rows) g" >/dev/null
  sql "VACUUM ANALYZE pepsi.workqueue" >/dev/null
}
left() { sql "SELECT count(*) FROM pepsi.workqueue"; }

run_case() { # label mode scope dispatchers kill
  local label="$1" mode="$2" scope="$3" n="$4" kill="${5:-no}"
  config "$mode" "$scope"
  load
  local pids=() t0; t0="$(now)"
  for i in $(seq "$n"); do
    "$rel/pepsi-dispatch" -c "$work/pepsi.conf" -L warn 2>"$work/d$i.log" &
    pids+=($!)
  done
  if [ "$kill" = yes ]; then
    while [ "$(left)" -gt $((rows * 2 / 3)) ]; do sleep 0.05; done
    kill -KILL "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true
    pids=("${pids[@]:1}")
  fi
  while [ "$(left)" != 0 ]; do sleep 0.05; done
  local secs; secs="$(echo "$(now) - $t0" | bc -l)"
  for p in "${pids[@]}"; do kill -TERM "$p"; done
  for p in "${pids[@]}"; do wait "$p" || true; done
  local rate; rate="$(echo "$rows / $secs" | bc -l)"
  local finished; finished="$(sql "SELECT coalesce(sum(messages), 0) FROM pepsi.stage_stats WHERE stage = 'c'")"
  echo "$label $rate $finished"
}

echo "machine: $(nproc) cores; rows: $rows; $(date -u +%Y-%m-%d)"
echo
echo "| case | dispatchers | rows/s | ratio to one | passes at c (stage_stats) |"
echo "| --- | --- | --- | --- | --- |"
base=""
for round in 1 2; do
  while read -r label rate finished; do
    [ -z "$base" ] && base="$rate"
    case "$label" in single) n=1 ;; *) n=3 ;; esac
    printf '| %s (round %s) | %s | %.0f | %.2f | %s |\n' "$label" "$round" "$n" "$rate" "$(echo "$rate / $base" | bc -l)" "$finished"
  done < <(
    run_case single single host 1
    run_case shared-host shared host 3
    run_case shared-global shared global 3
    [ "$round" = 1 ] && run_case shared-host-kill9 shared host 3 yes
  )
done
rm -rf "$work"
psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
