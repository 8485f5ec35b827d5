#!/usr/bin/env bash
# The performance page's measurements (docs/performance.md), side by side
# with llama.cpp when its llama-bench is given, in one run:
#
#   tools/bench/perf.sh [-l PATH/TO/llama-bench] [-a PATH/TO/ats] [-t THREADS] [-d DIR] [-q]
#
# It builds ats (or runs the binary -a names: a release, or one built
# elsewhere for a machine without Go), writes the synthetic models
# (Qwen3-14B and Qwen3-30B-A3B shapes, Q4_K_M layout; about 26 GiB in DIR,
# default /tmp/ats-perf), runs every row of the page's tables with ats
# bench and, with -l, llama-bench in llama.cpp's best configuration found
# for that row, and prints one table. -q runs only the CPU row (no GPU
# needed); rows that need a GPU are left out without one.
set -euo pipefail
cd "$(dirname "$0")/../.."
llama="" ats="" threads=$(nproc) dir=/tmp/ats-perf quick=0
while getopts "l:a:t:d:q" o; do
  case $o in
    l) llama=$OPTARG ;;
    a) ats=$OPTARG ;;
    t) threads=$OPTARG ;;
    d) dir=$OPTARG ;;
    q) quick=1 ;;
    *) sed -n 2,14p "$0"; exit 2 ;;
  esac
done
mkdir -p "$dir"
if [ -z "$ats" ]; then
  CGO_ENABLED=0 go build -trimpath -o "$dir/ats" ./cmd/ats
  ats="$dir/ats"
fi
"$ats" version
gpu=0
if [ "$quick" = 0 ] && "$ats" gpu >/dev/null 2>&1; then gpu=1; fi
lscpu 2>/dev/null | grep -E "^Model name|^CPU\(s\)" || true
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi

q14=$dir/qwen3-14b-q4_k_m.gguf
q30=$dir/qwen3-30b-a3b-q4_k_m-balanced.gguf
[ -f "$q14" ] || "$ats" synth --preset qwen3-14b --layout q4_k_m -o "$q14"
if [ "$gpu" = 1 ] && [ ! -f "$q30" ]; then
  "$ats" synth --preset qwen3-30b-a3b --layout q4_k_m --routing balanced -o "$q30"
fi

# tps FILE TEST: avg_ts of the row whose test is TEST (pp512, tg64, ...) in
# a CSV of ats bench or llama-bench (the same columns).
tps() {
  awk -F, -v want="$2" '
    NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); col[$i] = i }; next }
    { gsub(/"/, "") }
    { t = ("test" in col) ? $col["test"] : ""; if (t == "") t = ($col["n_prompt"] > 0 ? "pp" $col["n_prompt"] : "tg" $col["n_gen"]) }
    t == want { printf "%.1f", $col["avg_ts"]; found = 1 }
    END { if (!found) printf "-" }' "$1"
}

rows=()
# row LABEL MODEL PP TG "ATS FLAGS" "LLAMA PP FLAGS" "LLAMA TG FLAGS"
row() {
  local label=$1 model=$2 pp=$3 tg=$4 af=$5 lpp=$6 ltg=$7 out
  out=$dir/$(echo "$label" | tr -c 'a-zA-Z0-9' _)
  echo "== $label" >&2
  # shellcheck disable=SC2086
  "$ats" bench -m "$model" -p "$pp" -n "$tg" -r 3 -o csv $af >"$out.ats.csv"
  local a_pp a_tg l_pp="-" l_tg="-"
  a_pp=$(tps "$out.ats.csv" "pp$pp")
  a_tg=$(tps "$out.ats.csv" "tg$tg")
  if [ -n "$llama" ]; then
    # shellcheck disable=SC2086
    "$llama" -m "$model" -p "$pp" -n 0 -r 3 -o csv $lpp >"$out.lpp.csv" && l_pp=$(tps "$out.lpp.csv" "pp$pp")
    # shellcheck disable=SC2086
    "$llama" -m "$model" -p 0 -n "$tg" -r 3 -o csv $ltg >"$out.ltg.csv" && l_tg=$(tps "$out.ltg.csv" "tg$tg")
  fi
  rows+=("| $label | $a_pp | $a_tg | $l_pp | $l_tg |")
}

# llama.cpp's best configurations found for each row (docs/performance.md).
split14pp='blk\.([0-9]|1[0-9]|2[0-3])\.ffn_(up|gate|down)\.weight=CPU'
split14tg='blk\.(1[6-9]|2[0-9]|3[0-9])\.ffn_(up|gate|down)\.weight=CPU'
row "Qwen3-14B, CPU only, $threads threads (pp64, tg32)" "$q14" 64 32 "--backend cpu -t $threads" "-dev none -t $threads" "-dev none -t $threads"
if [ "$gpu" = 1 ]; then
  row "Qwen3-14B, all on the GPU" "$q14" 512 64 "--backend gpu" "-ngl 99" "-ngl 99"
  row "Qwen3-30B-A3B, all on the GPU" "$q30" 512 64 "--backend gpu" "-ngl 99" "-ngl 99"
  row "Qwen3-14B at 4.5 GiB of VRAM" "$q14" 512 64 "--vram-budget 4.5GiB -t $threads" \
    "-ngl 99 -ot $split14pp -fa 1 -mmp 0 -t $threads" "-ngl 99 -ot $split14tg -t $threads"
  row "Qwen3-30B-A3B at 6 GiB of VRAM" "$q30" 512 64 "--vram-budget 6GiB -t $threads" \
    "-ngl 99 -ncmoe 35 -fa 1 -mmp 0 -t $threads" "-ngl 99 -ncmoe 35 -fa 1 -t $threads"
fi

echo
echo "| setup | ats pp | ats tg | llama.cpp pp | llama.cpp tg |"
echo "| --- | ---: | ---: | ---: | ---: |"
printf '%s\n' "${rows[@]}"
echo "(tokens/s, mean of 3 runs after a warm-up; pp512 and tg64 unless the row says otherwise; the CSVs are in $dir)"
