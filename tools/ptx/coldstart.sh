#!/usr/bin/env bash
# Measures ats's GPU cold start on a machine with an NVIDIA GPU: the time to
# the first token of a tiny model with the driver's JIT cache disabled
# (CUDA_CACHE_DISABLE=1, as on a first run or in a fresh container), and the
# load time of each kernel module.
#
#  1. `ats eval` of the oracle prompt (16 tokens, one decoded) on the GPU,
#     RUNS times with the embedded SASS, then RUNS times with
#     CUDA_FORCE_PTX_JIT=1 (every module JIT-compiled from PTX, as ats did
#     before it shipped SASS). Each run prints its wall time (process start
#     to exit, an upper bound of the time to the first token), eval's own
#     prefill line, and every module load with its time (ATS_GPU_LOG_LOADS=1):
#     which modules the model needed, and when.
#  2. The same with a one-token prompt: its first step is the captured
#     decode graph, so the lazily loaded modules load inside the capture.
#  3. The tests of lazy loading and of a load inside a capture.
#  4. BenchmarkModuleLoad: each module loaded and unloaded alone, SASS and
#     then PTX JIT.
#
# Usage: tools/ptx/coldstart.sh          (from anywhere in the repository)
#        RUNS=5 MODEL=/path/x.gguf tools/ptx/coldstart.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
shared=${ATS_SHARED:-$root/../shared}
model=${MODEL:-$shared/testdata/oracle/tiny-qwen3-q4_k_m.gguf}
runs=${RUNS:-3}
prompt=1,300,400,500,17,99,260,261,262,263,42,7,300,300,301,302
[[ -f "$model" ]] || { echo "coldstart.sh: no model at $model (set MODEL or ATS_SHARED)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=$tmp/ats
CGO_ENABLED=0 go build -trimpath -o "$bin" ./cmd/ats
echo "binary: $(stat -c %s "$bin") bytes"
"$bin" gpu | grep -E '^(CUDA|NVML|device)|compute capability' || true

# eval_once LABEL TOKENS NGEN [VAR=VALUE...]: one cold eval, timed.
eval_once() {
	local label=$1 tokens=$2 ngen=$3
	shift 3
	local t0 t1
	t0=$(date +%s%N)
	env CUDA_CACHE_DISABLE=1 ATS_GPU_LOG_LOADS=1 "$@" "$bin" eval -m "$model" --tokens "$tokens" \
		--n-gen "$ngen" --backend gpu >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err" >&2; return 1; }
	t1=$(date +%s%N)
	printf '%s: %d ms wall\n' "$label" $(((t1 - t0) / 1000000))
	sed 's/^/    /' "$tmp/err"
}

echo
echo "== 1. cold eval, 16-token prompt, 1 token decoded"
for i in $(seq "$runs"); do eval_once "SASS run $i" "$prompt" 1; done
for i in $(seq "$runs"); do eval_once "PTX JIT run $i" "$prompt" 1 CUDA_FORCE_PTX_JIT=1; done

echo
echo "== 2. cold eval, 1-token prompt (first step captured), 2 tokens decoded"
eval_once "SASS" 1 2
eval_once "PTX JIT" 1 2 CUDA_FORCE_PTX_JIT=1

echo
echo "== 3. lazy loading tests"
go test ./cudadrv -count=1 -run 'TestLazyLoading|TestFirstLaunchInCapture' -v 2>&1 | grep -E '^(---|ok|FAIL|panic)|_test.go' || true

echo
echo "== 4. module load times (CUDA_CACHE_DISABLE=1)"
CUDA_CACHE_DISABLE=1 go test ./cudadrv -count=1 -run NONE -bench ModuleLoad -benchtime 5x 2>&1 | grep -E '^(Benchmark|ok|FAIL)'
CUDA_CACHE_DISABLE=1 CUDA_FORCE_PTX_JIT=1 go test ./cudadrv -count=1 -run NONE -bench ModuleLoad -benchtime 1x 2>&1 | grep -E '^(Benchmark|ok|FAIL)'
