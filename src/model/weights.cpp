#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <regex>
#include <stdexcept>

#include "format/error.h"

namespace mla {

namespace {

// Whether a compressed-tensors target or ignore entry names a layer: the name itself, or a "re:"
// pattern matched at the start (re.match semantics), tried on the name without and with the
// checkpoint's "language_model." prefix.
bool names_layer(const std::string& entry, const std::string& plain, const std::string& base) {
  const bool pattern = entry.rfind("re:", 0) == 0;
  const std::regex re = pattern ? std::regex(entry.substr(3)) : std::regex();
  for (const std::string& name : {plain, base})
    if (pattern ? std::regex_search(name, re, std::regex_constants::match_continuous) : entry == name) return true;
  return false;
}

class Loader {
 public:
  Loader(const Checkpoint& ckpt, const ModelConfig& cfg, bool with_mtp, parallel::ExpertRange experts,
         const LoadQuantization* quantize = nullptr, const std::function<void(size_t, size_t)>* progress = nullptr)
      : ckpt_(ckpt), cfg_(cfg), with_mtp_(with_mtp && has_mtp_module(ckpt, cfg)), experts_(experts),
        quantize_(quantize), progress_(progress) {
    if (progress_ && *progress_) total_ = ckpt_.total_bytes();
  }

