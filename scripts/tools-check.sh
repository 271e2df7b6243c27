#!/usr/bin/env bash
# Checks of shipped files that need tools outside Go: each runs when its tool is
# installed; a missing tool is a note, or a failure when REQUIRE_TOOLS=1 (CI).
set -euo pipefail
cd "$(dirname "$0")/.."

missing() {
  if [ "${REQUIRE_TOOLS:-0}" = 1 ]; then
    echo "FAIL: $1 is required (REQUIRE_TOOLS=1) but not installed" >&2
    exit 1
  fi
  echo "skipped: $1 not installed ($2)"
}

# Every bundled profiles file validates.
go run ./cmd/poold check profiles/demo.json
go run ./cmd/poold check profiles/example-vllm.json

# Prometheus alert and recording rules, and their unit tests.
if command -v promtool >/dev/null; then
  promtool check rules deploy/prometheus/poold-rules.yml
  promtool test rules deploy/prometheus/tests/poold-rules.test.yml
else
  missing promtool "apt-get install prometheus"
fi

# The systemd units: verified against freshly built binaries, and each unit's
# `systemd-analyze security` exposure within its bound.
if command -v systemd-analyze >/dev/null; then
  ./scripts/verify-units.sh
else
  missing systemd-analyze "apt-get install systemd"
fi

# docs/first-gpu-host.md, each step that needs no GPU, in a temporary root
# with the simulator as vLLM (as root: systemd-tmpfiles sets owners).
if [ "$(id -u)" != 0 ]; then
  [ "${REQUIRE_TOOLS:-0}" = 1 ] && { echo "FAIL: the GPU guide check needs root" >&2; exit 1; }
  echo "skipped: the GPU guide check needs root"
elif command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null &&
  command -v systemd-analyze >/dev/null && command -v curl >/dev/null; then
  ./scripts/check-gpu-guide.sh
else
  missing "systemd-sysusers, systemd-tmpfiles, systemd-analyze or curl" "apt-get install systemd curl"
fi

# The Anthropic TypeScript SDK against poold's Messages route: the version
# pinned in test/e2e/anthropic-sdk/package-lock.json, installed from the npm
# registry, then the e2e test that runs it (which skips without it).
if command -v node >/dev/null && command -v npm >/dev/null; then
  (cd test/e2e/anthropic-sdk && npm ci --no-audit --no-fund)
  go test -count=1 -run '^TestAnthropicSDK$' ./test/e2e/
else
  missing "node or npm" "apt-get install nodejs npm"
fi

# Lint: staticcheck, pinned, over the whole tree, tests included (every
# finding fails; a deliberate exception carries a //lint:ignore with why).
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# Known vulnerabilities: govulncheck against a database built from the
# golang.org/x/vulndb module (needs only Go and the module proxy).
./scripts/vulncheck.sh
