"""A plain numpy forward pass of the DeepSeek Sparse Attention families, DeepSeek-V3.2
(`deepseek_v32`) and GLM-5 (`glm_moe_dsa`): MLA as ../../shared/reference/mla_reference.py
computes it (whose functions this file imports), plus the lightning indexer and attention over
each query's top-k positions. It follows DeepSeek-V3.2-Exp inference/model.py (class Indexer)
without its FP8 steps (q and k are not quantized; the index score is computed in float32):

  q_idx[t, h] = wq_b(qr[t]) split [rope | rest]   (qr: the MLA's q_a_layernorm(q_a_proj(x)))
  k_idx[t]    = LayerNorm(wk(x[t])) (weight, bias, eps 1e-6) split [rope | rest]
  RoPE on the first qk_rope_head_dim values of both, with the MLA's frequencies, in halves
    (NeoX) pairing unless indexer_rope_interleave (then (even, odd) pairs like the MLA's own)
  q_idx, k_idx <- Hadamard(.) * index_head_dim^-0.5 (orthogonal: the scores do not change)
  w[t, h]     = weights_proj(x[t])[h] * index_n_heads^-0.5 * index_head_dim^-0.5
  I[t, s]     = sum_h w[t, h] * relu(q_idx[t, h] . k_idx[s]),  s <= t
  sel(t)      = the min(index_topk, t + 1) positions of largest I[t, :] among s <= t
  attention of query t over sel(t) only (the causal and the index masks together).

GLM-5's indexer_types (or index_topk_pattern, or index_topk_freq / index_skip_topk_offset as
transformers derives them): a "shared" layer runs no indexer and reuses the selection of the
layer before it.

Needs numpy (Debian: python3-numpy).
Usage: python3 dsa_reference.py MODEL_DIR        compare with MODEL_DIR/golden.safetensors
       python3 dsa_reference.py --self-check MODEL_DIR
         (dense MLA equality when index_topk >= every length, decode = teacher forcing, margins)"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "reference"))
import mla_reference as mr  # noqa: E402
import safetensors_np as st  # noqa: E402


def normalize_config(cfg):
    """transformers 5's rope_parameters folded back into rope_theta / rope_scaling (the form
    mla_reference reads)."""
    cfg = dict(cfg)
    rp = cfg.get("rope_parameters")
    if rp:
        cfg["rope_theta"] = rp["rope_theta"]
        t = rp.get("rope_type", "default")
        if t == "yarn":
            cfg["rope_scaling"] = {k: v for k, v in rp.items() if k not in ("rope_theta",)}
            cfg["rope_scaling"]["type"] = "yarn"
        elif t == "default":
            cfg["rope_scaling"] = None
        else:
            raise ValueError(f"rope type {t!r} is not supported")
    return cfg


def indexer_types(cfg):
    L = cfg["num_hidden_layers"]
    if cfg.get("indexer_types"):
        return list(cfg["indexer_types"])
    pat = cfg.get("index_topk_pattern")
    if pat:
        return [{"F": "full", "S": "shared"}[c] for c in pat]
    freq = max(cfg.get("index_topk_freq", 1) or 1, 1)
    off = cfg.get("index_skip_topk_offset", 2)
    return ["full" if (max(i - off + 1, 0) % freq) == 0 else "shared" for i in range(L)]


def hadamard(n):
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    assert h.shape[0] == n, "index_head_dim must be a power of two"
    return h


def rope_halves(x, cos, sin):  # x [T, ..., dim]: (i, i + dim/2) pairs (NeoX)
    d = x.shape[-1] // 2
    c = cos.reshape(cos.shape[0], *([1] * (x.ndim - 2)), -1)
    s = sin.reshape(sin.shape[0], *([1] * (x.ndim - 2)), -1)
    x1, x2 = x[..., :d], x[..., d:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def layer_norm(x, wt, b, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * wt + b


def index_scores(cfg, w, a, x, qr, cos, sin):
    """I [T, T] in float32 (-inf above the diagonal)."""
    T = x.shape[0]
    Hi, D, R = cfg["index_n_heads"], cfg["index_head_dim"], cfg["qk_rope_head_dim"]
    rot = mr.rope if cfg.get("indexer_rope_interleave", False) else rope_halves
    q = (qr @ w[a + "indexer.wq_b.weight"].T).reshape(T, Hi, D)
    q = np.concatenate([rot(q[..., :R], cos, sin), q[..., R:]], -1)
    k = layer_norm(x @ w[a + "indexer.wk.weight"].T, w[a + "indexer.k_norm.weight"], w[a + "indexer.k_norm.bias"])
    k = np.concatenate([rot(k[:, :R], cos, sin), k[:, R:]], -1)
    Hm = hadamard(D) * D ** -0.5
    q, k = q @ Hm.T, k @ Hm.T
    wt = (x @ w[a + "indexer.weights_proj.weight"].T) * Hi ** -0.5 * D ** -0.5
    q32, k32, w32 = q.astype(np.float32), k.astype(np.float32), wt.astype(np.float32)
    s = np.maximum(np.einsum("thd,sd->ths", q32, k32), np.float32(0))
    I = np.einsum("ths,th->ts", s, w32).astype(np.float32)
    return np.where(np.tril(np.ones((T, T), bool)), I, np.float32(-np.inf))


def select(I, topk, stats=None):
    """Boolean [T, T]: each row's top-k among s <= t (all of them when t + 1 <= topk)."""
    T = I.shape[0]
    m = np.zeros((T, T), bool)
    for t in range(T):
        if t + 1 <= topk:
            m[t, : t + 1] = True
            continue
        row = I[t, : t + 1].astype(np.float64)
        order = np.argsort(-row, kind="stable")
        m[t, order[:topk]] = True
        if stats is not None:
            gap = (row[order[topk - 1]] - row[order[topk]]) / max(np.abs(row).max(), 1e-30)
            stats["min_margin"] = min(stats.get("min_margin", np.inf), gap)
            stats["sparse_rows"] = stats.get("sparse_rows", 0) + 1
    return m


