#include "tools/quantize.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include "format/error.h"
#include "format/progress.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/gguf_model.h"
#include "tokenizer/tokenizer_parts.h"
#include "tools/checkpoint_writer.h"
#include "tools/run_modes.h"

namespace mla {

using nlohmann::json;
namespace fs = std::filesystem;
using quant::QuantFormat;
using quant::weight_format;

namespace {

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// The layers of each class as compressed-tensors targets ("re:" patterns, anchored at the start,
// matched with and without a "language_model." prefix).
std::vector<std::string> class_targets(WeightClass c) {
  switch (c) {
    case WeightClass::RoutedExperts: return {"re:.*mlp\\.experts\\.\\d+\\.(gate|up|down)_proj$"};
    case WeightClass::Attention: return {"re:.*self_attn\\.(q_a_proj|q_b_proj|q_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)$"};
    case WeightClass::SharedExperts: return {"re:.*mlp\\.shared_experts\\.(gate|up|down)_proj$"};
    case WeightClass::DenseMlp: return {"re:.*layers\\.\\d+\\.mlp\\.(gate|up|down)_proj$"};
    case WeightClass::EmbedHead: return {"re:.*embed_tokens$", "re:.*lm_head$"};
    case WeightClass::None: return {};
  }
  return {};
}

constexpr WeightClass kClasses[] = {WeightClass::RoutedExperts, WeightClass::Attention, WeightClass::SharedExperts,
                                    WeightClass::DenseMlp, WeightClass::EmbedHead};

// One weight matrix of the output and where it comes from.
struct Matrix {
  std::string base;
  WeightClass cls = WeightClass::None;
  // The stored matrix; for a derived one (kv_b from a GGUF file's k_b / v_b) its shape as F32,
  // the values made by `derive` when its turn comes.
  MatrixView src;
  std::function<std::vector<float>()> derive;
  std::vector<std::string> inputs;  // the tensors it is read from
  size_t bytes_in = 0;              // theirs
  QuantFormat to = QuantFormat::BF16;
};

// A tensor stored without scales (float, or one of llama.cpp's block formats) as a matrix of
// its last dimension's columns, the others' product of rows.
MatrixView plain_view(const TensorInfo& t) {
  MatrixView m;
  if (t.ggml) m.format = *t.ggml;
  else if (t.dtype == DType::BF16) m.format = WeightFormat::BF16;
  else if (t.dtype == DType::F16) m.format = WeightFormat::F16;
  else if (t.dtype == DType::F32) m.format = WeightFormat::F32;
  else format_error(t.file, t.name, std::string("dtype ") + dtype_name(t.dtype) + " is not supported for a weight");
  m.cols = t.shape.empty() ? 1 : t.shape.back();
  m.rows = m.cols ? t.numel() / m.cols : 0;
  m.data = t.data;
  if (m.bytes() != t.nbytes)
    format_error(t.file, t.name, "holds " + std::to_string(t.nbytes) + " bytes, not the " + std::to_string(m.bytes()) +
                                     " of " + t.shape_str() + " in " + weight_format_name(m.format));
  return m;
}

// The view of a stored matrix (any format the loader reads), as the loader builds it.
MatrixView source_view(const Checkpoint& ck, const std::string& base, int64_t int4_group, int64_t int8_group,
                       std::vector<std::string>& inputs) {
  MatrixView m;
  if (const TensorInfo* p = ck.find(base + ".weight_packed")) {
    const TensorInfo& s = ck.get(base + ".weight_scale");
    const TensorInfo& sh = ck.get(base + ".weight_shape");
    if (p->dtype != DType::I32 || s.dtype != DType::BF16 || sh.dtype != DType::I32 || sh.numel() != 2)
      format_error(p->file, p->name, "INT4 pack-quantized tensors must be I32 weight_packed, BF16 weight_scale, I32 [2] weight_shape");
    const int32_t* dims = reinterpret_cast<const int32_t*>(sh.data);
    m.format = WeightFormat::INT4_GROUP;
    m.rows = dims[0];
    m.cols = dims[1];
    m.group_size = int4_group;
    m.scale_cols = m.cols / int4_group;
    if (p->shape != std::vector<int64_t>{m.rows, m.cols / 8} || s.shape != std::vector<int64_t>{m.rows, m.scale_cols})
      format_error(p->file, p->name, "shape disagrees with weight_shape and the group size");
    m.data = p->data;
    m.scales = s.data;
    inputs = {p->name, s.name, sh.name};
    return m;
  }
  const TensorInfo& t = ck.get(base + ".weight");
  inputs = {base + ".weight"};  // the hub name (a GGUF tensor's own name is the file's)
  if (t.ggml) return plain_view(t);  // a GGUF file's block format, dequantized by dequant_row
  m.rows = t.shape[0];
  m.cols = t.shape[1];
  m.data = t.data;
  switch (t.dtype) {
    case DType::BF16: m.format = WeightFormat::BF16; break;
    case DType::F16: m.format = WeightFormat::F16; break;
    case DType::F32: m.format = WeightFormat::F32; break;
    case DType::F8_E4M3: {
      const TensorInfo* s = ck.find(base + ".weight_scale_inv");
      if (!s) s = &ck.get(base + ".weight_scale");
      if (s->dtype != DType::F32 || s->shape != std::vector<int64_t>{(m.rows + 127) / 128, (m.cols + 127) / 128})
        format_error(s->file, s->name, "block-FP8 scales must be F32 [ceil(out/128), ceil(in/128)]");
      m.format = WeightFormat::FP8_BLOCK128;
      m.scales = s->data;
      m.scale_cols = (m.cols + 127) / 128;
      inputs.push_back(s->name);
      break;
    }
    case DType::I8: {
      const TensorInfo& s = ck.get(base + ".weight_scale");
      if (int8_group <= 0 || m.cols % int8_group || s.dtype != DType::BF16 ||
          s.shape != std::vector<int64_t>{m.rows, m.cols / int8_group})
        format_error(s.file, s.name, "INT8 groups need an int-quantized group in config.json and BF16 scales [out, in/group]");
      m.format = WeightFormat::INT8_GROUP;
      m.group_size = int8_group;
      m.scale_cols = m.cols / int8_group;
      m.scales = s.data;
      inputs.push_back(s.name);
      if (const TensorInfo* zp = ck.find(base + ".weight_zero_point")) inputs.push_back(zp->name);
      break;
    }
    default: format_error(t.file, t.name, std::string("dtype ") + dtype_name(t.dtype) + " is not supported for a weight");
  }
  return m;
}

// The matrix (whose values `src` holds) in its target format: converted, or its bytes copied
// when already in it.
quant::QuantizedMatrix materialize(const Matrix& m, const MatrixView& src, const LoadQuantization& f, int threads) {
  if (src.format != weight_format(m.to) || (is_int_group(src.format) && src.group_size != f.group_size))
    return quant::quantize_matrix(src, m.to, f.rule, f.group_size, threads);
  quant::QuantizedMatrix q;
  q.format = src.format;
  q.rows = src.rows;
  q.cols = src.cols;
  q.group_size = src.group_size;
  const uint8_t* d = static_cast<const uint8_t*>(src.data);
  q.data.assign(d, d + src.bytes());
  if (src.scales) {
    const uint8_t* s = static_cast<const uint8_t*>(src.scales);
    q.scales.assign(s, s + src.scale_bytes());
  }
  return q;
}

// llama.cpp's MLA layout (model/gguf_model.h) as the hub's kv_b_proj [H (nope + v), kv_lora]:
// per head, W_UK (k_b's head [kv_lora, nope] = W_UK^T, transposed back) then W_UV's rows (v_b's
// head [v, kv_lora]): kv_b_from_heads (model/weights.h), as the loader derives it. The values are
// made, float32, only when the matrix is written.
Matrix derived_kv_b(const Checkpoint& ck, const ModelConfig& cfg, const std::string& attn) {
  const int64_t H = cfg.num_attention_heads, nope = cfg.qk_nope_head_dim, vd = cfg.v_head_dim, kvr = cfg.kv_lora_rank;
  const TensorInfo& kb = ck.get(attn + "k_b_proj.weight");
  const TensorInfo& vb = ck.get(attn + "v_b_proj.weight");
  auto expect_shape = [](const TensorInfo& t, std::vector<int64_t> want) {
    if (t.shape == want) return;
    TensorInfo w;
    w.shape = std::move(want);
    format_error(t.file, t.name, "has shape " + t.shape_str() + " but the config needs " + w.shape_str());
  };
  expect_shape(kb, {H, kvr, nope});
  expect_shape(vb, {H, vd, kvr});
  Matrix m;
  m.base = attn + "kv_b_proj";
  m.cls = WeightClass::Attention;
  m.src.format = WeightFormat::F32;
  m.src.rows = H * (nope + vd);
  m.src.cols = kvr;
  m.inputs = {attn + "k_b_proj.weight", attn + "v_b_proj.weight"};
  m.bytes_in = kb.nbytes + vb.nbytes;
  const MatrixView uk_t = plain_view(kb), uv = plain_view(vb);  // [H kv_lora, nope], [H v, kv_lora]
  m.derive = [=] { return kv_b_from_heads(uk_t, uv, H); };
  return m;
}

// The tokenizer files of a GGUF input, from its tokenizer.* metadata (tokenizer_parts.h):
// tokenizer.json (tiktoken.model for Kimi) and tokenizer_config.json with the chat template and
// the bos / eos tokens, the folder Tokenizer::load reads as the tokenizer the file itself gives.
// A tokenizer this engine cannot read (SentencePiece, an unknown pre-tokenizer, none at all) is no
// reason to fail the weights: nothing is written and the note returned says why.
std::optional<std::string> write_gguf_tokenizer(const GgufFile& f, const fs::path& out) {
  try {
    write_tokenizer_folder(gguf_tokenizer_parts(f.metadata(), f.path()), out.string());
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string("no tokenizer files written: ") + e.what() +
           "; copy tokenizer.json and tokenizer_config.json from the model's hub folder into " + out.string() +
           " before running it";
  }
}

// generation_config.json of a GGUF input: its bos and eos ids (tokenizer.ggml.*), where it has them.
void write_gguf_generation_config(const GgufFile& f, const fs::path& out) {
  json g = json::object();
  if (const auto bos = f.get_int("tokenizer.ggml.bos_token_id")) g["bos_token_id"] = *bos;
  if (const auto eos = f.get_int("tokenizer.ggml.eos_token_id")) g["eos_token_id"] = *eos;
  if (!g.empty()) std::ofstream(out / "generation_config.json") << g.dump(2) << "\n";
}

// The tensors a matrix in format f is written as: INT4 weight_packed, weight_scale and
// weight_shape; INT8 and FP8 weight and weight_scale; bf16 weight.
int tensors_of(QuantFormat f) {
  switch (f) {
    case QuantFormat::INT4: return 3;
    case QuantFormat::INT8: case QuantFormat::FP8: return 2;
    case QuantFormat::BF16: return 1;
  }
  return 1;
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) format_error(p.string(), "", "cannot open");
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    format_error(p.string(), "", std::string("not valid JSON: ") + e.what());
  }
}

}  // namespace

