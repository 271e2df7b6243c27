#!/usr/bin/env bash
# Runs probe.py (what a vLLM engine does while it starts) under the seccomp
# filters that stand in for systemd/poold.service's SystemCallFilter=,
# RestrictAddressFamilies= and, for comparison, options the unit leaves off.
# docs/security.md records what it showed. Each variant runs in parallel and
# writes OUT/VARIANT.txt; the summary prints every step's verdict.
#
# On a machine with systemd-analyze and the kernel headers, first write the
# allow lists next to this script:
#
#   test/gpu/unit-filters/run.sh lists
#
# then, on the GPU host (python3 with PyTorch, Triton, numba and psutil):
#
#   test/gpu/unit-filters/run.sh [OUT]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)

if [ "${1:-}" = lists ]; then
  python3 "$here/allowlist.py" "$root/systemd/poold.service" >"$here/allow-unit.txt"
  python3 "$here/allowlist.py" "$root/systemd/poold.service" '~@privileged' >"$here/allow-no-privileged.txt"
  echo "wrote $here/allow-unit.txt and $here/allow-no-privileged.txt"
  exit 0
fi
[ -f "$here/allow-unit.txt" ] || { echo "no allow lists: run '$0 lists' on a machine with systemd-analyze" >&2; exit 2; }

out=${1:-$(mktemp -d)}
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The unit's RestrictAddressFamilies= as numbers.
families=$(sed -n 's/^RestrictAddressFamilies=//p' "$root/systemd/poold.service" |
  sed 's/AF_UNIX/1/; s/AF_INET6/10/; s/AF_INET/2/; s/AF_NETLINK/16/' | tr ' ' ',')

variant() {
  local name=$1 port=$2
  shift 2
  mkdir -p "$scratch/$name"
  # Fresh compile caches, so that every variant compiles.
  TRITON_CACHE_DIR=$scratch/$name/triton TORCHINDUCTOR_CACHE_DIR=$scratch/$name/inductor \
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    timeout 300 python3 "$here/seccomp_run.py" "$@" -- python3 "$here/probe.py" "$port" >"$out/$name.txt" 2>&1 &&
    echo "exit 0" >>"$out/$name.txt" || echo "exit $?" >>"$out/$name.txt"
}
variant none 29501 &
variant unit 29502 --allow "$here/allow-unit.txt" --families "$families" &
variant mdwe 29503 --mdwe &
variant no-netlink 29504 --families 1,2,10 &
variant no-privileged 29505 --allow "$here/allow-no-privileged.txt" --families "$families" &
wait
cd "$out"
grep -H -E '^(STEP|exit)' none.txt unit.txt mdwe.txt no-netlink.txt no-privileged.txt | cut -c1-300
echo "full output in $out"
