#!/usr/bin/env bash
# GPU smoke test for poold on a real GPU host: NVML telemetry and the stop
# contract's VRAM step, then, with vLLM installed, the vLLM behaviour poold
# relies on (docs/gpu.md, "vLLM behaviour poold relies on"). Run it on a
# machine with an NVIDIA GPU, the driver (libnvidia-ml.so.1), Go, jq, curl
# and python3 with PyTorch (CUDA); the vLLM part needs `vllm` on PATH and two
# small models in the Hugging Face cache (or reachable):
#
#   test/gpu/smoke.sh [GPU_INDEX]
#   POOLD_BIN=bin/poold test/gpu/smoke.sh 0   # a poold built elsewhere: Go not needed
#   SMOKE_CHAT_MODEL=Qwen/Qwen2.5-0.5B-Instruct SMOKE_EMBED_MODEL=BAAI/bge-small-en-v1.5 test/gpu/smoke.sh 0
#
# Part 1 builds poold, runs it with two profiles whose "engine" is a small
# Python server that allocates GPU memory with PyTorch, and checks that
# /status shows the memory rise when the first loads and fall after a swap
# to the second, that the swap reported a vram_release phase, and that no
# "not released" warning was counted.
#
# Part 2 runs poold with real vLLM engines on the GPU: a generative model
# that sleeps at level 2 with request logging on, and a pooling model. It
# prints one line per item of the table in docs/gpu.md that it checks (1 to 5,
# 9 and 12),
# "item N: PASS …" or "item N: FAIL …", and exits 1 if any failed.
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

tools=(jq curl python3 nvidia-smi)
[[ -n "${POOLD_BIN:-}" ]] || tools+=(go)
for tool in "${tools[@]}"; do
	command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { echo "PyTorch with CUDA is required" >&2; exit 2; }

if [[ -n "${POOLD_BIN:-}" ]]; then
	cp "$POOLD_BIN" "$WORK/poold"
else
	(cd "$ROOT" && go build -o "$WORK/poold" ./cmd/poold)
fi

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
# Any other labels (kind) may sit between: match the two that matter.
grep -Eq '^poold_swap_duration_seconds_count\{[^}]*phase="vram_release"[^}]*pool="g"[^}]*\} 1$' <<<"$METRICS" ||
	fail "no vram_release phase in /metrics: $(grep '^poold_swap_duration_seconds_count' <<<"$METRICS")"
if grep -q '^poold_vram_not_released_total{pool="g"} [1-9]' <<<"$METRICS"; then fail "VRAM reported not released"; fi
grep -q 'poold_gpu_memory_used_bytes{gpu="'"$GPU"'"' <<<"$METRICS" || fail "no poold_gpu_memory_used_bytes for GPU $GPU"
echo "PASS: memory rose on load, was released after the swap, vram_release reported"

kill -TERM "$POOLD_PID" 2>/dev/null || true
wait "$POOLD_PID" 2>/dev/null || true
POOLD_PID=""

if ! command -v vllm >/dev/null; then
	echo "SKIP items 1-5, 9, 12: vllm is not installed"
	exit 0
fi

# Part 2: real vLLM engines.
CHAT_MODEL="${SMOKE_CHAT_MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
EMBED_MODEL="${SMOKE_EMBED_MODEL:-BAAI/bge-small-en-v1.5}"
FAILED=0
item() { # item N PASS|FAIL message
	echo "item $1: $2 $3"
	if [[ "$2" == FAIL ]]; then FAILED=1; fi
}
pool() { status | jq -c '.pools[0]'; }
wait_pool() { # wait_pool JQ_CONDITION SECONDS: true once /status's pool meets it
	local deadline=$((SECONDS + $2))
	while ((SECONDS < deadline)); do
		if [[ "$(pool | jq "$1")" == true ]]; then return 0; fi
		sleep 1
	done
	return 1
}
post() { # post PATH BODY [CURL_ARGS…]: prints the status code
	local path=$1 body=$2
	shift 2
	curl -sS -o "$WORK/answer" -w '%{http_code}' --max-time 900 "http://$ADDR$path" -H 'Content-Type: application/json' -d "$body" "$@"
}
vchat() { post /v1/chat/completions "{\"model\":\"chat\",\"max_tokens\":4,\"messages\":[{\"role\":\"user\",\"content\":\"$1\"}]}"; }
vembed() { post /v1/embeddings '{"model":"embed","input":"hello"}'; }
metric() { curl -fsS "http://$ADDR/metrics" | awk -v m="$1" '$1 == m {print $2}'; }

cat >"$WORK/vllm-profiles.json" <<JSON
{
  "pools": [{"name": "g", "gpus": [$GPU], "minResidency": "0s", "maxSleeping": 1}],
  "defaults": {"startupTimeout": "20m", "stopTimeout": "60s"},
  "profiles": [
    {"id": "chat", "model": "$CHAT_MODEL", "maxModelLen": 32768, "sleep": {"level": 2},
     "args": ["--enable-log-requests"]},
    {"id": "embed", "model": "$EMBED_MODEL", "args": ["--runner", "pooling", "--gpu-memory-utilization", "0.5"]}
  ]
}
JSON

# Item 1: no flag vLLM has removed, and vLLM accepts every argument (the
# engines below start).
if "$WORK/poold" check "$WORK/vllm-profiles.json" 2>"$WORK/check.err" >/dev/null && ! grep -q "no longer accepts" "$WORK/check.err"; then
	CHECK_OK=1
else
	CHECK_OK=0
fi

