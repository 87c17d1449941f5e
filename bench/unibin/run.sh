#!/usr/bin/env bash
# bench/unibin/run.sh: what the unified binary saves, the release build's per-program
# executables (multibin) next to the unified layout (make unibin) in the same run:
#   disk    = bytes of the executables Pepsi installs (a symlink counts its few bytes)
#   memory  = PSS (proportional set size, /proc/<pid>/smaps_rollup) summed over the running
#             Pepsi processes: pepsi-ingress, pepsi-dispatch and the stage workers the
#             default graph starts once mail went through it (local and remote branch),
#             measured after they have gone idle. PSS divides each shared page among the
#             processes mapping it, so the sum is the physical memory they take together.
#
#   bench/unibin/run.sh [messages=20]
#
# Needs PostgreSQL (DATABASE_URL, else the server on 127.0.0.1:5432, else a private one
# under target/bench-unibin/pg), python3, openssl, cargo. UNIBIN_BUILD=no measures the
# release builds already there. Uses CARGO_TARGET_DIR if set.
set -euo pipefail
messages="${1:-20}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/services.sh
target="${CARGO_TARGET_DIR:-$root/target}"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  stop_services
  rm -rf "$work"
}
trap cleanup EXIT

if [ "${UNIBIN_BUILD:-yes}" != no ]; then
  say "== building the release executables, both shapes"
  cargo build --release -q --bins
  make -s --no-print-directory unibin PROFILE=release
fi
ensure_postgres "$root/target/bench-unibin/pg"
# The two lists, from the table of programs the unified binary is built from.
folded="$("$target/release/unibin/pepsi" --list | tr '\n' ' ')"
standalone="$("$target/release/unibin/pepsi" --list-standalone | tr '\n' ' ')"

# disk DIR NAMES...: the bytes of those files in DIR (a symlink's own few bytes).
disk() {
  local dir="$1" b total=0
  shift
  for b in "$@"; do
    total=$((total + $(stat -c %s "$dir/$b")))
  done
  echo "$total"
}

# The Pepsi processes: the ingress, the dispatcher and every descendant of the dispatcher.
tree() {
  local p="$1" c
  echo "$p"
  for c in $(cat "/proc/$p/task/$p/children" 2>/dev/null); do tree "$c"; done
}

# memory DIR NAME: starts Pepsi from DIR, sends mail down both branches, waits for the
# queue to drain and the workers to idle; writes "processes PSS-kB" to $work/NAME.result
# and the per-process table to $work/NAME.table.
memory() {
  local dir="$1" name="$2" port db_url home p pss total=0 n=0
  home="$work/$name"
  db_url="${DATABASE_URL%/*}/pepsi_bench_unibin"
  psql "$DATABASE_URL" -Atqc "DROP DATABASE IF EXISTS pepsi_bench_unibin WITH (FORCE)" >/dev/null
  port="$(free_port)"
  mkdir -p "$home/mail/alice/Maildir/"{new,cur,tmp} "$home/keys"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 \
    -out "$home/keys/example.test.pepsi.pem" 2>/dev/null
  cat >"$home/pepsi.conf" <<CONF
@inline@ $root/etc/pepsi.conf
[PATHS]
PEPSI_HOME = $home
[pepsi-ingress]
# Accepted like a relay domain; not local, so routed to the remote branch.
LOCAL_DOMAINS = example.test remote.example
[listener-mx]
ADDRESS = 127.0.0.1:$port
VERIFY = no
[srs]
SECRETS = $(openssl rand -hex 16)
# Remote mail is sent to a port nobody listens on: it is deferred, which is enough to
# start every stage of the remote branch.
[stage-relay]
PROGRAM = pepsi-stage-relay-to-smarthost
HOST = 127.0.0.1
PORT = 9
TLS = none
CONF
  local penv=(env PEPSI_HOME="$home" PEPSI_KEY_DIR="$home/keys" DATABASE_URL="$db_url" PATH="$dir:$PATH")
  "${penv[@]}" pepsi-setup db -c "$home/pepsi.conf" >/dev/null
  psql "$db_url" -qc "INSERT INTO pepsi.mailbox_account (address) VALUES ('alice@example.test')"
  "${penv[@]}" pepsi-dispatch -c "$home/pepsi.conf" -L warn 2>"$home/dispatch.log" &
  local dispatch=$!
  "${penv[@]}" pepsi-ingress -c "$home/pepsi.conf" -L warn 2>"$home/ingress.log" &
  local ingress=$!
  pids=("$ingress" "$dispatch")
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done
  python3 - "$port" "$messages" <<'PY'
import smtplib, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    rcpt = "alice@example.test" if i % 2 == 0 else "someone@remote.example"
    with smtplib.SMTP("127.0.0.1", port) as s:
        s.sendmail("bob@example.test", [rcpt], f"Subject: {i}\r\n\r\nhello\r\n")
PY
  for _ in $(seq 300); do
    [ "$(psql "$db_url" -Atqc "SELECT count(*) FROM pepsi.workqueue WHERE status IN ('pending', 'running')")" = 0 ] && break
    sleep 0.1
  done
  sleep 2
  printf '%-34s %8s\n' process "PSS kB" >"$work/$name.table"
  for p in "$ingress" $(tree "$dispatch"); do
    pss="$(awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)"
    [ -n "$pss" ] || continue
    printf '%-34s %8s\n' "$(tr '\0' ' ' <"/proc/$p/cmdline" | cut -d' ' -f1 | xargs basename)" "$pss" >>"$work/$name.table"
    total=$((total + pss)); n=$((n + 1))
  done
  kill -TERM "$ingress" "$dispatch"; wait "$ingress" "$dispatch" 2>/dev/null || true
  pids=()
  echo "$n $total" >"$work/$name.result"
}

say "== multibin: $target/release"
memory "$target/release" multibin
read -r mn mpss <"$work/multibin.result"
say "== unibin: $target/release/unibin"
memory "$target/release/unibin" unibin
read -r un upss <"$work/unibin.result"
# shellcheck disable=SC2086
mdisk="$(disk "$target/release" $folded $standalone)"
# shellcheck disable=SC2086
udisk="$(disk "$target/release/unibin" pepsi $folded $standalone)"
# shellcheck disable=SC2086
mfolded="$(disk "$target/release" $folded)"
ufolded="$(disk "$target/release/unibin" pepsi)"
echo
echo "release build, $(nproc) cores; $messages messages, half to the local, half to the remote branch"
printf '%-10s | %10s | %9s | %13s\n' shape "disk MiB" processes "PSS total MiB"
printf '%-10s | %10.1f | %9d | %13.1f\n' multibin "$(echo "$mdisk / 1048576" | bc -l)" "$mn" "$(echo "$mpss / 1024" | bc -l)"
printf '%-10s | %10.1f | %9d | %13.1f\n' unibin "$(echo "$udisk / 1048576" | bc -l)" "$un" "$(echo "$upss / 1024" | bc -l)"
printf 'the folded programs alone: %.1f MiB as their own executables, %.1f MiB as pepsi\n' \
  "$(echo "$mfolded / 1048576" | bc -l)" "$(echo "$ufolded / 1048576" | bc -l)"
echo
echo "multibin processes:"; cat "$work/multibin.table"
echo
echo "unibin processes:"; cat "$work/unibin.table"
