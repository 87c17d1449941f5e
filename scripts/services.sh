# scripts/services.sh: find or start the PostgreSQL and Redis servers the project needs.
# Sourced by scripts/test.sh and scripts/run.sh; every function reports what it does on stderr.
#
# A server named by DATABASE_URL / REDIS_URL, or answering on the standard loopback port, is
# used as it is. Otherwise a private one is started from the system's binaries (installed with
# apt when missing) under a directory of the caller's choosing, and stopped by stop_services.

PRIVATE_PIDS=()
PRIVATE_PGDATA=""

say() { printf '%s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    say "need root to run: $*"; return 1; fi
}

APT_UPDATED=""
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  if [ -z "$APT_UPDATED" ]; then as_root apt-get update -qq >&2; APT_UPDATED=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# listed_packages ROOT [SECTION...]: the packages of scripts/apt-packages.txt (one per line,
# `#` comments) in the given sections ([build], [run], [test]), or in all of them.
listed_packages() {
  local list="$1/scripts/apt-packages.txt" section="" line want
  shift
  [ -f "$list" ] || { say "no $list"; return 1; }
  while IFS= read -r line; do
    line="${line%%#*}"; line="${line//[[:space:]]/}"
    [ -n "$line" ] || continue
    case "$line" in \[*\]) section="${line#[}"; section="${section%]}"; continue ;; esac
    if [ $# -eq 0 ]; then printf '%s\n' "$line"; continue; fi
    for want in "$@"; do [ "$want" = "$section" ] && printf '%s\n' "$line"; done
  done < "$list"
}

# install_listed_packages ROOT [SECTION...]: installs the packages of those sections (all
# when none is named) that are missing.
install_listed_packages() {
  local root="$1" pkgs
  shift
  mapfile -t pkgs < <(listed_packages "$root" "$@")
  [ ${#pkgs[@]} -eq 0 ] || apt_install "${pkgs[@]}"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

pg_answers() { psql "$1" -Atqc 'SELECT 1' >/dev/null 2>&1; }

# local_db_url URL: URL (a database on a server of this host) as the shipped default
# configuration reaches a local server: through its Unix socket (etc/pepsi.conf's
# `postgres:///pepsi`), no TLS. Falls back to URL itself with TLS off when the server has
# no socket here.
local_db_url() {
  local url="$1" dir port db
  dir="$(psql "$url" -Atqc "SELECT split_part(current_setting('unix_socket_directories'), ',', 1)" 2>/dev/null)"
  port="$(psql "$url" -Atqc "SELECT current_setting('port')" 2>/dev/null)"
  db="${url##*/}"; db="${db%%\?*}"
  if [ -n "$dir" ] && [ -S "$dir/.s.PGSQL.$port" ] && pg_answers "postgres:///$db?host=$dir&port=$port&user=$(psql "$url" -Atqc 'SELECT current_user')"; then
    printf 'postgres:///%s?host=%s&port=%s&user=%s\n' "$db" "$dir" "$port" "$(psql "$url" -Atqc 'SELECT current_user')"
  else
    case "$url" in *sslmode=*) printf '%s\n' "$url" ;; *\?*) printf '%s&sslmode=disable\n' "$url" ;; *) printf '%s?sslmode=disable\n' "$url" ;; esac
  fi
}

pg_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  command -v initdb >/dev/null && { dirname "$(command -v initdb)"; return 0; }
  return 1
}