  ModelWeights load() {
    const auto& c = cfg_;
    const std::string p = c.weight_prefix;
    w_.embed = matrix(p + "model.embed_tokens", c.vocab_size, c.hidden_size, /*linear=*/false);
    w_.final_norm = vec(p + "model.norm.weight", c.hidden_size);
    if (ckpt_.find(p + "lm_head.weight") || !c.tie_word_embeddings)
      w_.lm_head = matrix(p + "lm_head", c.vocab_size, c.hidden_size);
    else
      w_.lm_head = w_.embed;
    check_layer_count();
    const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, vd = c.v_head_dim, kvr = c.kv_lora_rank;
    // The MTP module's decoder layer (index num_hidden_layers) loads as the layers before it.
    for (int64_t l = 0; l < c.num_hidden_layers + (with_mtp_ ? 1 : 0); ++l) {
      LayerWeights L;
      const std::string lp = p + "model.layers." + std::to_string(l) + ".";
      const std::string a = lp + "self_attn.";
      L.input_norm = vec(lp + "input_layernorm.weight", c.hidden_size);
      L.post_attention_norm = vec(lp + "post_attention_layernorm.weight", c.hidden_size);
      if (c.q_lora_rank > 0) {
        L.q_a = matrix(a + "q_a_proj", c.q_lora_rank, c.hidden_size);
        L.q_a_norm = vec(a + "q_a_layernorm.weight", c.q_lora_rank);
        L.q_b = matrix(a + "q_b_proj", H * c.qk_head_dim(), c.q_lora_rank);
      } else {
        L.q = matrix(a + "q_proj", H * c.qk_head_dim(), c.hidden_size);
      }
      L.kv_a = matrix(a + "kv_a_proj_with_mqa", c.latent_dim(), c.hidden_size);
      L.kv_a_norm = vec(a + "kv_a_layernorm.weight", kvr);
      if (!ckpt_.find(a + "kv_b_proj.weight") && ckpt_.find(a + "k_b_proj.weight")) {
        split_kv_b(L, a);  // a GGUF file's attn_k_b / attn_v_b
      } else {
        L.kv_b = matrix(a + "kv_b_proj", H * (nope + vd), kvr);
        absorb(L);
      }
      L.o = matrix(a + "o_proj", c.hidden_size, H * vd);
      // The MTP module's layer (l == num_hidden_layers) attends densely (model/mtp.cpp): its
      // indexer, where the checkpoint has one, is not loaded (indexer_shared lists only the
      // decoder layers; reading it at l == num_hidden_layers read past its end).
      if (c.dsa() && l < c.num_hidden_layers && !c.indexer_shared[size_t(l)]) {
        const std::string ip = a + "indexer.";
        IndexerWeights& I = L.indexer;
        I.present = true;
        I.wq_b = matrix(ip + "wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
        I.wk = matrix(ip + "wk", c.index_head_dim, c.hidden_size);
        I.weights_proj = matrix(ip + "weights_proj", c.index_n_heads, c.hidden_size);
        I.k_norm = vec(ip + "k_norm.weight", c.index_head_dim);
        I.k_norm_bias = vec(ip + "k_norm.bias", c.index_head_dim);
      }
      L.moe = c.is_moe_layer(l);
      if (L.moe) {
        L.router = matrix(lp + "mlp.gate", c.n_routed_experts, c.hidden_size, /*linear=*/false);
        if (ckpt_.find(lp + "mlp.gate.e_score_correction_bias"))
          L.router_bias = vec(lp + "mlp.gate.e_score_correction_bias", c.n_routed_experts);
        else if (c.topk_method == TopkMethod::NoauxTc)
          format_error(ckpt_.dir(), lp + "mlp.gate.e_score_correction_bias", "missing (noaux_tc routing needs it)");
        for (int64_t e = 0; e < c.n_routed_experts; ++e)
          L.experts.push_back(experts_.has(e) ? mlp(lp + "mlp.experts." + std::to_string(e) + ".", c.moe_intermediate_size)
                                              : Mlp{});  // another rank's
        if (c.n_shared_experts > 0) {
          L.shared = mlp(lp + "mlp.shared_experts.", c.n_shared_experts * c.moe_intermediate_size);
          L.has_shared = true;
        }
      } else {
        L.dense = mlp(lp + "mlp.", c.intermediate_size);
      }
      w_.layers.push_back(std::move(L));
    }
    if (with_mtp_) load_mtp();
    return std::move(w_);
  }

 private:
  // The MTP module around the layer just loaded last (moved out of the decoder layers).
  void load_mtp() {
    const auto& c = cfg_;
    const std::string lp = c.weight_prefix + "model.layers." + std::to_string(c.num_hidden_layers) + ".";
    MtpWeights m;
    m.layer = std::move(w_.layers.back());
    w_.layers.pop_back();
    m.enorm = vec(lp + "enorm.weight", c.hidden_size);
    m.hnorm = vec(lp + "hnorm.weight", c.hidden_size);
    m.eh_proj = matrix(lp + "eh_proj", c.hidden_size, 2 * c.hidden_size);
    m.head_norm = vec(lp + "shared_head.norm.weight", c.hidden_size);
    m.head = ckpt_.find(lp + "shared_head.head.weight") ? matrix(lp + "shared_head.head", c.vocab_size, c.hidden_size)
                                                         : w_.lm_head;
    w_.mtp.push_back(std::move(m));
  }

  // A decoder layer at or past num_hidden_layers means config.json and the checkpoint disagree
  // (the model would silently run without it). MTP modules (DeepSeek-V3's layer 61: eh_proj,
  // enorm, hnorm) sit there by design and are skipped.
  void check_layer_count() const {
    const std::string prefix = cfg_.weight_prefix + "model.layers.";
    int64_t extra = -1;
    for (const std::string& name : ckpt_.names()) {
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      size_t i = prefix.size();
      int64_t l = 0;
      bool digits = false;
      while (i < name.size() && name[i] >= '0' && name[i] <= '9' && l < (int64_t(1) << 40))
        l = l * 10 + (name[i++] - '0'), digits = true;
      if (!digits || l < cfg_.num_hidden_layers) continue;
      if (ckpt_.find(prefix + std::to_string(l) + ".eh_proj.weight")) continue;  // an MTP module
      extra = std::max(extra, l);
    }
    if (extra >= 0)
      format_error(ckpt_.dir(), prefix + std::to_string(extra),
                   "the checkpoint has decoder layers up to " + std::to_string(extra) + " but config.json's "
                   "num_hidden_layers is " + std::to_string(cfg_.num_hidden_layers) +
                   " (fix num_hidden_layers: layers past it would be dropped)");
  }

  // Weight absorption: W_UV[h] is a row slice of kv_b; W_UK[h]^T is a transposed copy. bf16 kv_b
  // gives a bf16 copy. Block-FP8 kv_b gives an FP8 copy (the same codes, transposed, each 128 x 128
  // block keeping its scale) when every head's rows start on a scale block, (nope + v) % 128 == 0
  // as in DeepSeek-V3 and Kimi K2: a quarter of the float32 copy's bytes. Otherwise float32.
  void absorb(LayerWeights& L) {
    const int64_t H = cfg_.num_attention_heads, nope = cfg_.qk_nope_head_dim, vd = cfg_.v_head_dim,
                  kvr = cfg_.kv_lora_rank;
    if (L.kv_b.format == WeightFormat::FP8_BLOCK128 && L.kv_b.row0 == 0 && (nope + vd) % 128 == 0) {
      absorb_fp8(L);
      return;
    }
    const bool bf16 = L.kv_b.format == WeightFormat::BF16;
    const size_t esize = bf16 ? 2 : 4;
    auto buf = std::make_unique<std::vector<uint8_t>>(size_t(H * kvr * nope) * esize);
    std::vector<float> row(static_cast<size_t>(kvr));
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < nope; ++d) {
        L.kv_b.dequant_row(h * (nope + vd) + d, row.data());
        for (int64_t k = 0; k < kvr; ++k) {
          size_t idx = size_t((h * kvr + k) * nope + d);
          if (bf16) reinterpret_cast<uint16_t*>(buf->data())[idx] = f32_to_bf16(row[size_t(k)]);
          else reinterpret_cast<float*>(buf->data())[idx] = row[size_t(k)];
        }
      }
      MatrixView uk;
      uk.format = bf16 ? WeightFormat::BF16 : WeightFormat::F32;
      uk.rows = kvr;
      uk.cols = nope;
      uk.data = buf->data() + size_t(h * kvr * nope) * esize;
      L.w_uk_t.push_back(uk);
      L.w_uv.push_back(L.kv_b.slice_rows(h * (nope + vd) + nope, vd));
    }
    w_.bytes_by_format[std::string(bf16 ? "bf16" : "f32") + " (derived W_UK^T)"] += buf->size();
    w_.owned.push_back(std::move(buf));
  }

