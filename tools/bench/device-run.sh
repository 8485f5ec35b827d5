#!/bin/bash
# Final benchmark pass: CPU-only 14B decode (issue 5) and all-GPU 14B/30B-A3B (issue 6).
set -u
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core" 
./ats version
./ats gpu 2>&1 | head -12
time ./ats synth --preset qwen3-14b --layout q4_k_m -o /tmp/q14.gguf 2>&1 | tail -1
time ./ats synth --preset qwen3-30b-a3b --layout q4_k_m -o /tmp/q30.gguf 2>&1 | tail -1
echo "== 14B CPU only, 16 threads"
./ats bench --backend cpu -m /tmp/q14.gguf -p 64 -n 32 -r 3 -t 16 -o md 2>&1 | tail -6
echo "== 14B all on GPU"
./ats bench --backend gpu -m /tmp/q14.gguf -p 512 -n 64 -r 3 -o md 2>&1 | tail -6
echo "== 30B-A3B all on GPU"
./ats bench --backend gpu -m /tmp/q30.gguf -p 512 -n 64 -r 3 -o md 2>&1 | tail -6
