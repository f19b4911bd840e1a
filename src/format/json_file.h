// A JSON file read whole, its errors naming the file.
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace mla {

// The JSON in `path`; std::runtime_error "PATH: cannot open" or "PATH: <invalid>: <parser's message>".
inline nlohmann::json read_json_file(const std::string& path, const std::string& invalid = "bad JSON") {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": " + invalid + ": " + e.what());
  }
}

}  // namespace mla
