// C interface to the CUDA MLA decode kernel, for bench/gpu/torch_mla_decode.py (ctypes): the
// PyTorch peer and this kernel then run on the very same device tensors in one process.
#include <cstdint>
#include <exception>
#include <string>

#include "backend/cuda/mla_decode.h"

namespace {
thread_local std::string g_error;
}

extern "C" {

// Last error message of a call that returned null or non-zero.
const char* mla_decode_error() { return g_error.c_str(); }

// A plan for the host lengths on the current device; null on error.
void* mla_decode_plan(const int32_t* lengths, int batch, int s_q, int h_q) {
  try {
    return new mla::cuda::DecodePlan(
        mla::cuda::plan_decode(lengths, batch, s_q, h_q, mla::cuda::device_sm_count()));
  } catch (const std::exception& e) {
    g_error = e.what();
    return nullptr;
  }
}

void mla_decode_free(void* plan) { delete static_cast<mla::cuda::DecodePlan*>(plan); }

// Launches the decode on `stream` (0: the default stream); 0 on success.
int mla_decode_run(void* plan, const void* q, const void* cache, int fp8, int page_size, const int32_t* block_table,
                   int64_t block_table_stride, float softmax_scale, void* out, float* lse, void* stream) {
  try {
    if (!plan) throw std::invalid_argument("null plan");
    mla::cuda::DecodeArgs a;
    a.q = q;
    a.cache = cache;
    a.cache_dtype = fp8 ? mla::cuda::CacheDType::FP8 : mla::cuda::CacheDType::BF16;
    a.page_size = page_size;
    a.block_table = block_table;
    a.block_table_stride = block_table_stride;
    a.softmax_scale = softmax_scale;
    a.out = out;
    a.lse = lse;
    mla::cuda::run_decode(*static_cast<mla::cuda::DecodePlan*>(plan), a, static_cast<cudaStream_t>(stream));
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
    return 1;
  }
}

}  // extern "C"
