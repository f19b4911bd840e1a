// Tokenizer throughput: builds a mixed multi-MB corpus (English, Chinese, code, numbers, emoji)
// from the DeepSeek-V3 fixture texts, encodes it and prints encode MB/s and tokens/s, plus
// decode speed and load time. Rates are given per second of process CPU time (robust on a shared
// machine) and per second of wall time. No peer implementation is available on the machine to
// compare against, so only this engine's figures are printed.
//
// usage: tokenizer_bench [TOKENIZER_DIR] [CORPUS_MB]   (defaults: the fixture folder, 8)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall and CPU seconds of one call of fn.
template <class F>
std::pair<double, double> timed(F&& fn) {
  auto wall_start = std::chrono::steady_clock::now();
  double cpu_start = cpu_seconds();
  fn();
  double cpu = cpu_seconds() - cpu_start;
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return {wall, cpu};
}

std::string default_dir() {
#ifdef MLA_SHARED_DIR
  return std::string(MLA_SHARED_DIR) + "/fixtures/tokenizer/deepseek-v3";
#else
  return "../shared/fixtures/tokenizer/deepseek-v3";
#endif
}

// Texts of the fixture cases, grouped by category, plus a few built-in paragraphs.
std::vector<std::string> sample_texts(const std::string& dir) {
  std::vector<std::string> texts = {
      "The engine keeps one latent vector per token and layer; attention reads it directly. ",
      "多头潜在注意力把键和值压缩成一个低秩的潜在向量，从而大幅减少缓存。",
      "for (int i = 0; i < n; ++i) {\n    out[i] = scale * in[i] + bias[i];\n}\n",
      "Numbers: 3.14159, 2,718,281, 1e-9, 0x7fff, 2025-01-31, 65536 tokens/s. ",
  };
  std::ifstream in(dir + "/cases.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto c = nlohmann::json::parse(line);
    std::string text = c["text"];
    if (!text.empty()) texts.push_back(text);
  }
  return texts;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : default_dir();
  double corpus_mb = argc > 2 ? std::atof(argv[2]) : 8.0;
  try {
    std::optional<mla::Tokenizer> loaded;
    auto [load_wall, load_cpu] = timed([&] { loaded.emplace(mla::Tokenizer::load(dir)); });
    const mla::Tokenizer& tokenizer = *loaded;

    // Corpus: fixture texts in a fixed pseudo-random order, separated by spaces or newlines.
    std::vector<std::string> texts = sample_texts(dir);
    std::mt19937 rng(1234);
    std::string corpus;
    const size_t target = static_cast<size_t>(corpus_mb * 1024 * 1024);
    corpus.reserve(target + 4096);
    while (corpus.size() < target) {
      corpus += texts[rng() % texts.size()];
      corpus += (rng() % 4 == 0) ? "\n" : " ";
    }

    // Encode: the first pass also fills the word cache, so report cold and warm passes.
    std::vector<int32_t> ids;
    auto cold = timed([&] { ids = tokenizer.encode(corpus, false); });
    auto warm = timed([&] { ids = tokenizer.encode(corpus, false); });
    std::string decoded;
    auto decode = timed([&] { decoded = tokenizer.decode(ids); });
    if (decoded != corpus) {
      std::fprintf(stderr, "error: decode(encode(corpus)) differs from the corpus\n");
      return 1;
    }

    const double mb = static_cast<double>(corpus.size()) / (1024.0 * 1024.0);
    const double tokens = static_cast<double>(ids.size());
    std::printf("tokenizer: %s (vocab %zu), loaded in %.3f s (%.3f s CPU)\n", dir.c_str(), tokenizer.vocab_size(),
                load_wall, load_cpu);
    std::printf("corpus: %.2f MB (%zu bytes) from %zu texts, %zu tokens (%.2f bytes/token)\n", mb, corpus.size(),
                texts.size(), ids.size(), static_cast<double>(corpus.size()) / tokens);
    std::printf("%-20s %10s %14s %12s %14s\n", "", "MB/s CPU", "tokens/s CPU", "MB/s wall", "tokens/s wall");
    auto row = [&](const char* name, std::pair<double, double> t) {
      std::printf("%-20s %10.2f %14.0f %12.2f %14.0f\n", name, mb / t.second, tokens / t.second, mb / t.first,
                  tokens / t.first);
    };
    row("encode (cold cache)", cold);
    row("encode (warm cache)", warm);
    row("decode", decode);
    std::printf("peer: none available on this machine (no HuggingFace tokenizers); figures are this engine's only\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
