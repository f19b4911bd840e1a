// The one table of model shapes: the released configs of every supported family (as their
// config.json files, with the fields ModelConfig::from_json reads: sizes, routing, RoPE and its
// YaRN scaling, real vocabularies), and the CPU benchmark's checkpoint shape as its own entry.
// `mla analyze --preset`, `mla bench`'s checkpoint and the tests that mean a released shape
// take their configs from here.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"

namespace mla {

struct Preset {
  const char* name;    // "deepseek-v3", ... as `mla analyze --preset` takes it
  const char* source;  // where the config comes from
  bool released;       // a released model's config (false: a shape of our own, e.g. the benchmark's)
  nlohmann::json config;
};

// Every entry, released models first, in the order `mla analyze --help` lists them.
const std::vector<Preset>& presets();
// The entry of that name; throws std::invalid_argument naming the known ones.
const Preset& find_preset(const std::string& name);
// The entry's config as ModelConfig::from_json reads it.
ModelConfig preset_config(const std::string& name);

// The name of the benchmark's entry: DeepSeek-V2-Lite's layer shapes with DeepSeek-V3's
// vocabulary (129,280) and no YaRN (see presets.cpp for why it is not the release).
inline constexpr const char* kBenchPreset = "bench-v2-lite";
// The benchmark checkpoint's config.json with `layers` layers.
nlohmann::json bench_checkpoint_config(int64_t layers);

}  // namespace mla
