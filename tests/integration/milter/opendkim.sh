#!/bin/sh
# opendkim.sh MODE PORT DIR: Debian's OpenDKIM in the foreground on inet:PORT@127.0.0.1,
# for tests/integration/milter.rs, its files under DIR.
#   sign:   signs mail From example.test (selector pepsi, DIR/pepsi.private, made here when
#           missing) sent by a client on 127.0.0.1; writes DIR/keys.txt, the public key
#           as a DNS record for the verifier.
#   verify: verifies signatures, answering every DNS question of OpenDKIM from
#           DIR/keys.txt (TestDNSData: no real DNS), and inserts Authentication-Results
#           under the authserv-id mx.example.test.
# The canonicalization is simple/simple (DKIM_CANON to change it): the strictest test of
# how the header fields travel.
set -eu
mode=${1:?usage: opendkim.sh sign|verify PORT DIR}
port=${2:?usage: opendkim.sh sign|verify PORT DIR}
dir=${3:?usage: opendkim.sh sign|verify PORT DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
key="$dir/pepsi.private"
if [ ! -s "$key" ]; then
  (umask 077; openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$key" 2>/dev/null)
fi
printf 'pepsi._domainkey.example.test v=DKIM1; k=rsa; p=%s\n' \
  "$(openssl pkey -in "$key" -pubout -outform DER 2>/dev/null | base64 -w0)" > "$dir/keys.txt"
printf '127.0.0.1\n::1\n' > "$dir/internal-hosts"
# No syslog here; the key's directory is under /tmp, which RequireSafeKeys refuses.
common="Syslog no
Background no
Socket inet:$port@127.0.0.1
PidFile $dir/opendkim-$mode.pid
UMask 007
SoftwareHeader no
TemporaryDirectory $dir"
case "$mode" in
  sign) printf '%s\nMode s\nDomain example.test\nSelector pepsi\nKeyFile %s\nRequireSafeKeys false\nInternalHosts file:%s\nCanonicalization %s\nSignatureAlgorithm rsa-sha256\n' \
          "$common" "$key" "$dir/internal-hosts" "${DKIM_CANON:-simple/simple}" > "$dir/$mode.conf" ;;
  verify) printf '%s\nMode v\nTestDNSData file:%s\nDNSTimeout 1\nAuthservID mx.example.test\nAlwaysAddARHeader yes\n' \
          "$common" "$dir/keys.txt" > "$dir/$mode.conf" ;;
  *) echo "opendkim.sh: the mode is sign or verify, not $mode" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] && echo "UserID root" >> "$dir/$mode.conf"
exec opendkim -f -x "$dir/$mode.conf"
