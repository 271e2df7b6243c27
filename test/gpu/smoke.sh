#!/usr/bin/env bash
# GPU smoke test for poold's NVML telemetry and the stop contract's VRAM step.
# Run it on a machine with an NVIDIA GPU, the driver (libnvidia-ml.so.1), Go, jq
# and python3 with PyTorch (CUDA):
#
#   test/gpu/smoke.sh [GPU_INDEX]
#
# It builds poold, runs it with two profiles whose "engine" is a small Python
# server that allocates GPU memory with PyTorch and serves /v1/models and
# /v1/chat/completions, and checks that /status shows the memory rise when
# the first loads and fall after a swap to the second, that the swap reported a
# vram_release phase, and that no "not released" warning was counted.
set -euo pipefail

GPU="${1:-0}"
HOG_GIB=4     # what the first engine allocates
SMALL_GIB=1   # what the second one allocates
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$(mktemp -d)"
POOLD_PID=""
cleanup() {
	if [[ -n "$POOLD_PID" ]]; then
		kill -TERM "$POOLD_PID" 2>/dev/null || true
		wait "$POOLD_PID" 2>/dev/null || true
	fi
	rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; echo "--- poold log (tail) ---" >&2; tail -n 40 "$WORK/poold.log" >&2 || true; exit 1; }

for tool in go jq curl python3 nvidia-smi; do
	command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { echo "PyTorch with CUDA is required" >&2; exit 2; }

(cd "$ROOT" && go build -o "$WORK/poold" ./cmd/poold)

cat >"$WORK/engine.py" <<'PY'
# A tiny OpenAI-shaped engine: allocates --gib GiB on the GPU, then serves.
import argparse, json, torch
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--id", required=True)
ap.add_argument("--gib", type=float, required=True)
a = ap.parse_args()
hold = torch.empty(int(a.gib * (1 << 30)), dtype=torch.uint8, device="cuda")
hold.fill_(1)
torch.cuda.synchronize()

class H(BaseHTTPRequestHandler):
    def reply(self, obj):
        b = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def do_GET(self):
        self.reply({"object": "list", "data": [{"id": a.id, "object": "model", "owned_by": "smoke"}]})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply({"id": "x", "object": "chat.completion", "model": a.id,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", a.port), H).serve_forever()
PY

cat >"$WORK/profiles.json" <<JSON
{
  "pools": [{"name": "g", "gpus": [$GPU], "minResidency": "0s"}],
  "defaults": {"startupTimeout": "5m", "stopTimeout": "30s"},
  "profiles": [
    {"id": "hog", "model": "none", "command": ["python3", "$WORK/engine.py", "--port", "{port}", "--id", "{id}", "--gib", "$HOG_GIB"]},
    {"id": "small", "model": "none", "command": ["python3", "$WORK/engine.py", "--port", "{port}", "--id", "{id}", "--gib", "$SMALL_GIB"]}
  ]
}
JSON

ADDR="127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$WORK/poold" serve --listen "$ADDR" --profiles "$WORK/profiles.json" --log-format json --access-log "$WORK/access.log" >"$WORK/poold.log" 2>&1 &
POOLD_PID=$!
for _ in $(seq 100); do curl -fsS "http://$ADDR/health" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fsS "http://$ADDR/health" >/dev/null || fail "poold did not start"

status() { curl -fsS "http://$ADDR/status"; }
used() { status | jq '.pools[0].gpuMemory[0].usedBytes'; }
chat() { curl -fsS -o /dev/null -w '%{http_code}' "http://$ADDR/v1/chat/completions" -H 'Content-Type: application/json' -d "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"; }

[[ "$(status | jq '.gpu.available')" == "true" ]] || fail "/status says GPU telemetry is unavailable: $(status | jq -c .gpu)"
BASE=$(used)
echo "baseline: $((BASE >> 20)) MiB used on GPU $GPU"

[[ "$(chat hog)" == 200 ]] || fail "request for hog failed"
LOADED=$(used)
echo "hog loaded: $((LOADED >> 20)) MiB used"
(( LOADED - BASE >= (HOG_GIB << 30) * 9 / 10 )) || fail "memory rose by only $(((LOADED - BASE) >> 20)) MiB with hog loaded"
status | jq -e ".gpu.devices[] | select(.index == $GPU) | .processes | length >= 1" >/dev/null || fail "no compute process listed"

[[ "$(chat small)" == 200 ]] || fail "request for small failed"
SWAPPED=$(used)
echo "after the swap to small: $((SWAPPED >> 20)) MiB used"
(( SWAPPED < LOADED - (HOG_GIB << 30) / 2 )) || fail "memory not released after the swap: $((SWAPPED >> 20)) MiB used"

METRICS="$(curl -fsS "http://$ADDR/metrics")"
grep -q 'poold_swap_duration_seconds_count{phase="vram_release",pool="g"} 1' <<<"$METRICS" || fail "no vram_release phase in /metrics"
if grep -q '^poold_vram_not_released_total{pool="g"} [1-9]' <<<"$METRICS"; then fail "VRAM reported not released"; fi
grep -q 'poold_gpu_memory_used_bytes{gpu="'"$GPU"'"' <<<"$METRICS" || fail "no poold_gpu_memory_used_bytes for GPU $GPU"
echo "PASS: memory rose on load, was released after the swap, vram_release reported"
