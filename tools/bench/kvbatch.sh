#!/usr/bin/env bash
# Tests and measures the CUDA kernels of the paged KV cache on a machine
# with an NVIDIA GPU, and prints a short table at the end:
#
#  1. TestKVBatch (cudadrv/kernels): cache writes (StoreKV, the rope's fused
#     write) and the gather bit-exact against CPU references, decode and
#     prefill attention over f16 and q8_0 caches against a float64
#     attention, a captured graph replayed at other positions and tables,
#     GatherRows, and the contiguous launchers;
#  2. the engine's op tests of the kernels whose parameters changed
#     (runtime/backend/cuda TestGPUOps: rope, kv_store, attention);
#  3. BenchmarkKVDecode: one layer's decode attention at depth 256, 1024,
#     4096 and 16384, 1 and 8 sequences, Qwen3-14B's and Qwen3-30B-A3B's
#     heads: the contiguous attn_dec ("old", one launch a sequence) against
#     the paged kernel on f16 and q8_0 caches (one launch), on q8_0 with
#     the output rotated back as the engine runs it ("q8_0 rotated"), and,
#     for one sequence, the CUDA-core kernel a short row takes ("f16
#     short").
#
# Usage (from anywhere in the repository; about a minute on an H200):
#   tools/bench/kvbatch.sh
# Without go on the GPU machine, build the test binaries elsewhere and pass
# them (GPU_TEST may be left out: step 2 is then skipped):
#   CGO_ENABLED=0 go test -c -o .carry/kernels.test ./cudadrv/kernels
#   CGO_ENABLED=0 go test -c -o .carry/cuda.test ./runtime/backend/cuda
#   KERNELS_TEST=$PWD/.carry/kernels.test GPU_TEST=$PWD/.carry/cuda.test tools/bench/kvbatch.sh
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

kt=${KERNELS_TEST:-}
gt=${GPU_TEST:-}
if [[ -z "$kt" ]]; then
	command -v go >/dev/null || { echo "kvbatch.sh: no go: set KERNELS_TEST (see the header)" >&2; exit 1; }
	(cd "$root" && CGO_ENABLED=0 go test -c -o "$tmp/kernels.test" ./cudadrv/kernels &&
		CGO_ENABLED=0 go test -c -o "$tmp/cuda.test" ./runtime/backend/cuda) || exit 1
	kt=$tmp/kernels.test
	gt=${gt:-$tmp/cuda.test}
fi
touch "$tmp/summary"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true

# tests LOG NAME DIR BIN ARGS...: runs a test binary in its package's
# directory, keeps the verbose log, prints the failures.
tests() {
	local log=$1 name=$2 dir=$3 bin=$4
	shift 4
	(cd "$root/$dir" && "$bin" -test.v "$@") >"$log" 2>&1
	local rc=$?
	grep -E -- '--- FAIL|^panic|Error Trace|NMSE .* over|: value [0-9]+ is' "$log" | head -40
	printf '%s: rc %d, %d passed, %d failed, %d skipped\n' "$name" "$rc" \
		"$(grep -c -- '--- PASS' "$log")" "$(grep -c -- '--- FAIL' "$log")" "$(grep -c -- '--- SKIP' "$log")" >>"$tmp/summary"
	return 0
}

tests "$tmp/kv.log" "TestKVBatch (cudadrv/kernels)" cudadrv/kernels "$kt" \
	-test.run 'TestKVBatch|TestPlanDecodeKV|TestPlanAttention' -test.count 1
if [[ -n "$gt" ]]; then
	tests "$tmp/ops.log" "TestGPUOps rope, kv_store, attention (runtime/backend/cuda)" runtime/backend/cuda "$gt" \
		-test.run 'TestGPUOps/(rope|kv_store|attention)' -test.count 1
else
	echo "TestGPUOps (runtime/backend/cuda): not run, no GPU_TEST" >>"$tmp/summary"
fi
(cd "$root/cudadrv/kernels" && "$kt" -test.run '^$' -test.bench 'BenchmarkKVDecode' -test.benchtime 100x) >"$tmp/bench.log" 2>&1
grep -E '^(Benchmark|FAIL|panic|---)' "$tmp/bench.log" | sed 's/^/  /'

echo
echo "== summary"
cat "$tmp/summary"
echo
echo "decode attention, one layer (us a step; GB/s of K and V read):"
awk '
/^BenchmarkKVDecode\// {
	split($1, f, "/")
	m = substr(f[2], 7); d = substr(f[3], 7); s = substr(f[4], 6); k = substr(f[5], 8)
	sub(/-[0-9]+$/, "", k)
	key = m " " d " " s
	if (!(key in seen)) { seen[key] = 1; order[n++] = key }
	for (i = 3; i < NF; i++) {
		if ($(i + 1) == "us/step") us[key, k] = $i
		if ($(i + 1) == "GB/s") gb[key, k] = $i
	}
}
END {
	printf "| model | depth | seqs | old us | f16 us | f16 short us | q8_0 us | q8_0 rotated us | old GB/s | f16 GB/s | q8_0 GB/s | old/f16 | f16/q8_0 |\n"
	printf "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
	for (j = 0; j < n; j++) {
		key = order[j]; split(key, p, " ")
		r1 = (us[key, "f16"] > 0) ? sprintf("%.2f", us[key, "old"] / us[key, "f16"]) : "-"
		r2 = (us[key, "q8_0"] > 0) ? sprintf("%.2f", us[key, "f16"] / us[key, "q8_0"]) : "-"
		short = ((key, "f16-short") in us) ? us[key, "f16-short"] : "-"
		printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p[1], p[2], p[3],
			us[key, "old"], us[key, "f16"], short, us[key, "q8_0"], us[key, "q8_0rot"], gb[key, "old"], gb[key, "f16"], gb[key, "q8_0"], r1, r2
	}
}' "$tmp/bench.log"
