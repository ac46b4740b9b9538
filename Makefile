# payments: the two commands a newcomer needs are `make run` and `make test`.

CARGO ?= cargo
SHELL := bash
# `make run` is development: SQLite in ./data, the in-process sandbox, and a
# development JWT secret that the server refuses next to a real provider;
# tokens minted for the audience `payments-backoffice` are the back office's.
DEV_JWT_SECRET := dev-only-secret-do-not-use-in-production
DEV_BACKOFFICE_AUDIENCE := payments-backoffice

.PHONY: run test bench lint fmt build clean-data contract

## Serve on http://127.0.0.1:8080 with SQLite and the built-in sandbox.
## Builds every binary first, in one build (payments-api, payments-jobs,
## payments-sandbox, payments-smoke, payments-load), so the docs' commands,
## which run target/debug/<binary>, start at once: `cargo run -p X` would
## compile again, since features unify differently per package.
run:
	$(CARGO) build --workspace --bins
	JWT_HS256_SECRET="$${JWT_HS256_SECRET:-$(DEV_JWT_SECRET)}" \
	JWT_BACKOFFICE_AUDIENCE="$${JWT_BACKOFFICE_AUDIENCE:-$(DEV_BACKOFFICE_AUDIENCE)}" \
	"$${CARGO_TARGET_DIR:-target}/debug/payments-api"

## Every test on every backend: SQLite; PostgreSQL and MariaDB from
## TEST_POSTGRES_URL / TEST_MYSQL_URL, else throwaway servers from the local
## server binaries. A missing backend's tests are skipped, each printing
## `SKIPPED: <backend>: ...`, and counted as skipped in the summary;
## REQUIRE_ALL_BACKENDS=1 (CI) makes a missing backend fail the run. `cargo test`
## alone works too: the tests build a missing or stale binary themselves. Then
## the TypeScript client's tests (clients/typescript, npm test) against the same
## binaries: skipped without node and npm, except under REQUIRE_ALL_BACKENDS.
test:
	$(CARGO) build --workspace --bins --quiet
	@mkdir -p target
	@set -o pipefail; export REQUIRE_ALL_BACKENDS="$${REQUIRE_ALL_BACKENDS:-0}"; \
	  { $(CARGO) test --workspace --all-targets && $(CARGO) test --workspace --doc \
	    && ./scripts/typescript-client test; } 2>&1 | tee target/test.log
	@./scripts/test-summary target/test.log

## Benchmarks of the release binaries on SQLite, PostgreSQL and MariaDB
## (throwaway servers, made durable) against their ceilings: rewrites
## docs/benchmarks.md (keeping its analysis section), docs/benchmarks.svg and
## target/bench/*.json.
## BENCH_* variables size the runs; the list is in docs/benchmarks.md.
bench:
	$(CARGO) build --release --workspace --bins
	$(CARGO) run --release --quiet -p payments-tests --bin payments-bench

## openapi.yaml against a running server: lint, then schemathesis (positive
## and negative data; statuses, headers and bodies must conform; no 5xx).
contract:
	$(CARGO) build --workspace --bins --quiet
	./scripts/schemathesis

## Formatting and clippy, and the TypeScript client's biome and tsc --strict, as CI runs them.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --quiet -- -D warnings
	$(CARGO) clippy -p payments-api --no-default-features --all-targets --quiet -- -D warnings
	./scripts/typescript-client lint

fmt:
	$(CARGO) fmt --all

build:
	$(CARGO) build --workspace --release

## Forget the development state: ./data holds `make run`'s SQLite database
## and its in-process sandbox's ledger (charges, refunds, idempotency keys),
## which only make sense together.
clean-data:
	rm -rf data
