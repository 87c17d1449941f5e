#!/usr/bin/env bash
# scripts/fresh-check.sh [DIR]: proves that a bare Debian machine with only the Rust toolchain
# builds and runs Pepsi with the README's commands, and times it cold.
#
# In DIR (default target/fresh-check of this checkout; emptied first) it makes a minimal
# Debian root with `debootstrap --variant=minbase --include=make` (make: the one package the
# README asks for beside the Rust toolchain; SUITE, default bookworm, from MIRROR,
# default the Debian mirror of this machine's apt sources), copies in this machine's Rust
# toolchain (`rustc --print sysroot`, cargo-nextest beside it, as rustup lays them out:
# /root/.cargo/bin on PATH) and the committed tree of HEAD (`git archive`, neither the work
# tree's changes nor target/), then, in a private mount and PID namespace (so every mount and
# every process it starts goes with it, whatever happens), chrooted into that root as root:
#   1. `make run ARGS=--once` in /root/pepsi with an empty cargo home: the Debian packages of
#      scripts/apt-packages.txt's [build] and [run] sections, the crates from crates.io, the
#      cold build, the private PostgreSQL, the demonstration message delivered;
#   2. `make run` again in the background and, once it is up, the README's
#      `swaks --server 127.0.0.1:2525 --from bob@example.test --to alice@example.test`,
#      the message looked for in alice's Maildir; then Ctrl-C (SIGINT to its process group)
#      and a clean stop looked for.
# It prints the times of debootstrap, of the package installation, of the build, of the
# first delivery and of the whole cold `make run`, writes them to DIR/summary.txt, and exits
# non-zero on any failure. The chroot shares this machine's network (apt and crates.io) and its
# local certificate authorities (/usr/local/share/ca-certificates), so
# 127.0.0.1:2525, :8080 and :55432 must be free while it runs. Needs root, debootstrap (it
# installs it with apt-get when missing), unshare and chroot; takes 20-60 minutes on two cores.
#
#   scripts/fresh-check.sh                     # in target/fresh-check
#   KEEP=yes scripts/fresh-check.sh /var/tmp/fc # keep the root afterwards (default: kept too;
#                                              # KEEP=no removes it on success)
set -euo pipefail

