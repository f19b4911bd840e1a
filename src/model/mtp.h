// The multi-token prediction (MTP) module of DeepSeek-V3 (technical report §2.2), shipped by
// DeepSeek-V3/R1/V3.1 and GLM-4.7-Flash as the checkpoint's layer num_hidden_layers
// (num_nextn_predict_layers = 1). For the token t_i at position i with the main model's hidden
// state h_i, it predicts t_{i+2} from t_{i+1}:
//
//   h'_i   = eh_proj([enorm(Emb(t_{i+1})); hnorm(h_i)])     embedding half first
//   h''_i  = DecoderLayer(h'_i)  at position i               MLA (own latent cache) + MoE
//   logits = head(shared_head.norm(h''_i))                    head: shared_head.head or lm_head
//
// h_i is the main model's final-norm output (the input of lm_head), as vLLM's deepseek_mtp.py
// and SGLang's deepseek_nextn.py receive it from the target model and as the checkpoints'
// modeling_deepseek.py hands it over (the main model's forward ends in model.norm). A chained
// draft (k > 1) feeds the module its own shared_head.norm output as the next h. Unlike vLLM,
// position 0's embedding is not zeroed (SGLang does not either; it changes one cache row).
//
// Model::mtp_forward (model.h) runs it over a ragged batch; the engine's MTP draft source
// (engine/speculative.h) keeps each sequence's MTP cache beside its main one.
// reference/mtp_reference.py is the numpy reference of the same computation.
#pragma once
#include <cstdint>

#include "backend/cpu/context.h"
#include "model/weights.h"

namespace mla {

// x [T, 2 hidden] = [enorm(emb[t]); hnorm(hidden[t])] for each row: eh_proj's input.
void mtp_input(const cpu::Context& ctx, const MtpWeights& m, const float* emb, const float* hidden, int64_t T,
               int64_t D, float eps, float* x);

}  // namespace mla
