#include "format/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "format/error.h"

namespace mla {

static_assert(std::endian::native == std::endian::little, "the GGUF reader reads little-endian values in place");

namespace fs = std::filesystem;

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type) {
  // ggml's type_traits (ggml.c) and gguf-py's GGML_QUANT_SIZES: block values, block bytes.
  // Numbers 4, 5 (the old q4_2, q4_3) and 31..33, 36..38 (removed repacked layouts) hold nothing.
  switch (GgmlType(type)) {
    case GgmlType::F32: return GgmlTypeInfo{"f32", 1, 4};
    case GgmlType::F16: return GgmlTypeInfo{"f16", 1, 2};
    case GgmlType::Q4_0: return GgmlTypeInfo{"q4_0", 32, 18};
    case GgmlType::Q4_1: return GgmlTypeInfo{"q4_1", 32, 20};
    case GgmlType::Q5_0: return GgmlTypeInfo{"q5_0", 32, 22};
    case GgmlType::Q5_1: return GgmlTypeInfo{"q5_1", 32, 24};
    case GgmlType::Q8_0: return GgmlTypeInfo{"q8_0", 32, 34};
    case GgmlType::Q8_1: return GgmlTypeInfo{"q8_1", 32, 36};
    case GgmlType::Q2_K: return GgmlTypeInfo{"q2_K", 256, 84};
    case GgmlType::Q3_K: return GgmlTypeInfo{"q3_K", 256, 110};
    case GgmlType::Q4_K: return GgmlTypeInfo{"q4_K", 256, 144};
    case GgmlType::Q5_K: return GgmlTypeInfo{"q5_K", 256, 176};
    case GgmlType::Q6_K: return GgmlTypeInfo{"q6_K", 256, 210};
    case GgmlType::Q8_K: return GgmlTypeInfo{"q8_K", 256, 292};
    case GgmlType::IQ2_XXS: return GgmlTypeInfo{"iq2_xxs", 256, 66};
    case GgmlType::IQ2_XS: return GgmlTypeInfo{"iq2_xs", 256, 74};
    case GgmlType::IQ3_XXS: return GgmlTypeInfo{"iq3_xxs", 256, 98};
    case GgmlType::IQ1_S: return GgmlTypeInfo{"iq1_s", 256, 50};
    case GgmlType::IQ4_NL: return GgmlTypeInfo{"iq4_nl", 32, 18};
    case GgmlType::IQ3_S: return GgmlTypeInfo{"iq3_s", 256, 110};
    case GgmlType::IQ2_S: return GgmlTypeInfo{"iq2_s", 256, 82};
    case GgmlType::IQ4_XS: return GgmlTypeInfo{"iq4_xs", 256, 136};
    case GgmlType::I8: return GgmlTypeInfo{"i8", 1, 1};
    case GgmlType::I16: return GgmlTypeInfo{"i16", 1, 2};
    case GgmlType::I32: return GgmlTypeInfo{"i32", 1, 4};
    case GgmlType::I64: return GgmlTypeInfo{"i64", 1, 8};
    case GgmlType::F64: return GgmlTypeInfo{"f64", 1, 8};
    case GgmlType::IQ1_M: return GgmlTypeInfo{"iq1_m", 256, 56};
    case GgmlType::BF16: return GgmlTypeInfo{"bf16", 1, 2};
    case GgmlType::TQ1_0: return GgmlTypeInfo{"tq1_0", 256, 54};
    case GgmlType::TQ2_0: return GgmlTypeInfo{"tq2_0", 256, 66};
    case GgmlType::MXFP4: return GgmlTypeInfo{"mxfp4", 32, 17};
  }
  return std::nullopt;
}

size_t GgufValue::size() const {
  if (kind != Kind::Array) return 1;
  switch (elem) {
    case Kind::Float: return floats.size();
    case Kind::String: return strings.size();
    default: return ints.size();
  }
}

std::string GgufTensor::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

