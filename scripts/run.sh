#!/usr/bin/env bash
# scripts/run.sh: builds Pepsi and brings it up on the embedded default configuration.
#
# Without DATABASE_URL a private PostgreSQL runs under ./var/pg; the schema, procedures and
# roles are applied with pepsi-setup; then the main job runs: a message is admitted with
# workqueue_add, claimed as the dispatcher would claim it, and handed to its stage worker
# over the real stdin/stdout protocol. The private server is stopped at exit.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/services.sh
trap stop_services EXIT

say "== building"
cargo build --quiet --bins
bin="${CARGO_TARGET_DIR:-$root/target}/debug"

mkdir -p var
ensure_postgres "$root/var/pg" 55432 private
# The default configuration reads these two.
export PEPSI_HOME="$root/var"
export DATABASE_URL="${DATABASE_URL%/*}/pepsi"
cfg="$root/etc/pepsi.conf"

say "== pepsi-setup db -c etc/pepsi.conf"
"$bin/pepsi-setup" db -c "$cfg"

say "== admitting a message from bob@example.test to alice@example.test"
id=$(psql "$DATABASE_URL" -Atq -v ON_ERROR_STOP=1 <<'SQL'
SELECT pepsi.workqueue_add('bob@example.test', ARRAY['alice@example.test'],
  convert_to(E'From: bob@example.test\r\nTo: alice@example.test\r\nSubject: hello\r\n', 'UTF8'),
  convert_to(E'Hello from make run.\r\n', 'UTF8'),
  '{"dsn": {"ret": null, "envid": null, "rcpt": [{"notify": null, "orcpt": null}]}}', NULL, '127.0.0.1');
SQL
)
say "queued as workqueue id $id at stage init"
psql "$DATABASE_URL" -Atq -c "UPDATE pepsi.workqueue SET status = 'running' WHERE workqueue_id = $id" >/dev/null
say "== echo $id | pepsi-stage-discard worker -c etc/pepsi.conf"
status=$(echo "$id" | "$bin/pepsi-stage-discard" worker -c "$cfg")
say "worker status line: $status"
left=$(psql "$DATABASE_URL" -Atq -c "SELECT count(*) FROM pepsi.workqueue WHERE workqueue_id = $id")
if [ "${status%% *}" = 0 ] && [ "$left" = 0 ]; then
  say "done: the message went through stage init and left the queue"
else
  say "the message is still queued (status line: $status)"; exit 1
fi
say "the queue lives in $DATABASE_URL (a private server's data stays in var/pg)"
