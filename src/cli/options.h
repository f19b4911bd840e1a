// Option groups the `mla` subcommands share. Each adds its options to a CLI::App in the order
// of the command's --help; the help text is the command's where commands word it differently.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "cli/cpu_options.h"

namespace mla::cli {

inline constexpr const char* kCheckpointHelp = "checkpoint folder (config.json, *.safetensors, tokenizer.json)";
inline constexpr const char* kWeightsHelp = "checkpoint folder (config.json, *.safetensors)";

// -m,--model: the model folder, required.
inline CLI::Option* add_model_option(CLI::App& app, std::string& dir, const std::string& help = kCheckpointHelp) {
  return app.add_option("-m,--model", dir, help)->required();
}

// --threads and, where the command offers the choice (a help text is given), --precision;
// context() checks both and builds the cpu::Context the command hands to Model::load.
struct CpuOptions {
  int threads = 0;
  std::string precision = "precise";
  cpu::Context context() const { return cpu_context(threads, precision); }
};

inline void add_cpu_options(CLI::App& app, CpuOptions& o, const std::string& precision_help = "") {
  app.add_option("--threads", o.threads, "CPU threads (default: all)");
  if (!precision_help.empty()) app.add_option("--precision", o.precision, precision_help);
}

}  // namespace mla::cli
