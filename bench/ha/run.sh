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
# single dispatcher.
#
# The case shared-host-kill9 (round 1) runs three shared dispatchers with HAND_FORWARD = no
# (so a running row is one a worker holds), kills one with SIGKILL at a third of the rows and
# checks issue 17's acceptance on all ROWS: a trigger records every claim and every finish,
# a psql \watch samples the running rows per dispatcher epoch and stage every 20 ms. It fails
# (exit 1, naming the check) unless no row was claimed twice at one stage except by the killed
# dispatcher, no epoch ran more rows of a stage than its pools hold (PARALLELISM 2 x
# QUEUE_LIMIT 8 = 16), and every row finished exactly once with none left behind.
#
# Usage: bench/ha/run.sh [ROWS] [CASES]
#   ROWS   rows per case (100000)
#   CASES  all (default) or kill9: only the checked kill -9 case, once
# Needs DATABASE_URL or the server on 127.0.0.1:5432.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/services.sh
trap stop_services EXIT
rows="${1:-100000}"
cases="${2:-all}"
case "$cases" in all|kill9) ;; *) echo "bench/ha/run.sh: CASES must be all or kill9, not $cases" >&2; exit 2 ;; esac
ensure_postgres "$root/target/bench-services/pg"
cargo build --quiet --release --bin pepsi-dispatch --bin pepsi-setup --example pepsi-test-stage
rel="${CARGO_TARGET_DIR:-$root/target}/release"
db="pepsi_bench_ha"
url="${DATABASE_URL%/*}/$db"
psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
"$rel/pepsi-setup" db --database-url "$url" >/dev/null
work="$(mktemp -d)"

