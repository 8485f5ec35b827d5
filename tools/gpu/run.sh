#!/usr/bin/env bash
# Runs the GPU test suites that tools/gpu/stage.sh staged in .carry/, from
# the repository root of a checkout of the same commit, and prints each
# suite's verdict and failures last; the whole logs go to $OUT when it is
# set, packed into one suites.tgz (a GPU machine's reply brings back only
# a few files). SUITES picks some (default: all); RUN narrows the session
# suite.
#
#   tools/gpu/run.sh
#   SUITES="kernels cuda" tools/gpu/run.sh
# Binaries staged from another branch (BRANCH=... stage.sh) read that
# branch's kernels from .carry/fatbin.tar; ATS_FATBIN_DIR is exported for
# what the caller runs after this script only when it sources it.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=$root/.carry
logs=${LOGS:-$(mktemp -d)} # LOGS (outside $OUT): where a caller greps them afterwards
mkdir -p "$logs"
export ATS_FATBIN_DIR=$root/cudadrv/kernels
for f in "$carry"/*.xz; do
	[[ -e "$f" ]] && xz -df "$f"
done
if [[ -e "$carry/fatbin.tar" ]]; then
	ATS_FATBIN_DIR=$carry/branch-kernels
	mkdir -p "$ATS_FATBIN_DIR" && tar -C "$ATS_FATBIN_DIR" -xf "$carry/fatbin.tar"
	echo "kernels: the staged branch's ($ATS_FATBIN_DIR)"
fi
chmod +x "$carry"/*.test "$carry"/ats 2>/dev/null
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
declare -A dir=([cudadrv]=cudadrv [kernels]=cudadrv/kernels [cuda]=runtime/backend/cuda [session]=runtime/session)
declare -A bin=([cudadrv]=cudadrv [kernels]=cudadrv_kernels [cuda]=runtime_backend_cuda [session]=runtime_session)
declare -A pat=([cudadrv]=. [kernels]=. [cuda]=. [session]="${RUN:-GPU|Oracles|Truncate|Placements|KeptRing|Prefetch|Scheduler|Embed}")
rc=0
for s in ${SUITES:-cudadrv kernels cuda session}; do
	t=$carry/${bin[$s]}.test
	[[ -x "$t" ]] || { echo "$s: no test binary (run tools/gpu/stage.sh)"; rc=1; continue; }
	d=$root/${dir[$s]}
	# A staged branch's kernels suite checks its own sources' fatbins.
	[[ $s == kernels && -e "$carry/fatbin.tar" ]] && d=$ATS_FATBIN_DIR
	(cd "$d" && timeout "${TIMEOUT:-300}" "$t" -test.count=1 -test.v -test.run "${pat[$s]}" >"$logs/$s.log" 2>&1)
	r=$?
	[[ $r != 0 ]] && rc=1
	echo "== $s: exit $r, $(grep -c '^--- PASS' "$logs/$s.log") passed, $(grep -c '^--- SKIP' "$logs/$s.log") skipped, $(grep -c -- '--- FAIL' "$logs/$s.log") failed"
	grep -A3 -- '--- FAIL' "$logs/$s.log" | head -20
done
[[ -n "${OUT:-}" ]] && tar -czf "$OUT/suites.tgz" -C "$logs" .
exit $rc
