# Pepsi: the two commands of the README, and a few conveniences.

.PHONY: fuzz run test build unibin clippy fmt man install deb

# The unified binary (spec 22.2, docs/unibin.md). These two lists are authoritative: every
# `[[bin]]` of Cargo.toml except `pepsi` itself is in exactly one of them, the folded ones
# require the `multibin` feature, and `pepsi` runs exactly the folded names
# (`pepsi::programs`); tests/integration/unibin.rs checks all of it.
#
# Folded: linked into the one multi-call executable `pepsi`, installed as a symlink to it.
FOLDED_BINARIES = \
	pepsi-dispatch \
	pepsi-failure-bouncer \
	pepsi-ingress \
	pepsi-keydisc \
	pepsi-queue \
	pepsi-settings \
	pepsi-stage-aliases \
	pepsi-stage-arc \
	pepsi-stage-autocrypt-learn \
	pepsi-stage-block-language \
	pepsi-stage-bounce \
	pepsi-stage-check-whitelist \
	pepsi-stage-count \
	pepsi-stage-discard \
	pepsi-stage-dkim-sign \
	pepsi-stage-if \
	pepsi-stage-if-headers \
	pepsi-stage-milter \
	pepsi-stage-relay-to-internet \
	pepsi-stage-relay-to-lmtp \
	pepsi-stage-route \
	pepsi-stage-srs \
	pepsi-stage-vacation \
	pepsi-status

# Standalone: their own executables in both builds.
# - Privileged (a setuid/setgid bit on the shared file would apply to every program linked
#   to it): pepsi-helper-maildir-writer (setuid root), its caller
#   pepsi-stage-relay-to-maildir (setgid), pepsi-stage-relay-to-smarthost (no bit since it
#   reads no token file; kept standalone), pepsi-sendmail (setgid pepsi-sendmail, the
#   group that may write the drop directory; run by every local user as /usr/sbin/sendmail),
#   pepsi-quota (setgid pepsi-maildir: its recount runs the Maildir writer),
#   pepsi-helper-dot-forward (setuid root: reads ~/.forward as its account) and its caller
#   pepsi-stage-dot-forward (setgid pepsi-forward); pepsi-whitelist (setuid pepsi: any
#   local user edits their own mailbox's list through the service account's database role);
#   pepsi-stage-encrypt and pepsi-stage-decrypt (setuid pepsi-crypto: that database role
#   alone reads the sealed private keys; docs/crypto.md). pepsi-keys has no bit but links
#   the whole key store and its crypto libraries, which no running service but those two
#   needs.
# - Deployed or invoked separately: pepsi-stage-detect-language (links lingua's language
#   models, a large dependency nothing else uses; also the pepsi-detect-language(1) command,
#   COMMAND_LINKS below); pepsi-helper-mailbox-scan (no bit, but execed by name
#   from pepsi-whitelist as the mailbox's owner, on a Maildir the owner controls: a small
#   program of its own rather than the whole shared binary under a user's ids); pepsi-setup (one-off provisioning, run as root, its own
#   code used by nothing else); pepsi-config (links every program's configuration parser,
#   pepsi::checks, to check an override before it is stored: code no running service needs); pepsi-httpd (the administrative web surface: started as root
#   to bind, then drops privileges, and links an HTTP server stack no other program uses); migadu_counters and counterctl, the counting service and
#   its client: a product of their own with their own service, configuration and release
#   cycle, possibly on another host, whose HTTP/Redis/CDB stack no Pepsi process uses, so
#   folding them in would only grow every Pepsi process's shared binary.
STANDALONE_BINARIES = \
	pepsi-setup \
	pepsi-helper-maildir-writer \
	pepsi-stage-relay-to-maildir \
	pepsi-helper-dot-forward \
	pepsi-stage-dot-forward \
	pepsi-stage-relay-to-smarthost \
	pepsi-sendmail \
	pepsi-quota \
	pepsi-whitelist \
	pepsi-keys \
	pepsi-stage-encrypt \
	pepsi-stage-decrypt \
	pepsi-helper-mailbox-scan \
	pepsi-stage-detect-language \
	pepsi-config \
	pepsi-httpd \
	migadu_counters \
	counterctl

# Second names of a standalone program (name:program): a multi-call executable of its own,
# which is a command under the first name (pepsi-detect-language(1)) and a stage under its own.
COMMAND_LINKS = pepsi-detect-language:pepsi-stage-detect-language

# `make unibin [PROFILE=release|dev]` builds with --no-default-features --features unibin
# and lays out $(UNIBIN_DIR): `pepsi`, one symlink to it per folded program, and the
# standalone executables, the shape of an installed system's directory of programs (the
# dispatcher started from it finds every stage program beside itself).
PROFILE ?= release
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
PROFILE_DIR := $(if $(filter dev test,$(PROFILE)),debug,$(PROFILE))
UNIBIN_DIR := $(TARGET_DIR)/$(PROFILE_DIR)/unibin

