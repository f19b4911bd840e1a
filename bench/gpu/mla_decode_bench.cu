// Benchmark of the CUDA MLA decode kernel at FlashMLA's published shapes (batch 128, mean
// cached lengths 4096 and 8192, fixed or variable, h_q 16/32/64/128, s_q 1/2, BF16 and FP8
// caches). Inputs are random, generated on the device; pages in random order. Prints
// microseconds per call, TFLOPS (2 s_q sum(len) h_q (576 + 512)) and GB/s of cache, q and
// output traffic. The PyTorch peer and the ratio come from torch_mla_decode.py, which drives
// the same kernel through mla_decode_capi; this program is the fallback without PyTorch.
// Usage: mla_decode_bench [--quick]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/mla_decode.h"

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}

// Values in [-2, 2) as bf16.
__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(float(hash32(seed * 0x9e3779b97f4a7c15ull + uint64_t(i))) * (4.0f / 4294967296.0f) - 2.0f);
}

// FP8 rows: random e4m3 bytes (NaN codes avoided), scales in [0.001, 0.01), bf16 rope.
__global__ void fill_fp8_rows(uint8_t* p, int64_t rows, uint64_t seed) {
  const int64_t n = rows * mla::cuda::kFp8RowBytes;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t off = i % mla::cuda::kFp8RowBytes;
    const uint32_t h = hash32(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    if (off < 512) {
      uint8_t b = uint8_t(h);
      if ((b & 0x7f) == 0x7f) b ^= 1;
      p[i] = b;
    } else if (off < 528) {
      if (off % 4 == 0) {
        const float s = 0.001f + float(h % 9000) * 1e-6f;
        memcpy(p + i, &s, 4);
      }
    } else if (off % 2 == 0) {
      const __nv_bfloat16 v = __float2bfloat16(float(h % 4000) * 0.001f - 2.0f);
      memcpy(p + i, &v, 2);
    }
  }
}

struct Result {
  double us, tflops, gbs;
};

Result run_case(int batch, int s_q, int h_q, int mean_len, bool varlen, bool fp8, int iters, std::mt19937& rng) {
  using namespace mla::cuda;
  std::vector<int32_t> lengths(size_t(batch), mean_len);
  if (varlen) {
    std::normal_distribution<double> nd(mean_len, mean_len / 2.0);
    for (int32_t& l : lengths) l = int32_t(std::clamp<double>(std::round(nd(rng)), s_q, 2.0 * mean_len));
  }
  const int page = 64;
  int max_pages = 0;
  int64_t total_pages = 0, total_tokens = 0;
  for (int32_t l : lengths) {
    max_pages = std::max(max_pages, (l + page - 1) / page);
    total_pages += (l + page - 1) / page;
    total_tokens += l;
  }
  std::vector<int32_t> order(static_cast<size_t>(total_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> table(size_t(batch) * max_pages, 0);
  for (int b = 0, next = 0; b < batch; ++b)
    for (int i = 0; i < (lengths[size_t(b)] + page - 1) / page; ++i) table[size_t(b) * max_pages + i] = order[size_t(next++)];

  const int64_t row_bytes = fp8 ? kFp8RowBytes : kHeadDim * 2;
  const int64_t rows = int64_t(batch) * s_q * h_q;
  void *q, *cache, *out;
  int32_t* bt;
  float* lse;
  ok(cudaMalloc(&q, rows * kHeadDim * 2), "cudaMalloc q");
  ok(cudaMalloc(&cache, total_pages * page * row_bytes), "cudaMalloc cache");
  ok(cudaMalloc(&out, rows * kKvLora * 2), "cudaMalloc out");
  ok(cudaMalloc(&lse, rows * 4), "cudaMalloc lse");
  ok(cudaMalloc(&bt, table.size() * 4), "cudaMalloc block table");
  ok(cudaMemcpy(bt, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "copy block table");
  fill_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(q), rows * kHeadDim, 1);
  if (fp8) fill_fp8_rows<<<4096, 256>>>(static_cast<uint8_t*>(cache), total_pages * page, 2);
  else fill_bf16<<<4096, 256>>>(static_cast<__nv_bfloat16*>(cache), total_pages * page * kHeadDim, 2);
  ok(cudaGetLastError(), "filling inputs");

  DecodePlan plan = plan_decode(lengths.data(), batch, s_q, h_q, device_sm_count());
  DecodeArgs a;
  a.q = q;
  a.cache = cache;
  a.cache_dtype = fp8 ? CacheDType::FP8 : CacheDType::BF16;
  a.page_size = page;
  a.block_table = bt;
  a.block_table_stride = max_pages;
  a.softmax_scale = 1.0f / std::sqrt(192.0f);
  a.out = out;
  a.lse = lse;
  for (int i = 0; i < 3; ++i) run_decode(plan, a, nullptr);
  cudaEvent_t e0, e1;
  ok(cudaEventCreate(&e0), "event");
  ok(cudaEventCreate(&e1), "event");
  ok(cudaEventRecord(e0), "event");
  for (int i = 0; i < iters; ++i) run_decode(plan, a, nullptr);
  ok(cudaEventRecord(e1), "event");
  ok(cudaEventSynchronize(e1), "running the decode kernel");
  float ms = 0;
  ok(cudaEventElapsedTime(&ms, e0, e1), "event time");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(q);
  cudaFree(cache);
  cudaFree(out);
  cudaFree(lse);
  cudaFree(bt);

  const double sec = ms / 1e3 / iters;
  const double flops = 2.0 * s_q * double(total_tokens) * h_q * (kHeadDim + kKvLora);
  const double bytes = double(total_tokens) * row_bytes + double(rows) * (kHeadDim + kKvLora) * 2;
  return {sec * 1e6, flops / sec / 1e12, bytes / sec / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    cudaDeviceProp prop;
    ok(cudaGetDeviceProperties(&prop, 0), "no CUDA device");
    std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    std::printf("%-5s %5s %4s %4s %6s %-6s %10s %8s %8s\n", "cache", "batch", "s_q", "h_q", "mean", "lens", "us",
                "TFLOPS", "GB/s");
    std::mt19937 rng(1234);
    for (bool fp8 : {false, true})
      for (int mean : {4096, 8192})
        for (bool varlen : {false, true})
          for (int s_q : {1, 2})
            for (int h_q : {16, 32, 64, 128}) {
              if (quick && (mean != 4096 || varlen)) continue;
              Result r = run_case(128, s_q, h_q, mean, varlen, fp8, quick ? 5 : 20, rng);
              std::printf("%-5s %5d %4d %4d %6d %-6s %10.1f %8.1f %8.0f\n", fp8 ? "fp8" : "bf16", 128, s_q, h_q, mean,
                          varlen ? "var" : "fixed", r.us, r.tflops, r.gbs);
            }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mla_decode_bench: %s\n", e.what());
    return 1;
  }
}