config() { # mode scope [hand_forward]
  cat > "$work/pepsi.conf" <<CONF
[database]
URL = $url
MAX_CONNECTIONS = 4
[pepsi-dispatch]
POLL_INTERVAL = 1s
MODE = $1
PARALLELISM_SCOPE = $2
HAND_FORWARD = ${3:-yes}
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

# The kill -9 case's records: every claim (pending to running) with its epoch, every finish.
record() {
  sql "SET client_min_messages = warning; DROP TABLE IF EXISTS public.claim, public.finished" >/dev/null
  sql "CREATE TABLE public.claim (workqueue_id bigint, stage text, epoch bigint);
       CREATE TABLE public.finished (workqueue_id bigint);
       GRANT ALL ON public.claim, public.finished TO PUBLIC;
       CREATE OR REPLACE FUNCTION public.record_claim() RETURNS trigger LANGUAGE plpgsql AS \$\$
         BEGIN INSERT INTO public.claim VALUES (NEW.workqueue_id, NEW.stage, NEW.claim_epoch); RETURN NULL; END \$\$;
       CREATE OR REPLACE FUNCTION public.record_finish() RETURNS trigger LANGUAGE plpgsql AS \$\$
         BEGIN INSERT INTO public.finished VALUES (OLD.workqueue_id); RETURN NULL; END \$\$;
       CREATE OR REPLACE TRIGGER record_claim AFTER UPDATE ON pepsi.workqueue FOR EACH ROW
         WHEN (OLD.status = 'pending' AND NEW.status = 'running') EXECUTE FUNCTION public.record_claim();
       CREATE OR REPLACE TRIGGER record_finish AFTER DELETE ON pepsi.workqueue FOR EACH ROW
         EXECUTE FUNCTION public.record_finish()" >/dev/null
}
unrecord() {
  sql "DROP TRIGGER IF EXISTS record_claim ON pepsi.workqueue;
       DROP TRIGGER IF EXISTS record_finish ON pepsi.workqueue" >/dev/null
}
# Fails naming the check unless the kill -9 case met the acceptance; $1 is the killed epoch.
check_kill9() {
  local killed="$1" twice most finished distinct
  twice="$(sql "SELECT count(*) FROM (SELECT workqueue_id, stage FROM public.claim GROUP BY 1, 2
                HAVING count(*) > 1 AND NOT bool_or(epoch = $killed)) x")"
  most="$(sort -n "$work/running" | tail -1)"
  finished="$(sql "SELECT count(*) FROM public.finished")"
  distinct="$(sql "SELECT count(DISTINCT workqueue_id) FROM public.finished")"
  echo "kill9 check: killed epoch $killed; rows claimed twice at one stage without it: $twice;" \
       "most rows of one stage running for one epoch: ${most:-0} (pools 16);" \
       "finished $finished ($distinct distinct) of $rows; left $(left)" >&2
  # run_case runs in a process substitution: failures are written down for the main shell.
  [ "$twice" = 0 ] || echo "kill9 check failed: $twice rows claimed twice" >>"$work/failed"
  [ "${most:-0}" -le 16 ] || echo "kill9 check failed: $most running rows of one stage" >>"$work/failed"
  [ "$finished" = "$rows" ] && [ "$distinct" = "$rows" ] && [ "$(left)" = 0 ] \
    || echo "kill9 check failed: totals" >>"$work/failed"
}

run_case() { # label mode scope dispatchers kill
  local label="$1" mode="$2" scope="$3" n="$4" kill="${5:-no}"
  local watch="" killed=""
  if [ "$kill" = yes ]; then config "$mode" "$scope" no; else config "$mode" "$scope"; fi
  load
  if [ "$kill" = yes ]; then
    record
    printf '%s\n' "SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM pepsi.workqueue WHERE status = 'running' GROUP BY claim_epoch, stage) x" '\watch 0.02' \
      | psql "$url" -Atq >"$work/running" 2>/dev/null &
    watch=$!
  fi
  local pids=() t0; t0="$(now)"
  for i in $(seq "$n"); do
    "$rel/pepsi-dispatch" -c "$work/pepsi.conf" -L warn 2>"$work/d$i.log" &
    pids+=($!)
  done
  if [ "$kill" = yes ]; then
    while [ "$(left)" -gt $((rows * 2 / 3)) ]; do sleep 0.05; done
    killed="$(sql "SELECT epoch FROM pepsi.dispatcher WHERE pid = ${pids[0]}")"
    kill -KILL "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true
    pids=("${pids[@]:1}")
  fi
  while [ "$(left)" != 0 ]; do sleep 0.05; done
  local secs; secs="$(echo "$(now) - $t0" | bc -l)"
  for p in "${pids[@]}"; do kill -TERM "$p"; done
  for p in "${pids[@]}"; do wait "$p" || true; done
  local rate; rate="$(echo "$rows / $secs" | bc -l)"
  local finished; finished="$(sql "SELECT coalesce(sum(messages), 0) FROM pepsi.stage_stats WHERE stage = 'c'")"
  if [ -n "$watch" ]; then
    kill "$watch" 2>/dev/null; wait "$watch" 2>/dev/null || true
    check_kill9 "$killed"
    unrecord
  fi
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
    ratio="$(printf '%.2f' "$(echo "$rate / $base" | bc -l)")"
    [ "$cases" = kill9 ] && ratio="–"
    printf '| %s (round %s) | %s | %.0f | %s | %s |\n' "$label" "$round" "$n" "$rate" "$ratio" "$finished"
  done < <(
    if [ "$cases" = kill9 ]; then
      run_case shared-host-kill9 shared host 3 yes
    else
      run_case single single host 1
      run_case shared-host shared host 3
      run_case shared-global shared global 3
      if [ "$round" = 1 ]; then run_case shared-host-kill9 shared host 3 yes; fi
    fi
  )
  [ "$cases" = kill9 ] && break
done
failed=0
if [ -e "$work/failed" ]; then cat "$work/failed" >&2; failed=1; fi
rm -rf "$work"
psql "$DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
exit "$failed"