namespace {

// An array may hold at most this many elements: far above any real vocabulary (a few hundred
// thousand tokens) and merge list, and it caps what a file's metadata can make us allocate.
constexpr uint64_t kMaxArrayElements = uint64_t(1) << 24;

const char* value_type_name(uint32_t t) {
  static const char* const names[] = {"u8",   "i8",  "u16", "i16", "u32", "i32", "f32",
                                      "bool", "str", "arr", "u64", "i64", "f64"};
  return t < 13 ? names[t] : "unknown";
}

// Bytes of a scalar of value type t; 0 for a string, an array or an unknown number.
size_t value_type_size(uint32_t t) {
  static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return t < 13 ? sizes[t] : 0;
}

std::string key_ctx(const std::string& key) { return "key '" + key + "': "; }

// A bounds-checked cursor over one mapped file: every read names the file and, through `ctx`
// ("key 'K': ", "tensor record 3: "), what it was reading when the file ended.
struct Cursor {
  const std::string& file;
  const uint8_t* base;
  size_t size;
  size_t pos = 0;

  size_t left() const { return size - pos; }

  const uint8_t* take(size_t n, const std::string& ctx, const char* what) {
    if (n > left())
      format_error(file, "",
                   ctx + "truncated: " + what + " at byte " + std::to_string(pos) + " needs " + std::to_string(n) +
                       " bytes, the file has " + std::to_string(left()) + " left (" + std::to_string(size) +
                       " bytes in all)");
    const uint8_t* p = base + pos;
    pos += n;
    return p;
  }
  template <class T>
  T read(const std::string& ctx, const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), ctx, what), sizeof(T));
    return v;
  }
  std::string string(const std::string& ctx, const char* what) {
    const uint64_t n = read<uint64_t>(ctx, what);
    if (n > left())
      format_error(file, "",
                   ctx + what + " of " + std::to_string(n) + " bytes at byte " + std::to_string(pos) +
                       " runs past the end of the file (" + std::to_string(left()) + " bytes left; truncated?)");
    const uint8_t* p = take(size_t(n), ctx, what);
    return std::string(reinterpret_cast<const char*>(p), size_t(n));
  }
};

// One scalar of value type t (not a string, not an array) into the integer, float or bool.
void read_scalar(Cursor& c, uint32_t t, const std::string& ctx, int64_t* i, double* f, bool* b) {
  switch (GgufType(t)) {
    case GgufType::U8: *i = c.read<uint8_t>(ctx, "a u8"); return;
    case GgufType::I8: *i = c.read<int8_t>(ctx, "an i8"); return;
    case GgufType::U16: *i = c.read<uint16_t>(ctx, "a u16"); return;
    case GgufType::I16: *i = c.read<int16_t>(ctx, "an i16"); return;
    case GgufType::U32: *i = c.read<uint32_t>(ctx, "a u32"); return;
    case GgufType::I32: *i = c.read<int32_t>(ctx, "an i32"); return;
    case GgufType::I64: *i = c.read<int64_t>(ctx, "an i64"); return;
    case GgufType::U64: {
      const uint64_t v = c.read<uint64_t>(ctx, "a u64");
      if (v > uint64_t(INT64_MAX))
        format_error(c.file, "", ctx + "u64 value " + std::to_string(v) + " is above 2^63 - 1, more than this reader holds");
      *i = int64_t(v);
      return;
    }
    case GgufType::F32: *f = c.read<float>(ctx, "an f32"); return;
    case GgufType::F64: *f = c.read<double>(ctx, "an f64"); return;
    case GgufType::Bool: {
      const uint8_t v = c.read<uint8_t>(ctx, "a bool");
      if (v > 1) format_error(c.file, "", ctx + "bool value " + std::to_string(v) + " is neither 0 nor 1");
      *b = v == 1;
      return;
    }
    default: format_error(c.file, "", ctx + "unknown value type " + std::to_string(t));
  }
}

GgufValue::Kind kind_of(uint32_t t) {
  switch (GgufType(t)) {
    case GgufType::F32:
    case GgufType::F64: return GgufValue::Kind::Float;
    case GgufType::Bool: return GgufValue::Kind::Bool;
    case GgufType::String: return GgufValue::Kind::String;
    case GgufType::Array: return GgufValue::Kind::Array;
    default: return GgufValue::Kind::Int;
  }
}

