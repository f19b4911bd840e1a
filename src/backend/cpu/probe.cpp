// The machine probes (see probe.h).
#include "backend/cpu/probe.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backend/cpu/formats/gemm.h"
#include "backend/cpu/common/stream_prefetch.h"

namespace mla::cpu {

namespace {

// The sum of every pass's loads, kept so that no load is left out.
volatile float read_sink = 0;

// Adds the 64-byte lines of [p, p + n) to four accumulators (whole lines only), touching each
// page two pages ahead as the decode GEMVs do: the fastest plain read measured.
inline void read_lines(const uint8_t* p, size_t n, __m512& a0, __m512& a1, __m512& a2, __m512& a3) {
  const uint8_t* const end = p + n / 64 * 64;
  for (; p + 256 <= end; p += 256) {
    touch_page_ahead<256>(p);
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(reinterpret_cast<const float*>(p)));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(reinterpret_cast<const float*>(p + 64)));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(reinterpret_cast<const float*>(p + 128)));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(reinterpret_cast<const float*>(p + 192)));
  }
  for (; p < end; p += 64) a0 = _mm512_add_ps(a0, _mm512_loadu_ps(reinterpret_cast<const float*>(p)));
}

}  // namespace

double read_gbps(std::span<const ReadSpan> spans, int threads) {
  const int team = threads_or_default(threads);
  double total = 0;
  for (const ReadSpan& s : spans) total += double(s.bytes);
  const auto t0 = std::chrono::steady_clock::now();
  float sum = 0;
#pragma omp parallel num_threads(team) reduction(+ : sum)
  {
    const int nt = omp_get_num_threads(), me = omp_get_thread_num();
    const double lo = total * me / nt, hi = total * (me + 1) / nt;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    double at = 0;
    for (const ReadSpan& s : spans) {
      const double s0 = std::max(lo, at), s1 = std::min(hi, at + double(s.bytes));
      if (s1 > s0) read_lines(s.data + size_t(s0 - at), size_t(s1 - s0), a0, a1, a2, a3);
      at += double(s.bytes);
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    sum += lanes[0];
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  read_sink = read_sink + sum;
  return total / seconds / 1e9;
}

ReadBuffer::ReadBuffer(size_t bytes, int threads) {
  bytes_ = std::max<size_t>(bytes / 4096 * 4096, 4096);
  mem_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem_ == MAP_FAILED) throw std::runtime_error("read loop: cannot map " + std::to_string(bytes_) + " bytes");
  madvise(mem_, bytes_, MADV_HUGEPAGE);  // best effort
  threads_ = threads_or_default(threads);
  per_ = bytes_ / size_t(threads_) / 256 * 256;
  // First touch by the thread that reads it; then huge pages asked for where faults got none.
#pragma omp parallel num_threads(threads_)
  std::memset(static_cast<uint8_t*>(mem_) + per_ * size_t(omp_get_thread_num()), 1, per_);
  madvise(mem_, bytes_, 25 /* MADV_COLLAPSE, Linux 6.1 */);
}

ReadBuffer::~ReadBuffer() { munmap(mem_, bytes_); }

void gemm_probe_bf16(const Context& ctx, int64_t n, const uint16_t* a, const uint16_t* b, float* c) {
  gemm_bf16_nt(ctx, a, n, n, b, n, n, n, c, n);
}

}  // namespace mla::cpu
