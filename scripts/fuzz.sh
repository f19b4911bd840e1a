#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang++, AddressSanitizer + UndefinedBehaviorSanitizer)
# in build-fuzz/ and runs each for a bounded time over its seed corpus (fuzz/corpus/<target>/;
# new inputs go to a temporary folder, the committed corpus is only read). Fails on the first
# crash, leak, sanitizer report or timeout; the input is left in build-fuzz/crash-<target>-*.
#   FUZZ_SECONDS  seconds per target (default 25)
#   FUZZ_TARGETS  targets to run (default all)
#   FUZZ_CXX      the clang++ to use (default clang++-14, else clang++)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-25}
targets=${FUZZ_TARGETS:-"fuzz_safetensors fuzz_gguf fuzz_config fuzz_tokenizer fuzz_chat_template fuzz_request fuzz_page_file"}
cxx=${FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || true)}
if [ -z "$cxx" ]; then
  echo "fuzz.sh: no clang++ (install clang libclang-rt-14-dev: scripts/install-deps.sh)" >&2
  exit 1
fi
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
mkdir -p build-fuzz
blog=build-fuzz/build.log
cmake -S fuzz -B build-fuzz -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" > "$blog" 2>&1 || { cat "$blog"; exit 1; }
cmake --build build-fuzz -j"${FUZZ_JOBS:-$(nproc)}" >> "$blog" 2>&1 || { tail -50 "$blog"; exit 1; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for t in $targets; do
  work=$(mktemp -d)
  log=$(mktemp)
  if ! build-fuzz/"$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="build-fuzz/crash-$t-" "$work" "fuzz/corpus/$t" > "$log" 2>&1; then
    tail -60 "$log"
    echo "fuzz.sh: $t FAILED (input in build-fuzz/crash-$t-*)" >&2
    rm -rf "$work" "$log"
    exit 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  echo "fuzz.sh: $t: ${seconds} s, ${runs} executions, ${cov:-cov: ?}, no crash"
  rm -rf "$work" "$log"
done
