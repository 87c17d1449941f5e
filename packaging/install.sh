#!/bin/sh
# packaging/install.sh: what `make install` does (the Makefile passes its variables in the
# environment). Lays out an installation under $DESTDIR$PREFIX (docs/install.md):
#
#   $PREFIX/libexec/pepsi/pepsi             the unified executable
#   $PREFIX/libexec/pepsi/<folded>          a symlink to it per folded program, beside it, so
#                                           the dispatcher finds every stage program there
#   $PREFIX/libexec/pepsi/<standalone>      the standalone executables
#   $PREFIX/bin/<program>                   a symlink per program: ../libexec/pepsi/pepsi for
#                                           a folded one, ../libexec/pepsi/<program> else
#   $PREFIX/share/man/man{1,7,8}/           the manual pages (make man)
#   $PREFIX/share/pepsi/                    privileges.txt, pepsi.conf (the default)
#   $SYSCONFDIR/pepsi/pepsi.conf, secrets.d/ the configuration, never overwritten (SYSCONFDIR
#                                           /etc: where the programs look without -c)
#   $SENDMAIL_PATH                          -> pepsi-sendmail, with INSTALL_SENDMAIL=yes
#
# The bits, owners and groups are those of packaging/privileges.txt, the one list the
# Debian package's postinst applies too. They are applied here only when run as root
# without DESTDIR (creating the system users and groups the list names when missing);
# otherwise every file is installed with plain modes and what a root install or the
# package would set is printed, nothing fails for want of chown.
set -eu

: "${PREFIX:?}" "${UNIBIN_DIR:?}" "${MAN_DIR:?}" "${FOLDED:?}" "${STANDALONE:?}"
DESTDIR="${DESTDIR:-}"
INSTALL_SENDMAIL="${INSTALL_SENDMAIL:-no}"
SENDMAIL_PATH="${SENDMAIL_PATH:-/usr/sbin/sendmail}"
here="$(cd "$(dirname "$0")" && pwd)"
list="$here/privileges.txt"

libexec="$PREFIX/libexec/pepsi"
bindir="$PREFIX/bin"
mandir="$PREFIX/share/man"
datadir="$PREFIX/share/pepsi"
d="$DESTDIR"

fail() { echo "make install: $*" >&2; exit 1; }
[ -x "$UNIBIN_DIR/pepsi" ] || fail "no unified layout in $UNIBIN_DIR (make unibin)"
[ -d "$MAN_DIR/man8" ] || fail "no manual pages in $MAN_DIR (make man)"

privileged=no
if [ -z "$DESTDIR" ] && [ "$(id -u)" = 0 ]; then
  privileged=yes
fi

install -d -m 0755 "$d$libexec" "$d$bindir" "$d$datadir" "$d$mandir"
install -m 0755 "$UNIBIN_DIR/pepsi" "$d$libexec/pepsi"
for b in $STANDALONE; do
  install -m 0755 "$UNIBIN_DIR/$b" "$d$libexec/$b"
done
for b in $FOLDED; do
  ln -sfn pepsi "$d$libexec/$b"
  ln -sfn ../libexec/pepsi/pepsi "$d$bindir/$b"
done
for b in $STANDALONE; do
  ln -sfn "../libexec/pepsi/$b" "$d$bindir/$b"
done
ln -sfn ../libexec/pepsi/pepsi "$d$bindir/pepsi"
# Second names of standalone programs (name:program), in both directories.
for l in ${COMMAND_LINKS:-}; do
  ln -sfn "${l#*:}" "$d$libexec/${l%%:*}"
  ln -sfn "../libexec/pepsi/${l#*:}" "$d$bindir/${l%%:*}"
done
if [ "$INSTALL_SENDMAIL" = yes ]; then
  install -d -m 0755 "$d$(dirname "$SENDMAIL_PATH")"
  ln -sfn "$libexec/pepsi-sendmail" "$d$SENDMAIL_PATH"
fi

for section in 1 7 8; do
  [ -d "$MAN_DIR/man$section" ] || continue
  install -d -m 0755 "$d$mandir/man$section"
  for page in "$MAN_DIR/man$section"/*; do
    install -m 0644 "$page" "$d$mandir/man$section/"
  done
done
install -m 0644 "$list" "$d$datadir/privileges.txt"
install -m 0644 "$here/../etc/pepsi.conf" "$d$datadir/pepsi.conf"

# The system users and groups of the list, as the package's postinst makes them.
ensure_accounts() {
  grep -E '^(group|user)[[:space:]]' "$list" | while read -r kind name primary extra home; do
    case "$kind" in
      group)
        getent group "$name" >/dev/null || groupadd --system "$name" ;;
      user)
        getent group "$primary" >/dev/null || groupadd --system "$primary"
        getent passwd "$name" >/dev/null ||
          useradd --system --gid "$primary" --home-dir "$home" --no-create-home \
            --shell /usr/sbin/nologin --comment "Pepsi mail server ($name)" "$name"
        [ "$extra" = - ] || usermod --append --groups "$extra" "$name" ;;
    esac
  done
}

# The directories and program modes of the list.
apply() {
  grep -E '^(program|dir)[[:space:]]' "$list" | while read -r kind path owner group mode; do
    case "$kind" in
      program) path="$libexec/$path" ;;
    esac
    if [ "$privileged" = yes ]; then
      [ "$kind" = dir ] && install -d "$path"
      chown "$owner:$group" "$path"
      chmod "$mode" "$path"
    else
      printf '  %s %s:%s %s %s\n' "$mode" "$owner" "$group" "$kind" "$path"
    fi
  done
}

if [ "$privileged" = yes ]; then
  ensure_accounts
  apply
else
  echo "make install: not root, or DESTDIR set: installed without owners and bits. A root"
  echo "install (or the package's postinst) sets these, from $datadir/privileges.txt:"
  apply
fi

# The configuration: installed when absent, never overwritten (the package leaves it to its
# postinst, INSTALL_CONFIG=no).
[ "${INSTALL_CONFIG:-yes}" = yes ] || { echo "installed under $DESTDIR$PREFIX"; exit 0; }
etc="${SYSCONFDIR:-/etc}/pepsi"
conf="$d$etc/pepsi.conf"
install -d -m 0755 "$d$etc"
install -d -m 0750 "$d$etc/secrets.d"
if [ -e "$conf" ]; then
  echo "make install: kept $conf (the default is $datadir/pepsi.conf)"
else
  install -m 0644 "$here/../etc/pepsi.conf" "$conf"
fi
if [ "$privileged" = yes ]; then
  chown root:pepsi "$conf"
fi
echo "installed under $DESTDIR$PREFIX"