"$WORK/poold" serve --listen "$ADDR" --profiles "$WORK/vllm-profiles.json" --log-format json --log-level debug \
	--state-dir "$WORK/state" --access-log "$WORK/vllm-access.log" >"$WORK/poold.log" 2>&1 &
POOLD_PID=$!
for _ in $(seq 100); do curl -fsS "http://$ADDR/health" >/dev/null 2>&1 && break; sleep 0.2; done

# Item 12 first, on the cold start of chat: request logging on, an 80 KB
# prompt logged on one line; the engine serves on.
CODE=$(vchat "$(python3 -c 'print("word " * 16000, end="")')")
CHAT_PID=$(pool | jq '.engine.pid')
if [[ "$CODE" == 200 && "$(vchat hello)" == 200 && "$(pool | jq '.engine.pid')" == "$CHAT_PID" ]] && grep -q 'line truncated' "$WORK/poold.log"; then
	item 12 PASS "an 80 KB prompt logged by --enable-log-requests was cut in poold's log; the engine serves on"
else
	item 12 FAIL "status $CODE; pool $(pool); truncated lines: $(grep -c 'line truncated' "$WORK/poold.log")"
fi
if ((CHECK_OK)) && [[ "$CODE" == 200 ]]; then
	item 1 PASS "poold check warns of no removed flag, and vLLM accepted the generative profile's arguments"
else
	item 1 FAIL "$(cat "$WORK/check.err"); chat status $CODE"
fi

# Item 2: a cold start of the pooling model beside chat asleep (level 2):
# poold applies vLLM's memory rule first, evicting chat if it must.
CODE=$(vembed)
EVICTED=$(grep -c '"stopping sleeping engine"' "$WORK/poold.log" || true)
if [[ "$CODE" == 200 ]] && ! grep -q 'less than desired GPU memory utilization' "$WORK/poold.log"; then
	item 2 PASS "embed started cold beside the sleeping chat (sleepers evicted: $EVICTED), vLLM never refused it"
else
	item 2 FAIL "embed status $CODE: $(head -c 300 "$WORK/answer"); vLLM refusals: $(grep -c 'less than desired GPU memory utilization' "$WORK/poold.log")"
fi

# Item 5: chat again: woken from level 2 (weights, reload_weights, KV
# cache) if it still sleeps, and it answers.
CODE=$(vchat again)
if [[ "$CODE" == 200 ]] && ! grep -q '"wake failed; starting cold instead"' "$WORK/poold.log"; then
	if grep -q '"msg":"engine ready".*"profile":"chat".*"kind":"wake"' "$WORK/poold.log"; then
		item 5 PASS "chat woke from level 2 in vLLM's documented order and answered"
	else
		item 5 SKIP "chat answered, but started cold (evicted for item 2): no level-2 wake to check"
	fi
else
	item 5 FAIL "status $CODE; $(grep -m1 'wake failed' "$WORK/poold.log")"
fi

# Item 4: requests 6 s apart, beyond vLLM's 5 s keep-alive: the engine
# never closed an idle connection before poold did.
for _ in 1 2 3; do sleep 6; vchat spaced >/dev/null; done
CLOSED=$(metric poold_engine_connections_closed_by_engine_total)
if [[ "$CLOSED" == 0 ]]; then
	item 4 PASS "no idle connection closed by vLLM first over 3 requests 6 s apart"
else
	item 4 FAIL "poold_engine_connections_closed_by_engine_total is $CLOSED"
fi

# Item 3: vLLM's own words for a taken port, which poold must recognise.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 -c "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',$PORT)); s.listen(); time.sleep(900)" &
HOLDER=$!
sleep 1
CUDA_VISIBLE_DEVICES=$GPU timeout 900 vllm serve "$EMBED_MODEL" --runner pooling --host 127.0.0.1 --port "$PORT" \
	--gpu-memory-utilization 0.1 >"$WORK/port.log" 2>&1 || true
kill "$HOLDER" 2>/dev/null || true
if grep -Eiq 'address already in use|port [0-9]+ is already in use' "$WORK/port.log"; then
	item 3 PASS "vLLM said: $(grep -Eio -m1 'address already in use|port [0-9]+ is already in use' "$WORK/port.log")"
else
	item 3 FAIL "no message poold recognises; vLLM's last lines: $(tail -n 3 "$WORK/port.log" | tr '\n' ' ')"
fi

# Item 9: the engine core dies (VLLM::EngineCore killed) while the API
# server lives: poold fails the engine over (/health 503, or the exit after
# vLLM's watchdog) and the next request starts a fresh one.
ENGINE=$(pool | jq '.engine.pid')
CORE=$(pgrep -g "$ENGINE" -f 'VLLM::EngineCore' | head -n 1 || true)
if [[ -n "$CORE" ]]; then
	kill -KILL "$CORE"
	if wait_pool '.state == "failed"' 120; then
		WHY=$(pool | jq -r '.lastError')
		CODE=$(vchat "after the failover")
		if [[ "$CODE" == 200 && "$(pool | jq '.engine.pid')" != "$ENGINE" ]]; then
			item 9 PASS "failed over: $(head -c 120 <<<"$WHY"); a fresh engine answered"
		else
			item 9 FAIL "after the failover: status $CODE, pool $(pool)"
		fi
	else
		item 9 FAIL "the pool did not fail within 120 s of the engine core's death: $(pool)"
	fi
else
	item 9 FAIL "no VLLM::EngineCore process in the engine's group $ENGINE"
fi

if ((FAILED)); then
	echo "--- poold log (tail) ---" >&2
	tail -n 40 "$WORK/poold.log" >&2
	exit 1
fi

