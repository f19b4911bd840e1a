// A GGUF writer for tests: metadata of every value type and tensors of any type number with
// raw bytes, laid out as llama.cpp lays a file out, with overrides to corrupt any field the
// reader checks. It writes what it is told and checks nothing: a test can make any bad file.
//
//   test::GgufBuilder b;
//   b.add_string("general.architecture", "deepseek2");
//   b.add_u32("deepseek2.block_count", 2);
//   b.add_tensor_f32("token_embd.weight", {4, 3}, values);      // ne in ggml order
//   b.add_tensor("blk.0.ffn_down.weight", 8 /*Q8_0*/, {32, 2}, bytes);
//   b.write(dir / "model.gguf");
//
// Layout: "GGUF", u32 version, u64 tensor count, u64 metadata count, the metadata in the order
// added, the tensor records, zero padding to the data alignment, then each tensor's bytes at
// the next multiple of the alignment (its record's offset, unless overridden).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace mla::test {

class GgufBuilder {
 public:
  // GGUF's value type numbers (as mla::GgufType; repeated so the builder stands alone).
  enum Type : uint32_t { U8 = 0, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64 };

  struct Tensor {
    std::string name;
    uint32_t type = 0;             // ggml type number, any value
    std::vector<int64_t> ne;       // written as given: ggml order, ne[0] innermost
    std::vector<uint8_t> data;     // written as given (the reader checks the size)
    std::optional<uint64_t> offset;   // override of the offset written in the record
    std::optional<uint32_t> n_dims;   // override of the dimension count written (ne as given)
  };

  // ---- header fields and overrides
  std::string magic = "GGUF";                   // its first 4 bytes are written
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;         // written instead of the real count
  std::optional<uint64_t> kv_count;             // likewise for the metadata
  uint64_t alignment = 32;                      // where data is placed; set_alignment also writes the key

  // ---- metadata, in the order added (a key may be added twice: the reader must refuse it)
  GgufBuilder& add_u8(const std::string& k, uint8_t v) { return scalar(k, U8, v); }
  GgufBuilder& add_i8(const std::string& k, int8_t v) { return scalar(k, I8, v); }
  GgufBuilder& add_u16(const std::string& k, uint16_t v) { return scalar(k, U16, v); }
  GgufBuilder& add_i16(const std::string& k, int16_t v) { return scalar(k, I16, v); }
  GgufBuilder& add_u32(const std::string& k, uint32_t v) { return scalar(k, U32, v); }
  GgufBuilder& add_i32(const std::string& k, int32_t v) { return scalar(k, I32, v); }
  GgufBuilder& add_u64(const std::string& k, uint64_t v) { return scalar(k, U64, v); }
  GgufBuilder& add_i64(const std::string& k, int64_t v) { return scalar(k, I64, v); }
  GgufBuilder& add_f32(const std::string& k, float v) { return scalar(k, F32, v); }
  GgufBuilder& add_f64(const std::string& k, double v) { return scalar(k, F64, v); }
  GgufBuilder& add_bool(const std::string& k, bool v) { return scalar(k, Bool, uint8_t(v)); }
  GgufBuilder& add_string(const std::string& k, const std::string& v) {
    std::vector<uint8_t> body;
    put(body, uint32_t(String));
    put_string(body, v);
    return add_raw(k, std::move(body));
  }
  // An array of scalars: T is the C++ type of `elem` (uint8_t for Bool).
  template <class T>
  GgufBuilder& add_array(const std::string& k, Type elem, const std::vector<T>& v) {
    std::vector<uint8_t> body;
    put(body, uint32_t(Array));
    put(body, uint32_t(elem));
    put(body, uint64_t(v.size()));
    for (const T& x : v) put(body, x);
    return add_raw(k, std::move(body));
  }
  GgufBuilder& add_string_array(const std::string& k, const std::vector<std::string>& v) {
    std::vector<uint8_t> body;
    put(body, uint32_t(Array));
    put(body, uint32_t(String));
    put(body, uint64_t(v.size()));
    for (const std::string& x : v) put_string(body, x);
    return add_raw(k, std::move(body));
  }
  // A key with any bytes after it (the u32 value type and the value): unknown value types,
  // nested arrays, lying array lengths.
  GgufBuilder& add_raw(const std::string& k, std::vector<uint8_t> body) {
    kvs_.push_back({k, std::move(body)});
    return *this;
  }
  // general.alignment (u32) and the data placed on it.
  GgufBuilder& set_alignment(uint32_t a) {
    alignment = a;
    return add_u32("general.alignment", a);
  }

