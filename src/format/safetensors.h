// Safetensors files, memory-mapped: one file (SafetensorsFile) or a checkpoint folder of
// shards (Checkpoint, following model.safetensors.index.json when present). Every header is
// validated in full at open: a file that opens is safe to read anywhere its header says.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/matrix.h"

namespace mla {

struct TensorInfo {
  std::string name;
  std::string file;  // path of the file holding it, for error messages
  DType dtype;
  std::vector<int64_t> shape;
  // Set for a tensor stored in one of llama.cpp's block formats (a GGUF file's Q4_K ...,
  // tensor/ggml_blocks.h): `shape` counts weights, dtype is U8 and nbytes the blocks' bytes.
  std::optional<WeightFormat> ggml;
  const uint8_t* data = nullptr;  // into the mapping
  size_t nbytes = 0;
  int64_t numel() const;
  std::string shape_str() const;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws FormatError
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const uint8_t* mapping() const { return static_cast<const uint8_t*>(map_); }
  size_t mapping_size() const { return map_size_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All the weights of a checkpoint folder. With model.safetensors.index.json, the shards it
// names (each tensor must be in the shard the index says); else model.safetensors; else every
// *.safetensors file in the folder.
class GgufFile;

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  // The tensors of a GGUF file under their hub names (model/gguf_model.h makes them): `tensors`
  // point into the file's mappings; `source_name` gives a hub name's name in the file, for the
  // message about a missing tensor.
  Checkpoint(std::shared_ptr<const GgufFile> file, std::map<std::string, TensorInfo> tensors,
             std::function<std::string(const std::string&)> source_name);
  ~Checkpoint();
  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& get(const std::string& name) const;  // throws FormatError naming the tensor
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }  // the folder, or the GGUF file (its first part)
  const GgufFile* gguf() const { return gguf_.get(); }  // null for a folder of safetensors
  size_t total_bytes() const;
  // Reads every mapped page once so the first forward pass does not stall on the disk;
  // progress(done, total) is called as it goes.
  void prefault(const std::function<void(size_t done, size_t total)>& progress) const;
  // Drops the mapped pages from this process (MADV_DONTNEED) once the weights were copied out:
  // the mapping stays valid and a later read faults the page back in from the page cache.
  void release_pages() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::shared_ptr<const GgufFile> gguf_;
  std::map<std::string, TensorInfo> gguf_tensors_;
  std::function<std::string(const std::string&)> source_name_;
  std::map<std::string, const TensorInfo*> index_;
};

// Drops the whole pages inside [p, p + n) of a mapping from this process (MADV_DONTNEED), as
// release_pages does for a whole checkpoint: for readers that stream a checkpoint tensor by
// tensor and are done with each (quantizing at load, mla quantize).
void release_mapped_range(const void* p, size_t n);

// ---- writing: the one safetensors writer (checkpoints, `mla logits`, tests)

// One tensor to write, produced when its turn comes: fill writes exactly nbytes() bytes, so a
// multi-gigabyte checkpoint is never held in memory.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::function<void(uint8_t* out)> fill;
  size_t nbytes() const;
};

// Writes a safetensors file: the JSON header (keys sorted, padded with spaces to a multiple of
// 8 bytes; __metadata__ when metadata is not empty), then the tensors' data in the order given.
// Throws FormatError naming the path when it cannot be written.
void write_safetensors(const std::string& path, const std::vector<const TensorSpec*>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Tensors already in memory, written in name order.
struct TensorData {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
void write_safetensors(const std::string& path, const std::map<std::string, TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
TensorData tensor_f32(std::vector<int64_t> shape, const float* data);

}  // namespace mla
