# poold's developer entry points. `make test` is the whole suite (what CI runs).

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The commit, stamped too: a build without VCS stamping (-buildvcs=false, a
# copy without .git) still says what it was built from.
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
BIN     ?= bin

# go-nvml (the only cgo package outside the standard library) calls NVML
# functions that NVML's header marks deprecated, and its first build prints
# about 170 lines of warnings about them. This silences that one warning for
# every target, the tests' builds included; any other warning or error shows.
CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
export CGO_CFLAGS

# Build and test with the toolchain go.mod names (fetched once from the Go
# module proxy), even where the environment says GOTOOLCHAIN=local: the
# standard library that scripts/vulncheck.sh checks is then the one shipped.
export GOTOOLCHAIN := auto

.PHONY: build demo test vet fuzz-smoke tools-check test-vllm bench

# bin/poold and bin/fleetd, stamped with VERSION.
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/poold ./cmd/fleetd

# Run poold on the demo profiles: no GPU, the simulator engine as a real subprocess.
# The demo keeps its state (engines and usage ledgers) in the checkout,
# ignored by git, so it runs the same for every user, and stops its engines
# with poold on Ctrl-C. DEMOFLAGS adds poold flags (--listen ADDR).
DEMO_STATE ?= .demo
demo: build
	@echo "demo: poold's state in $(DEMO_STATE)/; Ctrl-C stops poold and its engines"
	$(BIN)/poold --profiles profiles/demo.json --state-dir $(DEMO_STATE) --keep-engines-on-restart=false $(DEMOFLAGS)

# vet also builds the whole tree, tests included, for macOS (built, not run:
# the tests run on Linux only), where poold refuses to start engines.
vet:
	@test -z "$$(gofmt -l .)" || (echo "gofmt would change:"; gofmt -l .; exit 1)
	$(GO) vet ./...
	GOOS=darwin $(GO) vet ./...

# The whole test suite: vet, every Go test under the race detector, a few seconds
# of each fuzz target, the checks of the shipped config files, and then, alone,
# the real-vLLM suite.
test: vet
	$(GO) test -race -count=1 -timeout 60m ./...
	$(MAKE) fuzz-smoke
	$(MAKE) tools-check
	$(MAKE) test-vllm

# A count, not a duration: with a duration, Go's fuzzing coordinator can
# report its own deadline as a failure ("context deadline exceeded", no
# input written) when a worker is mid-run as it expires, which a busy
# machine makes likely (golang/go#75804, fixed only in Go 1.27).
FUZZTIME ?= 10000x
fuzz-smoke:
	$(GO) test -run '^$$' -fuzz '^FuzzRewrite$$' -fuzztime $(FUZZTIME) ./internal/openai/
	$(GO) test -run '^$$' -fuzz '^FuzzSSEReader$$' -fuzztime $(FUZZTIME) ./internal/openai/
	$(GO) test -run '^$$' -fuzz '^FuzzParseForm$$' -fuzztime $(FUZZTIME) ./internal/openai/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/profile/
	$(GO) test -run '^$$' -fuzz '^FuzzRouteOf$$' -fuzztime $(FUZZTIME) ./internal/proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzTransport$$' -fuzztime $(FUZZTIME) ./internal/upstream/

# Checks that need tools outside Go. Each is skipped with a note when its tool is
# missing, unless REQUIRE_TOOLS=1 (CI), where a missing tool fails.
tools-check:
	@./scripts/tools-check.sh

# The real-vLLM suite: poold in front of vLLM's CPU build, which
# scripts/install-vllm.sh installs (skipped with a note where it is not
# installed, unless POOLD_REQUIRE_VLLM=1, as in CI).
test-vllm:
	@GO=$(GO) ./scripts/test-vllm.sh

# The benchmark harness (docs/benchmarks.md): every workload directly against the
# engine and through poold, in alternating rounds, printed as one table.
# Workloads 1v and 5v run real engines, vLLM's CPU build, when it is given:
#   make bench BENCHFLAGS="-vllm $(scripts/install-vllm.sh --check) -only 1v,5v"
# (or POOLD_VLLM_HOME set); without it they are skipped with a note.
BENCHFLAGS ?=
bench:
	$(GO) run ./test/bench $(BENCHFLAGS)
