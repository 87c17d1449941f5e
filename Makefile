# Pepsi: the two commands of the README, and a few conveniences.

.PHONY: fuzz run test build unibin clippy fmt man install deb

# The unified binary (spec 22.2, docs/unibin.md). Which programs are folded into the one
# multi-call executable `pepsi` (installed as symlinks to it) and which are standalone (their
# own executables in both builds, each for the reason its row gives) is the table of programs
# in src/programs/mod.rs; the recipes below read its lists from the built `pepsi`
# (`pepsi --list`, `pepsi --list-standalone`, and the second names of standalone programs,
# `pepsi --list-links`), and tests/integration/unibin.rs checks the
# `[[bin]]` targets of Cargo.toml against it.

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
	@standalone=$$($(TARGET_DIR)/$(PROFILE_DIR)/pepsi --list-standalone) || exit 1; \
	for b in pepsi $$standalone; do \
	  ln -f $(TARGET_DIR)/$(PROFILE_DIR)/$$b $(UNIBIN_DIR)/$$b 2>/dev/null || \
	  cp -f $(TARGET_DIR)/$(PROFILE_DIR)/$$b $(UNIBIN_DIR)/$$b || exit 1; \
	done
	@folded=$$($(UNIBIN_DIR)/pepsi --list) || exit 1; \
	for b in $$folded; do ln -s pepsi $(UNIBIN_DIR)/$$b || exit 1; done
	@links=$$($(UNIBIN_DIR)/pepsi --list-links) || exit 1; \
	for l in $$links; do ln -s $${l#*:} $(UNIBIN_DIR)/$${l%%:*} || exit 1; done
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
	  FOLDED="$$($(UNIBIN_DIR)/pepsi --list)" STANDALONE="$$($(UNIBIN_DIR)/pepsi --list-standalone)" \
	  COMMAND_LINKS="$$($(UNIBIN_DIR)/pepsi --list-links)" \
	  INSTALL_SENDMAIL='$(INSTALL_SENDMAIL)' SENDMAIL_PATH='$(SENDMAIL_PATH)' \
	  INSTALL_CONFIG='$(INSTALL_CONFIG)' packaging/install.sh

# `make deb [PROFILE=release] [DEB_DIR=...] [INSTALL_SENDMAIL=no]`: the Debian packages
# `pepsi`, `migadu-counters` and `pepsi-telemetry` in $(DEB_DIR), built with dpkg-deb from `make install
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
