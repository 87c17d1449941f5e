#!/usr/bin/env bash
# bench/chaos/run.sh: issue 34's chaos acceptance test (tests/integration/chaos.rs) at a
# larger size: MESSAGES messages (10,000) from 4 SMTP clients through the real ingress,
# dispatcher, stages and Maildir writer, on a private PostgreSQL server the test starts,
# while it injects 12 events (kill -9 of stage workers, of the Maildir writer and of the
# dispatcher, immediate PostgreSQL restarts). It prints the test's summary (events, accepted,
# delivered copies, duplicates and what preceded them) and exits as the test does: 0 when
# every accepted message is in its Maildirs exactly once (a second copy only for a message
# the client sent again after its end of data got no 250).
#
# Usage: bench/chaos/run.sh [MESSAGES]
# Needs the PostgreSQL server programs (initdb, pg_ctl); no running server is used.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
messages="${1:-10000}"
case "$messages" in ''|*[!0-9]*) echo "bench/chaos/run.sh: MESSAGES must be a number, not $messages" >&2; exit 2 ;; esac
log="$(mktemp "${TMPDIR:-/tmp}/pepsi-chaos.XXXXXX")"
echo "commit $(git rev-parse --short HEAD), $messages messages, log in $log"
status=0
PEPSI_CHAOS_MESSAGES="$messages" cargo test --quiet -p pepsi --test integration chaos:: \
  -- --nocapture >"$log" 2>&1 || status=$?
grep -E '^(chaos|attempts|events|dispatcher|failure bouncer|delivered)|^  (event|refused|failure bouncer|duplicate)|^test |panicked|test result' "$log" || true
exit "$status"
