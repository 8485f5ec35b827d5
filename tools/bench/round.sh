#!/usr/bin/env bash
# Side by side with llama.cpp on one machine: the server under concurrent
# requests and a long prompt (hybrid and all on the GPU), and prompt and
# generation speed at depth (ats bench -d against llama-bench -d), on a
# synthetic Qwen3-14B Q4_K_M. Writes every result as JSON into OUT and
# prints a summary last.
#
# Usage: ATS=/path/to/ats LLAMA=/path/to/llama.cpp/build/bin tools/bench/round.sh OUT
#   MODEL=FILE.gguf    use this file instead of synthesizing one
#   THREADS=16 BUDGET=4.5GiB DEPTH_BUDGET=7.6GiB CTX=16384 LONG=6000 GEN=64
#   DEPTHS=0,4096,16384
#   LATE=0             no late request: by default each concurrency row also
#                      sends one more request once the others decode (its
#                      time to first token), which then decodes beside them
#   SKIP_GPU_ONLY=1    leave out the all-GPU server rows
#   SKIP_HYBRID=1, SKIP_DEPTH=1  leave out the hybrid server rows, the depth
#                      rows (SKIP_HYBRID=1 SKIP_DEPTH=1: the all-GPU rows alone)
#   DEPTH_ATS_FLAGS, DEPTH_LLAMA_FLAGS  the depth rows' placement (default:
#                      the hybrid at DEPTH_BUDGET against llama.cpp's split;
#                      "--backend gpu" and "" put both wholly on the GPU)
# llama.cpp's side: the FFN of layers 16-39 on the CPU with flash attention
# and --no-mmap (its fastest hybrid configuration for prefill at about 4.5
# GiB; see docs/performance.md), one unified KV cache of CTX for its slots.
set -uo pipefail
ats=${ATS:-ats}
lb=${LLAMA:-}
out=${1:?usage: round.sh OUT}
mkdir -p "$out"
T=${THREADS:-16}
budget=${BUDGET:-4.5GiB}
dbudget=${DEPTH_BUDGET:-7.6GiB}
ctx=${CTX:-16384}
long=${LONG:-6000}
gen=${GEN:-64}
depths=${DEPTHS:-0,4096,16384}
m=${MODEL:-/tmp/ats-round/q14.gguf}
ot='blk\.(1[6-9]|2[0-9]|3[0-9])\.ffn_.*=CPU'
late=(--late)
[[ "${LATE:-1}" == 0 ]] && late=()
start=$SECONDS
note() { echo "[$((SECONDS - start))s] $*" | tee -a "$out/round.log"; }

# Every tool first: a missing one would otherwise surface as a server that
# never comes up, after the wait for it.
for tool in "$ats" curl jq; do
	command -v "$tool" >/dev/null || { echo "round.sh: $tool not found" >&2; exit 1; }
done
need=(llama-server)
[[ -z "${SKIP_DEPTH:-}" ]] && need+=(llama-bench)
for b in "${need[@]}"; do
	[[ -z "$lb" || -x "$lb/$b" ]] || { echo "round.sh: $lb/$b not found" >&2; exit 1; }
done

if [[ ! -f "$m" ]]; then
	mkdir -p "$(dirname "$m")"
	note "synthesizing $m"
	"$ats" synth --preset qwen3-14b --layout q4_k_m -o "$m" >>"$out/round.log" 2>&1 || exit 1
fi

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

# load NAME URL PID: the concurrency rows and the long prompt against a server.
load() {
	local name=$1 url=$2 pid=$3
	if ! up "$url"; then
		note "$name: not up"
		kill "$pid" 2>/dev/null
		return 1
	fi
	note "$name: up"
	# The VRAM the whole process takes, by NVML, to set the other side's budget.
	nvidia-smi --query-gpu=memory.used --format=csv,noheader >"$out/$name-vram.txt" 2>/dev/null
	timeout 300 "$ats" bench --serve "$url" --concurrency "${CONC:-1,4,8}" -n "$gen" "${late[@]}" -o json >"$out/$name-concurrency.json" 2>>"$out/round.log" || note "$name: concurrency failed"
	note "$name: concurrency done"
	if [[ -n "${LONG_ROWS-1}" ]]; then
		timeout 300 "$ats" bench --serve "$url" --concurrency 1 -n 32 -p "$long" -o json >"$out/$name-long.json" 2>>"$out/round.log" || note "$name: long prompt failed"
		note "$name: long prompt done"
	fi
	curl -sf "$url/metrics" >"$out/$name-metrics.txt" 2>/dev/null
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
}

