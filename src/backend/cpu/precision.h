// The precision of the CPU matrix products, one setting of cpu::Context (context.h):
//  precise (a Context's default): float32 activations and accumulation everywhere; `mla
//    logits` and the fixture tests run this way (logits within 1e-3 of transformers').
//  fast (`mla run`, `chat`, `serve` and `bench` by default): activations rounded to bf16 (about
//    3 significant digits) inside the products, float32 accumulation. Prompt-sized products run
//    as bf16 x bf16 -> f32 GEMMs on AMX or oneDNN; single-token products of bf16, FP8 and INT4
//    weights on the GEMV's VDPBF16PS kernels (gemv.h, Context::gemv_bf16_max_tokens), FP8
//    products of 2 to 16 tokens on AMX tiles where the CPU has them (amx.h). Without AMX, the
//    prompt-sized products of INT4 / INT8 weights take int8 activations instead (per chunk of
//    32 columns a scale; Context::int8_activations, vnni_gemm.h), and so do their decode
//    products where the weights are repacked at load (repack.h). dispatch.h says
//    which kernel runs a product. `mla verify` reports the difference against float32.
#pragma once
#include <string>

namespace mla::cpu {

enum class Precision { Precise, Fast };

Precision parse_precision(const std::string& s);  // "precise" | "fast"; throws std::invalid_argument
const char* precision_name(Precision p);

}  // namespace mla::cpu