json quantization_config(const LoadQuantization& f) {
  std::map<QuantFormat, std::vector<std::string>> targets;  // by format, bf16 left out
  for (WeightClass c : kClasses) {
    const auto to = f.target(c);
    if (to && *to != QuantFormat::BF16)
      for (auto& t : class_targets(c)) targets[*to].push_back(t);
  }
  if (targets.empty()) return nullptr;
  const char* observer = f.rule == quant::ScaleRule::Search ? "mse" : "minmax";
  auto int_group = [&](int bits) {
    return json{{"num_bits", bits}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"},
                {"group_size", f.group_size}, {"dynamic", false}, {"actorder", nullptr}, {"observer", observer}};
  };
  json groups = json::object();
  std::string format;
  for (auto& [q, list] : targets) {
    json weights;
    std::string name, fmt;
    switch (q) {
      case QuantFormat::INT4: name = "group_0", fmt = "pack-quantized", weights = int_group(4); break;
      case QuantFormat::FP8:
        name = "group_1", fmt = "float-quantized";
        weights = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", "block"},
                   {"block_structure", {128, 128}}, {"dynamic", false}, {"observer", observer}};
        break;
      case QuantFormat::INT8: name = "group_2", fmt = "int-quantized", weights = int_group(8); break;
      case QuantFormat::BF16: continue;
    }
    groups[name] = {{"targets", list}, {"weights", weights}, {"input_activations", nullptr},
                    {"output_activations", nullptr}, {"format", fmt}};
    format = format.empty() ? fmt : "mixed-precision";
  }
  return {{"quant_method", "compressed-tensors"},
          {"format", format},
          {"quantization_status", "compressed"},
          {"config_groups", groups},
          {"ignore", json::array()},
          {"kv_cache_scheme", nullptr}};
}