GgufValue read_value(Cursor& c, const std::string& key) {
  const std::string ctx = key_ctx(key);
  const uint32_t t = c.read<uint32_t>(ctx, "the value type");
  if (t > 12) format_error(c.file, "", ctx + "unknown value type " + std::to_string(t));
  GgufValue v;
  v.kind = kind_of(t);
  if (v.kind == GgufValue::Kind::String) {
    v.type = GgufType::String;
    v.s = c.string(ctx, "a string");
    return v;
  }
  if (v.kind != GgufValue::Kind::Array) {
    v.type = GgufType(t);
    read_scalar(c, t, ctx, &v.i, &v.f, &v.b);
    return v;
  }
  const uint32_t et = c.read<uint32_t>(ctx, "the array's element type");
  if (et == uint32_t(GgufType::Array)) format_error(c.file, "", ctx + "arrays of arrays are not supported");
  if (et > 12) format_error(c.file, "", ctx + "array of unknown value type " + std::to_string(et));
  v.type = GgufType(et);
  v.elem = kind_of(et);
  const uint64_t n = c.read<uint64_t>(ctx, "the array's length");
  // Bound the count by the bytes left before allocating: each element takes at least its
  // scalar size (a string its 8-byte length).
  const size_t min_size = et == uint32_t(GgufType::String) ? 8 : value_type_size(et);
  if (n > c.left() / min_size)
    format_error(c.file, "",
                 ctx + "array of " + std::to_string(n) + " " + value_type_name(et) + " elements runs past the end of the file (" +
                     std::to_string(c.left()) + " bytes left)");
  if (n > kMaxArrayElements)
    format_error(c.file, "",
                 ctx + "array of " + std::to_string(n) + " elements is longer than the " +
                     std::to_string(kMaxArrayElements) + " this reader accepts");
  switch (v.elem) {
    case GgufValue::Kind::String:
      v.strings.reserve(size_t(n));
      for (uint64_t k = 0; k < n; ++k) v.strings.push_back(c.string(ctx, "an array string"));
      break;
    case GgufValue::Kind::Float:
      v.floats.reserve(size_t(n));
      for (uint64_t k = 0; k < n; ++k) {
        double f = 0;
        read_scalar(c, et, ctx, nullptr, &f, nullptr);
        v.floats.push_back(f);
      }
      break;
    default:
      v.ints.reserve(size_t(n));
      for (uint64_t k = 0; k < n; ++k) {
        int64_t i = 0;
        bool b = false;
        read_scalar(c, et, ctx, &i, nullptr, &b);
        v.ints.push_back(v.elem == GgufValue::Kind::Bool ? int64_t(b) : i);
      }
  }
  return v;
}

// What one part holds once parsed: its metadata and tensors (data pointers into the mapping).
struct Parsed {
  uint32_t version = 0;
  uint32_t alignment = 32;
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensor> tensors;
};

