// The CPU context of a command (backend/cpu/context.h) from its --threads and --precision
// options: run, chat, serve, logits, verify and demo build theirs here and hand it to
// Model::load (bench builds its own in tools/bench.cpp from the same options).
#pragma once
#include <stdexcept>
#include <string>

#include "backend/cpu/context.h"

namespace mla::cli {

// threads: --threads (0: all cores); precision: --precision ("fast" | "precise").
inline cpu::Context cpu_context(int threads, const std::string& precision = "precise") {
  if (threads < 0) throw std::invalid_argument("--threads must not be negative, got " + std::to_string(threads));
  cpu::Context ctx;
  ctx.threads = threads;
  try {
    ctx.precision = cpu::parse_precision(precision);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--precision: ") + e.what());
  }
  return ctx;
}

}  // namespace mla::cli