QuantizeReport quantize_checkpoint(const QuantizeOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  if (fs::exists(opt.out) && fs::equivalent(opt.in, opt.out, ec))
    throw std::invalid_argument("-o must be another folder than -m");
  const ModelConfig cfg = ModelConfig::load(opt.in);
  const std::unique_ptr<Checkpoint> ckp = open_checkpoint(opt.in);  // a hub folder or a GGUF file
  const Checkpoint& ck = *ckp;
  const LoadQuantization& f = opt.formats;
  const int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();

  // The matrices by base name, and the tensors they are read from. A tensor in one of
  // llama.cpp's block formats is never copied: a hub folder cannot hold it, so it becomes its
  // class's target or else bf16. llama.cpp's k_b / v_b become the hub's kv_b_proj.
  std::vector<Matrix> matrices;
  std::set<std::string> consumed;
  for (const std::string& name : ck.names()) {
    if (ends_with(name, ".self_attn.v_b_proj.weight")) continue;  // with k_b_proj
    if (ends_with(name, ".self_attn.k_b_proj.weight")) {
      const std::string attn = name.substr(0, name.size() - 15);  // "model.layers.L.self_attn."
      consumed.insert(name);
      consumed.insert(attn + "v_b_proj.weight");
      if (ck.find(attn + "kv_b_proj.weight")) continue;  // both layouts: the loader reads kv_b
      Matrix m = derived_kv_b(ck, cfg, attn);
      m.to = f.target(m.cls).value_or(QuantFormat::BF16);
      matrices.push_back(std::move(m));
      continue;
    }
    std::string base;
    if (ends_with(name, ".weight_packed")) base = name.substr(0, name.size() - 14);
    else if (ends_with(name, ".weight") && ck.get(name).shape.size() == 2) base = name.substr(0, name.size() - 7);
    else continue;
    const WeightClass c = weight_class(base);
    auto to = f.target(c);
    if (!to && ck.get(name).ggml) to = QuantFormat::BF16;
    if (!to) continue;
    Matrix m;
    m.base = base;
    m.cls = c;
    m.to = *to;
    m.src = source_view(ck, base, cfg.int4.group_size, cfg.int8_group_size, m.inputs);
    m.bytes_in = m.src.bytes() + m.src.scale_bytes();
    for (auto& i : m.inputs) consumed.insert(i);
    matrices.push_back(std::move(m));
  }
  for (const Matrix& m : matrices) {
    if (m.to == QuantFormat::INT4 && (m.src.cols % f.group_size || m.src.cols % 8))
      format_error(opt.in, m.base, "in-features " + std::to_string(m.src.cols) + " are not a multiple of the INT4 group " +
                                     std::to_string(f.group_size) + " (choose --experts fp8)");
    if (m.to == QuantFormat::INT8 && m.src.cols % f.group_size)
      format_error(opt.in, m.base, "in-features " + std::to_string(m.src.cols) + " are not a multiple of the INT8 group " +
                                     std::to_string(f.group_size) + " (choose fp8 for this class)");
  }

  QuantizeReport rep;
  auto stats = std::make_shared<std::map<std::string, ClassStats>>();
  // Each matrix becomes 1-3 tensors, written one after the other; the first one written
  // converts the matrix, the others take their part of it, the last one frees it.
  struct Pending {
    std::shared_ptr<quant::QuantizedMatrix> q;
    int left = 0;
  };
  auto pending = std::make_shared<std::map<std::string, Pending>>();
  std::vector<TensorSpec> specs;
  for (const Matrix& m : matrices) {
    const Matrix* mp = &m;
    const int64_t R = m.src.rows, C = m.src.cols;
    ClassStats& cs = (*stats)[weight_class_name(m.cls)];
    cs.tensors += 1;
    cs.bytes_in += m.bytes_in;
    auto part = [mp, pending, stats, &f, &ck, threads](int which) {
      return [mp, pending, stats, &f, &ck, threads, which](uint8_t* out) {
        Pending& p = (*pending)[mp->base];
        if (!p.q) {
          MatrixView src = mp->src;
          std::vector<float> derived;
          if (mp->derive) derived = mp->derive(), src.data = derived.data();
          p.q = std::make_shared<quant::QuantizedMatrix>(materialize(*mp, src, f, threads));
          for (const std::string& i : mp->inputs) {  // read once: RSS stays near the output's
            const TensorInfo& t = ck.get(i);
            release_mapped_range(t.data, t.nbytes);
          }
          p.left = tensors_of(mp->to);
          ClassStats& s = (*stats)[weight_class_name(mp->cls)];
          s.err2 += p.q->err2;
          s.ref2 += p.q->ref2;
          s.converted += mp->src.format != weight_format(mp->to);
        }
        const quant::QuantizedMatrix& q = *p.q;
        if (which == 0) std::memcpy(out, q.data.data(), q.data.size());
        else if (which == 1) std::memcpy(out, q.scales.data(), q.scales.size());
        else {
          const int32_t dims[2] = {int32_t(q.rows), int32_t(q.cols)};
          std::memcpy(out, dims, 8);
        }
        if (--p.left == 0) pending->erase(mp->base);
      };
    };
    switch (m.to) {
      case QuantFormat::BF16: specs.push_back({m.base + ".weight", DType::BF16, {R, C}, part(0)}); break;
      case QuantFormat::FP8:
        specs.push_back({m.base + ".weight", DType::F8_E4M3, {R, C}, part(0)});
        specs.push_back({m.base + ".weight_scale", DType::F32, {(R + 127) / 128, (C + 127) / 128}, part(1)});
        break;
      case QuantFormat::INT4:
        specs.push_back({m.base + ".weight_packed", DType::I32, {R, C / 8}, part(0)});
        specs.push_back({m.base + ".weight_scale", DType::BF16, {R, C / f.group_size}, part(1)});
        specs.push_back({m.base + ".weight_shape", DType::I32, {2}, part(2)});
        break;
      case QuantFormat::INT8:
        specs.push_back({m.base + ".weight", DType::I8, {R, C}, part(0)});
        specs.push_back({m.base + ".weight_scale", DType::BF16, {R, C / f.group_size}, part(1)});
        break;
    }
    size_t out_bytes = 0;
    for (size_t i = specs.size() - size_t(tensors_of(m.to)); i < specs.size(); ++i)
      out_bytes += specs[i].nbytes();
    cs.bytes_out += out_bytes;
  }
  // Everything else (norms, the router, biases, other towers' tensors) as it is; what is left in
  // a block format (not a 2-D weight) as bf16 of its shape.
  for (const std::string& name : ck.names()) {
    if (consumed.count(name)) continue;
    const TensorInfo* t = &ck.get(name);
    if (t->ggml) {
      const MatrixView v = plain_view(*t);
      specs.push_back({name, DType::BF16, t->shape, [t, v](uint8_t* out) {
                         std::vector<float> row(size_t(v.cols));
                         uint16_t* o = reinterpret_cast<uint16_t*>(out);
                         for (int64_t r = 0; r < v.rows; ++r) {
                           v.dequant_row(r, row.data());
                           for (int64_t k = 0; k < v.cols; ++k) o[r * v.cols + k] = f32_to_bf16(row[size_t(k)]);
                         }
                         release_mapped_range(t->data, t->nbytes);
                       }});
      ClassStats& cs = (*stats)[weight_class_name(WeightClass::None)];
      cs.tensors += 1;
      cs.bytes_in += t->nbytes;
      cs.bytes_out += specs.back().nbytes();
      continue;
    }
    specs.push_back({name, t->dtype, t->shape, [t](uint8_t* out) {
                       std::memcpy(out, t->data, t->nbytes);
                       release_mapped_range(t->data, t->nbytes);
                     }});
    ClassStats& cs = (*stats)[weight_class_name(WeightClass::None)];
    cs.tensors += 1;
    cs.bytes_in += t->nbytes;
    cs.bytes_out += t->nbytes;
  }
  size_t total = 0;
  for (auto& s : specs) total += s.nbytes();
  rep.shards = int(std::max<size_t>(1, (total + opt.shard_bytes - 1) / opt.shard_bytes));

  // Progress over the output bytes.
  auto bar = std::make_shared<Progress>("quantizing " + f.str() + " to " + opt.out, opt.progress);
  track_progress(specs, bar);

  const GgufFile* gguf = ck.gguf();
  json config = gguf ? gguf_config_json(*gguf) : read_json(fs::path(opt.in) / "config.json");
  config.erase("quantization_config");
  if (config.contains("text_config") && config["text_config"].is_object()) config["text_config"].erase("quantization_config");
  rep.quantization_config = quantization_config(f);
  if (!rep.quantization_config.is_null()) config["quantization_config"] = rep.quantization_config;
  write_checkpoint(opt.out, config, std::move(specs), rep.shards);
  bar->finish();

  if (gguf) {
    // The tokenizer and generation settings from the file's metadata.
    if (auto note = write_gguf_tokenizer(*gguf, opt.out)) rep.notes.push_back(std::move(*note));
    write_gguf_generation_config(*gguf, opt.out);
  } else {
    // The tokenizer, chat template and generation settings, as they are.
    for (auto& e : fs::directory_iterator(opt.in)) {
      const std::string fn = e.path().filename().string();
      if (!e.is_regular_file() || e.path().extension() == ".safetensors" || fn == "config.json" ||
          fn == "model.safetensors.index.json")
        continue;
      fs::copy_file(e.path(), fs::path(opt.out) / fn, fs::copy_options::overwrite_existing);
    }
  }

  rep.classes = *stats;
  for (auto& [k, s] : rep.classes) rep.bytes_in += s.bytes_in, rep.bytes_out += s.bytes_out;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ofstream(fs::path(opt.out) / "quantize_report.json") << quantize_report_json(rep).dump(2) << "\n";
  return rep;
}

