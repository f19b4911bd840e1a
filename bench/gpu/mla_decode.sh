#!/usr/bin/env bash
# MLA decode on a Hopper GPU: builds the CUDA backend, runs the kernel's correctness tests
# (tests/cuda, against the fp32 CPU reference), then measures the kernel at FlashMLA's shapes
# beside a PyTorch absorbed implementation on the same tensors (torch_mla_decode.py), printing
# microseconds, TFLOPS, GB/s and the ratio. Without PyTorch it prints the kernel's figures only
# (mla_decode_bench). Meant to finish in about 5 minutes on an H200 with 16 cores.
# Usage: bench/gpu/mla_decode.sh [--quick]     (env: BUILD=build folder, JOBS=parallel jobs)
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
QUICK=${1:-}
status=0

nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv 2>/dev/null || true
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMLA_CUDA=ON -DMLA_TESTS=ON -DMLA_BENCH=ON >"$BUILD.configure.log" 2>&1 \
  || { echo "configure failed:"; tail -30 "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j"$JOBS" --target mla_decode_bench mla_decode_capi || exit 1

echo "== correctness: mla_cuda_tests (tests/cuda: kernel against the CPU reference)"
if cmake --build "$BUILD" -j"$JOBS" --target mla_cuda_tests >"$BUILD.tests.log" 2>&1; then
  timeout 360 "$BUILD/mla_cuda_tests" --gtest_brief=1 || status=1
else
  echo "mla_cuda_tests did not build (see $BUILD.tests.log):"; grep -m 10 -E "error" "$BUILD.tests.log"; status=1
fi

echo "== speed"
if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  timeout 300 python3 bench/gpu/torch_mla_decode.py --lib "$BUILD/libmla_decode_capi.so" $QUICK || status=1
else
  echo "PyTorch with CUDA is not available here: kernel figures only, no peer ratio"
  timeout 300 "$BUILD/mla_decode_bench" $QUICK || status=1
fi
exit $status