  // W_UK[h]^T as block-FP8 [kvr, nope]: codes kv_b[h (nope + v) + d, k] at [k, d]; the scale of
  // block (i, j) is kv_b's block (h (nope + v) / 128 + j, i).
  void absorb_fp8(LayerWeights& L) {
    const int64_t H = cfg_.num_attention_heads, nope = cfg_.qk_nope_head_dim, vd = cfg_.v_head_dim,
                  kvr = cfg_.kv_lora_rank;
    const int64_t sr = (kvr + 127) / 128, sc = (nope + 127) / 128;  // scale blocks of one head's copy
    const size_t codes = size_t(H * kvr * nope), scale_off = (codes + 63) / 64 * 64;
    auto buf = std::make_unique<std::vector<uint8_t>>(scale_off + size_t(H * sr * sc) * sizeof(float));
    uint8_t* const out = buf->data();
    float* const out_scales = reinterpret_cast<float*>(out + scale_off);
    const uint8_t* const kb = static_cast<const uint8_t*>(L.kv_b.data);
    const float* const kb_scales = static_cast<const float*>(L.kv_b.scales);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t r0 = h * (nope + vd);
      for (int64_t d = 0; d < nope; ++d)
        for (int64_t k = 0; k < kvr; ++k) out[size_t((h * kvr + k) * nope + d)] = kb[size_t((r0 + d) * kvr + k)];
      for (int64_t i = 0; i < sr; ++i)
        for (int64_t j = 0; j < sc; ++j)
          out_scales[(h * sr + i) * sc + j] = kb_scales[(r0 / 128 + j) * L.kv_b.scale_cols + i];
      MatrixView uk;
      uk.format = WeightFormat::FP8_BLOCK128;
      uk.rows = kvr;
      uk.cols = nope;
      uk.data = out + size_t(h * kvr * nope);
      uk.scales = out_scales + h * sr * sc;
      uk.scale_cols = sc;
      L.w_uk_t.push_back(uk);
      L.w_uv.push_back(L.kv_b.slice_rows(r0 + nope, vd));
    }
    w_.bytes_by_format["fp8-block128 (derived W_UK^T)"] += buf->size();
    w_.owned.push_back(std::move(buf));
  }