def mlp(w, pre, xx):
    return (mr.silu(xx @ w[pre + "gate_proj.weight"].T) * (xx @ w[pre + "up_proj.weight"].T)) @ w[pre + "down_proj.weight"].T


def moe(cfg, w, p, x):
    """Sigmoid scores with e_score_correction_bias and noaux_tc group-limited top-k (DeepSeek-V3's
    routing, which both families use)."""
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    ng, tg = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    lg = x @ w[p + "mlp.gate.weight"].T
    out = mlp(w, p + "mlp.shared_experts.", x)
    for t in range(x.shape[0]):
        sc = 1 / (1 + np.exp(-lg[t]))
        choice = sc + w[p + "mlp.gate.e_score_correction_bias"]
        if ng > 1:
            g = choice.reshape(ng, -1)
            keep = np.argsort(-np.sort(g, -1)[:, -2:].sum(-1), kind="stable")[:tg]
            msk = np.zeros(ng, bool)
            msk[keep] = True
            choice = np.where(np.repeat(msk, E // ng), choice, -np.inf)
        idx = np.argsort(-choice, kind="stable")[:K]
        wt = sc[idx]
        if cfg.get("norm_topk_prob"):
            wt = wt / (wt.sum() + 1e-20)
        wt = wt * cfg.get("routed_scaling_factor", 1.0)
        for e_i, we in zip(idx, wt):
            out[t] += we * mlp(w, p + f"mlp.experts.{e_i}.", x[t : t + 1])[0]
    return out


def forward(cfg, w, ids, path="absorb", topk=None, stats=None, selections=None):
    """Logits [T, vocab] and each layer's output, float64 (index scores in float32). topk:
    overrides index_topk (None: the config's). selections: a list that receives each layer's
    [T, T] selection mask."""
    cfg = normalize_config(cfg)
    T = len(ids)
    H, nope, rdim, vd = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvr, eps = cfg["kv_lora_rank"], cfg["rms_norm_eps"]
    topk = cfg["index_topk"] if topk is None else topk
    cos, sin, scale = mr.rope_tables(cfg, T)
    types = indexer_types(cfg)
    h = w["model.embed_tokens.weight"][ids]
    causal = np.tril(np.ones((T, T), bool))
    hiddens = [h.copy()]
    sel = None
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        x = mr.rms(h, w[p + "input_layernorm.weight"], eps)
        qr = mr.rms(x @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], eps)
        q = (qr @ w[a + "q_b_proj.weight"].T).reshape(T, H, nope + rdim)
        q_nope, q_pe = q[..., :nope], mr.rope(q[..., nope:], cos, sin)
        kv = x @ w[a + "kv_a_proj_with_mqa.weight"].T
        c = mr.rms(kv[:, :kvr], w[a + "kv_a_layernorm.weight"], eps)
        k_pe = mr.rope(kv[:, kvr:], cos, sin)
        if types[l] == "full" or sel is None:
            sel = select(index_scores(cfg, w, a, x, qr, cos, sin), topk, stats) if T > topk else causal
        if selections is not None:
            selections.append(sel.copy())
        mask = causal & sel
        wkvb = w[a + "kv_b_proj.weight"].reshape(H, nope + vd, kvr)
        w_uk, w_uv = wkvb[:, :nope, :], wkvb[:, nope:, :]
        if path == "expand":
            kvx = np.einsum("tc,hdc->thd", c, wkvb)
            s = (np.einsum("thd,shd->hts", q_nope, kvx[..., :nope]) + np.einsum("thd,sd->hts", q_pe, k_pe)) * scale
            s = np.where(mask[None], s, -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", pr, kvx[..., nope:])
        else:
            q_lat = np.einsum("thd,hdc->thc", q_nope, w_uk)
            s = (np.einsum("thc,sc->hts", q_lat, c) + np.einsum("thd,sd->hts", q_pe, k_pe)) * scale
            s = np.where(mask[None], s, -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            o = np.einsum("thc,hdc->thd", np.einsum("hts,sc->thc", pr, c), w_uv)
        h = h + o.reshape(T, H * vd) @ w[a + "o_proj.weight"].T
        x = mr.rms(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + (mlp(w, p + "mlp.", x) if l < cfg["first_k_dense_replace"] else moe(cfg, w, p, x))
        hiddens.append(h.copy())
    hn = mr.rms(h, w["model.norm.weight"], eps)
    hiddens[-1] = hn
    return hn @ w["lm_head.weight"].T, hiddens


def dense_mla_config(cfg):
    """The same model read as plain MLA (mla_reference's deepseek_v3), the indexer left out."""
    c = normalize_config(cfg)
    c["model_type"] = "deepseek_v3"
    return c


def self_check(d):
    """Returns a dict of the checks' worst figures; raises AssertionError when one fails."""
    cfg, w = mr.load_model(d)
    g = st.load(os.path.join(d, "golden.safetensors"))
    out = {}
    ids = g["seq3_ids"][0]
    T = len(ids)
    # 1. top-k at least the length: DSA is dense MLA on the same weights, on both paths.
    big = max(T, cfg["index_topk"])
    dense, _ = mr.forward(dense_mla_config(cfg), w, ids, "absorb")
    for path in ("absorb", "expand"):
        lg, _ = forward(cfg, w, ids, path, topk=big)
        out[f"dense_equal_{path}"] = float(np.abs(lg - dense).max())
        assert out[f"dense_equal_{path}"] < 1e-9, out
    # 2. token by token (each step sees only its prefix) equals teacher forcing.
    full, _ = forward(cfg, w, ids)
    worst = 0.0
    for n in range(1, T + 1, 7):
        lg, _ = forward(cfg, w, ids[:n])
        worst = max(worst, float(np.abs(lg[-1] - full[n - 1]).max()))
    out["decode_vs_teacher"] = worst
    assert worst < 1e-9, out
    # 3. the two attention paths agree under sparsity, and sparsity is real.
    lg_e, _ = forward(cfg, w, ids, "expand")
    out["expand_vs_absorb"] = float(np.abs(lg_e - full).max())
    assert out["expand_vs_absorb"] < 1e-9, out
    if T > cfg["index_topk"]:
        out["sparse_vs_dense"] = float(np.abs(full - dense).max())
        assert out["sparse_vs_dense"] > 1e-3, out
    # 4. the margin between the k-th and (k+1)-th index score over every sequence and layer.
    stats = {}
    for j in range(4):
        forward(cfg, w, g[f"seq{j}_ids"][0], stats=stats)
    out.update(stats)
    if stats.get("sparse_rows"):
        assert stats["min_margin"] > 1e-4, out
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--self-check":
        d = sys.argv[2]
        print(os.path.basename(d.rstrip("/")), {k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in self_check(d).items()})
        sys.exit(0)
    d = sys.argv[1]
    cfg, w = mr.load_model(d)
    g = st.load(os.path.join(d, "golden.safetensors"))
    worst = {}
    for j in range(4):
        ids = g[f"seq{j}_ids"][0]
        for path in ("expand", "absorb"):
            lg, _ = forward(cfg, w, ids, path)
            worst[path] = max(worst.get(path, 0), float(np.abs(lg - g[f"seq{j}_logits"][0]).max()))
    print(os.path.basename(d.rstrip("/")), {k: f"{v:.2e}" for k, v in worst.items()})
    sys.exit(0 if max(worst.values()) < 1e-4 else 1)
