#!/usr/bin/env bash
# Verifies systemd/*.service with systemd-analyze (250 or newer).
#
# 1. verify: the units name the installed binaries (/usr/local/bin/poold,
#    /usr/local/bin/fleetd), which verify requires to exist; so the check builds
#    both and verifies copies of the units whose /usr/local/bin/ paths point at
#    the builds. Any message from verify fails it.
# 2. security: each unit's exposure score (0 is the safest, 10 the worst) must
#    stay within its bound. docs/security.md records the scores and explains
#    every exposure left.
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/units"
go build -o "$tmp/bin/" ./cmd/poold ./cmd/fleetd
for unit in systemd/*.service; do
  sed "s|/usr/local/bin/|$tmp/bin/|g" "$unit" >"$tmp/units/$(basename "$unit")"
done
out=$(systemd-analyze verify "$tmp"/units/*.service 2>&1) || { echo "$out" >&2; exit 1; }
if [ -n "$out" ]; then
  echo "systemd-analyze verify complained:" >&2
  echo "$out" >&2
  exit 1
fi
echo "systemd units verified: $(cd systemd && echo *.service)"

# exposure UNIT BOUND: fails when UNIT's exposure is above BOUND (one decimal).
exposure() {
  local unit=$1 bound=$2 report score
  report=$(systemd-analyze security --offline=true --no-pager "$unit")
  score=$(sed -n 's/^→ Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' <<<"$report")
  if [ -z "$score" ]; then
    echo "systemd-analyze security printed no overall exposure for $unit:" >&2
    echo "$report" >&2
    exit 1
  fi
  # --threshold takes the exposure in tenths and fails above it.
  if ! systemd-analyze security --offline=true --no-pager --threshold="${bound/./}" "$unit" >/dev/null; then
    echo "FAIL: $unit exposure $score is above its bound $bound; what it may still do:" >&2
    grep '✗' <<<"$report" >&2
    exit 1
  fi
  echo "$unit exposure $score (bound $bound)"
}
exposure systemd/poold.service 3.0
exposure systemd/fleetd.service 2.5