  // llama.cpp's MLA layout (model/gguf_model.h): kv_b split per head into k_b [H, kv_lora, nope],
  // which is W_UK^T, and v_b [H, v, kv_lora], which is W_UV, each in its stored format: the
  // absorbed path reads them where they lie. The expanded path's kv_b [H (nope + v), kv_lora] is
  // derived from them: W_UK transposed back and W_UV's rows, float32 when both are stored in
  // float32 or float16, else bf16 (a bf16 file's values exactly; a block format's dequantized).
  void split_kv_b(LayerWeights& L, const std::string& a) {
    const int64_t H = cfg_.num_attention_heads, nope = cfg_.qk_nope_head_dim, vd = cfg_.v_head_dim,
                  kvr = cfg_.kv_lora_rank;
    const TensorInfo& kb = ckpt_.get(a + "k_b_proj.weight");
    const TensorInfo& vb = ckpt_.get(a + "v_b_proj.weight");
    expect_shape(kb, {H, kvr, nope});
    expect_shape(vb, {H, vd, kvr});
    MatrixView uk = head_view(kb, kvr, nope), uv = head_view(vb, vd, kvr);
    for (int64_t h = 0; h < H; ++h) {
      L.w_uk_t.push_back(uk.slice_rows(h * kvr, kvr));
      L.w_uv.push_back(uv.slice_rows(h * vd, vd));
    }
    const bool wide = (uk.format == WeightFormat::F32 || uk.format == WeightFormat::F16) &&
                      (uv.format == WeightFormat::F32 || uv.format == WeightFormat::F16);
    const std::vector<float> kv_b = kv_b_from_heads(uk, uv, H);
    auto buf = std::make_unique<std::vector<uint8_t>>(kv_b.size() * (wide ? 4 : 2));
    if (wide) std::memcpy(buf->data(), kv_b.data(), buf->size());
    else
      for (size_t i = 0; i < kv_b.size(); ++i) reinterpret_cast<uint16_t*>(buf->data())[i] = f32_to_bf16(kv_b[i]);
    L.kv_b = MatrixView{};
    L.kv_b.format = wide ? WeightFormat::F32 : WeightFormat::BF16;
    L.kv_b.rows = H * (nope + vd);
    L.kv_b.cols = kvr;
    L.kv_b.data = buf->data();
    count(std::string(wide ? "f32" : "bf16") + " (derived kv_b)", buf->size());
    w_.owned.push_back(std::move(buf));
  }

  // A [H, rows, cols] tensor as one matrix of H * rows rows (its heads' rows one after another).
  MatrixView head_view(const TensorInfo& t, int64_t rows, int64_t cols) {
    MatrixView m;
    m.rows = t.shape[0] * rows;
    m.cols = cols;
    m.data = t.data;
    m.format = stored_format(t);
    count(weight_format_name(m.format), t.nbytes);
    return m;
  }

  // The format of a plain (unscaled) stored weight: float, or one of llama.cpp's block formats.
  WeightFormat stored_format(const TensorInfo& t) const {
    if (t.ggml) return *t.ggml;
    switch (t.dtype) {
      case DType::BF16: return WeightFormat::BF16;
      case DType::F16: return WeightFormat::F16;
      case DType::F32: return WeightFormat::F32;
      default: format_error(t.file, t.name, std::string("dtype ") + dtype_name(t.dtype) + " is not supported here");
    }
  }

