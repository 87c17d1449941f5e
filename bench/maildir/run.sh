#!/usr/bin/env bash
# bench/maildir/run.sh: what a keyed delivery costs the Maildir writer as the mailbox grows,
# with the index of keyed copies (the default) and without it (`--key-index-dirs 0`: new/
# and cur/ read for every delivery, as before the index), in alternating rounds of one run.
#
# For each mailbox size (files already in cur/), each round makes two fresh Maildirs of that
# size and sends N keyed 4 KiB deliveries into each through the writer's protocol
# (bench/maildir/writer.py: dir-sync later, a `sync` every 20 as the stage's rounds), one
# writer with the index and one without; it prints deliveries/s and the writer's CPU per
# delivery for each, then the medians and their ratio.
#
#   bench/maildir/run.sh [deliveries=2000] [rounds=3] [sizes=0,10000,50000]
#
# Environment: MAILDIR_BUILD=no measures the release writer already built. Needs python3,
# cargo. Uses CARGO_TARGET_DIR if set; works in a temporary directory under target/.
set -euo pipefail
n="${1:-2000}"
rounds="${2:-3}"
sizes="${3:-0,10000,50000}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
if [ "${MAILDIR_BUILD:-yes}" != no ]; then
  cargo build --release -q --bin pepsi-helper-maildir-writer
fi
writer="$target/release/pepsi-helper-maildir-writer"
[ -x "$writer" ] || { echo "no release writer at $writer (build it, or drop MAILDIR_BUILD=no)" >&2; exit 1; }
mkdir -p "$target"
work="$(mktemp -d "$target/bench-maildir.XXXXXX")"
trap 'rm -rf "$work"' EXIT
py="$root/bench/maildir/writer.py"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $n deliveries a run, $rounds rounds"
for size in ${sizes//,/ }; do
  : > "$work/on" ; : > "$work/off"
  for r in $(seq 1 "$rounds"); do
    for side in on off; do
      md="$work/mail/$side-$size-$r/Maildir"
      python3 "$py" fill "$md" "$size"
      sync
      args=()
      [ "$side" = off ] && args=(--key-index-dirs 0)
      line="$(python3 "$py" run "$writer" "$md" "$n" 20 "${args[@]}")"
      echo "size $size round $r index $side: $line"
      echo "$line" >> "$work/$side"
      rm -rf "$work/mail"
    done
  done
  python3 "$py" summary "$size" "$work/on" "$work/off"
done
