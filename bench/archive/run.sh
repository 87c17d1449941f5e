#!/usr/bin/env bash
# bench/archive/run.sh: the lists' archive at scale, next to notmuch (Xapian) on the same
# posts in the same run.
#
# The corpus (bench/archive/archive.py corpus): N list posts (default 100,000) in threads,
# about 1.9 KB each, as one mbox and as a Maildir. Per side:
#   import   Pepsi: `pepsi-archive import LIST FILE` (the release build) into an empty list
#            archive in PostgreSQL: parsing, threading, parts, the search column and its GIN
#            index, in transactions of 500 posts.
#            notmuch: `notmuch new` on the Maildir into an empty database.
#   search   200 queries one after another (single words common and rare, two words, from:),
#            each a process of its own as an operator or a script would run it:
#            `pepsi-archive search LIST QUERY --limit 20 --json` and
#            `notmuch search --limit=20 QUERY`.
#            p50 and p99 of the wall time per query, and how many found nothing.
#
#   bench/archive/run.sh [messages=100000]
#
# Environment: ARCHIVE_OUT=DIR keeps the raw records there (default
# target/bench-archive/last); ARCHIVE_BUILD=no measures the release binary already built.
#
# Needs: notmuch (installed when missing), PostgreSQL (DATABASE_URL, else the server on
# 127.0.0.1:5432, else a private one under target/bench-archive/pg), python3, cargo. Uses
# CARGO_TARGET_DIR if set.
set -euo pipefail
messages="${1:-100000}"
case "$messages" in ''|*[!0-9]*) echo "messages is a number, not $messages" >&2; exit 2 ;; esac
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/services.sh
target="${CARGO_TARGET_DIR:-$root/target}"
bin="$target/release"
py="$root/bench/archive/archive.py"
out="${ARCHIVE_OUT:-$target/bench-archive/last}"
rm -rf "$out"
mkdir -p "$out"
work="$(mktemp -d)"
cleanup() { stop_services; rm -rf "$work"; }
trap cleanup EXIT

command -v notmuch >/dev/null || apt_install notmuch
ensure_postgres "$root/target/bench-archive/pg"
{
  echo "postgresql: $(psql "$DATABASE_URL" -Atqc "SELECT current_setting('server_version') || ', fsync=' || current_setting('fsync') || ', synchronous_commit=' || current_setting('synchronous_commit')")"
  echo "notmuch: $(notmuch --version)"
  echo "machine: $(nproc) cores, $(uptime)"
  echo "pepsi: $(git -C "$root" rev-parse --short HEAD), $bin/pepsi-archive"
} | tee "$out/env" >&2

say "== building pepsi-archive, pepsi-setup and pepsi-list (release)"
if [ "${ARCHIVE_BUILD:-yes}" = no ]; then
  say "ARCHIVE_BUILD=no: measuring the existing binaries in $bin"
else
  cargo build --release -q --bin pepsi-archive --bin pepsi-setup --bin pepsi-list
fi

say "== the corpus: $messages posts"
python3 "$py" corpus --messages "$messages" --mbox "$work/corpus.mbox" \
  --maildir "$work/maildir" --queries "$out/queries"

# ---- Pepsi
db_url="${DATABASE_URL%/*}/pepsi_bench_archive"
psql "$DATABASE_URL" -Atqc "DROP DATABASE IF EXISTS pepsi_bench_archive WITH (FORCE)" >/dev/null
cat > "$work/pepsi.conf" <<CONF
[database]
URL = $db_url

[pepsi]
HOSTNAME = bench.example.test
LOCAL_DOMAINS = example.test
CONF
"$bin/pepsi-setup" db -c "$work/pepsi.conf" >/dev/null
"$bin/pepsi-list" -c "$work/pepsi.conf" create big@example.test --display-name Bench >/dev/null
"$bin/pepsi-list" -c "$work/pepsi.conf" configure big@example.test archive_policy=public >/dev/null
say "== pepsi-archive import"
t0="$(date +%s.%N)"
"$bin/pepsi-archive" -c "$work/pepsi.conf" import big@example.test "$work/corpus.mbox" \
  --json >"$out/pepsi.import" 2>"$out/pepsi.import.log"
t1="$(date +%s.%N)"
pepsi_import="$(python3 -c "print($t1 - $t0)")"
say "== pepsi-archive search"
python3 "$py" search --queries "$out/queries" --out "$out/pepsi.search" -- \
  "$bin/pepsi-archive" -c "$work/pepsi.conf" search big@example.test "{}" --limit 20 --json

# ---- notmuch
export NOTMUCH_CONFIG="$work/notmuch-config"
printf '[database]\npath=%s\n[new]\ntags=\n[search]\nexclude_tags=\n' "$work/maildir" >"$NOTMUCH_CONFIG"
say "== notmuch new"
t0="$(date +%s.%N)"
notmuch new >"$out/notmuch.new" 2>&1
t1="$(date +%s.%N)"
notmuch_import="$(python3 -c "print($t1 - $t0)")"
say "== notmuch search"
python3 "$py" search --queries "$out/queries" --out "$out/notmuch.search" -- \
  notmuch search --limit=20 "{}"

echo
echo "the lists' archive: $messages posts imported, then 200 queries (one process each)"
printf '%-8s | %8s | %8s | %8s | %8s | %8s | %5s\n' side posts import/s posts/s 'p50 ms' 'p99 ms' empty \
  | sed 's/import\/s/seconds /' | tee "$out/table"
python3 "$py" report --name pepsi --import-seconds "$pepsi_import" --messages "$messages" \
  --searches "$out/pepsi.search" --json "$out/pepsi.json" | tee -a "$out/table"
python3 "$py" report --name notmuch --import-seconds "$notmuch_import" --messages "$messages" \
  --searches "$out/notmuch.search" --json "$out/notmuch.json" | tee -a "$out/table"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
a, b = (json.load(open(f"{out}/{s}.json")) for s in ("pepsi", "notmuch"))
print(f"ratios pepsi/notmuch: import rate {a['import_per_s'] / b['import_per_s']:.2f}, "
      f"search p50 {b['search_p50_ms'] / a['search_p50_ms']:.2f} (above 1: pepsi faster), "
      f"p99 {b['search_p99_ms'] / a['search_p99_ms']:.2f}")
print(f"raw records: {out}")
PY
