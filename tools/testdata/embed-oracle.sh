#!/usr/bin/env bash
# Writes the embedding oracle (testdata/oracle/embed, before packing: see
# testdata/oracle/README.md): the tiny model shaped as Qwen3-Embedding and
# the vectors llama.cpp's llama-embedding computes for it.
#
#   tools/testdata/embed-oracle.sh ATS LLAMA_BIN OUT_DIR
#
# ATS is an ats binary, LLAMA_BIN the folder of a llama.cpp build's
# llama-embedding (CPU only), OUT_DIR the folder to write. Needs python3.
# Then go run ./tools/testdata -from DIR packs DIR/oracle/embed with the
# rest.
set -eu
ats=$1 bin=$2 out=$3
model=$out/tiny-qwen3-embed-f16.gguf
"$ats" synth --preset tiny-qwen3-embed --layout f16 --seed 31 -o "$model" --force
sep='<#>'
prompts=(
  'hello world'
  'The quick brown fox jumps over the lazy dog.'
  $'Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: What is the capital of France?'
  'héllo wörld — naïve café, 你好 🙂'
  "$(printf 'A long text to embed, sentence %d of four, with a few words more. ' $(seq 1 4))"
)
joined=$(IFS=; printf '%s' "${prompts[0]}"; for p in "${prompts[@]:1}"; do printf '%s%s' "$sep" "$p"; done)
# One batch of all the prompts, each its own sequence; one thread, flash
# attention off, KV cache in f16 (the default), as the logits oracles.
# llama-embedding prints through llama.cpp's log thread, which may lose the
# end of its output when the program exits: take the first whole answer
# (the values do not change from run to run).
whole() { python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); assert len(a)==int(sys.argv[2]) and all(len(v)==64 for v in a)' "$@" 2>/dev/null; }
embed() { # embed OUT N ARGS...: the vectors of N prompts into OUT
  local f=$1 n=$2; shift 2
  for try in $(seq 1 50); do
    "$bin/llama-embedding" -m "$model" --embd-separator "$sep" -t 1 -fa off -c 512 --embd-output-format array "$@" 2>/dev/null >"$f" || true
    whole "$f" "$n" && return 0
  done
  echo "no whole answer from llama-embedding $*" >&2; return 1
}
run() { local f=$1; shift; embed "$f" ${#prompts[@]} -p "$joined" "$@"; }
tmp=$(mktemp -d)
run "$tmp/last" --pooling last --embd-normalize 2
run "$tmp/last_raw" --pooling last --embd-normalize -1
run "$tmp/mean" --pooling mean --embd-normalize 2
run "$tmp/cls" --pooling cls --embd-normalize 2
# Each prompt alone, to see how much batching moves the vectors.
: >"$tmp/last_single"
for i in "${!prompts[@]}"; do
  embed "$tmp/one" 1 -p "${prompts[$i]}" --pooling last --embd-normalize 2
  cat "$tmp/one" >>"$tmp/last_single"
done
# The token ids llama.cpp evaluated (--verbose-prompt prints them, on the
# same log thread: retry until every prompt's count of ids is there).
for try in $(seq 1 50); do
  "$bin/llama-embedding" -m "$model" -p "$joined" --embd-separator "$sep" -t 1 -fa off -c 512 --pooling last --verbose-prompt \
    >"$tmp/verbose" 2>"$tmp/verbose.err" || true
  grep -aE '^ *[0-9]+ -> ' "$tmp/verbose" >"$tmp/tokens" || true
  grep -aE 'number of tokens in prompt' "$tmp/verbose.err" >"$tmp/counts" || true
  [ "$(awk -F'= ' '{s+=$2} END {print s+0}' "$tmp/counts")" = "$(wc -l <"$tmp/tokens")" ] && [ "$(wc -l <"$tmp/counts")" = ${#prompts[@]} ] && break
done
python3 - "$tmp" "$out/tiny-qwen3-embed-f16.embeddings.json" "${prompts[@]}" <<'PY'
import json, re, sys
tmp, dst, prompts = sys.argv[1], sys.argv[2], sys.argv[3:]
def arr(name):
    return json.loads(open(f"{tmp}/{name}", encoding="utf-8").read().strip())
ids = [int(l.split("->")[0]) for l in open(f"{tmp}/tokens", encoding="utf-8", errors="replace")]
counts = [int(re.search(r"= (\d+)", l).group(1)) for l in open(f"{tmp}/counts")]
assert sum(counts) == len(ids) and len(counts) == len(prompts), (counts, len(ids))
tokens, i = [], 0
for c in counts:
    tokens.append(ids[i:i+c]); i += c
single = [json.loads(l)[0] for l in open(f"{tmp}/last_single").read().split("\n") if l.strip()]
assert len(single) == len(prompts)
doc = {"model": "tiny-qwen3-embed-f16.gguf", "prompts": prompts, "tokens": tokens,
       "last": arr("last"), "last_raw": arr("last_raw"), "mean": arr("mean"), "cls": arr("cls"),
       "last_single": single}
json.dump(doc, open(dst, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
PY
rm -r "$tmp"
