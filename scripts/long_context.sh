#!/usr/bin/env bash
# The long-context cases beyond CI's 32,768 tokens (docs/long-context.md): every attention path
# of the dense families at 131,072 tokens and at each family's max_position_embeddings
# (DeepSeek-V3 163,840, Kimi K2.5 262,144, GLM-4.7-Flash 202,752), and DeepSeek Sparse Attention
# (DeepSeek-V3.2, GLM-5) at 65,536 tokens, its indexer's top-k included, against the float64
# references of tests/model/test_long_context.cpp. Needs the release build (cmake --preset
# release; the mla_tests target). THREADS sets the OpenMP threads (default: all cores; on cores
# shared with other work THREADS=1 is much faster: docs/long-context.md). About 85 minutes with
# THREADS=1 on a 2-core AMD Zen 5 VM.
set -euo pipefail
cd "$(dirname "$0")/.."
tests=build/mla_tests
if [ ! -x "$tests" ]; then
  echo "scripts/long_context.sh: no $tests: build it first (cmake --preset release && cmake --build build --target mla_tests)" >&2
  exit 1
fi
export OMP_NUM_THREADS="${THREADS:-$(nproc)}"
run() {
  echo "== MLA_LONG_CONTEXT_TOKENS=$1 $2"
  local t0=$SECONDS
  MLA_LONG_CONTEXT_TOKENS="$1" "$tests" --gtest_filter="$2"
  echo "== $((SECONDS - t0)) s"
}
run 131072 'LongContext.*-LongContext.Sparse*'
run max 'LongContext.*-LongContext.Sparse*'
run 65536 'LongContext.Sparse*'
