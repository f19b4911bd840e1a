#include "format/safetensors.h"

#include "format/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/error.h"

namespace mla {

using nlohmann::json;

void format_error(const std::string& file, const std::string& tensor, const std::string& what) {
  std::string msg = file;
  if (!tensor.empty()) msg += (msg.empty() ? "" : ": ") + std::string("tensor '") + tensor + "'";
  msg += (msg.empty() ? "" : ": ") + what;
  throw FormatError(msg);
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) format_error(path, "", std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    format_error(path, "", "not a regular file");
  }
  map_size_ = size_t(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    format_error(path, "", "truncated: " + std::to_string(map_size_) + " bytes, less than the 8-byte header length");
  }
  map_ = mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    format_error(path, "", std::string("mmap failed: ") + std::strerror(errno));
  }
  try {
    const uint8_t* base = static_cast<const uint8_t*>(map_);
    uint64_t hlen;
    std::memcpy(&hlen, base, 8);
    if (hlen > map_size_ - 8)
      format_error(path, "", "header length " + std::to_string(hlen) + " runs past the end of the file (" +
                                 std::to_string(map_size_) + " bytes)");
    json hdr;
    try {
      hdr = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + hlen));
    } catch (const json::exception& e) {
      format_error(path, "", std::string("header is not valid JSON: ") + e.what());
    }
    if (!hdr.is_object()) format_error(path, "", "header is not a JSON object");
    const uint8_t* data = base + 8 + hlen;
    const size_t data_size = map_size_ - 8 - hlen;
    std::vector<std::pair<size_t, size_t>> spans;
    std::vector<std::string> span_names;
    for (auto& [name, v] : hdr.items()) {
      if (name == "__metadata__") {
        if (v.is_object())
          for (auto& [k, m] : v.items())
            if (m.is_string()) metadata_[k] = m.get<std::string>();
        continue;
      }
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        format_error(path, name, "entry lacks dtype, shape or data_offsets");
      TensorInfo t;
      t.name = name;
      t.file = path;
      if (!v["dtype"].is_string() || !parse_dtype(v["dtype"].get<std::string>(), &t.dtype))
        format_error(path, name, "unsupported dtype " + v["dtype"].dump());
      if (!v["shape"].is_array()) format_error(path, name, "shape is not an array");
      int64_t numel = 1;
      for (auto& d : v["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) format_error(path, name, "bad shape " + v["shape"].dump());
        int64_t di = d.get<int64_t>();
        if (di != 0 && numel > (int64_t(1) << 50) / di) format_error(path, name, "shape too large " + v["shape"].dump());
        numel *= di;
        t.shape.push_back(di);
      }
      auto& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        format_error(path, name, "data_offsets must be two non-negative integers, got " + off.dump());
      uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
      if (b > e) format_error(path, name, "data_offsets " + off.dump() + " begin after they end");
      if (e > data_size)
        format_error(path, name, "data_offsets " + off.dump() + " run past the end of the data (" +
                                     std::to_string(data_size) + " bytes; file truncated?)");
      size_t want = size_t(numel) * dtype_size(t.dtype);
      if (e - b != want)
        format_error(path, name, "holds " + std::to_string(e - b) + " bytes but " + dtype_name(t.dtype) + " " +
                                     t.shape_str() + " needs " + std::to_string(want));
      t.data = data + b;
      t.nbytes = e - b;
      spans.push_back({b, e});
      span_names.push_back(name);
      tensors_[name] = std::move(t);
    }
    std::vector<size_t> order(spans.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return spans[a] < spans[b]; });
    for (size_t i = 1; i < order.size(); ++i) {
      auto& p = spans[order[i - 1]];
      auto& c = spans[order[i]];
      if (c.first < p.second && c.second > c.first && p.second > p.first)
        format_error(path, span_names[order[i]], "data overlaps tensor '" + span_names[order[i - 1]] + "'");
    }
  } catch (...) {
    munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

namespace fs = std::filesystem;

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) format_error(dir, "", "not a directory");
  fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  json weight_map;
  if (fs::exists(index_path)) {
    std::ifstream f(index_path);
    json idx;
    try {
      idx = json::parse(f);
    } catch (const json::exception& e) {
      format_error(index_path.string(), "", std::string("not valid JSON: ") + e.what());
    }
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      format_error(index_path.string(), "", "has no weight_map object");
    weight_map = idx["weight_map"];
    for (auto& [name, shard] : weight_map.items()) {
      if (!shard.is_string()) format_error(index_path.string(), name, "shard name is not a string");
      auto s = shard.get<std::string>();
      if (s.find('/') != std::string::npos || s.find("..") != std::string::npos)
        format_error(index_path.string(), name, "shard name '" + s + "' is not a file in the folder");
      if (std::find(shard_names.begin(), shard_names.end(), s) == shard_names.end()) shard_names.push_back(s);
    }
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    for (auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shard_names.push_back(e.path().filename().string());
    std::sort(shard_names.begin(), shard_names.end());
  }
  if (shard_names.empty()) format_error(dir, "", "no safetensors files (model.safetensors or an index) in the folder");
  for (auto& s : shard_names) {
    auto path = (fs::path(dir) / s).string();
    if (!fs::exists(path)) format_error(path, "", "shard named by model.safetensors.index.json is missing");
    files_.push_back(std::make_unique<SafetensorsFile>(path));
    for (auto& [name, t] : files_.back()->tensors()) {
      if (!weight_map.is_null()) {
        auto it = weight_map.find(name);
        if (it == weight_map.end()) continue;  // not indexed: ignored, as the hub loaders do
        if (it->get<std::string>() != s) continue;
      }
      if (index_.count(name)) format_error(path, name, "tensor appears in two files (also " + index_[name]->file + ")");
      index_[name] = &t;
    }
  }
  if (!weight_map.is_null())
    for (auto& [name, shard] : weight_map.items())
      if (!index_.count(name))
        format_error((fs::path(dir) / shard.get<std::string>()).string(), name,
                     "listed in model.safetensors.index.json but not in that shard");
}

