// The MLA arithmetic of a model configuration, as `mla analyze` prints it: KV-cache sizes of
// the latent against the expanded (MHA-form) cache and the DeepSeek-V2 paper's MHA / GQA / MQA
// accounting, the FLOPs of the expand and absorb paths (mla::MlaCosts) for given batch
// shapes, and the arithmetic intensity of absorbed decode against a roofline. Presets are the
// entries of the one table of shapes (model/presets.h). Per layer, one device, no tensor
// parallelism.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace mla {

struct AnalyzeCase {
  int64_t new_tokens = 0;    // T
  int64_t total_tokens = 0;  // S: cached plus new
};
// Parses "T,S" (1 <= T <= S); throws std::invalid_argument naming the text.
AnalyzeCase parse_analyze_case(const std::string& s);

struct Roofline {
  double peak_tflops = 0;    // dense bf16 peak, 10^12 FLOP/s
  double bandwidth_tbs = 0;  // memory bandwidth, 10^12 byte/s
  double ridge() const { return peak_tflops / bandwidth_tbs; }  // FLOP per byte
};

// The object `mla analyze --json` writes: keys kv, flops, decode_intensity (see analyze.cpp).
nlohmann::json analyze_json(const ModelConfig& c, const std::vector<AnalyzeCase>& cases,
                            const std::optional<Roofline>& roofline);
// The same figures as a readable report; `name` heads it.
std::string analyze_report(const ModelConfig& c, const std::string& name, const std::vector<AnalyzeCase>& cases,
                           const std::optional<Roofline>& roofline);

}  // namespace mla
