// config.json from the fuzzer's bytes: any JSON text gives a ModelConfig whose values passed
// validation, or a FormatError naming the key; never another exception, never UB.
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "format/error.h"
#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!mla::fuzz::shallow_json(std::string_view(reinterpret_cast<const char*>(data), size))) return 0;
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    mla::ModelConfig c = mla::ModelConfig::from_json(j, "config.json");
    // What validation promises: finite, positive constants and sizes whose products fit.
    if (!(c.rms_norm_eps > 0) || !std::isfinite(c.routed_scaling_factor) || !(c.rope_theta > 0)) __builtin_trap();
    if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.kv_lora_rank <= 0) __builtin_trap();
    volatile double s = c.softmax_scale();
    if (!std::isfinite(s)) __builtin_trap();
    volatile int64_t q = c.qk_head_dim() * c.num_attention_heads * c.hidden_size;
    (void)q;
  } catch (const mla::FormatError&) {
  }
  return 0;
}
