// Machine probes: the loops `mla bench` (tools/bench.h) sets the model's figures against, run on
// the machine as it is now. The read loop reads memory as fast as a plain read goes, so that the
// decode limit it gives is one; the GEMM probe is the square bf16 product prompt processing is
// compared with. The compute peak is compute_peak.h's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/cpu/context.h"

namespace mla::cpu {

// Bytes a read pass reads: [data, data + bytes).
struct ReadSpan {
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

// One pass of the read loop over `spans` laid end to end, each of `threads` threads (0: all
// cores, as Context::threads) reading an equal share of the whole: 64-byte AVX-512 loads of whole
// lines only (a span's last partial line, at most 63 bytes, is left out), touching each page two
// pages ahead as the decode GEMVs do (stream_prefetch.h). GB/s (1e9 bytes/s) of the spans' bytes.
double read_gbps(std::span<const ReadSpan> spans, int threads);

// Memory for the read loop: `bytes` rounded down to whole 4 KiB pages (one at least), anonymous,
// on huge pages where the system allows, each thread's share first touched by the thread that
// reads it.
class ReadBuffer {
 public:
  ReadBuffer(size_t bytes, int threads);
  ~ReadBuffer();
  ReadBuffer(const ReadBuffer&) = delete;
  ReadBuffer& operator=(const ReadBuffer&) = delete;
  // What a pass reads: `threads` equal shares of whole 256-byte blocks, from the start.
  ReadSpan span() const { return {static_cast<const uint8_t*>(mem_), per_ * size_t(threads_)}; }
  int threads() const { return threads_; }

 private:
  void* mem_ = nullptr;
  size_t bytes_ = 0, per_ = 0;
  int threads_ = 1;
};

// The GEMM probe's product: C = A B^T for n x n bf16 A and B (row-major) into float32 C, on
// oneDNN's matmul (AMX where the CPU has it) on ctx's threads. The first call for an n creates
// the primitive.
void gemm_probe_bf16(const Context& ctx, int64_t n, const uint16_t* a, const uint16_t* b, float* c);

}  // namespace mla::cpu
