#!/usr/bin/env bash
# ats serve under concurrent requests against ats bench's single stream,
# on one machine: the hybrid at a VRAM budget, all on the GPU, and CPU only.
# Each server takes N concurrent /v1/completions of GEN tokens (temperature
# TEMP, ignore_eos) with ats bench --serve, a late request among them, and ats
# bench measures tg of GEN tokens with the same placement flags and the
# same cache reserved in the budget (-c CTX, as the server). Writes the
# JSON into OUT and prints a summary last.
#
# TEMP (unset: 0, greedy) is the requests' --temperature. On a synthetic
# (random-weight) model greedy requests soon all emit the same token, so a
# mixture of experts routes a whole batch to the same experts and the
# concurrent figures flatter it: TEMP=0.8 samples each request with its
# own seed (bench --serve's --seed base 1 plus the request's index).
#
# Usage: ATS=/path/to/ats tools/bench/batching.sh MODEL OUT
#   THREADS=16 BUDGET=4.5GiB GEN=128 CTX=4096
#   HYBRID_CONC=1,4,8 HYBRID_PARALLEL=9 GPU_CONC=1 GPU_PARALLEL=32 CPU_CONC=1,4 CPU_PARALLEL=4
#   SETUPS="hybrid gpu cpu" TEMP=0.8
#   LATE=0   no late request (by default each row also times one that
#            arrives while the others decode, and it then decodes beside them)
set -uo pipefail
ats=${ATS:-ats}
m=${1:?usage: batching.sh MODEL OUT} out=${2:?}
mkdir -p "$out"
T=${THREADS:-16} budget=${BUDGET:-4.5GiB} gen=${GEN:-128} ctx=${CTX:-4096} temp=${TEMP:-0}
late=(--late)
[[ "${LATE:-1}" == 0 ]] && late=()
start=$SECONDS
note() { echo "[$((SECONDS - start))s] $*" | tee -a "$out/batching.log"; }
for tool in "$ats" curl jq; do
	command -v "$tool" >/dev/null || { echo "batching.sh: $tool not found" >&2; exit 1; }
done
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
port=8191
for s in ${SETUPS:-hybrid gpu cpu}; do
	case $s in
	hybrid) flags="--vram-budget $budget" conc=${HYBRID_CONC:-1,4,8} par=${HYBRID_PARALLEL:-9} ;;
	gpu) flags="--backend gpu" conc=${GPU_CONC:-1} par=${GPU_PARALLEL:-32} ;;
	cpu) flags="--backend cpu" conc=${CPU_CONC:-1,4} par=${CPU_PARALLEL:-4} ;;
	*) note "unknown setup $s"; continue ;;
	esac
	# shellcheck disable=SC2086
	timeout 300 "$ats" bench -m "$m" $flags -c "$ctx" -t "$T" -p 0 -n "$gen" -r 2 -o json >"$out/$s-bench-tg.json" 2>>"$out/batching.log" || note "$s: bench failed"
	note "$s: bench done"
	# shellcheck disable=SC2086
	"$ats" serve "$m" $flags -c "$ctx" --parallel "$par" -t "$T" --port $port >"$out/$s-serve.log" 2>&1 &
	pid=$!
	if up "http://127.0.0.1:$port"; then
		timeout 400 "$ats" bench --serve "http://127.0.0.1:$port" --concurrency "$conc" -n "$gen" --temperature "$temp" "${late[@]}" -o json >"$out/$s-serve.json" 2>>"$out/batching.log" || note "$s: serve load failed"
		curl -sf "http://127.0.0.1:$port/metrics" >"$out/$s-metrics.txt"
	else
		note "$s: server not up"
	fi
	kill $pid 2>/dev/null
	wait $pid 2>/dev/null
	note "$s: serve done"
	port=$((port + 1))
done
for s in ${SETUPS:-hybrid gpu cpu}; do
	echo "== $s: bench tg$gen $(jq -r '.[0].avg_ts*10|floor/10' "$out/$s-bench-tg.json" 2>/dev/null) t/s"
	jq -r '.[] | "c=\(.concurrency) aggregate \(.aggregate_tokens_per_s*10|floor/10) t/s, per request \(.requests|map(.tokens_per_s)|add/length*10|floor/10) t/s, TTFT p50 \(.ttft_p50_ms|floor) ms, TPOT p50 \(.tpot_p50_ms*10|floor/10) ms, late TTFT \(.ttft_late_ms // 0|floor) ms, failed \(.failed)"' "$out/$s-serve.json" 2>/dev/null
done
