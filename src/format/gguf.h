// GGUF files (llama.cpp's model format, versions 2 and 3), memory-mapped: one file or a split set
// (NAME-00001-of-0000N.gguf, every part beside the first). The header, every metadata value and
// every tensor record are validated at open: a file that opens is safe to read anywhere its
// records say, and a bad one throws FormatError naming the file and what is wrong.
//
// Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 metadata count; the
// metadata (key string, u32 value type, value); the tensor records (name string, u32 dims, u64
// ne[dims], u32 ggml type, u64 offset); padding to general.alignment (default 32); the tensor
// data, each tensor at its offset from there. A string is a u64 length and its bytes.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mla {

// ggml's tensor types, by their numbers in a GGUF file.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

// The block shape of a ggml type: `values` elements in `bytes` bytes (1 and the element size for
// the plain types). nullopt for a number ggml does not define.
struct GgmlTypeInfo {
  const char* name;  // "q4_K", as ggml names it
  int64_t values;
  size_t bytes;
};
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type);

// GGUF's value types, by their numbers in a file (`type` of a GgufValue).
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};

// A metadata value. Scalars: integers (every width, signed or not) in `i` (u64 above 2^63 - 1
// is an error), floats in `f`, bools in `b` (a byte other than 0 or 1 is an error), strings in
// `s`. Arrays hold their elements by kind in `ints`, `floats` or `strings` (bool arrays in
// `ints`, as 0 and 1); arrays of arrays are rejected.
struct GgufValue {
  enum class Kind { Int, Float, Bool, String, Array };
  Kind kind = Kind::Int;
  Kind elem = Kind::Int;  // arrays: their elements' kind
  GgufType type = GgufType::U8;  // the type in the file: the scalar's, or an array's elements'
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  size_t size() const;  // arrays: element count; scalars: 1
};

struct GgufTensor {
  std::string name;
  std::string file;  // path of the part holding it, for error messages
  uint32_t type = 0;  // GgmlType
  std::vector<int64_t> ne;  // ggml order: ne[0] is the innermost (contiguous) dimension
  const uint8_t* data = nullptr;  // into the mapping
  size_t nbytes = 0;
  std::string shape_str() const;  // "[ne0, ne1, ...]"
};

class GgufFile {
 public:
  // `path`: a .gguf file, the first part of a split set (or any part: the set is found from its
  // name), or a folder holding one model's .gguf file(s) (mmproj-*.gguf beside it ignored).
  // Every part of a set must be there, and its split.no / split.count must agree with its name;
  // the parts' tensors must add up to split.tensors.count. Throws FormatError.
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }  // the first part
  const std::vector<std::string>& parts() const { return parts_; }
  uint32_t version() const { return version_; }  // of the first part
  uint32_t alignment() const { return alignment_; }  // general.alignment of the first part

  // Metadata of the first part (split.* keys of every part are checked at open).
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const GgufValue* find(const std::string& key) const;
  // Typed reads; nullopt when the key is absent, FormatError naming the key when it holds
  // another kind (integers read as floats too).
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_float(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  // The same, the key required (FormatError naming the key when absent).
  int64_t require_int(const std::string& key) const;
  std::string require_string(const std::string& key) const;

  // Tensors of every part, by name (a name in two parts is an error).
  const std::map<std::string, GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(const std::string& name) const;
  size_t total_bytes() const;  // tensor data bytes of every part

  // The mapping of parts()[part], whole (tensor data pointers lie inside their part's).
  const uint8_t* mapping(size_t part) const;
  size_t mapping_size(size_t part) const;

  // As Checkpoint's: read every mapped page once (progress as it goes); drop the pages.
  void prefault(const std::function<void(size_t done, size_t total)>& progress) const;
  void release_pages() const;

 private:
  struct Part;
  // Maps and validates part `no` (1-based) of `count`, adding its tensors; the first part's
  // metadata becomes the file's. Returns the part's split.tensors.count (-1 when absent).
  int64_t open_part(const std::string& file, int no, int count, bool split_name);

  std::string path_;
  std::vector<std::string> parts_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, GgufTensor> tensors_;
  std::vector<std::unique_ptr<Part>> mapped_;
};

// The GGUF file `path` names, if it names one: a path ending in .gguf (existing or not: opening
// it reports what is wrong), or a folder holding .gguf files and no config.json (its model's
// file: the one .gguf, or the first part of its split set, by name; mmproj-*.gguf projector
// files beside it do not count). A folder whose model is ambiguous (several .gguf files, or
// only projectors) gives the folder itself, so that opening it reports why. nullopt for
// anything else (a hub checkpoint folder).
std::optional<std::string> gguf_path(const std::string& path);

}  // namespace mla