  // scale_fmt ue8m0: every block scale is a power of two (an 8-bit exponent stored as float32).
  void check_ue8m0(const TensorInfo& s) const {
    for (int64_t i = 0; i < s.numel(); ++i) {
      float f;
      std::memcpy(&f, s.data + 4 * i, 4);
      int e = 0;
      if (!(f > 0) || std::frexp(f, &e) != 0.5f)
        format_error(s.file, s.name, "scale " + std::to_string(f) + " at " + std::to_string(i) +
                                         " is not a power of two (quantization_config scale_fmt ue8m0)");
    }
  }

  void count(const std::string& fmt, size_t n) { w_.bytes_by_format[fmt] += n; }

  void expect_shape(const TensorInfo& t, std::vector<int64_t> want) {
    if (t.shape != want) {
      TensorInfo tmp;
      tmp.shape = want;
      format_error(t.file, t.name, "has shape " + t.shape_str() + " but the config needs " + tmp.shape_str());
    }
  }

  // Whether compressed-tensors quantizes this Linear layer: every Linear unless a name or a
  // "re:" pattern of the ignore list matches it (re.match semantics: anchored at the start).
  // Names are tried with and without the checkpoint's "language_model." prefix.
  bool int4_quantized(const std::string& base) const {
    if (!cfg_.int4.enabled) return false;
    const std::string plain = base.substr(cfg_.weight_prefix.size());
    if (!int4_targeted(plain, base)) return false;
    for (const auto& ig : cfg_.int4.ignore)
      if (names_layer(ig, plain, base)) return false;
    return true;
  }

