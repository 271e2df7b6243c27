#!/usr/bin/env bash
# The real-vLLM suite (test/e2e/realvllm_test.go): poold in front of vLLM's
# CPU build, installed by scripts/install-vllm.sh. Where it is not installed
# the suite is skipped with a note, unless POOLD_REQUIRE_VLLM=1 (CI), where
# that is a failure. It runs alone, one engine or a few at a time.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! home=$(scripts/install-vllm.sh --check); then
  if [ "${POOLD_REQUIRE_VLLM:-}" = 1 ]; then
    echo "test-vllm: vLLM's CPU build is not installed (scripts/install-vllm.sh), and POOLD_REQUIRE_VLLM=1" >&2
    exit 1
  fi
  echo "test-vllm: skipped: vLLM's CPU build is not installed (run scripts/install-vllm.sh, 6 GB)"
  exit 0
fi
POOLD_VLLM_SUITE=1 POOLD_VLLM_HOME=$home exec ${GO:-go} test -race -count=1 -v -timeout 20m -run '^TestRealVLLM' ./test/e2e/