std::string quantize_report_text(const QuantizeReport& r) {
  std::ostringstream o;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.3f GB -> %.3f GB in %d shard%s, %.1f s\n", double(r.bytes_in) / 1e9,
                double(r.bytes_out) / 1e9, r.shards, r.shards == 1 ? "" : "s", r.seconds);
  o << buf;
  for (auto& [name, s] : r.classes) {
    std::snprintf(buf, sizeof buf, "  %-20s %6lld tensors (%lld converted), %.3f -> %.3f GB, relative RMS error %.5f\n",
                  name.c_str(), (long long)s.tensors, (long long)s.converted, double(s.bytes_in) / 1e9,
                  double(s.bytes_out) / 1e9, s.rel_rms());
    o << buf;
  }
  for (const auto& n : r.notes) o << "note: " << n << "\n";
  return o.str();
}

json quantize_report_json(const QuantizeReport& r) {
  json classes = json::object();
  for (auto& [name, s] : r.classes)
    classes[name] = {{"tensors", s.tensors}, {"converted", s.converted}, {"bytes_in", s.bytes_in},
                     {"bytes_out", s.bytes_out}, {"relative_rms_error", s.rel_rms()}};
  return {{"bytes_in", r.bytes_in}, {"bytes_out", r.bytes_out}, {"shards", r.shards},
          {"seconds", r.seconds}, {"classes", classes}, {"quantization_config", r.quantization_config},
          {"notes", r.notes}};
}

