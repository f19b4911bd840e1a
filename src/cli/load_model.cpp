#include "cli/load_model.h"

#include <cstdlib>
#include <string_view>

#include "format/gguf.h"
#include "parallel/comm.h"

namespace mla::cli {

std::unique_ptr<Model> load_model(const std::string& dir, const cpu::Context& ctx, bool show_progress,
                                  const LoadQuantization& quantize, bool with_mtp) {
  LoadOptions opt{ctx, show_progress, quantize, with_mtp, &parallel::world()};
  auto model = Model::load(dir, opt);
  const char* debug = std::getenv("MLA_DEBUG");
  if (debug && std::string_view(debug) != "0") {
    static PassLog log;
    model->set_observer(&log);
  }
  return model;
}

namespace {

// The GGUF file `model` names, opened; null for a folder.
std::unique_ptr<GgufFile> open_gguf(const std::string& model) {
  const auto path = gguf_path(model);
  return path ? std::make_unique<GgufFile>(*path) : nullptr;
}

}  // namespace

Tokenizer load_tokenizer(const std::string& model, const std::string& tokenizer_dir) {
  const auto gguf = tokenizer_dir.empty() ? open_gguf(model) : nullptr;
  return Tokenizer::load_for_model(gguf ? gguf->path() : model, gguf ? &gguf->metadata() : nullptr, tokenizer_dir);
}

GenerationConfig load_generation(const std::string& model, const std::string& tokenizer_dir, const ModelConfig& config) {
  const auto gguf = open_gguf(model);
  return GenerationConfig::load_for_model(gguf ? gguf->path() : model, gguf ? &gguf->metadata() : nullptr, tokenizer_dir,
                                          config);
}

}  // namespace mla::cli
