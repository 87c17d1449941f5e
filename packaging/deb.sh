#!/bin/sh
# packaging/deb.sh: the second half of `make deb`. The Makefile has run `make install
# PREFIX=/usr DESTDIR=$DEB_DIR/stage/pepsi INSTALL_CONFIG=no`; this moves the counting
# service's two programs and the telemetry receiver into trees of their own, adds debian/
# (control, maintainer scripts, systemd units, logrotate) and the documentation, and builds
#   $DEB_DIR/pepsi_<version>_<arch>.deb
#   $DEB_DIR/migadu-counters_<version>_<arch>.deb
#   $DEB_DIR/pepsi-telemetry_<version>_<arch>.deb
# with dpkg-deb --root-owner-group: every file root:root with the modes it has here. The
# privileged programs are shipped without their bits; the postinst sets them from
# /usr/share/pepsi/privileges.txt (packaging/privileges.txt), the list `make install` uses.
set -eu

: "${DEB_DIR:?}" "${UNIBIN_DIR:?}" "${MAN_DIR:?}"
INSTALL_SENDMAIL="${INSTALL_SENDMAIL:-no}"
src="$(cd "$(dirname "$0")/.." && pwd)"
stage="$DEB_DIR/stage"
p="$stage/pepsi"
c="$stage/migadu-counters"
t="$stage/pepsi-telemetry"

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$src/Cargo.toml" | head -n 1)"
arch="$(dpkg --print-architecture)"
[ -n "$version" ] || { echo "make deb: no version in Cargo.toml" >&2; exit 1; }

# --- pepsi -----------------------------------------------------------------------------
[ -x "$p/usr/libexec/pepsi/pepsi" ] || { echo "make deb: $p is not an installed tree" >&2; exit 1; }
for b in migadu_counters counterctl pepsi-telemetry; do
  rm -f "$p/usr/libexec/pepsi/$b" "$p/usr/bin/$b"
done
rm -f "$p/usr/share/man/man8/migadu_counters.8" "$p/usr/share/man/man1/counterctl.1" \
  "$p/usr/share/man/man8/pepsi-telemetry.8"

install -d -m 0755 "$p/usr/lib/systemd/system" "$p/usr/share/doc/pepsi" "$p/DEBIAN"
for unit in "$src"/debian/systemd/pepsi*.service "$src"/debian/systemd/pepsi*.timer \
  "$src"/debian/systemd/pepsi.target; do
  install -m 0644 "$unit" "$p/usr/lib/systemd/system/"
done
for doc in "$src"/docs/*.md "$src"/README.md; do
  install -m 0644 "$doc" "$p/usr/share/doc/pepsi/"
done
install -m 0644 "$src/debian/copyright" "$p/usr/share/doc/pepsi/copyright"
for script in postinst prerm postrm; do
  install -m 0755 "$src/debian/pepsi.$script" "$p/DEBIAN/$script"
done

depends=""
if [ "$INSTALL_SENDMAIL" = yes ]; then
  # The package is then this host's MTA: it owns /usr/sbin/sendmail.
  depends="
Provides: mail-transport-agent
Conflicts: mail-transport-agent
Replaces: mail-transport-agent"
fi

control() { # template tree -> DEBIAN/control
  size="$(du -sk --exclude=DEBIAN "$2" | cut -f1)"
  DEPS="$depends" awk -v v="$version" -v a="$arch" -v s="$size" '
    { gsub(/@VERSION@/, v); gsub(/@ARCH@/, a); gsub(/@SIZE@/, s) }
    /@DEPENDS@/ { sub(/@DEPENDS@/, ""); print; d = ENVIRON["DEPS"]; if (d != "") print substr(d, 2); next }
    { print }' "$1" >"$2/DEBIAN/control"
}
control "$src/debian/pepsi.control" "$p"

# --- migadu-counters -------------------------------------------------------------------
rm -rf "$c"
install -d -m 0755 "$c/usr/bin" "$c/usr/share/man/man1" "$c/usr/share/man/man8" \
  "$c/usr/lib/systemd/system" "$c/usr/share/doc/migadu-counters" "$c/etc/logrotate.d" \
  "$c/DEBIAN"
install -m 0755 "$UNIBIN_DIR/migadu_counters" "$UNIBIN_DIR/counterctl" "$c/usr/bin/"
install -m 0644 "$MAN_DIR/man8/migadu_counters.8" "$c/usr/share/man/man8/"
install -m 0644 "$MAN_DIR/man1/counterctl.1" "$c/usr/share/man/man1/"
# The crate's unit, with the paths of this package (one definition of the service).
sed -e 's|/usr/local/bin/|/usr/bin/|g' \
  -e 's|file:///usr/local/share/doc/migadu_counters/|file:///usr/share/doc/migadu-counters/|' \
  -e 's|^# systemd unit for migadu_counters: install as .*|# systemd unit for migadu_counters (the migadu-counters package).|' \
  "$src/crates/migadu-counters/dist/migadu_counters.service" \
  >"$c/usr/lib/systemd/system/migadu_counters.service"
install -m 0644 "$src/debian/migadu-counters.logrotate" "$c/etc/logrotate.d/migadu-counters"
install -m 0644 "$src/crates/migadu-counters/config.toml.example" "$src/docs/counters.md" \
  "$c/usr/share/doc/migadu-counters/"
install -m 0644 "$src/debian/copyright" "$c/usr/share/doc/migadu-counters/copyright"
install -m 0755 "$src/debian/migadu-counters.postinst" "$c/DEBIAN/postinst"
printf '/etc/logrotate.d/migadu-counters\n' >"$c/DEBIAN/conffiles"
depends=""
control "$src/debian/migadu-counters.control" "$c"

# --- pepsi-telemetry -------------------------------------------------------------------
# The receiver runs on a host of its own: its program, unit and configuration, nothing of
# the pepsi package (docs/telemetry.md).
rm -rf "$t"
install -d -m 0755 "$t/usr/bin" "$t/usr/share/man/man8" "$t/usr/lib/systemd/system" \
  "$t/usr/share/doc/pepsi-telemetry" "$t/etc/pepsi-telemetry" "$t/DEBIAN"
install -m 0755 "$UNIBIN_DIR/pepsi-telemetry" "$t/usr/bin/"
install -m 0644 "$MAN_DIR/man8/pepsi-telemetry.8" "$t/usr/share/man/man8/"
install -m 0644 "$src/debian/pepsi-telemetry.service" "$t/usr/lib/systemd/system/"
install -m 0644 "$src/etc/pepsi-telemetry.conf" "$t/etc/pepsi-telemetry/pepsi-telemetry.conf"
install -m 0644 "$src/docs/telemetry.md" "$t/usr/share/doc/pepsi-telemetry/"
install -m 0644 "$src/debian/copyright" "$t/usr/share/doc/pepsi-telemetry/copyright"
for script in postinst prerm postrm; do
  install -m 0755 "$src/debian/pepsi-telemetry.$script" "$t/DEBIAN/$script"
done
printf '/etc/pepsi-telemetry/pepsi-telemetry.conf\n' >"$t/DEBIAN/conffiles"
control "$src/debian/pepsi-telemetry.control" "$t"

for pkg in pepsi migadu-counters pepsi-telemetry; do
  dpkg-deb --root-owner-group -Zxz -z1 --build "$stage/$pkg" \
    "$DEB_DIR/${pkg}_${version}_${arch}.deb" >/dev/null
  echo "$DEB_DIR/${pkg}_${version}_${arch}.deb"
done
