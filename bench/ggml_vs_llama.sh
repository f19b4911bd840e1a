#!/bin/sh
# One token's decode on llama.cpp's block formats, mla's kernels against llama.cpp's on the same
# shapes and formats: llama-bench's tg on bench/ggml_model.py's model quantized with --pure to each
# format, and bench/matmul --ggml-model (the same weight products, one token). Alternating, ROUNDS
# times; llama-bench's best and mean of 5 samples, mla's best of 15 steps.
#
#   bench/ggml_vs_llama.sh LLAMA_BIN_DIR MODEL_DIR MLA_BUILD_DIR THREADS ROUNDS FORMAT...
#   (MODEL_DIR holds llama-<format>.gguf, e.g. llama-q4_k.gguf; FORMAT: q4_0 .. q6_k)
set -e
llama=$1 models=$2 build=$3 threads=$4 rounds=$5
shift 5
export LD_LIBRARY_PATH="$llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for f in "$@"; do
  r=0
  while [ $r -lt "$rounds" ]; do
    "$llama/llama-bench" -m "$models/llama-$f.gguf" -p 0 -n 32 -t "$threads" -r 5 -o jsonl 2>/dev/null |
      python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    print('llama.cpp $f, %d threads: best %.2f, mean %.2f tokens/s' % (d['n_threads'], max(d['samples_ts']), d['avg_ts']))"
    "$build/matmul" --threads "$threads" --ggml-model "$f" | grep fast
    r=$((r + 1))
  done
done