  // `linear`: an nn.Linear of the model (embeddings and the MoE router are not), so the INT4
  // quantization config applies to it.
  MatrixView matrix(const std::string& base, int64_t rows, int64_t cols, bool linear = true) {
    MatrixView m;
    m.rows = rows;
    m.cols = cols;
    const bool want_int4 = linear && int4_quantized(base);
    const TensorInfo* packed = ckpt_.find(base + ".weight_packed");
    if (want_int4 && !packed)
      format_error(ckpt_.dir(), base + ".weight_packed",
                   "missing: quantization_config quantizes this layer (it matches no entry of its ignore list)");
    if (packed) {
      if (!cfg_.int4.enabled)
        format_error(packed->file, packed->name, "is INT4 pack-quantized but config.json has no compressed-tensors quantization_config");
      if (!want_int4)
        format_error(packed->file, packed->name, "is INT4 pack-quantized but quantization_config's ignore list keeps this layer unquantized");
      const int64_t gs = cfg_.int4.group_size;
      const TensorInfo& scale = ckpt_.get(base + ".weight_scale");
      const TensorInfo& shape = ckpt_.get(base + ".weight_shape");
      if (packed->dtype != DType::I32) format_error(packed->file, packed->name, std::string("dtype ") + dtype_name(packed->dtype) + " must be I32");
      if (scale.dtype != DType::BF16) format_error(scale.file, scale.name, std::string("dtype ") + dtype_name(scale.dtype) + " must be BF16");
      if (shape.dtype != DType::I32 || shape.numel() != 2) format_error(shape.file, shape.name, "must be I32 [2]");
      const int32_t* ws = reinterpret_cast<const int32_t*>(shape.data);
      if (ws[0] != rows || ws[1] != cols)
        format_error(shape.file, shape.name, "says [" + std::to_string(ws[0]) + ", " + std::to_string(ws[1]) +
                                                 "] but the config needs [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
      if (cols % 8 || cols % gs) format_error(packed->file, packed->name, "in-features " + std::to_string(cols) + " not a multiple of 8 and of the group size");
      expect_shape(*packed, {rows, cols / 8});
      expect_shape(scale, {rows, cols / gs});
      m.format = WeightFormat::INT4_GROUP;
      m.data = packed->data;
      m.scales = scale.data;
      m.scale_cols = cols / gs;
      m.group_size = gs;
      count("int4-group", packed->nbytes + scale.nbytes);
      return place(base, m);
    }
    const TensorInfo& t = ckpt_.get(base + ".weight");
    expect_shape(t, {rows, cols});
    m.data = t.data;
    if (t.ggml) {  // a GGUF file's block format: the blocks hold their scales
      m.format = *t.ggml;
      count(weight_format_name(m.format), t.nbytes);
      return place(base, m);
    }
    switch (t.dtype) {
      case DType::BF16: m.format = WeightFormat::BF16; break;
      case DType::F16: m.format = WeightFormat::F16; break;
      case DType::F32: m.format = WeightFormat::F32; break;
      case DType::F8_E4M3: {
        // DeepSeek names the block scales weight_scale_inv, compressed-tensors weight_scale.
        const TensorInfo* cs = ckpt_.find(base + ".weight_scale_inv") ? nullptr : ckpt_.find(base + ".weight_scale");
        const TensorInfo& s = cs ? *cs : ckpt_.get(base + ".weight_scale_inv");
        if (s.dtype != DType::F32) format_error(s.file, s.name, std::string("dtype ") + dtype_name(s.dtype) + " must be F32");
        expect_shape(s, {(rows + 127) / 128, (cols + 127) / 128});
        m.format = WeightFormat::FP8_BLOCK128;
        if (cfg_.ue8m0_scales) check_ue8m0(s);
        m.scales = s.data;
        m.scale_cols = (cols + 127) / 128;
        count("fp8-block128", s.nbytes);
        break;
      }
      case DType::I8: int8_groups(base, t, m); break;
      default:
        format_error(t.file, t.name, std::string("dtype ") + dtype_name(t.dtype) + " is not supported for a weight");
    }
    count(weight_format_name(m.format), t.nbytes);
    return place(base, m);
  }

  // compressed-tensors int-quantized INT8 (an I8 `weight`): one BF16 `weight_scale` per group of
  // the config's group size along a row; a `weight_zero_point`, where saved, must be all zero
  // (symmetric). In-features that are not whole groups are an error.
  void int8_groups(const std::string& base, const TensorInfo& t, MatrixView& m) {
    const int64_t gs = cfg_.int8_group_size, rows = m.rows, cols = m.cols;
    if (gs <= 0)
      format_error(t.file, t.name, "is INT8 but config.json has no int-quantized group (num_bits 8, strategy group)");
    if (cols % gs)
      format_error(t.file, t.name, "in-features " + std::to_string(cols) + " not a multiple of the INT8 group size " +
                                       std::to_string(gs));
    const TensorInfo& scale = ckpt_.get(base + ".weight_scale");
    if (scale.dtype != DType::BF16) format_error(scale.file, scale.name, std::string("dtype ") + dtype_name(scale.dtype) + " must be BF16");
    expect_shape(scale, {rows, cols / gs});
    if (const TensorInfo* zp = ckpt_.find(base + ".weight_zero_point")) {
      for (size_t i = 0; i < zp->nbytes; ++i)
        if (zp->data[i] != 0) format_error(zp->file, zp->name, "is not zero: only symmetric INT8 is supported");
    }
    m.format = WeightFormat::INT8_GROUP;
    m.scales = scale.data;
    m.scale_cols = cols / gs;
    m.group_size = gs;
    count("int8-group", scale.nbytes);
  }

  // Whether an INT4 config group targets the layer: "Linear" targets every one; otherwise a name
  // or "re:" pattern must match (as the ignore list is matched).
  bool int4_targeted(const std::string& plain, const std::string& base) const {
    if (cfg_.int4.targets.empty()) return true;
    for (const auto& t : cfg_.int4.targets)
      if (t == "Linear" || names_layer(t, plain, base)) return true;
    return false;
  }

  // Quantize at load: converts m when its class has a target format other than its own, keeps
  // the copy, and releases the mapped pages it was read from.
  MatrixView place(const std::string& base, const MatrixView& m) {
    const size_t src_bytes = m.bytes() + m.scale_bytes();
    MatrixView out = m;
    const WeightClass wc = weight_class(base);
    const auto to = quantize_ ? quantize_->target(wc) : std::nullopt;
    const WeightFormat want = to ? quant::weight_format(*to) : m.format;
    if (want != m.format) {
      quant::QuantizedMatrix q;
      try {
        q = quant::quantize_matrix(m, *to, quantize_->rule, quantize_->group_size);
      } catch (const std::invalid_argument& e) {
        format_error(ckpt_.dir(), base, std::string("cannot quantize at load: ") + e.what());
      }
      auto& qe = w_.quantized[weight_class_name(wc)];
      qe.err2 += q.err2;
      qe.ref2 += q.ref2;
      qe.tensors += 1;
      if ((w_.bytes_by_format[weight_format_name(m.format)] -= src_bytes) == 0)
        w_.bytes_by_format.erase(weight_format_name(m.format));
      out = q.view();
      count(std::string(weight_format_name(out.format)) + " (quantized at load)", out.bytes() + out.scale_bytes());
      auto data = std::make_unique<std::vector<uint8_t>>(std::move(q.data));
      auto scales = std::make_unique<std::vector<uint8_t>>(std::move(q.scales));
      out.data = data->data();
      out.scales = scales->empty() ? nullptr : scales->data();
      w_.owned.push_back(std::move(data));
      w_.owned.push_back(std::move(scales));
      release_mapped_range(m.data, m.bytes());
      if (m.scales) release_mapped_range(m.scales, m.scale_bytes());
    }
    done_ += src_bytes;
    if (progress_ && *progress_) (*progress_)(std::min(done_, total_), total_);
    return out;
  }

  std::vector<float> vec(const std::string& name, int64_t n) {
    const TensorInfo& t = ckpt_.get(name);
    expect_shape(t, {n});
    std::vector<float> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* p = t.data + size_t(i) * dtype_size(t.dtype);
      switch (t.dtype) {
        case DType::F32: { float f; std::memcpy(&f, p, 4); out[size_t(i)] = f; break; }
        case DType::BF16: { uint16_t h; std::memcpy(&h, p, 2); out[size_t(i)] = bf16_to_f32(h); break; }
        case DType::F16: { uint16_t h; std::memcpy(&h, p, 2); out[size_t(i)] = f16_to_f32(h); break; }
        default: format_error(t.file, t.name, std::string("dtype ") + dtype_name(t.dtype) + " is not supported for a vector");
      }
    }
    count(std::string(dtype_name(t.dtype)) + " (norms, biases)", t.nbytes);
    return out;
  }

