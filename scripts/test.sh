#!/usr/bin/env bash
# scripts/test.sh: runs every test of the workspace against real PostgreSQL and Redis.
#
# Uses DATABASE_URL / REDIS_URL when they answer, else the standard loopback ports, else
# starts private servers under target/test-services (stopped again at exit). Installs the
# Debian packages of every section of scripts/apt-packages.txt when missing. Then runs clippy
# with warnings denied and the whole test suite (cargo-nextest when installed), and last the
# tests whose outcome the layout can change again on the unified binary (`make unibin
# PROFILE=dev`, docs/unibin.md), with fusion allowed and without. UNIBIN=no skips that part.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
. scripts/services.sh
trap stop_services EXIT

install_listed_packages "$root"
PG_FSYNC=off ensure_postgres "$root/target/test-services/pg"
ensure_redis "$root/target/test-services/redis"

# With pepsi/unibin beside the default multibin, every [[bin]] is linted, the unified
# `pepsi` too, in one pass with the same feature resolution as the workspace build.
say "== cargo clippy --workspace --all-targets --features pepsi/unibin -- -D warnings"
cargo clippy --workspace --all-targets --features pepsi/unibin --quiet -- -D warnings

nextest=no
cargo nextest --version >/dev/null 2>&1 && nextest=yes
if [ "$nextest" = yes ]; then
  say "== cargo nextest run --workspace"
  cargo nextest run --workspace --no-fail-fast "$@"
else
  say "== cargo test --workspace"
  cargo test --workspace --no-fail-fast "$@"
fi

# The same system and dispatcher tests (built as above, with the default features) on the
# programs of the unified layout: only the root package compiles again.
[ "${UNIBIN:-yes}" = no ] && exit 0
say "== make unibin PROFILE=dev"
make --no-print-directory unibin PROFILE=dev
export PEPSI_BIN_DIR="${CARGO_TARGET_DIR:-$root/target}/debug/unibin"
# The modules of the one test harness (tests/integration/main.rs) that run again: those
# whose outcome the layout can change, no more. With fusion allowed: the whole pipeline
# (system_*), the dispatcher starting programs beside itself and fusing chains (dispatch),
# the milter and the set-user-id crypto programs as the layout installs them, and the layout
# itself (unibin). Without fusion, the pipeline's stages run as one process each from the
# same `pepsi`: the system tests alone cover that. The standby dispatcher (ha) and every
# other module do not depend on how the programs are laid out.
for fusion in yes no; do
  if [ "$fusion" = yes ]; then
    modules=(system_delivery system_remote dispatch milter crypto unibin)
  else
    modules=(system_delivery system_remote)
  fi
  say "== the layout-dependent tests on $PEPSI_BIN_DIR, ALLOW_FUSION = $fusion"
  if [ "$nextest" = yes ]; then
    filter="test(/^($(IFS='|'; echo "${modules[*]}"))::/)"
    PEPSI_ALLOW_FUSION=$fusion cargo nextest run -p pepsi --test integration -E "$filter" \
      --no-fail-fast "$@"
  else
    PEPSI_ALLOW_FUSION=$fusion cargo test -p pepsi --test integration --no-fail-fast "$@" \
      -- "${modules[@]/%/::}"
  fi
done
