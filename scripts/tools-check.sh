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
