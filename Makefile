# nodetrust — see README.md. `make demo` runs a control plane and joins a node;
# `make test` runs every test.
GO ?= go
PROTOC ?= protoc
BIN := bin
PROTO_DIR := api/proto
PROTOS := $(shell find $(PROTO_DIR) -name '*.proto' | sort)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build demo test deps proto proto-check lint fmt-check vet staticcheck race fuzz fuzz-ci bench-smoke screenshots

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

demo: deps build
	./scripts/demo.sh

deps:
	./scripts/deps.sh

proto:
	$(PROTOC) -I $(PROTO_DIR) \
		--plugin=protoc-gen-go=$$($(GO) tool -n protoc-gen-go) \
		--plugin=protoc-gen-go-grpc=$$($(GO) tool -n protoc-gen-go-grpc) \
		--go_out=. --go_opt=module=github.com/nodetrust/nodetrust \
		--go-grpc_out=. --go-grpc_opt=module=github.com/nodetrust/nodetrust \
		$(PROTOS)

# proto-check fails when the committed generated code differs from what
# `make proto` produces.
proto-check:
	@if ! command -v $(PROTOC) >/dev/null; then \
		if [ "$$CI" = true ]; then echo "protoc is missing: CI needs Debian's protobuf-compiler (make deps as root)" >&2; exit 1; fi; \
		echo "proto-check skipped: protoc is not installed (make deps as root)" >&2; exit 0; \
	fi; \
	$(MAKE) --no-print-directory proto
	@git diff --exit-code -- api/ || (echo "generated code is stale: run 'make proto' and commit the result" >&2; exit 1)
	@test -z "$$(git status --porcelain -- api/)" || (echo "generated files are not committed: run 'make proto' and commit the result" >&2; git status --porcelain -- api/ >&2; exit 1)

lint: fmt-check vet staticcheck

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt would change:" $$out >&2; exit 1; fi

vet:
	$(GO) vet ./...
	CGO_ENABLED=1 $(GO) vet -tags tpmsim ./...

staticcheck:
	$(GO) run $(STATICCHECK) ./...

# The packages with concurrency (servers, sessions, caches, the store, the
# helper), run again with the race detector.
RACE_PKGS := ./callsig ./internal/bcd/agent ./internal/bcd/federation ./internal/bcd/leases \
	./internal/bcd/localserver ./internal/bcd/tpmhelper ./internal/fleetd/connlimit \
	./internal/fleetd/install ./internal/fleetd/service ./internal/fleetd/store/sqlite ./internal/fleetd/throttle

race:
	CGO_ENABLED=1 $(GO) test -race -count=1 -tags tpmsim $(RACE_PKGS)

# Every fuzz target for FUZZTIME (default 30s each); crashers land in the
# target's testdata/fuzz folder (scripts/fuzz.sh).
fuzz:
	./scripts/fuzz.sh

# What make test runs: every fuzz target for a second.
fuzz-ci:
	FUZZTIME=1s ./scripts/fuzz.sh

# Each hot-path benchmark for one iteration, so none rots, printing its
# figures (docs/performance.md): the join handler, the renewal handler, a
# held session, the store's writes of a join and a renewal, a leaf's
# signing, a call from a known machine, and nodetrust beside SPIRE (one
# small round; docs/performance.md has the full run's command).
bench-smoke:
	$(GO) test -run '^$$' -benchtime 1x -bench 'Join|RenewVerify|SessionHold' ./internal/fleetd/service/
	$(GO) test -run '^$$' -benchtime 1x -bench 'CompleteJoin|RecordRenewal|StartReports' ./internal/fleetd/store/sqlite/ ./internal/benchcpu/
	$(GO) test -run '^$$' -benchtime 1x -bench 'Issue|Sign' ./pki/ ./pki/joinresponse/
	$(GO) test -run '^$$' -benchtime 1x -bench 'VerifyRemoteCached|VerifyMachineProof' ./callsig/
	$(GO) test -run '^$$' -benchtime 1x -bench 'AgainstSPIRE' ./internal/integration/ -args -peer-nodes 100

# The TPM simulator needs cgo and the tpmsim build tag; release builds have
# neither. One run builds it once for every package.
# The end-to-end package alone runs for several minutes on 2 cores; go test's
# default 10-minute limit is too tight for a loaded machine.
test: deps proto-check lint
	CGO_ENABLED=1 $(GO) test -count=1 -timeout 40m -tags tpmsim ./...
	$(MAKE) --no-print-directory race
	$(MAKE) --no-print-directory bench-smoke
	$(MAKE) --no-print-directory fuzz-ci

# The console's screenshots in docs/ (docs/console.md), taken by its
# browser test against a real fleetd; needs chromium (make deps as root).
screenshots:
	NODETRUST_SCREENSHOTS=$(CURDIR)/docs CGO_ENABLED=1 $(GO) test -count=1 -tags tpmsim -run '^TestConsole$$' ./internal/integration/