void parse(const std::string& file, const uint8_t* base, size_t size, Parsed& out) {
  Cursor c{file, base, size};
  const uint8_t* magic = c.take(4, "", "the magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    std::string shown;
    for (int k = 0; k < 4; ++k) {
      char buf[8];
      if (std::isprint(magic[k])) std::snprintf(buf, sizeof buf, "%c", magic[k]);
      else std::snprintf(buf, sizeof buf, "\\x%02x", magic[k]);
      shown += buf;
    }
    format_error(file, "", "not a GGUF file: magic '" + shown + "', expected 'GGUF'");
  }
  out.version = c.read<uint32_t>("", "the version");
  if (out.version == 1)
    format_error(file, "", "GGUF version 1 (32-bit counts) is not supported: convert the model again with a current llama.cpp");
  if (out.version != 2 && out.version != 3) {
    const std::string hint = (out.version & 0xFFFF) == 0 ? "; a big-endian file?" : "";
    format_error(file, "", "GGUF version " + std::to_string(out.version) + " is not supported (2 and 3 are" + hint + ")");
  }
  const uint64_t n_tensors = c.read<uint64_t>("", "the tensor count");
  const uint64_t n_kv = c.read<uint64_t>("", "the metadata count");

  // Each metadata entry takes at least 14 bytes (a one-byte key, its type, a u8), each tensor
  // record at least 33 (a one-byte name, 1 dim): counts beyond that cannot be in the file, and
  // nothing is allocated for them.
  if (n_kv > c.left() / 14)
    format_error(file, "",
                 "metadata count " + std::to_string(n_kv) + " cannot fit in the file (" + std::to_string(c.left()) +
                     " bytes left, 14 or more per entry; truncated?)");

  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string at = "metadata entry " + std::to_string(k) + ": ";
    std::string key = c.string(at, "the key");
    if (key.empty()) format_error(file, "", at + "the key is empty");
    GgufValue v = read_value(c, key);
    if (!out.metadata.emplace(key, std::move(v)).second) format_error(file, "", key_ctx(key) + "appears twice");
  }

  if (auto it = out.metadata.find("general.alignment"); it != out.metadata.end()) {
    const GgufValue& a = it->second;
    if (a.kind != GgufValue::Kind::Int || a.type != GgufType::U32)
      format_error(file, "",
                   key_ctx(it->first) + "must be a u32, is " +
                       (a.kind == GgufValue::Kind::Array ? std::string("an array") : value_type_name(uint32_t(a.type))));
    if (a.i == 0 || (a.i & (a.i - 1)) != 0)
      format_error(file, "", key_ctx(it->first) + "alignment " + std::to_string(a.i) + " is not a power of two");
    out.alignment = uint32_t(a.i);
  }

  if (n_tensors > c.left() / 33)
    format_error(file, "",
                 "tensor count " + std::to_string(n_tensors) + " cannot fit in the file (" + std::to_string(c.left()) +
                     " bytes left after the metadata, 33 or more per tensor record; truncated?)");
  out.tensors.reserve(size_t(n_tensors));
  std::vector<uint64_t> offsets;  // from the data section's start, checked once it is known
  offsets.reserve(size_t(n_tensors));
  std::map<std::string, size_t> seen;
  for (uint64_t k = 0; k < n_tensors; ++k) {
    const std::string at = "tensor record " + std::to_string(k) + ": ";
    GgufTensor t;
    t.file = file;
    t.name = c.string(at, "the name");
    if (t.name.empty()) format_error(file, "", at + "the name is empty");
    if (!seen.emplace(t.name, k).second)
      format_error(file, t.name, "appears twice (tensor records " + std::to_string(seen[t.name]) + " and " + std::to_string(k) + ")");
    const uint32_t dims = c.read<uint32_t>(at, "the dimension count");
    if (dims < 1 || dims > 4)
      format_error(file, t.name, "has " + std::to_string(dims) + " dimensions; ggml tensors have 1 to 4");
    int64_t elements = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const int64_t ne = c.read<int64_t>(at, "a dimension");
      if (ne < 0) format_error(file, t.name, "ne[" + std::to_string(d) + "] is " + std::to_string(ne) + ", negative");
      t.ne.push_back(ne);
    }
    // A zero dimension makes an empty tensor, as ggml allows; else the product must fit.
    for (int64_t ne : t.ne)
      if (__builtin_mul_overflow(elements, ne, &elements))
        format_error(file, t.name, "shape " + t.shape_str() + " holds 2^63 elements or more");
    t.type = c.read<uint32_t>(at, "the ggml type");
    const auto info = ggml_type_info(t.type);
    if (!info) format_error(file, t.name, "unknown ggml type " + std::to_string(t.type) + " (shape " + t.shape_str() + ")");
    if (t.ne[0] % info->values != 0)
      format_error(file, t.name,
                   "ne[0] = " + std::to_string(t.ne[0]) + " is not a multiple of " + info->name + "'s block of " +
                       std::to_string(info->values) + " values");
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(uint64_t(elements / info->values), uint64_t(info->bytes), &nbytes) || nbytes > SIZE_MAX)
      format_error(file, t.name, std::string(info->name) + " " + t.shape_str() + " is more bytes than 2^64");
    t.nbytes = size_t(nbytes);
    offsets.push_back(c.read<uint64_t>(at, "the data offset"));
    out.tensors.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment after the records.
  const size_t data_start = (c.pos + out.alignment - 1) / out.alignment * out.alignment;
  if (!out.tensors.empty() && data_start > size)
    format_error(file, "",
                 "truncated: the tensor data would start at byte " + std::to_string(data_start) + ", past the end of the file (" +
                     std::to_string(size) + " bytes)");
  std::vector<std::pair<uint64_t, size_t>> spans;  // (offset, tensor index), non-empty tensors
  for (size_t k = 0; k < out.tensors.size(); ++k) {
    GgufTensor& t = out.tensors[k];
    const uint64_t offset = offsets[k];
    if (offset % out.alignment != 0)
      format_error(file, t.name,
                   "data offset " + std::to_string(offset) + " is not a multiple of the alignment " + std::to_string(out.alignment));
    uint64_t end = 0;
    if (offset > size - data_start || __builtin_add_overflow(offset, uint64_t(t.nbytes), &end) || end > size - data_start)
      format_error(file, t.name,
                   "its " + std::to_string(t.nbytes) + " bytes at data offset " + std::to_string(offset) +
                       " (the data section starts at byte " + std::to_string(data_start) + ") run past the end of the file (" +
                       std::to_string(size) + " bytes; truncated?)");
    t.data = base + data_start + offset;
    if (t.nbytes) spans.push_back({offset, k});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    const GgufTensor& prev = out.tensors[spans[k - 1].second];
    if (spans[k - 1].first + prev.nbytes > spans[k].first)
      format_error(file, out.tensors[spans[k].second].name, "data overlaps tensor '" + prev.name + "'");
  }
}

