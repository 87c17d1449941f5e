#!/usr/bin/env bash
# scripts/test.sh: runs every test of the workspace against real PostgreSQL and Redis.
#
# Uses DATABASE_URL / REDIS_URL when they answer, else the standard loopback ports, else
# starts private servers under target/test-services (stopped again at exit). Installs the
# Debian packages the tests need (scripts/apt-packages.txt) when missing. Then runs clippy
# with warnings denied and the whole test suite (cargo-nextest when installed).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/services.sh
trap stop_services EXIT

install_listed_packages "$root"
ensure_postgres "$root/target/test-services/pg"
ensure_redis "$root/target/test-services/redis"

say "== cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

if cargo nextest --version >/dev/null 2>&1; then
  say "== cargo nextest run --workspace"
  cargo nextest run --workspace --no-fail-fast "$@"
else
  say "== cargo test --workspace"
  cargo test --workspace --no-fail-fast "$@"
fi
