#!/usr/bin/env bash
# govulncheck against a vulnerability database built locally from the
# golang.org/x/vulndb module (the only network here is the Go module proxy, so
# vuln.go.dev cannot be reached). Fails when a vulnerable function of a
# required module or of the standard library is called (see
# scripts/vulncheck/main.go); go.mod's toolchain line names the Go release
# whose standard library is checked.
set -euo pipefail
cd "$(dirname "$0")/.."

VULNDB=v0.0.0-20261105234957-e22db6528018
GOVULNCHECK=v1.9.0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$(cd "$work" && go mod download -json "golang.org/x/vulndb@$VULNDB" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
(cd "$work" && go run "golang.org/x/vulndb/cmd/indexdb@$VULNDB" -vulns "$src/data/osv" -out "$work/db")
# govulncheck exits 3 when it finds anything; the filter decides.
go run "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK" -db "file://$work/db" -format json ./... > "$work/out.json" || true
go run ./scripts/vulncheck < "$work/out.json"
