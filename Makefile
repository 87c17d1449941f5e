# Pepsi: the two commands of the README, and a few conveniences.

.PHONY: run test build clippy fmt

# Build and bring the system up on the embedded default configuration.
run:
	scripts/run.sh

# Every test, against real PostgreSQL and Redis (started privately when none answers).
test:
	scripts/test.sh

build:
	cargo build --bins

clippy:
	cargo clippy --workspace --all-targets -- -D warnings

fmt:
	cargo fmt --all