say() { printf '[fresh-check %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# ---------------------------------------------------------------------------------------
# Inside the private namespaces (re-executed by the outer part below): mount, chroot, run.
if [ "${1:-}" = --inside ]; then
  c="$2"
  mount -t proc proc "$c/proc"
  mount --rbind /dev "$c/dev"
  mount -t tmpfs -o mode=1777 tmpfs "$c/dev/shm"
  mount --rbind /sys "$c/sys"
  mount -t tmpfs -o mode=1777 tmpfs "$c/tmp"
  exec chroot "$c" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash /root/fresh-check-steps.sh
fi

# ---------------------------------------------------------------------------------------
# The outer part, on this machine.
[ "$(id -u)" = 0 ] || { say "needs root (debootstrap, mount, chroot)"; exit 1; }
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$(realpath -m "${1:-$root/target/fresh-check}")"
suite="${SUITE:-bookworm}"
mirror="${MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror="$(grep -rhoE '(URIs:|deb) +https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null |
    grep -oE 'https?://[^ ]*' | head -n1 || true)"
  mirror="${mirror:-http://deb.debian.org/debian}"
fi
security="${SECURITY_MIRROR:-${mirror%/debian*}/debian-security}"
c="$dir/root"
commit="$(git -C "$root" rev-parse HEAD)"
sysroot="$(rustc --print sysroot)"
nextest="$(command -v cargo-nextest || true)"

for port in 2525 8080 55432; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    say "127.0.0.1:$port is taken on this machine, and the chroot shares its network: stop what listens there"
    exit 1
  fi
done

ns_pid=""
cleanup() {
  local rc=$?
  if [ -n "$ns_pid" ] && kill -0 "$ns_pid" 2>/dev/null; then
    say "stopping the namespace (pid $ns_pid)"
    kill -KILL "$ns_pid" 2>/dev/null || true
    wait "$ns_pid" 2>/dev/null || true
  fi
  # The mounts lived in the private namespace only; nothing of this machine's is left
  # mounted under DIR (checked, since a remove would otherwise reach through a bind mount).
  if grep -qF " $c/" /proc/self/mounts; then
    say "still mounted under $c (not removed):"; grep -F " $c/" /proc/self/mounts >&2
  elif [ "$rc" = 0 ] && [ "${KEEP:-yes}" = no ]; then
    rm -rf "$c"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

command -v debootstrap >/dev/null || {
  say "installing debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}

if grep -qF " $c" /proc/self/mounts; then
  say "something is mounted under $c: not touching it"; grep -F " $c" /proc/self/mounts >&2; exit 1
fi
rm -rf "$c"
mkdir -p "$dir"
say "checking commit $commit ($(git -C "$root" log -1 --format=%s "$commit" | cut -c1-80))"
say "debootstrap --variant=minbase --include=make $suite $c $mirror"
t0=$(date +%s)
debootstrap --variant=minbase --include=make "$suite" "$c" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
  { tail -n 30 "$dir/debootstrap.log" >&2; say "debootstrap failed (log $dir/debootstrap.log)"; exit 1; }
t_debootstrap=$(( $(date +%s) - t0 ))
say "debootstrap: ${t_debootstrap}s"

# apt sources as a Debian installation has them; no service starts inside the chroot (its
# PostgreSQL package would start the system cluster on this machine's port 5432).
cat >"$c/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security $suite-security main
EOF
printf '#!/bin/sh\nexit 101\n' >"$c/usr/sbin/policy-rc.d"
chmod 755 "$c/usr/sbin/policy-rc.d"
cp -L /etc/resolv.conf "$c/etc/resolv.conf"
cp -L /etc/hosts "$c/etc/hosts"
# This machine's local certificate authorities (a site's TLS-inspecting proxy, say): the
# ca-certificates package that `make run` installs adds them to the bundle cargo trusts, as
# on any machine of this network.
mkdir -p "$c/usr/local/share/ca-certificates"
for ca in /usr/local/share/ca-certificates/*.crt; do
  [ -f "$ca" ] && cp "$ca" "$c/usr/local/share/ca-certificates/" && say "local CA: $(basename "$ca")"
done

# The Rust toolchain, as rustup lays it out: the toolchain directory and /root/.cargo/bin.
tc="/root/.rustup/toolchains/$(basename "$sysroot")"
mkdir -p "$c$tc" "$c/root/.cargo/bin"
tar -C "$sysroot" --exclude=./share/doc -cf - . | tar -C "$c$tc" -xf -
for b in "$c$tc"/bin/*; do ln -s "$tc/bin/$(basename "$b")" "$c/root/.cargo/bin/$(basename "$b")"; done
[ -n "$nextest" ] && cp "$nextest" "$c/root/.cargo/bin/cargo-nextest"
say "toolchain: $("$sysroot/bin/rustc" --version) from $sysroot${nextest:+, and $nextest}"

# The committed tree of HEAD.
mkdir -p "$c/root/pepsi"
git -C "$root" archive --format=tar "$commit" | tar -C "$c/root/pepsi" -xf -

cat >"$c/root/fresh-check-steps.sh" <<'STEPS'
set -uo pipefail
cd /root/pepsi
start=$(date +%s)
stamp() { while IFS= read -r line; do printf '%5ds %s\n' "$(( $(date +%s) - start ))" "$line"; done; }
fail() { echo "FAILED: $*"; exit 1; }
# in_group PGID: some process of that process group is alive (no procps in a minimal root).
in_group() { awk -v g="$1" '{ sub(/.*\) /, ""); if ($3 == g) found = 1 } END { exit !found }' /proc/[0-9]*/stat 2>/dev/null; }

echo "== 1. make run ARGS=--once (cold: nothing but the Rust toolchain installed)"
make run ARGS=--once > >(stamp | tee /root/run-once.log) 2>&1
rc=$?
sleep 1
[ "$rc" = 0 ] || fail "make run ARGS=--once exited with status $rc"
grep -q 'delivered: var/mail/alice/Maildir/new/' /root/run-once.log || fail "no delivery line"
t_at() { awk -v m="$1" 'index($0, m) { print $1 + 0; exit }' /root/run-once.log; }
echo "TIME install=$(t_at '== building') build_done=$(t_at '== pepsi-setup db') delivered=$(t_at 'delivered:') total=$(( $(date +%s) - start ))"

echo "== 2. make run in the background, then the README's swaks line"
before=$(ls var/mail/alice/Maildir/new | wc -l)
# With job control on, the background job is a process group of its own, Ctrl-C's target.
# SIGINT back to its default first, as in a terminal: this script may have been started in the
# background (nohup ... &), which leaves SIGINT ignored, and a shell cannot trap a signal
# ignored when it started.
set -m
perl -e '$SIG{INT} = "DEFAULT"; $SIG{QUIT} = "DEFAULT"; exec @ARGV or die "$ARGV[0]: $!"' \
  make run >/root/run-bg.log 2>&1 < /dev/null &
bg=$!
set +m
t1=$(date +%s)
up=no
for _ in $(seq 600); do
  grep -q 'Pepsi is running' /root/run-bg.log && { up=yes; break; }
  kill -0 "$bg" 2>/dev/null || break
  sleep 0.5
done
[ "$up" = yes ] || { cat /root/run-bg.log; fail "make run did not come up"; }
echo "TIME warm_up=$(( $(date +%s) - t1 ))"
swaks --server 127.0.0.1:2525 --from bob@example.test --to alice@example.test >/root/swaks.log 2>&1 ||
  { cat /root/swaks.log; fail "swaks failed"; }
grep -q '<- *250 ' /root/swaks.log || { cat /root/swaks.log; fail "swaks saw no 250"; }
# The demonstration message of this run and swaks's.
for _ in $(seq 200); do
  [ "$(ls var/mail/alice/Maildir/new | wc -l)" -ge $(( before + 2 )) ] && break
  sleep 0.05
done
n=$(ls var/mail/alice/Maildir/new | wc -l)
[ "$n" -ge $(( before + 2 )) ] || { cat /root/run-bg.log; fail "swaks's message was not delivered ($n messages in alice's new/, $before before this run)"; }
grep -l 'X-Mailer: swaks' var/mail/alice/Maildir/new/* >/dev/null || fail "no message from swaks in alice's Maildir"
echo "swaks's message delivered: $(grep -l 'X-Mailer: swaks' var/mail/alice/Maildir/new/* | head -n1)"

echo "== 3. Ctrl-C"
kill -INT -- "-$bg"
# make exits at once; scripts/run.sh (same process group) stops the programs and PostgreSQL.
stopped=no
for _ in $(seq 300); do
  if ! kill -0 "$bg" 2>/dev/null && grep -q 'stopped; the queue and the mail stay under ./var' /root/run-bg.log &&
     ! in_group "$bg"; then stopped=yes; break; fi
  sleep 0.1
done
[ "$stopped" = yes ] || { cat /root/run-bg.log; fail "make run did not stop cleanly within 30 s of SIGINT"; }
for port in 2525 8080 55432; do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && fail "127.0.0.1:$port still answers after the stop"
done
echo "stopped cleanly"
echo "== OK"
STEPS

say "running make run in the chroot (log follows)"
unshare --mount --propagation private --pid --fork --kill-child \
  bash "$root/scripts/fresh-check.sh" --inside "$c" > >(tee "$dir/steps.log") 2>&1 &
ns_pid=$!
rc=0
wait "$ns_pid" || rc=$?
ns_pid=""
sleep 1

times="$(grep -E '^ *([0-9]+s )?TIME ' "$dir/steps.log" | sed -E 's/^ *([0-9]+s )?TIME //' | tr '\n' ' ')"
summary="commit $commit, $(date -u +%Y-%m-%d), $suite minbase, $(nproc) cores: debootstrap=${t_debootstrap}s $times(seconds from the start of make run)"
if [ "$rc" = 0 ] && grep -q '^== OK' "$dir/steps.log"; then
  say "OK: $summary"
  echo "OK $summary" >"$dir/summary.txt"
else
  say "FAILED (status $rc): $summary; log $dir/steps.log"
  echo "FAILED $summary" >"$dir/summary.txt"
  exit 1
fi