# ensure_postgres DIR [PORT] [private]: exports DATABASE_URL pointing at a server that
# answers. With "private", an unset DATABASE_URL means the private server, not port 5432.
# A private server it starts keeps fsync on unless PG_FSYNC=off (the test suite only).
ensure_postgres() {
  local dir="$1" port="${2:-}" mode="${3:-}"
  if [ -n "${DATABASE_URL:-}" ]; then
    pg_answers "$DATABASE_URL" && { say "PostgreSQL: using DATABASE_URL"; return 0; }
    say "PostgreSQL: DATABASE_URL does not answer; starting a private server instead"
  elif [ "$mode" != private ] && pg_answers "postgres://postgres@127.0.0.1:5432/postgres"; then
    export DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres"
    say "PostgreSQL: using the server on 127.0.0.1:5432"
    return 0
  fi
  command -v psql >/dev/null || apt_install postgresql-client
  pg_bindir >/dev/null || apt_install postgresql
  local bin; bin="$(pg_bindir)"
  local user; user="$(id -un)"
  local run=()
  if [ "$(id -u)" = 0 ]; then
    # initdb and postgres refuse to run as root.
    id postgres >/dev/null 2>&1 || as_root useradd --system --home-dir /nonexistent postgres
    # From / : the caller's directory may be closed to that account.
    user=postgres; run=(runuser -u postgres -- env -C /)
  fi
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  chmod 700 "$dir"
  if [ "$(id -u)" = 0 ] && ! runuser -u postgres -- test -w "$dir"; then
    # A checkout the postgres account cannot reach (under root's 0700 home, say): the data
    # go to a directory of their own, one per checkout directory.
    local alt; alt="/var/lib/pepsi-dev/pg-$(printf '%s' "$dir" | md5sum | cut -c1-16)"
    say "PostgreSQL: the postgres account cannot reach $dir (a closed parent directory); using $alt"
    dir="$alt"
    mkdir -p "$dir"; chown postgres "$dir"; chmod 700 "$dir"
  fi
  if [ ! -f "$dir/PG_VERSION" ]; then
    say "PostgreSQL: initdb in $dir"
    "${run[@]}" "$bin/initdb" -D "$dir" -U "$user" -A trust -E UTF8 --no-locale >/dev/null
  fi
  [ -n "$port" ] || port="$(free_port)"
  # Durable unless the caller asks otherwise: a 250 means the message is on disk. Only the
  # test suite, whose databases are thrown away, sets PG_FSYNC=off.
  local fsync=""
  [ "${PG_FSYNC:-on}" = off ] && fsync="-c fsync=off"
  if ! "${run[@]}" "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    "${run[@]}" "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $dir $fsync" start >/dev/null
    PRIVATE_PGDATA="$dir"
  else
    port="$(sed -n 4p "$dir/postmaster.pid")"
  fi
  export DATABASE_URL="postgres://$user@127.0.0.1:$port/postgres"
  PG_RUN=("${run[@]}"); PG_BIN="$bin"
  pg_answers "$DATABASE_URL" || { say "PostgreSQL: private server in $dir does not answer (see $dir/server.log)"; return 1; }
  say "PostgreSQL: private server on 127.0.0.1:$port (data in $dir)"
}

# ensure_redis DIR: exports REDIS_URL pointing at a server that answers.
ensure_redis() {
  local dir="$1"
  command -v redis-cli >/dev/null && command -v redis-server >/dev/null || apt_install redis-server
  if [ -n "${REDIS_URL:-}" ] && redis-cli -u "$REDIS_URL" ping 2>/dev/null | grep -q PONG; then
    say "Redis: using REDIS_URL"; return 0
  fi
  if redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
    export REDIS_URL="redis://127.0.0.1:6379"; say "Redis: using the server on 127.0.0.1:6379"; return 0
  fi
  local port; port="$(free_port)"
  mkdir -p "$dir"
  redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$dir" \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
  for _ in $(seq 50); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  PRIVATE_PIDS+=("$(cat "$dir/redis.pid")")
  export REDIS_URL="redis://127.0.0.1:$port"
  say "Redis: private server on 127.0.0.1:$port"
}

stop_services() {
  if [ -n "$PRIVATE_PGDATA" ]; then
    "${PG_RUN[@]}" "$PG_BIN/pg_ctl" -D "$PRIVATE_PGDATA" -m fast -w stop >/dev/null 2>&1 || true
    say "PostgreSQL: private server stopped"
  fi
  for pid in "${PRIVATE_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
}
