#!/bin/bash
# spamass.sh PORT DIR: Debian's spamass-milter on inet:PORT@127.0.0.1 in front of its own
# spamd (SpamAssassin, Debian's compiled rules, no network tests), for
# tests/integration/milter.rs; every file under DIR. GTUBE scores 1000 and is rejected
# (550 5.7.1 Blocked by SpamAssassin: -r 15); a body with `pepsi-test-spam-marker` scores
# 10, spam but under the reject score, so SpamAssassin rewrites it (the subject marked, the
# body replaced by a report with the original attached); other mail gets X-Spam-Status.
# Stop with SIGTERM (spamd is stopped too) or SIGKILL (both get a parent-death signal).
set -euo pipefail
port=${1:?usage: spamass.sh PORT DIR}
dir=${2:?usage: spamass.sh PORT DIR}
mkdir -p "$dir/site" "$dir/spamd"
dir=$(cd "$dir" && pwd)
chmod 755 "$dir" "$dir/site"
# spamd starts unprivileged: run as root it changes its effective uid, which clears its
# parent-death signal. DIR and the directories above it must be open to nobody.
as_nobody=()
if [ "$(id -u)" = 0 ]; then
  chown nobody:nogroup "$dir/spamd"
  as_nobody=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
fi
# The plugin loaders of the system configuration, and a site configuration of our own
# (the rules themselves come from /usr/share/spamassassin).
cp /etc/spamassassin/*.pre "$dir/site/"
cat > "$dir/site/local.cf" <<'CF'
dns_available no
skip_rbl_checks 1
use_bayes 0
bayes_auto_learn 0
required_score 5
report_safe 1
rewrite_header Subject *****SPAM*****
clear_report_template
report Spam: _SCORE_/_REQD_ _TESTS_
body PEPSI_TEST /pepsi-test-spam-marker/
describe PEPSI_TEST a marker the tests put in a body
score PEPSI_TEST 10
CF
spamd_port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

spamd_pid=
milter_pid=
stop() {
  trap - TERM INT HUP EXIT
  # spamass-milter keeps nothing; it takes seconds to stop on SIGTERM.
  [ -n "$milter_pid" ] && kill -KILL "$milter_pid" 2>/dev/null || true
  if [ -n "$spamd_pid" ]; then
    procs="$spamd_pid $(pgrep -P "$spamd_pid" 2>/dev/null | tr '\n' ' ')"
    kill -TERM $procs 2>/dev/null || true
    for _ in $(seq 50); do
      alive=
      for p in $procs; do
        state=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f1) || true
        [ -n "$state" ] && [ "$state" != Z ] && alive=1
      done
      [ -z "$alive" ] && break
      sleep 0.05
    done
    kill -KILL $procs 2>/dev/null || true
  fi
  wait 2>/dev/null || true
}
trap 'stop; exit 143' TERM
trap 'stop; exit 130' INT
trap 'stop; exit 129' HUP
trap stop EXIT

"${as_nobody[@]}" setpriv --pdeathsig TERM -- /usr/sbin/spamd \
  --listen="127.0.0.1:$spamd_port" --allowed-ips=127.0.0.1 --local --nouser-config \
  --max-children=1 --min-children=1 --min-spare=1 --max-spare=1 \
  --siteconfigpath="$dir/site" --helper-home-dir="$dir/spamd" \
  --pidfile="$dir/spamd/spamd.pid" --syslog=stderr >>"$dir/spamd.log" 2>&1 &
spamd_pid=$!
for _ in $(seq 1800); do
  kill -0 "$spamd_pid" 2>/dev/null || { echo "spamd stopped: see $dir/spamd.log" >&2; exit 1; }
  /usr/bin/spamc -d 127.0.0.1 -p "$spamd_port" -K >/dev/null 2>&1 && break
  sleep 0.1
done
# No -f (it would fork away) and no -i/-I: mail from 127.0.0.1 and logged-in senders is
# scanned too. Arguments after -- go to spamc.
setpriv --pdeathsig KILL -- /usr/sbin/spamass-milter -p "inet:$port@127.0.0.1" \
  -P "$dir/spamass-milter.pid" -r 15 -- -d 127.0.0.1 -p "$spamd_port" \
  >>"$dir/spamass-milter.log" 2>&1 &
milter_pid=$!
set +e
wait "$milter_pid"
rc=$?
milter_pid=
exit "$rc"
