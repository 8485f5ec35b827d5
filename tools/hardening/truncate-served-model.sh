#!/bin/bash
# Issue 33 on the GPU: truncate the model file while `ats serve` generates,
# with the whole model on the GPU, with a CPU+GPU placement that streams
# CPU weights, and on the CPU. The server must stay up, end that request
# with an error, and answer /health with 503 model_file_changed; a SIGBUS
# would kill it. Prints one row per backend. Run from the repository root:
#   bash tools/hardening/truncate-served-model.sh [cpu] [gpu] [hybrid]
# ATS=/path/to/ats uses that binary instead of building one (a machine
# without Go).
set -u
cd "$(dirname "$0")/../.."
backends=("$@")
[ ${#backends[@]} -eq 0 ] && backends=(cpu gpu hybrid)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "${ATS:-}" ]; then
	cp "$ATS" "$work/ats" || exit 1
else
	go build -o "$work/ats" ./cmd/ats || exit 1
fi
"$work/ats" synth --preset qwen3-0.6b --layout q8_0 -o "$work/base.gguf" >/dev/null 2>&1 || { echo "synth failed"; exit 1; }
port=18093
rows=()
for b in "${backends[@]}"; do
	cp "$work/base.gguf" "$work/m.gguf"
	case $b in
	cpu) flags=(--backend cpu) ;;
	gpu) flags=(--backend gpu) ;;
	hybrid) flags=(--backend auto --vram-budget 300MiB) ;; # about half the weights stream
	esac
	"$work/ats" serve "$work/m.gguf" --port $port -c 4096 "${flags[@]}" >"$work/serve-$b.log" 2>&1 &
	pid=$!
	for _ in $(seq 300); do
		curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
		sleep 0.2
	done
	# A long reply (the made-up vocabulary's end token is banned), cut by
	# the truncation half a second in.
	curl -sN "http://127.0.0.1:$port/v1/completions" \
		-d '{"prompt":"Once upon a time","max_tokens":3000,"stream":true,"logit_bias":{"2":-100}}' >"$work/reply-$b.txt" 2>&1 &
	req=$!
	sleep 0.5
	truncate -s 20000 "$work/m.gguf"
	wait $req
	sleep 0.5
	if kill -0 $pid 2>/dev/null; then alive=yes; else alive="NO (see below)"; fi
	health=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
	code=$(curl -s "http://127.0.0.1:$port/health" | grep -o '"status":"[^"]*"')
	ended=$(grep -o 'model_file_changed\|\[DONE\]' "$work/reply-$b.txt" | tail -1)
	rows+=("| $b | $alive | $health $code | ${ended:-none} | $(grep -c '^data:' "$work/reply-$b.txt") |")
	kill $pid 2>/dev/null
	wait $pid 2>/dev/null
	if [ "$alive" != yes ]; then tail -20 "$work/serve-$b.log"; fi
done
echo
echo "| backend | server alive | /health | the request ended with | events |"
echo "| --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
