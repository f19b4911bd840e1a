// generation_config.json defaults, EOS ids, and stop strings over streamed text.
#include "engine/generation_config.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "format/error.h"
#include "format/json_file.h"

namespace mla {

namespace {

[[noreturn]] void bad_key(const std::string& source, const std::string& key, const std::string& want,
                          const nlohmann::json& got) {
  throw std::runtime_error(source + ": '" + key + "' must be " + want + ", got " + got.dump());
}

std::optional<float> get_float(const nlohmann::json& j, const std::string& key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) bad_key(source, key, "a number", *it);
  return it->get<float>();
}

std::optional<int64_t> get_int(const nlohmann::json& j, const std::string& key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) bad_key(source, key, "an integer", *it);
  return it->get<int64_t>();
}

}  // namespace

GenerationConfig GenerationConfig::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw std::runtime_error(source + ": expected a JSON object");
  GenerationConfig g;
  g.temperature = get_float(j, "temperature", source);
  g.top_p = get_float(j, "top_p", source);
  g.min_p = get_float(j, "min_p", source);
  g.repetition_penalty = get_float(j, "repetition_penalty", source);
  g.top_k = get_int(j, "top_k", source);
  g.max_new_tokens = get_int(j, "max_new_tokens", source);
  if (auto it = j.find("do_sample"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) bad_key(source, "do_sample", "true or false", *it);
    g.do_sample = it->get<bool>();
  }
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    auto add = [&](const nlohmann::json& v) {
      if (!v.is_number_integer()) bad_key(source, "eos_token_id", "an integer or a list of integers", *it);
      int64_t id = v.get<int64_t>();
      if (std::find(g.eos_token_ids.begin(), g.eos_token_ids.end(), id) == g.eos_token_ids.end())
        g.eos_token_ids.push_back(id);
    };
    if (it->is_array()) {
      for (const auto& v : *it) add(v);
    } else {
      add(*it);
    }
  }
  return g;
}

GenerationConfig GenerationConfig::load(const std::string& model_dir, const ModelConfig& model) {
  GenerationConfig g;
  const std::string path = model_dir + "/generation_config.json";
  if (std::filesystem::exists(path)) {
    g = from_json(read_json_file(path), path);
  }
  std::vector<int64_t> eos = model.eos_token_ids;
  for (int64_t id : g.eos_token_ids)
    if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  g.eos_token_ids = std::move(eos);
  return g;
}

GenerationConfig GenerationConfig::from_gguf(const std::map<std::string, GgufValue>& metadata,
                                             const ModelConfig& model, const std::string& source) {
  auto find = [&](const std::string& key) -> const GgufValue* {
    auto it = metadata.find(key);
    return it == metadata.end() ? nullptr : &it->second;
  };
  auto number = [&](const std::string& key) -> std::optional<double> {
    const GgufValue* v = find(key);
    if (!v) return std::nullopt;
    if (v->kind == GgufValue::Kind::Float) return v->f;
    if (v->kind == GgufValue::Kind::Int) return static_cast<double>(v->i);
    throw FormatError(source + ": " + key + ": is not a number");
  };
  GenerationConfig g;
  if (auto v = number("general.sampling.temp")) g.temperature = static_cast<float>(*v);
  if (auto v = number("general.sampling.top_p")) g.top_p = static_cast<float>(*v);
  if (auto v = number("general.sampling.min_p")) g.min_p = static_cast<float>(*v);
  if (auto v = number("general.sampling.penalty_repeat")) g.repetition_penalty = static_cast<float>(*v);
  if (const GgufValue* v = find("general.sampling.top_k")) {
    if (v->kind != GgufValue::Kind::Int) throw FormatError(source + ": general.sampling.top_k: is not an integer");
    g.top_k = v->i;
  }
  g.eos_token_ids = model.eos_token_ids;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const GgufValue* v = find(key);
    if (!v) continue;
    if (v->kind != GgufValue::Kind::Int || v->i < 0)
      throw FormatError(source + ": " + key + ": is not a token id");
    if (!g.is_eos(v->i)) g.eos_token_ids.push_back(v->i);
  }
  return g;
}

GenerationConfig GenerationConfig::load_for_model(const std::string& model_path,
                                                  const std::map<std::string, GgufValue>* gguf,
                                                  const std::string& tokenizer_dir, const ModelConfig& model) {
  if (!tokenizer_dir.empty() && std::filesystem::exists(tokenizer_dir + "/generation_config.json"))
    return load(tokenizer_dir, model);
  if (gguf) return from_gguf(*gguf, model, model_path);
  return load(model_path, model);
}

SamplingParams GenerationConfig::apply(SamplingParams p) const {
  if (temperature) p.temperature = *temperature;
  if (top_p) p.top_p = *top_p;
  if (min_p) p.min_p = *min_p;
  if (repetition_penalty) p.repetition_penalty = *repetition_penalty;
  if (top_k) p.top_k = std::max<int64_t>(*top_k, 0);
  if (do_sample && !*do_sample) p.temperature = 0.0f;
  return p;
}

bool GenerationConfig::is_eos(int64_t id) const {
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), id) != eos_token_ids.end();
}

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStrings::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  // The earliest complete stop string ends the output.
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    size_t at = held_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is the start of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStrings::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace mla