LogitsDistance logits_distance(Model& ref, Model& q, const std::vector<std::vector<int32_t>>& sequences) {
  LogitsDistance d;
  const int64_t V = ref.config().vocab_size;
  if (q.config().vocab_size != V) throw std::invalid_argument("logits_distance: the models' vocabularies differ");
  double kl_sum = 0, abs_sum = 0;
  RunOptions ro;
  for (const auto& ids : sequences) {
    const auto a = run_logits(ref, ids, ro), b = run_logits(q, ids, ro);
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* x = a.data() + t * size_t(V);
      const float* y = b.data() + t * size_t(V);
      double mx = -INFINITY, my = -INFINITY;
      int64_t ax = 0, ay = 0;
      for (int64_t v = 0; v < V; ++v) {
        if (x[v] > mx) mx = x[v], ax = v;
        if (y[v] > my) my = y[v], ay = v;
        const double e = std::fabs(double(x[v]) - y[v]);
        abs_sum += e;
        d.max_abs = std::max(d.max_abs, e);
      }
      double zx = 0, zy = 0;
      for (int64_t v = 0; v < V; ++v) zx += std::exp(x[v] - mx), zy += std::exp(y[v] - my);
      const double lx = mx + std::log(zx), ly = my + std::log(zy);
      double kl = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double lp = x[v] - lx, lq = y[v] - ly;
        kl += std::exp(lp) * (lp - lq);
      }
      kl = std::max(0.0, kl);
      kl_sum += kl;
      d.max_kl = std::max(d.max_kl, kl);
      d.argmax_agree += ax == ay;
      d.positions += 1;
    }
  }
  if (d.positions) {
    d.mean_kl = kl_sum / double(d.positions);
    d.mean_abs = abs_sum / double(d.positions) / double(V);
  }
  return d;
}

