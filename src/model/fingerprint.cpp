// The prompt cache's fingerprint of a checkpoint and its computation (see fingerprint.h).
#include "model/fingerprint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "format/error.h"
#include "format/gguf.h"

namespace mla {

namespace {

constexpr int kSamples = 8;
constexpr int64_t kSampleBytes = 64 * 1024;

std::vector<char> read_range(std::ifstream& f, const std::string& path, int64_t at, int64_t n) {
  std::vector<char> buf(size_t(std::max<int64_t>(n, 0)));
  f.seekg(at);
  if (!f.read(buf.data(), std::streamsize(buf.size()))) throw FormatError("cannot read " + path);
  return buf;
}

// A GGUF model: each part's name and size, its first bytes (the header, the metadata and the
// tensor records, whole for any but a huge vocabulary) and samples of the rest.
Hash128 gguf_fingerprint(const std::string& path) {
  namespace fs = std::filesystem;
  const GgufFile file(path);
  Digest d;
  d.add("mla gguf v1");
  for (const std::string& part : file.parts()) {
    std::ifstream f(part, std::ios::binary);
    std::error_code ec;
    const int64_t size = int64_t(fs::file_size(part, ec));
    if (!f || ec) throw FormatError("cannot read " + part);
    d.add(fs::path(part).filename().string()).add_value(size);
    const int64_t head = std::min<int64_t>(size, int64_t(16) << 20);
    const std::vector<char> header = read_range(f, part, 0, head);
    d.add(header.data(), header.size());
    const int64_t rest = size - head;
    for (int i = 0; i < kSamples && rest > 0; ++i) {
      const int64_t n = std::min(kSampleBytes, rest);
      const std::vector<char> sample = read_range(f, part, head + (rest - n) * i / std::max(kSamples - 1, 1), n);
      d.add(sample.data(), sample.size());
    }
  }
  return d.finish();
}

}  // namespace

Hash128 checkpoint_fingerprint(const std::string& dir) {
  namespace fs = std::filesystem;
  if (const auto gguf = gguf_path(dir)) return gguf_fingerprint(*gguf);
  Digest d;
  d.add("mla checkpoint v1");
  std::vector<fs::path> shards;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  if (ec) throw FormatError("cannot list " + dir + ": " + ec.message());
  std::sort(shards.begin(), shards.end());
  {
    const std::string path = (fs::path(dir) / "config.json").string();
    std::ifstream f(path, std::ios::binary);
    if (!f) throw FormatError("cannot read " + path);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    d.add(text);
  }
  for (const fs::path& shard : shards) {
    const std::string path = shard.string();
    std::ifstream f(path, std::ios::binary);
    if (!f) throw FormatError("cannot read " + path);
    const int64_t size = int64_t(fs::file_size(shard, ec));
    if (ec || size < 8) throw FormatError("cannot read " + path);
    d.add(shard.filename().string()).add_value(size);
    uint64_t header_len = 0;
    const std::vector<char> len = read_range(f, path, 0, 8);
    std::memcpy(&header_len, len.data(), 8);
    const int64_t data_at = 8 + int64_t(std::min<uint64_t>(header_len, uint64_t(size - 8)));
    const std::vector<char> header = read_range(f, path, 8, data_at - 8);
    d.add(header.data(), header.size());
    const int64_t data = size - data_at;
    for (int i = 0; i < kSamples && data > 0; ++i) {
      const int64_t n = std::min(kSampleBytes, data);
      const int64_t at = data_at + (data - n) * i / std::max(kSamples - 1, 1);
      const std::vector<char> sample = read_range(f, path, at, n);
      d.add(sample.data(), sample.size());
    }
  }
  return d.finish();
}

Hash128 compute_fingerprint(const Hash128& checkpoint, const cpu::Context& ctx, const LoadQuantization& q) {
  const cpu::CpuFeatures f = cpu::features(ctx);
  Digest d;
  d.add("mla computation v1").add_value(checkpoint.hi).add_value(checkpoint.lo);
  d.add(cpu::precision_name(ctx.precision)).add_value(f.amx).add_value(f.fma_gemm);
  d.add_value(ctx.int8_activations).add_value(ctx.fp8_indexer).add_value(ctx.gemv_bf16_max_tokens);
  d.add_value(ctx.repack_weights);  // as Model::weights_repacked says it took effect
  d.add(q.str()).add_value(int(q.rule)).add_value(q.group_size);
  return d.finish();
}

}  // namespace mla
