// The model a command runs: loaded with the process's MPI world (one rank outside mpirun, its
// block of the routed experts under it) and, while MLA_DEBUG is set to anything but 0, the pass
// log (model/forward_observer.h) on standard error.
#pragma once
#include <memory>
#include <string>

#include "engine/generation_config.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace mla::cli {

std::unique_ptr<Model> load_model(const std::string& dir, const cpu::Context& ctx, bool show_progress = false,
                                  const LoadQuantization& quantize = {}, bool with_mtp = false);

// The text side of the model at `model` (a checkpoint folder or a GGUF file): its tokenizer and
// chat template, and its generation defaults; those of `tokenizer_dir` instead when given
// (--tokenizer DIR: for a GGUF file whose metadata is wrong).
Tokenizer load_tokenizer(const std::string& model, const std::string& tokenizer_dir);
GenerationConfig load_generation(const std::string& model, const std::string& tokenizer_dir, const ModelConfig& config);

}  // namespace mla::cli
