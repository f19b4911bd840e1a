// The weights a decoded token reads, and the FLOPs of a prompt (see tools/bench.h).
#include "tools/bench/sections.h"

namespace mla::bench {

namespace {

double view_params(const MatrixView& m) { return double(m.rows) * double(m.cols); }

// The first routed expert of a layer that this process holds (expert-parallel, the others are
// empty views); null when it holds none, or for a dense layer.
const Mlp* first_held_expert(const LayerWeights& L) {
  for (const Mlp& e : L.experts)
    if (e.gate.data) return &e;
  return nullptr;
}

// Faults in every page of a weight view.
uint64_t touch(const MatrixView& m) {
  uint64_t s = 0;
  const volatile uint8_t* p = static_cast<const uint8_t*>(m.data);
  for (size_t i = 0; i < m.bytes(); i += 4096) s += p[i];
  if (m.scales) {
    const volatile uint8_t* q = static_cast<const uint8_t*>(m.scales);
    for (size_t i = 0; i < m.scale_bytes(); i += 4096) s += q[i];
  }
  return s;
}

}  // namespace

double expert_bytes(const LayerWeights& L) {
  const Mlp* e = L.moe ? first_held_expert(L) : nullptr;
  if (!e) return 0;
  return view_bytes(e->gate) + view_bytes(e->up) + view_bytes(e->down);
}

double held_routed_bytes(const ModelWeights& w) {
  double n = 0;
  auto layer = [&](const LayerWeights& L) {
    for (const Mlp& e : L.experts)
      for (const MatrixView* m : {&e.gate, &e.up, &e.down})
        if (m->data) n += view_bytes(*m);
  };
  for (const auto& L : w.layers) layer(L);
  for (const auto& M : w.mtp) layer(M.layer);
  return n;
}

bool held_int_experts(const ModelWeights& w) {
  for (const auto& L : w.layers)
    if (const Mlp* e = first_held_expert(L)) return is_int_group(e->gate.format);
  return false;
}

uint64_t touch_all(const ModelWeights& w) {
  uint64_t s = touch(w.embed) + touch(w.lm_head);
  for (const auto& L : w.layers) {
    for (const MatrixView* m : {&L.q_a, &L.q_b, &L.q, &L.kv_a, &L.kv_b, &L.o, &L.router})
      if (m->data) s += touch(*m);
    for (const auto& m : L.w_uk_t) s += touch(m);
    auto mlp = [&](const Mlp& p) {
      if (p.gate.data) s += touch(p.gate) + touch(p.up) + touch(p.down);
    };
    mlp(L.dense);
    mlp(L.shared);
    for (const auto& e : L.experts) mlp(e);
  }
  return s;
}

ActiveWeights active_weights(const ModelWeights& w, const ModelConfig& c) {
  ActiveWeights a;
  auto add = [&](const std::string& part, const MatrixView& m, double times = 1) {
    a.bytes += times * view_bytes(m);
    a.params += times * view_params(m);
    a.bytes_by_part[part] += times * view_bytes(m);
    a.params_by_part[part] += times * view_params(m);
  };
  each_fixed_weight(w, [&](const char* part, const MatrixView& m) { add(part, m); });
  // The routed experts at one held expert's size (expert-parallel: this rank's first).
  for (const auto& L : w.layers)
    if (const Mlp* e = L.moe ? first_held_expert(L) : nullptr)
      for (const MatrixView* m : {&e->gate, &e->up, &e->down})
        if (m->data) add("routed experts", *m, double(c.num_experts_per_tok));
  a.bytes += double(w.embed.row_bytes());
  a.params += double(w.embed.cols);
  a.bytes_by_part["embedding row"] += double(w.embed.row_bytes());
  a.params_by_part["embedding row"] += double(w.embed.cols);
  return a;
}

double prompt_flops(const ActiveWeights& a, const ModelConfig& c, int64_t T) {
  double per_token = 0;
  for (auto& [part, params] : a.params_by_part)
    if (part != "lm_head" && part != "embedding row") per_token += params;
  const double lm = a.params_by_part.count("lm_head") ? a.params_by_part.at("lm_head") : 0;
  const double pairs = double(T) * double(T + 1) / 2;
  const double attn = 2 * pairs * double(c.num_attention_heads) * double(c.qk_head_dim() + c.v_head_dim) *
                      double(c.num_hidden_layers);
  return 2 * per_token * double(T) + 2 * lm + attn;
}

}  // namespace mla::bench
