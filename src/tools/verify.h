// The equivalence experiment behind `mla verify`: one token sequence is prefilled and then
// decoded K steps on both exact MLA paths (expand and absorb) in five modes: float32 compute
// with a float32 latent cache, float32 compute with the bf16 cache, the fast precision
// (activations rounded to bf16 inside the matrix products, backend/cpu/precision.h) with the
// bf16 cache, which is how `mla run` and `mla serve` compute by default, and float32 and fast
// compute with the fp8 cache (c_KV as e4m3 with one float32 scale per 128 values, k_pe bf16).
// It reports the cache bytes of the latent against the expanded form, how far apart the two
// paths' outputs are (final logits and every layer's attention output), each mode's absorb
// logits against the float32 mode's, and both paths' logits against the reference of the mode's
// cache: float32 compute with the plain naive attention in double (MlaForm::Reference) reading
// the same cache pages, so its c_KV is quantized exactly as the mode's.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace mla {

struct ErrorStats {
  int64_t count = 0;
  double max_abs = 0, mean_abs = 0, p99_abs = 0;
  double frac_equal = 0;  // fraction of values bit-for-bit equal as floats (a == b)
};
// |a - b| statistics over two equally long arrays; throws std::invalid_argument otherwise.
ErrorStats compare_outputs(std::span<const float> a, std::span<const float> b);

struct CacheBytes {
  int64_t active_tokens = 0, page_size = 0, pages_used = 0;
  int64_t bytes_per_token = 0, bytes_per_page = 0;       // latent, all layers (LatentPool)
  int64_t latent_active = 0, latent_allocated = 0;       // active tokens / the pages they hold
  int64_t expanded_active = 0, expanded_allocated = 0;   // the same tokens as expanded K/V
  int64_t expanded_elem_bytes = 0;                       // 4 (f32) or 2 (bf16)
};

struct VerifyMode {
  std::string name;  // "f32", "bf16 cache", "fast", "fp8 cache" or "fast fp8"
  KvDType kv_dtype = KvDType::F32;
  bool fast = false;  // the fast precision (else float32 compute)
  CacheBytes cache;
  ErrorStats logits;                // expand vs absorb, every row: the prompt's, then each decode step's
  std::vector<ErrorStats> attn;     // expand vs absorb, layer l's attention output (after o_proj)
  int64_t rows = 0, argmax_agree = 0;  // logits rows, and those whose argmax is the same on both paths
  ErrorStats absorb_vs_f32;         // bf16 modes: absorb logits against the f32 mode's
  int64_t argmax_agree_f32 = 0;     // bf16 modes: absorb rows whose argmax is the f32 mode's
  // Against the reference run on the same cache dtype (float32 compute, naive attention).
  ErrorStats expand_vs_reference, absorb_vs_reference;
  int64_t argmax_agree_reference = 0;  // absorb rows whose argmax is the reference's
};

struct VerifyOptions {
  std::vector<int32_t> ids;   // the prompt
  int64_t decode_steps = 8;   // K: greedy tokens of the f32 expand run, fed to every run
  int64_t page_size = 64;
};

struct VerifyReport {
  std::string model;
  int64_t num_layers = 0;
  std::vector<int32_t> prompt, decoded;
  int64_t page_size = 0;
  std::vector<VerifyMode> modes;  // f32, bf16 cache, fast, fp8 cache, fast fp8
};

VerifyReport verify_paths(Model& model, const VerifyOptions& opt, const std::string& model_name = "");
// One mode's comparison on a prompt alone (one prefill pass, no decode steps): expand against
// absorb, and each against the reference over the same cache (`mla demo` prints it). The
// absorb_vs_f32 fields are left empty.
VerifyMode compare_paths(Model& model, const std::vector<int32_t>& prompt, KvDType dtype, bool fast,
                         int64_t page_size = 64);
nlohmann::json verify_json(const VerifyReport& r);
std::string verify_text(const VerifyReport& r);

}  // namespace mla
