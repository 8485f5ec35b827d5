#!/usr/bin/env bash
# The share of a decode step's chosen experts the GPU takes in the hybrid
# (ATS_MOE_ROUTED): ats bench tg at depth with the planner's share and
# with forced ones, alternating with llama-bench's best split of the same
# VRAM when LLAMA is set, so that the machine's drift shows as spread.
# Writes each run's JSON and log into OUT and prints a table last.
#
# Usage: tools/bench/routed.sh MODEL OUT
#   ATS=ats  LLAMA=/path/to/llama.cpp/build/bin (optional)
#   BUDGET=7537MiB NCMOE=35 THREADS=16 DEPTH=16384 TG=64 ROUNDS=2
#   SHARES="auto 0.375 0.5 0.625"   auto: the planner's; 0: none routed
# The defaults are Qwen3-30B-A3B (ats synth --preset qwen3-30b-a3b
# --layout q4_k_m --routing balanced) at llama.cpp's VRAM for -ncmoe 35
# at depth 16384 on the GPU machine (docs/performance.md).
set -uo pipefail
m=${1:?usage: routed.sh MODEL OUT} out=${2:?usage: routed.sh MODEL OUT}
mkdir -p "$out"
ats=${ATS:-ats} lb=${LLAMA:-}
budget=${BUDGET:-7537MiB} ncmoe=${NCMOE:-35} T=${THREADS:-16}
depth=${DEPTH:-16384} tg=${TG:-64} rounds=${ROUNDS:-2}
read -r -a shares <<<"${SHARES:-auto 0.375 0.5 0.625}"
runs=()
for r in $(seq 1 "$rounds"); do
	if [[ -n "$lb" ]]; then
		f=$out/llama-$r
		timeout 600 "$lb/llama-bench" -m "$m" -ngl 99 -ncmoe "$ncmoe" -fa 1 -t "$T" -p 0 -n "$tg" -d "$depth" -r 1 -o json \
			>"$f.json" 2>"$f.log" || echo "llama-bench round $r failed" | tee -a "$out/routed.log"
		runs+=("llama.cpp -ncmoe $ncmoe|$r|$f")
	fi
	for s in "${shares[@]}"; do
		f=$out/ats-$s-$r
		ATS_MOE_ROUTED=$s timeout 600 "$ats" bench -m "$m" --vram-budget "$budget" -t "$T" -p 0 -n "$tg" -d "$depth" -r 1 -o json \
			>"$f.json" 2>"$f.log" || echo "ats share $s round $r failed" | tee -a "$out/routed.log"
		runs+=("ats ATS_MOE_ROUTED=$s|$r|$f")
	done
done
printf '| run | round | tg%s @ d%s, t/s | the GPU'"'"'s experts a layer |\n| --- | ---: | ---: | --- |\n' "$tg" "$depth"
for x in "${runs[@]}"; do
	IFS='|' read -r name r f <<<"$x"
	ts=$(jq -r '.[0].avg_ts // empty' "$f.json" 2>/dev/null)
	took=$(grep -o 'the GPU takes [0-9.]* of a layer'"'"'s chosen experts' "$f.log" 2>/dev/null | grep -o '[0-9.]*' | head -1)
	printf '| %s | %s | %.1f | %s |\n' "$name" "$r" "${ts:-0}" "${took:--}"
done