// A split set's part name: PREFIX-NNNNN-of-MMMMM.gguf, as llama.cpp's gguf-split writes it
// ("%s-%05d-of-%05d.gguf", part numbers from 1; split.count is a u16, so five digits).
struct SplitName {
  std::string prefix;  // with the folder
  int no = 0;          // 1-based
  int count = 0;
};

std::string split_part_path(const std::string& prefix, int no, int count) {
  char tail[48];
  std::snprintf(tail, sizeof tail, "-%05d-of-%05d.gguf", no, count);
  return prefix + tail;
}

std::optional<SplitName> parse_split_name(const std::string& path) {
  const std::string ext = ".gguf";
  if (path.size() < ext.size() || path.compare(path.size() - ext.size(), ext.size(), ext) != 0) return std::nullopt;
  const std::string stem = path.substr(0, path.size() - ext.size());
  const size_t of = stem.rfind("-of-");
  if (of == std::string::npos) return std::nullopt;
  if (of < 6) return std::nullopt;
  const size_t dash = of - 6;  // "-NNNNN" before "-of-"
  if (stem[dash] != '-') return std::nullopt;
  const std::string no = stem.substr(dash + 1, 5), count = stem.substr(of + 4);
  auto number = [](const std::string& s) -> int {
    if (s.size() != 5 || !std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) return -1;
    return std::stoi(s);
  };
  SplitName n{stem.substr(0, dash), number(no), number(count)};
  if (n.no < 1 || n.count < 1 || n.count > 65535 || n.no > n.count) return std::nullopt;
  if (split_part_path(n.prefix, n.no, n.count) != path) return std::nullopt;
  return n;
}