  // ---- tensors, in the order added; the returned reference takes overrides
  Tensor& add_tensor(const std::string& name, uint32_t type, std::vector<int64_t> ne, std::vector<uint8_t> data) {
    tensors_.push_back({name, type, std::move(ne), std::move(data), std::nullopt, std::nullopt});
    return tensors_.back();
  }
  Tensor& add_tensor_f32(const std::string& name, std::vector<int64_t> ne, const std::vector<float>& v) {
    std::vector<uint8_t> data(v.size() * 4);
    if (!v.empty()) std::memcpy(data.data(), v.data(), data.size());
    return add_tensor(name, 0, std::move(ne), std::move(data));
  }
  std::deque<Tensor>& tensors() { return tensors_; }

  // ---- output
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    std::string m = magic;
    m.resize(4, '\0');
    out.insert(out.end(), m.begin(), m.end());
    put(out, version);
    put(out, tensor_count.value_or(tensors_.size()));
    put(out, kv_count.value_or(kvs_.size()));
    for (const auto& [k, body] : kvs_) {
      put_string(out, k);
      out.insert(out.end(), body.begin(), body.end());
    }
    const uint64_t a = alignment ? alignment : 1;
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      put_string(out, t.name);
      put(out, t.n_dims.value_or(uint32_t(t.ne.size())));
      for (int64_t d : t.ne) put(out, d);
      put(out, t.type);
      put(out, t.offset.value_or(offset));
      offset = (offset + t.data.size() + a - 1) / a * a;
    }
    if (!tensors_.empty()) {
      out.resize((out.size() + a - 1) / a * a, 0);
      const size_t data_start = out.size();
      offset = 0;
      for (const Tensor& t : tensors_) {
        out.resize(data_start + offset, 0);
        out.insert(out.end(), t.data.begin(), t.data.end());
        offset = (offset + t.data.size() + a - 1) / a * a;
      }
    }
    return out;
  }
  void write(const std::string& path) const { write_bytes(path, bytes()); }

  static void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    if (!f) throw std::runtime_error("cannot write " + path);
  }

  // The name of part `no` (1-based) of `count` of a split set, as llama.cpp's gguf-split
  // writes it: PREFIX-00001-of-00003.gguf.
  static std::string split_name(const std::string& prefix, int no, int count) {
    char tail[48];
    std::snprintf(tail, sizeof tail, "-%05d-of-%05d.gguf", no, count);
    return prefix + tail;
  }
  // The split.* keys gguf-split writes in part `no` (1-based) of `count`.
  GgufBuilder& add_split_keys(int no, int count, int32_t total_tensors) {
    add_u16("split.no", uint16_t(no - 1));
    add_u16("split.count", uint16_t(count));
    return add_i32("split.tensors.count", total_tensors);
  }

  // Raw little-endian encoders, for add_raw bodies.
  template <class T>
  static void put(std::vector<uint8_t>& out, const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  static void put_string(std::vector<uint8_t>& out, const std::string& s) {
    put(out, uint64_t(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }

 private:
  template <class T>
  GgufBuilder& scalar(const std::string& k, Type t, T v) {
    std::vector<uint8_t> body;
    put(body, uint32_t(t));
    put(body, v);
    return add_raw(k, std::move(body));
  }

  std::vector<std::pair<std::string, std::vector<uint8_t>>> kvs_;
  std::deque<Tensor> tensors_;  // a deque: add_tensor's references stay valid
};

}  // namespace mla::test
