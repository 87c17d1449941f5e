#!/usr/bin/env bash
# bench/dispatch/run.sh: rows per second through a chain of three no-op stages, next to the
# database's own limit for the same per-pass work measured in the same run.
#
# Pepsi: pepsi-dispatch with three stages of examples/pepsi-test-stage (ACTION advance,
# advance, finish), PARALLELISM 2, QUEUE_LIMIT 1, 8 and 32; (a) a queue preloaded with ROWS
# rows, (b) rows arriving continuously in batches of 100 (each batch commits, then notifies).
# Reference: pgbench running one worker pass (the row SELECT and the advancing UPDATE) per
# transaction with 6 clients (3 stages × PARALLELISM 2) on the same database: the ceiling for
# rows/s is its pass rate / 3. Round trips: committed transactions per message
# (pg_stat_database), which counts every autocommit statement of dispatcher and workers.
#
# Usage: bench/dispatch/run.sh [ROWS]   (needs DATABASE_URL or the server on 127.0.0.1:5432)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/services.sh
trap stop_services EXIT
rows="${1:-20000}"
ensure_postgres "$root/target/bench-services/pg"
cargo build --quiet --release --bin pepsi-dispatch --bin pepsi-setup --example pepsi-test-stage
rel="${CARGO_TARGET_DIR:-$root/target}/release"
db="pepsi_bench_dispatch"
url="${DATABASE_URL%/*}/$db"
psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
"$rel/pepsi-setup" db --database-url "$url" >/dev/null
work="$(mktemp -d)"
pgbench="$(command -v pgbench || echo "$(pg_bindir)/pgbench")"

config() { # queue_limit
  cat > "$work/pepsi.conf" <<CONF
[database]
URL = $url
MAX_CONNECTIONS = 4
[pepsi-dispatch]
POLL_INTERVAL = 1s
[stage-init]
PROGRAM = $rel/examples/pepsi-test-stage
NEXT_STAGE = b
PARALLELISM = 2
QUEUE_LIMIT = $1
MAX_MESSAGES = 0
[stage-b]
PROGRAM = $rel/examples/pepsi-test-stage
NEXT_STAGE = c
PARALLELISM = 2
QUEUE_LIMIT = $1
MAX_MESSAGES = 0
[stage-c]
PROGRAM = $rel/examples/pepsi-test-stage
ACTION = finish
PARALLELISM = 2
QUEUE_LIMIT = $1
MAX_MESSAGES = 0
CONF
}

sql() { psql "$url" -Atqc "$1"; }
add() { sql "SELECT count(pepsi.workqueue_add('a@example.test', ARRAY['b@example.test'], convert_to(E'Subject: x\r\n', 'UTF8'), convert_to(E'y\r\n', 'UTF8'), '{}', 's' || (g % 50))) FROM generate_series(1, $1) g" >/dev/null; }
xacts() { sql "SELECT xact_commit FROM pg_stat_database WHERE datname = '$db'"; }
now() { date +%s.%N; }

# Waits until the queue is empty; prints the elapsed seconds since $1.
drain() {
  while [ "$(sql 'SELECT count(*) FROM pepsi.workqueue')" != 0 ]; do sleep 0.05; done
  echo "$(now) - $1" | bc -l
}

run_case() { # mode queue_limit
  local mode="$1" ql="$2"
  config "$ql"
  sql "TRUNCATE pepsi.workqueue, pepsi.workqueue_body, pepsi.stage_stats" >/dev/null
  [ "$mode" = preloaded ] && add "$rows"
  sleep 0.5
  local x0; x0="$(xacts)"
  local t0; t0="$(now)"
  "$rel/pepsi-dispatch" -c "$work/pepsi.conf" -L warn 2>"$work/dispatch.log" &
  local pid=$!
  if [ "$mode" = continuous ]; then
    for _ in $(seq $((rows / 100))); do add 100; sql "SELECT pg_notify('workqueue', '')" >/dev/null; done
  fi
  local secs; secs="$(drain "$t0")"
  kill -TERM "$pid"; wait "$pid" || true
  local x1; x1="$(xacts)"
  local feed=0
  [ "$mode" = continuous ] && feed=$((rows / 100 * 2))
  printf '| %s | %s | %.0f | %.2f |\n' "$mode" "$ql" "$(echo "$rows / $secs" | bc -l)" \
    "$(echo "($x1 - $x0 - $feed) / $rows" | bc -l)"
}

reference() {
  sql "TRUNCATE pepsi.workqueue, pepsi.workqueue_body RESTART IDENTITY" >/dev/null
  add "$rows" >/dev/null
  cat > "$work/pass.sql" <<'PASS'
\set id random(1, :rows)
SELECT workqueue_id, stage, status, mail_from, rcpt_to, state, received_at, auth_user FROM pepsi.workqueue WHERE workqueue_id = :id;
UPDATE pepsi.workqueue SET status = 'pending', stage = stage, state = state || '{"x":1}', timeout = NULL, updated_at = now() WHERE workqueue_id = :id;
PASS
  local tps
  tps="$("$pgbench" -n -c 6 -j 2 -T 10 -D rows="$rows" -f "$work/pass.sql" "$url" 2>/dev/null \
        | sed -n 's/^tps = \([0-9.]*\).*/\1/p')"
  echo "$tps"
}

echo "machine: $(nproc) cores; rows: $rows; $(date -u +%Y-%m-%d)"
ref_tps="$(reference)"
sql "TRUNCATE pepsi.workqueue, pepsi.workqueue_body" >/dev/null
echo "reference: pgbench, one pass (SELECT + advancing UPDATE) per transaction, 6 clients: $ref_tps passes/s = $(printf '%.0f' "$(echo "$ref_tps / 3" | bc -l)") rows/s through 3 stages"
echo
echo "| arrival | QUEUE_LIMIT | rows/s | transactions/message |"
echo "| --- | --- | --- | --- |"
for mode in preloaded continuous; do
  for ql in 1 8 32; do run_case "$mode" "$ql"; done
done
rm -rf "$work"
psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