Checkpoint::Checkpoint(std::shared_ptr<const GgufFile> file, std::map<std::string, TensorInfo> tensors,
                       std::function<std::string(const std::string&)> source_name)
    : dir_(file->path()), gguf_(std::move(file)), gguf_tensors_(std::move(tensors)), source_name_(std::move(source_name)) {
  for (auto& [name, t] : gguf_tensors_) index_[name] = &t;
}

Checkpoint::~Checkpoint() = default;

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
  auto* t = find(name);
  if (!t) {
    const std::string source = source_name_ ? source_name_(name) : std::string();
    if (!source.empty()) format_error(dir_, source, "missing from the file (the model needs it as " + name + ")");
    format_error(dir_, name, "missing from the checkpoint");
  }
  return *t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (auto& [n, t] : index_) out.push_back(n);
  return out;
}

size_t Checkpoint::total_bytes() const {
  if (gguf_) return gguf_->total_bytes();
  size_t n = 0;
  for (auto& [name, t] : index_) n += t->nbytes;
  return n;
}

void Checkpoint::prefault(const std::function<void(size_t, size_t)>& progress) const {
  if (gguf_) return gguf_->prefault(progress);
  size_t total = 0, done = 0;
  for (auto& f : files_) total += f->mapping_size();
  const size_t step = size_t(64) << 20;
  volatile uint8_t sink = 0;
  for (auto& f : files_) {
    const uint8_t* p = f->mapping();
    madvise(const_cast<uint8_t*>(p), f->mapping_size(), MADV_WILLNEED);
    for (size_t off = 0; off < f->mapping_size(); off += 4096) {
      sink = sink + p[off];
      if ((done + off) % step == 0 && progress) progress(done + off, total);
    }
    done += f->mapping_size();
  }
  if (progress) progress(total, total);
}

void Checkpoint::release_pages() const {
  if (gguf_) return gguf_->release_pages();
  for (auto& f : files_) madvise(const_cast<uint8_t*>(f->mapping()), f->mapping_size(), MADV_DONTNEED);
}

void release_mapped_range(const void* p, size_t n) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t b = (uintptr_t(p) + page - 1) / page * page, e = (uintptr_t(p) + n) / page * page;
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

size_t TensorSpec::nbytes() const {
  size_t n = dtype_size(dtype);
  for (auto d : shape) n *= size_t(d);
  return n;
}

void write_safetensors(const std::string& path, const std::vector<const TensorSpec*>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json hdr = json::object();
  size_t off = 0;
  for (const TensorSpec* t : tensors) {
    hdr[t->name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + t->nbytes()}}};
    off += t->nbytes();
  }
  if (!metadata.empty()) hdr["__metadata__"] = metadata;
  std::string h = hdr.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream f(path, std::ios::binary);
  if (!f) format_error(path, "", "cannot open for writing");
  uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), std::streamsize(h.size()));
  std::vector<uint8_t> buf;
  for (const TensorSpec* t : tensors) {
    buf.resize(t->nbytes());
    t->fill(buf.data());
    f.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
  }
  if (!f) format_error(path, "", "write failed (disk full?)");
}

void write_safetensors(const std::string& path, const std::map<std::string, TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (auto& [name, t] : tensors) {
    const TensorData* data = &t;
    specs.push_back({name, t.dtype, t.shape, [data](uint8_t* out) {
                       std::memcpy(out, data->bytes.data(), data->bytes.size());
                     }});
    if (specs.back().nbytes() != t.bytes.size())
      format_error(path, name, "holds " + std::to_string(t.bytes.size()) + " bytes, its shape and dtype " +
                                   std::to_string(specs.back().nbytes()));
  }
  std::vector<const TensorSpec*> order;
  for (const TensorSpec& s : specs) order.push_back(&s);
  write_safetensors(path, order, metadata);
}

TensorData tensor_f32(std::vector<int64_t> shape, const float* data) {
  TensorData t{DType::F32, std::move(shape), {}};
  int64_t n = 1;
  for (auto d : t.shape) n *= d;
  t.bytes.resize(size_t(n) * 4);
  std::memcpy(t.bytes.data(), data, t.bytes.size());
  return t;
}

}  // namespace mla
