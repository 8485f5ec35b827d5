#!/usr/bin/env bash
# Two ats binaries side by side on one machine: ats bench pp and tg, all on
# the GPU, hybrid at a VRAM budget, and CPU only, the binaries alternating
# within each configuration so that drift in the machine's load shows as
# spread, not as a difference. Writes each run's JSON into OUT and prints a
# table last.
#
# Usage: tools/bench/before-after.sh OLD NEW MODEL OUT
#   THREADS=16 BUDGET=4.5GiB PP=512 TG=64 REPS=2 ROUNDS=2
set -uo pipefail
old=${1:?usage: before-after.sh OLD NEW MODEL OUT} new=${2:?} m=${3:?} out=${4:?}
mkdir -p "$out"
T=${THREADS:-16} budget=${BUDGET:-4.5GiB} pp=${PP:-512} tg=${TG:-64} reps=${REPS:-2} rounds=${ROUNDS:-2}
declare -A cfg=([gpu]="--backend gpu" [hybrid]="--vram-budget $budget" [cpu]="--backend cpu")
for c in gpu hybrid cpu; do
	for r in $(seq 1 "$rounds"); do
		for b in old new; do
			bin=$old
			[[ $b == new ]] && bin=$new
			# shellcheck disable=SC2086
			timeout 300 "$bin" bench -m "$m" ${cfg[$c]} -t "$T" -p "$pp" -n "$tg" -r "$reps" -o json \
				>"$out/$c-$b-$r.json" 2>>"$out/before-after.log" || echo "$c $b round $r failed" | tee -a "$out/before-after.log"
		done
	done
done
printf '| config | binary | round | pp%s t/s | tg%s t/s |\n| --- | --- | ---: | ---: | ---: |\n' "$pp" "$tg"
for c in gpu hybrid cpu; do
	for r in $(seq 1 "$rounds"); do
		for b in old new; do
			f=$out/$c-$b-$r.json
			p=$(jq -r '.[] | select(.n_gen == 0) | .avg_ts' "$f" 2>/dev/null | head -1)
			g=$(jq -r '.[] | select(.n_prompt == 0) | .avg_ts' "$f" 2>/dev/null | head -1)
			printf '| %s | %s | %s | %.1f | %.1f |\n' "$c" "$b" "$r" "${p:-0}" "${g:-0}"
		done
	done
done
