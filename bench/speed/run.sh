#!/usr/bin/env bash
# bench/speed/run.sh: the mail paths' figures against Postfix, each the median of several
# rounds in one invocation: SMTP in -> Maildir (bench/e2e/run.sh) and relay to a smarthost
# with 1 and with 10 recipients (bench/relay/run.sh), every side saturated by the same
# clients. Per path it prints Pepsi's and Postfix's medians of msg/s, p99 from the 250 to
# delivery, CPU per message (Pepsi's own processes and PostgreSQL; Postfix's daemons) and,
# for the Maildir path, memory after the run (PSS; Pepsi's PostgreSQL backends included),
# with the ratios of the medians. Each round then runs both paths again in open loop, the
# messages started at SPEED_RATE a second (1 recipient for the relay), where what counts is
# the latency and the CPU at a load both sides carry. Rounds run the paths one after the
# other, so a slow spell of the machine touches both sides of a path alike.
#
#   bench/speed/run.sh [messages=10000] [rounds=3] [clients=20]
#
# Environment: SPEED_RATE=R the open-loop rate (default 100 messages a second; at 10,000
# messages each open-loop run takes 100 s a side; 0 leaves the open-loop runs out);
# SPEED_BUILD=no measures the release build already made (`make unibin
# PROFILE=release`); SPEED_OUT=DIR keeps every round's raw records there (default
# target/bench-speed/last); PEPSI_EXTRA_CONF as for the two benches. Needs what they need
# (postfix, PostgreSQL, python3; run as root).
set -euo pipefail
messages="${1:-10000}"
rounds="${2:-3}"
clients="${3:-20}"
rate="${SPEED_RATE:-100}"
case "$rate" in
  ''|*[!0-9]*) echo "bench/speed/run.sh: SPEED_RATE must be a whole number of messages a second, not '$rate'" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
out="${SPEED_OUT:-$target/bench-speed/last}"
rm -rf "$out"
mkdir -p "$out"
if [ "${SPEED_BUILD:-yes}" != no ]; then
  make -s --no-print-directory unibin PROFILE=release
fi
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown): $messages messages, $rounds rounds, $clients clients, open loop at $rate/s" | tee "$out/about"
for r in $(seq "$rounds"); do
  echo "round $r of $rounds: Maildir" >&2
  E2E_BUILD=no E2E_OUT="$out/r$r/maildir" bench/e2e/run.sh "$messages" "$clients" >"$out/r$r-maildir.txt" 2>&1 \
    || { echo "round $r: bench/e2e/run.sh failed, see $out/r$r-maildir.txt" >&2; exit 1; }
  echo "round $r of $rounds: relay" >&2
  RELAY_BUILD=no RELAY_OUT="$out/r$r/relay" bench/relay/run.sh "$messages" "$clients" 1,10 >"$out/r$r-relay.txt" 2>&1 \
    || { echo "round $r: bench/relay/run.sh failed, see $out/r$r-relay.txt" >&2; exit 1; }
  if [ "$rate" -gt 0 ]; then
    echo "round $r of $rounds: Maildir, open loop at $rate/s" >&2
    E2E_RATE="$rate" E2E_BUILD=no E2E_OUT="$out/r$r/maildir-open" bench/e2e/run.sh "$messages" "$clients" >"$out/r$r-maildir-open.txt" 2>&1 \
      || { echo "round $r: bench/e2e/run.sh (open loop) failed, see $out/r$r-maildir-open.txt" >&2; exit 1; }
    echo "round $r of $rounds: relay, open loop at $rate/s" >&2
    RELAY_RATE="$rate" RELAY_BUILD=no RELAY_OUT="$out/r$r/relay-open" bench/relay/run.sh "$messages" "$clients" 1 >"$out/r$r-relay-open.txt" 2>&1 \
      || { echo "round $r: bench/relay/run.sh (open loop) failed, see $out/r$r-relay-open.txt" >&2; exit 1; }
  fi
done
python3 "$root/bench/speed/summary.py" "$out" "$rounds" "$messages" "$rate"
