// The process-wide precision of the CPU matrix products.
//  precise (the default): float32 activations and accumulation everywhere; `mla logits` and the
//    fixture tests run this way (logits within 1e-3 of transformers').
//  fast: prompt-sized products (many tokens) run as bf16 x bf16 -> f32 GEMMs on AMX through
//    oneDNN, activations rounded to bf16 (about 3 significant digits). Decode-sized products
//    (few tokens) are bound by reading the weights and stay float32 in both modes.
#pragma once
#include <string>

namespace mla::cpu {

enum class Precision { Precise, Fast };

Precision precision();
void set_precision(Precision p);
Precision parse_precision(const std::string& s);  // "precise" | "fast"; throws std::invalid_argument
const char* precision_name(Precision p);

}  // namespace mla::cpu
