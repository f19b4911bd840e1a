// `mla analyze`: the MLA arithmetic of a config (KV-cache sizes, path FLOPs, decode
// intensity against a roofline), for a config.json or an entry of the preset table
// (model/presets.h: the released models and the benchmark's checkpoint).
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/command.h"
#include "format/json_file.h"
#include "tools/analyze.h"
#include "model/presets.h"

namespace {

int run(int argc, char** argv) {
  std::string names;
  for (const mla::Preset& p : mla::presets()) names += (names.empty() ? "" : ", ") + std::string(p.name);
  CLI::App app{"The MLA arithmetic of a model config: KV-cache bytes, FLOPs of the expand and absorb paths, "
               "decode arithmetic intensity",
               "mla analyze"};
  std::string config_path, preset, model;
  std::vector<std::string> case_strs;
  double peak_tflops = 0, bandwidth_tbs = 0;
  bool json_out = false;
  auto* cfg_opt = app.add_option("--config", config_path, "a config.json file");
  auto* preset_opt = app.add_option("--preset", preset, "a released config or the benchmark's (" + std::string(mla::kBenchPreset) + "): " + names);
  auto* model_opt = app.add_option("-m,--model", model, "a checkpoint folder or a GGUF file: its config");
  cfg_opt->excludes(preset_opt)->excludes(model_opt);
  preset_opt->excludes(cfg_opt)->excludes(model_opt);
  model_opt->excludes(cfg_opt)->excludes(preset_opt);
  app.add_option("--case", case_strs, "T,S: FLOPs of T new tokens after S-T cached (repeatable)")->allow_extra_args(false);
  auto* peak = app.add_option("--peak-tflops", peak_tflops, "peak compute, TFLOP/s (with --bandwidth-tbs)");
  auto* bw = app.add_option("--bandwidth-tbs", bandwidth_tbs, "memory bandwidth, TB/s (with --peak-tflops)");
  peak->needs(bw);
  bw->needs(peak);
  app.add_flag("--json", json_out, "write the figures as one JSON object");
  CLI11_PARSE(app, argc, argv);
  if (config_path.empty() && preset.empty() && model.empty())
    throw std::invalid_argument("give -m MODEL, --config FILE or --preset NAME (" + names + ")");

  mla::ModelConfig cfg;
  std::string name;
  if (!preset.empty()) {
    cfg = mla::preset_config(preset);
    name = preset;
  } else if (!model.empty()) {
    cfg = mla::ModelConfig::load(model);
    name = model;
  } else {
    cfg = mla::ModelConfig::from_json(mla::read_json_file(config_path, "not valid JSON"), config_path);
    name = config_path;
  }
  std::vector<mla::AnalyzeCase> cases;
  for (auto& s : case_strs) cases.push_back(mla::parse_analyze_case(s));
  std::optional<mla::Roofline> roof;
  if (*peak) {
    if (!(peak_tflops > 0) || !(bandwidth_tbs > 0))
      throw std::invalid_argument("--peak-tflops and --bandwidth-tbs must be positive");
    roof = mla::Roofline{peak_tflops, bandwidth_tbs};
  }
  if (json_out) std::cout << mla::analyze_json(cfg, cases, roof).dump(2) << "\n";
  else std::cout << mla::analyze_report(cfg, name, cases, roof);
  return 0;
}

mla::cli::Command reg("analyze", "MLA arithmetic of a config: KV-cache bytes, path FLOPs, decode intensity", run);

}  // namespace