  Mlp mlp(const std::string& prefix, int64_t inter) {
    const int64_t hd = cfg_.hidden_size;
    return {matrix(prefix + "gate_proj", inter, hd), matrix(prefix + "up_proj", inter, hd),
            matrix(prefix + "down_proj", hd, inter)};
  }

  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  bool with_mtp_ = false;
  parallel::ExpertRange experts_;
  const LoadQuantization* quantize_ = nullptr;
  const std::function<void(size_t, size_t)>* progress_ = nullptr;
  size_t done_ = 0, total_ = 0;
  ModelWeights w_;
};

}  // namespace

std::vector<float> kv_b_from_heads(const MatrixView& uk_t, const MatrixView& uv, int64_t heads) {
  const int64_t kvr = uk_t.rows / heads, nope = uk_t.cols, vd = uv.rows / heads;
  std::vector<float> out(size_t(heads * (nope + vd) * kvr)), row(static_cast<size_t>(nope));
  for (int64_t h = 0; h < heads; ++h) {
    float* head = out.data() + h * (nope + vd) * kvr;
    for (int64_t k = 0; k < kvr; ++k) {  // W_UK^T's row k is column k of W_UK
      uk_t.dequant_row(h * kvr + k, row.data());
      for (int64_t d = 0; d < nope; ++d) head[d * kvr + k] = row[size_t(d)];
    }
    for (int64_t j = 0; j < vd; ++j) uv.dequant_row(h * vd + j, head + (nope + j) * kvr);
  }
  return out;
}

bool has_mtp_module(const Checkpoint& ckpt, const ModelConfig& cfg) {
  return cfg.num_nextn_predict_layers > 0 &&
         ckpt.find(cfg.weight_prefix + "model.layers." + std::to_string(cfg.num_hidden_layers) + ".eh_proj.weight");
}

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, bool with_mtp, parallel::ExpertRange experts) {
  return Loader(ckpt, cfg, with_mtp, experts).load();
}