# The hybrid server.
if [[ -z "${SKIP_HYBRID:-}" ]]; then
	"$ats" serve "$m" --vram-budget "$budget" -c "$ctx" --parallel 4 -t "$T" --port 8181 >"$out/ats-hybrid.log" 2>&1 &
	load ats-hybrid http://127.0.0.1:8181 $!
	if [[ -n "$lb" ]]; then
		"$lb/llama-server" -m "$m" -ngl 99 -ot "$ot" -fa on --no-mmap -c "$ctx" -np 4 -kvu -t "$T" --port 8182 >"$out/llama-hybrid.log" 2>&1 &
		load llama-hybrid http://127.0.0.1:8182 $!
	fi
fi

# At depth: ats bench -d against llama-bench -d (pp with --no-mmap, its
# faster prefill; tg with the default).
if [[ -z "${SKIP_DEPTH:-}" ]]; then
	note "bench at depth"
	# shellcheck disable=SC2086
	timeout 400 "$ats" bench -m "$m" ${DEPTH_ATS_FLAGS---vram-budget $dbudget} -t "$T" -p 512 -n "$gen" -d "$depths" -r 1 -o json >"$out/ats-depth.json" 2>>"$out/round.log" || note "ats bench -d failed"
	note "ats bench -d done"
	if [[ -n "$lb" ]]; then
		dl=(-ot "$ot")
		[[ -n "${DEPTH_LLAMA_FLAGS+set}" ]] && read -ra dl <<<"$DEPTH_LLAMA_FLAGS"
		timeout 400 "$lb/llama-bench" -m "$m" -ngl 99 "${dl[@]}" -fa 1 -mmp 0 -t "$T" -p 512 -n 0 -d "$depths" -r 1 -o json >"$out/llama-depth-pp.json" 2>>"$out/round.log" || note "llama-bench pp failed"
		timeout 400 "$lb/llama-bench" -m "$m" -ngl 99 "${dl[@]}" -fa 1 -t "$T" -p 0 -n "$gen" -d "$depths" -r 1 -o json >"$out/llama-depth-tg.json" 2>>"$out/round.log" || note "llama-bench tg failed"
		note "llama-bench -d done"
	fi
fi

# All on the GPU: 8 and 32 requests at once.
if [[ -z "${SKIP_GPU_ONLY:-}" ]]; then
	"$ats" serve "$m" --backend gpu -c "$ctx" --parallel 32 -t "$T" --port 8183 >"$out/ats-gpu.log" 2>&1 &
	LONG_ROWS= CONC=8,32 load ats-gpu http://127.0.0.1:8183 $!
	if [[ -n "$lb" ]]; then
		"$lb/llama-server" -m "$m" -ngl 99 -fa on -c "$ctx" -np 32 -kvu -t "$T" --port 8184 >"$out/llama-gpu.log" 2>&1 &
		LONG_ROWS= CONC=8,32 load llama-gpu http://127.0.0.1:8184 $!
	fi
fi
note "done"

# The summary.
for f in "$out"/*-vram.txt; do
	[[ -f "$f" ]] && echo "== $(basename "$f" .txt): $(cat "$f")"
done
for f in "$out"/*-concurrency.json; do
	[[ -f "$f" ]] || continue
	echo "== $(basename "$f" .json)"
	jq -r '.[] | "c=\(.concurrency) aggregate \(.aggregate_tokens_per_s|floor) t/s, TTFT p50 \(.ttft_p50_ms|floor) ms, TPOT p50 \(.tpot_p50_ms*10|floor/10) ms, late TTFT \(.ttft_late_ms // 0|floor) ms, failed \(.failed)"' "$f" 2>/dev/null || cat "$f"
done
for f in "$out"/*-long.json; do
	[[ -f "$f" ]] || continue
	echo "== $(basename "$f" .json)"
	jq -r '.[] | .requests[0] | "prompt \(.prompt_tokens) tokens: first token after \(.ttft_ms|floor) ms (\(.prompt_tokens*1000/.ttft_ms|floor) t/s), then \(.tokens_per_s*10|floor/10) t/s"' "$f" 2>/dev/null || cat "$f"
done
for f in "$out"/ats-depth.json "$out"/llama-depth-*.json; do
	[[ -f "$f" ]] || continue
	echo "== $(basename "$f" .json)"
	jq -r '.[] | "\(.n_prompt) \(.n_gen) d\(.n_depth): \(.avg_ts*10|floor/10) t/s"' "$f" 2>/dev/null || cat "$f"
done