# Build and bring the system up on the embedded default configuration; `make run
# ARGS=--once` stops after the demonstration message (scripts/run.sh --once).
run:
	scripts/run.sh $(ARGS)

# Every test, against real PostgreSQL and Redis (started privately when none answers).
test:
	scripts/test.sh

build:
	cargo build --bins

# Every parser property of tests/integration/parsers_fuzz.rs with FUZZ_CASES random inputs each (the
# test suite runs 256): about a minute at the default on two cores.
FUZZ_CASES ?= 200000
fuzz:
	PROPTEST_CASES=$(FUZZ_CASES) cargo test -p pepsi --test integration -- parsers_fuzz::

unibin:
	cargo build --profile $(PROFILE) --no-default-features --features unibin --bins
	rm -rf $(UNIBIN_DIR)
	mkdir -p $(UNIBIN_DIR)
	@for b in pepsi $(STANDALONE_BINARIES); do \
	  ln -f $(TARGET_DIR)/$(PROFILE_DIR)/$$b $(UNIBIN_DIR)/$$b 2>/dev/null || \
	  cp -f $(TARGET_DIR)/$(PROFILE_DIR)/$$b $(UNIBIN_DIR)/$$b || exit 1; \
	done
	@for b in $(FOLDED_BINARIES); do ln -s pepsi $(UNIBIN_DIR)/$$b || exit 1; done
	@for l in $(COMMAND_LINKS); do ln -s $${l#*:} $(UNIBIN_DIR)/$${l%%:*} || exit 1; done
	@echo "unified layout: $(UNIBIN_DIR)"

# The manual page of every program, rendered from its clap command line, and the
# hand-written ones of man/ (pepsi.state.7), into $(MAN_DIR)/man{1,7,8} (src/manual.rs).
MAN_DIR := $(TARGET_DIR)/$(PROFILE_DIR)/man
man:
	cargo run --quiet --profile $(PROFILE) --example pepsi-man -- $(MAN_DIR)

# `make install [PREFIX=/usr/local] [DESTDIR=] [PROFILE=release] [INSTALL_SENDMAIL=no]`:
# the unified layout in $(PREFIX)/libexec/pepsi (`pepsi`, a symlink per folded program, the
# standalone programs), a $(PREFIX)/bin symlink per program (spec 22.2: every name in bin,
# docs/install.md says why), the manual pages, /etc/pepsi/pepsi.conf and secrets.d/ (never
# overwritten), and, run as root without DESTDIR, the accounts, owners and bits of
# packaging/privileges.txt (otherwise printed, not applied). packaging/install.sh does it.
PREFIX ?= /usr/local
DESTDIR ?=
INSTALL_SENDMAIL ?= no
SENDMAIL_PATH ?= /usr/sbin/sendmail
INSTALL_CONFIG ?= yes
SYSCONFDIR ?= /etc
install: unibin man
	PREFIX='$(PREFIX)' DESTDIR='$(DESTDIR)' UNIBIN_DIR='$(UNIBIN_DIR)' MAN_DIR='$(MAN_DIR)' \
	  SYSCONFDIR='$(SYSCONFDIR)' \
	  FOLDED='$(FOLDED_BINARIES)' STANDALONE='$(STANDALONE_BINARIES)' \
	  COMMAND_LINKS='$(COMMAND_LINKS)' \
	  INSTALL_SENDMAIL='$(INSTALL_SENDMAIL)' SENDMAIL_PATH='$(SENDMAIL_PATH)' \
	  INSTALL_CONFIG='$(INSTALL_CONFIG)' packaging/install.sh

# `make deb [PROFILE=release] [DEB_DIR=...] [INSTALL_SENDMAIL=no]`: the Debian packages
# `pepsi` and `migadu-counters` in $(DEB_DIR), built with dpkg-deb from `make install
# PREFIX=/usr` into a staging tree plus debian/ (control, postinst, units); the bits are
# applied by the postinst from the same privileges list (packaging/deb.sh).
DEB_DIR ?= $(TARGET_DIR)/$(PROFILE_DIR)/deb
deb: unibin man
	rm -rf $(DEB_DIR)/stage
	$(MAKE) --no-print-directory install PREFIX=/usr DESTDIR=$(abspath $(DEB_DIR))/stage/pepsi \
	  INSTALL_CONFIG=no PROFILE=$(PROFILE) INSTALL_SENDMAIL=$(INSTALL_SENDMAIL) >/dev/null
	DEB_DIR='$(abspath $(DEB_DIR))' UNIBIN_DIR='$(UNIBIN_DIR)' MAN_DIR='$(MAN_DIR)' \
	  INSTALL_SENDMAIL='$(INSTALL_SENDMAIL)' packaging/deb.sh

# pepsi/unibin beside the default multibin: every [[bin]], the unified `pepsi` too.
clippy:
	cargo clippy --workspace --all-targets --features pepsi/unibin -- -D warnings

fmt:
	cargo fmt --all
