#!/usr/bin/env bash
# Verifies systemd/*.service with systemd-analyze. The units name the installed
# binaries (/usr/local/bin/poold, /usr/local/bin/fleetd), which verify requires
# to exist; so the check builds both and verifies copies of the units whose
# /usr/local/bin/ paths point at the builds. Any message from verify fails it.
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
