#!/bin/bash
# CPU attention at depth: the tiled kernel (new) against the one before the
# paged cache (old), one layer of Qwen3-14B's and Qwen3-30B-A3B's shapes,
# f16 and q8_0 caches (ops.BenchmarkAttentionDepth), then the long and
# short llama.cpp oracles on the CPU backend. Build the test binaries
# first and carry them (the device machine has no network):
#
#	go test -c -o tools/bench/ops.test ./ops
#	go test -c -o tools/bench/runtime.test ./runtime
#	tools/bench/cpuattn.sh            # ATS_SHARED: the shared test data
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="$root/tools/bench"
lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\)|L2|L3"
threads=${THREADS:-$(nproc)}
echo "== attention, one layer, $threads threads (ms: wall per step; cpu-ms: CPU time of all threads)"
(cd "$root/ops" && "$bin/ops.test" -test.run NONE -test.bench 'AttentionDepth' -test.benchtime 3x -test.cpu "$threads") |
	awk '/^Benchmark/ {
		n = $1; sub(/^BenchmarkAttentionDepth\//, "", n); sub(/-[0-9]+$/, "", n)
		ms = ""; cpu = ""
		for (i = 2; i < NF; i++) { if ($(i+1) == "ns/op") ms = $i / 1e6; if ($(i+1) == "cpu-ms/op") cpu = $i }
		printf "%-48s %10.2f ms %10s cpu-ms\n", n, ms, cpu
	} /FAIL|panic/ { print }'
shared=${ATS_SHARED:-$root/shared}
if [ -d "$shared/testdata/oracle" ]; then
	echo "== oracles on the CPU backend (NMSE against llama.cpp)"
	(cd "$root/runtime" && ATS_SHARED="$shared" "$bin/runtime.test" -test.count 1 -test.v -test.run 'TestLongOracles|TestOracles$') |
		grep -E "NMSE|FAIL|^ok|PASS$"
else
	echo "no oracles at $shared/testdata/oracle (set ATS_SHARED)"
fi