bool is_projector(const std::string& filename) {
  std::string lower = filename;
  for (char& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return lower.rfind("mmproj", 0) == 0;
}

// The model file of a folder: its one .gguf, or the first part of its one split set
// (mmproj-*.gguf projectors beside it skipped). Throws FormatError naming what is there.
std::string model_in_folder(const std::string& dir) {
  std::map<std::string, std::pair<std::string, int>> models;  // display name -> (first part, parts)
  size_t projectors = 0;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".gguf" || !e.is_regular_file(ec)) continue;
    if (is_projector(name)) {
      ++projectors;
      continue;
    }
    if (auto s = parse_split_name(e.path().string())) {
      char tail[32];
      std::snprintf(tail, sizeof tail, "-*-of-%05d.gguf", s->count);
      const std::string shown = fs::path(s->prefix).filename().string() + tail;
      models[shown] = {split_part_path(s->prefix, 1, s->count), s->count};
    } else {
      models[name] = {e.path().string(), 1};
    }
  }
  if (ec) format_error(dir, "", "cannot list the folder: " + ec.message());
  if (models.empty())
    format_error(dir, "",
                 projectors ? "holds only multimodal projector files (mmproj-*.gguf), no GGUF model"
                            : "holds no .gguf file");
  if (models.size() > 1) {
    std::string list;
    for (auto& [shown, m] : models)
      list += (list.empty() ? "" : ", ") + shown + (m.second > 1 ? " (" + std::to_string(m.second) + " parts)" : "");
    format_error(dir, "", "holds " + std::to_string(models.size()) + " GGUF models, name the file to open: " + list);
  }
  return models.begin()->second.first;
}

}  // namespace

struct GgufFile::Part {
  std::string path;
  void* map = nullptr;
  size_t size = 0;
  ~Part() {
    if (map) munmap(map, size);
  }
};

GgufFile::GgufFile(const std::string& path) {
  std::error_code ec;
  const std::string file = fs::is_directory(path, ec) ? model_in_folder(path) : path;
  const auto split = parse_split_name(file);
  if (split) {
    for (int no = 1; no <= split->count; ++no) parts_.push_back(split_part_path(split->prefix, no, split->count));
  } else {
    parts_.push_back(file);
  }
  path_ = parts_.front();
  // Every part present before any is mapped: the missing one is the error worth reporting.
  for (size_t k = 0; k < parts_.size(); ++k)
    if (!fs::exists(parts_[k], ec))
      format_error(parts_[k], "",
                   parts_.size() > 1 ? "part " + std::to_string(k + 1) + " of " + std::to_string(parts_.size()) +
                                           " of the split set is missing"
                                     : "no such file");
  const int count = int(parts_.size());
  int64_t want_tensors = -1;
  for (int no = 1; no <= count; ++no) {
    const int64_t n = open_part(parts_[size_t(no - 1)], no, count, split.has_value());
    if (no == 1) want_tensors = n;
    else if (n != want_tensors)
      format_error(parts_[size_t(no - 1)], "",
                   "split.tensors.count is " + std::to_string(n) + ", the first part says " + std::to_string(want_tensors));
  }
  if (want_tensors >= 0 && size_t(want_tensors) != tensors_.size())
    format_error(path_, "",
                 "split.tensors.count is " + std::to_string(want_tensors) + " but the " + std::to_string(count) +
                     " part(s) hold " + std::to_string(tensors_.size()) + " tensors");
}

GgufFile::~GgufFile() = default;

