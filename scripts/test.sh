#!/usr/bin/env bash
# Builds mla and runs every test: the release build under CTest (one test per core), the
# unit tests of the loader, cache, tokenizer, chat templates, grammar, parsers, attention and the
# prompt GEMM kernels again under AddressSanitizer +
# UndefinedBehaviorSanitizer (CMake preset "asan"), and the libFuzzer targets of fuzz/ for a
# bounded time (scripts/fuzz.sh: 5 targets x FUZZ_SECONDS, default 25).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

# The tests read their fixtures from ../shared beside the checkout (DESIGN.md, "Fixtures").
if [ ! -d ../shared/fixtures ]; then
  echo "scripts/test.sh: no fixtures at $(cd .. && pwd)/shared/fixtures: the tests read them from ../shared beside the checkout" >&2
  exit 1
fi

cmake --preset release
cmake --build build -j"$jobs"

cmake --preset asan
cmake --build build-asan -j"$jobs" --target mla_tests
# Jinja values are reference-counted: the list the self-reference test appends to itself is
# never freed, which LeakSanitizer reports, so that one test runs in the release build only.
# The sanitizer build has no mla program (CMakeLists.txt), so the test that drives it runs in
# the release build only too (and GgufCli, which drives it on a GGUF file).
echo "== unit tests under ASan + UBSan"
OMP_NUM_THREADS=1 build-asan/mla_tests --gtest_brief=1 \
  --gtest_filter='Bad*:Gguf*:Fixtures/GgufConfig*:Files/GgufQuantized*:Ggml*:QuantizeGguf*:LatentPool*:PoolDtype*:Fp8*:PathPolicy*:KvExhaustion*:MlaPaths*:Packaging*:Tokenizer*:ChatTemplate*:Jinja*:CacheSize*:Fixtures/Golden.LayerOutputs*:Attention*:MlaUnit*:Moe*:PrefixCache*:PromptCacheTiers*:OutputStream*:Grammar*:JsonSchema*:ToolParser*:ReasoningParser*:EncodingDsv32*:DsaPool*:DsaConfig*:DsaIndexer*:SparseAttention*:QuantizeKernels*:ComputePeak*:Int8.*:QuantizeInt8.Malformed*:RopeParameters*:OneTokenKernels*:Matmul.FastPrecision*:Repack.*:AnthropicApi*:ResponsesApi*:ExpertParallel*-GgufCli.*:JinjaRender.SelfReferencingListPrintsToALimit:EncodingDsv32.ChatTemplateCommandUsesTheEncoder'

echo "== fuzzing (clang++, ASan + UBSan)"
bash scripts/fuzz.sh

# The official openai npm client for the end-to-end tests (tests/e2e, package-lock.json).
npm ci --prefix tests/e2e --no-audit --no-fund --loglevel=error

echo "== all tests (release build)"
ctest --test-dir build --output-on-failure --no-tests=error -j"$jobs"
