#!/bin/sh
# rspamd.sh PORT DIR: Debian's rspamd in the foreground, for tests/integration/milter.rs.
# One worker, the proxy in milter mode scanning by itself, on 127.0.0.1:PORT; every file
# it writes (configuration, database, run and log files) under DIR. No network and no
# Redis: the modules that would need them are off, DNS points at a dead loopback port.
# GTUBE is rejected (554 5.7.1 Gtube pattern); other mail is accepted with the
# X-Spamd-Result, X-Rspamd-Queue-Id and X-Spam-Status fields; the test pattern
# YJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X takes the
# add_header action (X-Spam: Yes).
set -eu
port=${1:?usage: rspamd.sh PORT DIR}
dir=${2:?usage: rspamd.sh PORT DIR}
mkdir -p "$dir/local.d" "$dir/db" "$dir/run" "$dir/log" "$dir/tmp"
dir=$(cd "$dir" && pwd)

# The stock rules and modules ($CONFDIR), but only this worker: the stock rspamd.conf
# would also start the normal and controller workers on the standard ports.
cat > "$dir/rspamd.conf" <<CONF
.include "\$CONFDIR/common.conf"
options {
  pidfile = "\$RUNDIR/rspamd.pid";
  .include "\$CONFDIR/options.inc"
  .include(try=true; priority=1,duplicate=merge) "\$LOCAL_CONFDIR/local.d/options.inc"
}
logging {
  type = "file";
  filename = "\$LOGDIR/rspamd.log";
  level = "info";
}
worker "rspamd_proxy" {
  bind_socket = "127.0.0.1:$port";
  milter = yes;
  timeout = 120s;
  count = 1;
  spam_header = "X-Spam";
  discard_on_reject = false;
  quarantine_on_reject = false;
  # Scanning in the proxy itself is a property of its default upstream.
  upstream "local" {
    default = yes;
    self_scan = yes;
  }
}
CONF

# The public-suffix list, cut to what the tests use (the stock one costs seconds per start).
printf 'com\nnet\norg\ntest\nexample\nlocalhost\n' > "$dir/tld.dat"
cat > "$dir/local.d/options.inc" <<CONF
dns {
  nameserver = ["127.0.0.1:53"];
  timeout = 0.2s;
  retransmits = 1;
  sockets = 1;
  enable_dnssec = false;
}
url_tld = "$dir/tld.dat";
tempdir = "$dir/tmp";
hs_cache_dir = "$dir/db";
disable_hyperscan = true;
enable_test_patterns = true;
task_timeout = 5s;
control_socket = null;
CONF
printf 'greylist = null;\nadd_header = 6;\nreject = 15;\n' > "$dir/local.d/actions.conf"
cat > "$dir/local.d/milter_headers.conf" <<'CONF'
use = ["x-spamd-result", "x-rspamd-queue-id", "x-spam-status"];
extended_spam_headers = true;
skip_local = false;
skip_authenticated = false;
CONF
for m in rbl surbl fuzzy_check asn spf dkim dmarc arc dkim_signing emails phishing \
         rspamd_update hfilter mx_check greylist neural ratelimit replies reputation \
         history_redis url_redirector dcc antivirus external_services metadata_exporter \
         metric_exporter clickhouse elastic bimi p0f whitelist maillist once_received \
         trie spamtrap multimap bayes_expiry; do
  echo "enabled = false;" > "$dir/local.d/$m.conf"
done

# rspamd will not run its workers as root unless told to (-i keeps them as root).
if [ "$(id -u)" = 0 ]; then insecure=-i; user=root; else insecure=; user=$(id -un); fi
exec rspamd -f $insecure -u "$user" -g "$(id -gn)" -c "$dir/rspamd.conf" \
  --var="LOCAL_CONFDIR=$dir" --var="DBDIR=$dir/db" --var="RUNDIR=$dir/run" \
  --var="LOGDIR=$dir/log"