int64_t GgufFile::open_part(const std::string& file, int no, int count, bool split_name) {
  auto part = std::make_unique<Part>();
  part->path = file;
  int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) format_error(file, "", std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    format_error(file, "", "not a regular file");
  }
  part->size = size_t(st.st_size);
  if (part->size < 24) {
    ::close(fd);
    format_error(file, "",
                 "truncated: " + std::to_string(part->size) + " bytes, less than the 24-byte GGUF header");
  }
  part->map = mmap(nullptr, part->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (part->map == MAP_FAILED) {
    part->map = nullptr;
    format_error(file, "", std::string("mmap failed: ") + std::strerror(errno));
  }

  Parsed p;
  parse(file, static_cast<const uint8_t*>(part->map), part->size, p);

  // split.*: each part says which it is; a lone file may say it is the only part.
  auto split_int = [&](const char* key) -> std::optional<int64_t> {
    auto it = p.metadata.find(key);
    if (it == p.metadata.end()) return std::nullopt;
    if (it->second.kind != GgufValue::Kind::Int) format_error(file, "", key_ctx(key) + "is not an integer");
    return it->second.i;
  };
  const auto s_no = split_int("split.no"), s_count = split_int("split.count"), s_tensors = split_int("split.tensors.count");
  if (split_name) {
    if (count > 1 && (!s_no || !s_count || !s_tensors))
      format_error(file, "", "named as part " + std::to_string(no) + " of " + std::to_string(count) +
                                 " of a split set but lacks split.no, split.count or split.tensors.count");
    if (s_count && *s_count != count)
      format_error(file, "", "split.count is " + std::to_string(*s_count) + " but the name says " + std::to_string(count) + " parts");
    if (s_no && *s_no != no - 1)
      format_error(file, "", "split.no is " + std::to_string(*s_no) + " (0-based) but the name says part " + std::to_string(no));
  } else if (s_count && *s_count != 1) {
    format_error(file, "",
                 "is part " + std::to_string(s_no.value_or(0) + 1) + " of a split set of " + std::to_string(*s_count) +
                     " (split.count), but its name is not NAME-0000K-of-0000N.gguf, so the other parts cannot be found");
  }
  if (s_tensors && *s_tensors < 0) format_error(file, "", "split.tensors.count is negative");

  for (auto& t : p.tensors) {
    auto [it, added] = tensors_.emplace(t.name, t);
    if (!added) format_error(file, t.name, "appears in two parts (also " + it->second.file + ")");
  }
  if (no == 1) {
    version_ = p.version;
    alignment_ = p.alignment;
    metadata_ = std::move(p.metadata);
  }
  mapped_.push_back(std::move(part));
  return s_tensors.value_or(-1);
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<int64_t> GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->kind != GgufValue::Kind::Int) format_error(path_, "", key_ctx(key) + "is not an integer");
  return v->i;
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->kind == GgufValue::Kind::Int) return double(v->i);
  if (v->kind != GgufValue::Kind::Float) format_error(path_, "", key_ctx(key) + "is not a number");
  return v->f;
}

std::optional<bool> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->kind != GgufValue::Kind::Bool) format_error(path_, "", key_ctx(key) + "is not a bool");
  return v->b;
}

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->kind != GgufValue::Kind::String) format_error(path_, "", key_ctx(key) + "is not a string");
  return v->s;
}

int64_t GgufFile::require_int(const std::string& key) const {
  auto v = get_int(key);
  if (!v) format_error(path_, "", key_ctx(key) + "is missing");
  return *v;
}

std::string GgufFile::require_string(const std::string& key) const {
  auto v = get_string(key);
  if (!v) format_error(path_, "", key_ctx(key) + "is missing");
  return *v;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

size_t GgufFile::total_bytes() const {
  size_t n = 0;
  for (auto& [name, t] : tensors_) n += t.nbytes;
  return n;
}

const uint8_t* GgufFile::mapping(size_t part) const { return static_cast<const uint8_t*>(mapped_.at(part)->map); }
size_t GgufFile::mapping_size(size_t part) const { return mapped_.at(part)->size; }

void GgufFile::prefault(const std::function<void(size_t, size_t)>& progress) const {
  size_t total = 0, done = 0;
  for (auto& p : mapped_) total += p->size;
  const size_t step = size_t(64) << 20;
  volatile uint8_t sink = 0;
  for (auto& p : mapped_) {
    const uint8_t* b = static_cast<const uint8_t*>(p->map);
    madvise(p->map, p->size, MADV_WILLNEED);
    for (size_t off = 0; off < p->size; off += 4096) {
      sink = sink + b[off];
      if ((done + off) % step == 0 && progress) progress(done + off, total);
    }
    done += p->size;
  }
  if (progress) progress(total, total);
}

void GgufFile::release_pages() const {
  for (auto& p : mapped_) madvise(p->map, p->size, MADV_DONTNEED);
}

std::optional<std::string> gguf_path(const std::string& path) {
  const std::string ext = ".gguf";
  if (path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) return path;
  std::error_code ec;
  if (!fs::is_directory(path, ec) || fs::exists(fs::path(path) / "config.json", ec)) return std::nullopt;
  bool any = false;
  for (auto& e : fs::directory_iterator(path, ec))
    if (e.path().extension() == ".gguf") any = true;
  if (!any) return std::nullopt;
  try {
    return model_in_folder(path);
  } catch (const FormatError&) {
    return path;  // ambiguous: opening the folder says why
  }
}

}  // namespace mla
