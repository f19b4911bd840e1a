#!/usr/bin/env bash
# Builds mla and runs every test: the release build under CTest (one test per core), and the
# unit tests of the loader, cache, tokenizer and attention again under AddressSanitizer +
# UndefinedBehaviorSanitizer (CMake preset "asan").
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

cmake --preset release
cmake --build build -j"$jobs"

cmake --preset asan
cmake --build build-asan -j"$jobs" --target mla_tests
echo "== unit tests under ASan + UBSan"
OMP_NUM_THREADS=1 build-asan/mla_tests --gtest_brief=1 \
  --gtest_filter='Bad*:LatentPool*:PoolDtype*:Fp8*:PathPolicy*:KvExhaustion*:MlaPaths*:Packaging*:Tokenizer*:ChatTemplate*:Fixtures/Golden.LayerOutputs*'

echo "== all tests (release build)"
ctest --test-dir build --output-on-failure -j"$jobs"