ModelWeights load_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const LoadQuantization& quantize,
                          const std::function<void(size_t, size_t)>& progress, bool with_mtp,
                          parallel::ExpertRange experts) {
  return Loader(ckpt, cfg, with_mtp, experts, &quantize, &progress).load();
}

static bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

WeightClass weight_class(const std::string& base) {
  if (base.find(".mlp.experts.") != std::string::npos) return WeightClass::RoutedExperts;
  if (base.find(".mlp.shared_experts.") != std::string::npos) return WeightClass::SharedExperts;
  if (base.find(".self_attn.") != std::string::npos) return WeightClass::Attention;
  if (ends_with(base, "embed_tokens") || ends_with(base, "lm_head")) return WeightClass::EmbedHead;
  if (base.find(".mlp.") != std::string::npos &&
      (ends_with(base, ".gate_proj") || ends_with(base, ".up_proj") || ends_with(base, ".down_proj")))
    return WeightClass::DenseMlp;
  return WeightClass::None;
}

const char* weight_class_name(WeightClass c) {
  switch (c) {
    case WeightClass::None: return "unquantized";
    case WeightClass::RoutedExperts: return "routed experts";
    case WeightClass::Attention: return "attention";
    case WeightClass::SharedExperts: return "shared experts";
    case WeightClass::DenseMlp: return "dense mlp";
    case WeightClass::EmbedHead: return "embeddings/lm_head";
  }
  return "?";
}

std::optional<quant::QuantFormat> LoadQuantization::target(WeightClass c) const {
  switch (c) {
    case WeightClass::RoutedExperts: return experts;
    case WeightClass::Attention: case WeightClass::SharedExperts: case WeightClass::DenseMlp: return others;
    case WeightClass::EmbedHead: return embed_head;
    case WeightClass::None: return std::nullopt;
  }
  return std::nullopt;
}

LoadQuantization LoadQuantization::parse(const std::string& spec) {
  LoadQuantization q;
  size_t at = 0;
  while (at <= spec.size() && !spec.empty()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string part = spec.substr(at, comma - at);
    const size_t eq = part.find('=');
    if (eq == std::string::npos)
      throw std::invalid_argument("--quantize: '" + part + "' is not class=format (experts=int4,others=fp8)");
    const std::string cls = part.substr(0, eq), fmt = part.substr(eq + 1);
    const auto f = quant::parse_quant_format(fmt, "--quantize " + cls);
    if (cls == "experts") q.experts = f;
    else if (cls == "others") q.others = f;
    else if (cls == "embed") q.embed_head = f;
    else throw std::invalid_argument("--quantize: unknown class '" + cls + "' (experts, others, embed)");
    if (f == quant::QuantFormat::INT4 && cls != "experts")
      throw std::invalid_argument("--quantize " + cls + "=int4: INT4 is for the routed experts only (others: int8, fp8 or bf16)");
    at = comma + 1;
  }
  return q;
}

std::string LoadQuantization::str() const {
  std::string s;
  auto add = [&](const char* k, const std::optional<quant::QuantFormat>& f) {
    if (!f) return;
    if (!s.empty()) s += ',';
    s.append(k).append("=").append(quant::quant_format_name(*f));
  };
  add("experts", experts);
  add("others", others);
  add("embed", embed_head);
  return s;
}

std::string weight_bytes_summary(const ModelWeights& w) {
  std::vector<std::pair<size_t, std::string>> parts;
  size_t total = 0;
  for (auto& [fmt, n] : w.bytes_by_format) {
    parts.push_back({n, fmt});
    total += n;
  }
  std::sort(parts.begin(), parts.end(), [](auto& a, auto& b) { return a.first > b.first; });
  auto gb = [](size_t n) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f GB", double(n) / 1e9);
    return std::string(buf);
  };
  std::string s = gb(total) + " resident:";
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : " ") + parts[i].second + " " + gb(parts[i].first);
  return s;
}

}  // namespace mla