std::vector<std::vector<int32_t>> comparison_sequences(const std::string& dir, int64_t vocab, int count, int64_t length) {
  std::vector<std::vector<int32_t>> out;
  const fs::path golden = fs::path(dir) / "golden.safetensors";
  if (fs::exists(golden)) {
    SafetensorsFile g(golden.string());
    for (int j = 0;; ++j) {
      const TensorInfo* t = g.find("seq" + std::to_string(j) + "_ids");
      if (!t) break;
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < t->numel(); ++i) {
        int64_t v;
        std::memcpy(&v, t->data + 8 * i, 8);
        ids.push_back(int32_t(v));
      }
      out.push_back(std::move(ids));
    }
    if (!out.empty()) return out;
  }
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(vocab - 1));
  for (int s = 0; s < count; ++s) {
    std::vector<int32_t> ids(static_cast<size_t>(length));
    for (auto& x : ids) x = tok(rng);
    out.push_back(std::move(ids));
  }
  return out;
}

std::string logits_distance_text(const LogitsDistance& d) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "logits against the input over %lld teacher-forced positions: mean KL %.3g (max %.3g), mean |d| %.4g, "
                "max |d| %.4g, argmax agrees at %lld/%lld\n",
                (long long)d.positions, d.mean_kl, d.max_kl, d.mean_abs, d.max_abs, (long long)d.argmax_agree,
                (long long)d.positions);
  return buf;
}

}  // namespace mla
