#!/usr/bin/env python3
"""Train a small DeepSeek-V3-architecture model on Debian's English text and export it in the
HuggingFace hub layout that `mla` loads (config.json, model.safetensors in bf16,
generation_config.json, tokenizer.json, tokenizer_config.json).

The model: MLA with q-LoRA and decoupled (interleaved) RoPE, a dense first layer, sigmoid-routed
MoE with one shared expert, grouped top-k (noaux_tc) and the auxiliary-loss-free bias balancing
(e_score_correction_bias nudged toward equal expert load after every step), and one MTP module
(layer num_hidden_layers) trained with its own next-next-token loss. The tokenizer: a byte-level
BPE trained here on the same text (GPT-2's pre-tokenizer pattern; the corpus is ASCII).

Run by hand, never by CI. See README.md beside this file for the command, corpus and results.
Needs Debian's python3-torch (1.13) and python3-numpy; fortunes and fortunes-min for the corpus.
"""
import argparse
import collections
import csv
import glob
import heapq
import json
import math
import os
import random
import re
import struct
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from corpus import build_corpus

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
N_SPECIAL = 2

# ---------------------------------------------------------------- corpus


# ---------------------------------------------------------------- byte-level BPE

# GPT-2's pre-tokenizer pattern (the one HuggingFace's ByteLevel pre-tokenizer applies with
# use_regex true), with the Unicode classes written for ASCII text: \p{L} = [A-Za-z],
# \p{N} = [0-9]. The corpus is ASCII, so this splits it exactly as the tokenizer.json will.
GPT2_SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def learning_rate(a, step, t_train, train_budget):
    """Linear warm-up over a.warmup steps, then cosine decay to 0.1 of a.lr; the decay follows
    the steps done or the time spent of the budget (seconds, 0: none), whichever is further."""
    progress = step / a.steps
    if train_budget:
        progress = max(progress, (time.time() - t_train) / train_budget)
    progress = min(progress, 1.0)
    return a.lr * min(1.0, step / a.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def train_bpe(docs, vocab_size):
    """Byte-level BPE: returns the merges (pairs of token strings), most frequent first.
    Ties break on the pair itself, so the result depends only on the text."""
    b2u = bytes_to_unicode()
    counts = collections.Counter()
    for d in docs:
        counts.update(GPT2_SPLIT.findall(d))
    words = [[b2u[b] for b in w.encode()] for w in counts]
    freq = list(counts.values())
    pairs = collections.defaultdict(int)
    where = collections.defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    merges = []
    n_merges = vocab_size - N_SPECIAL - 256
    while len(merges) < n_merges and heap:
        c, p = heapq.heappop(heap)
        if -c != pairs.get(p, 0) or c == 0:
            continue  # stale entry
        merges.append(p)
        a, b = p
        ab = a + b
        changed = collections.defaultdict(int)
        for i in list(where[p]):
            w = words[i]
            j, nw = 0, []
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    nw.append(ab)
                    j += 2
                else:
                    nw.append(w[j])
                    j += 1
            if nw == w:
                continue
            f = freq[i]
            for x, y in zip(w, w[1:]):
                pairs[(x, y)] -= f
                changed[(x, y)] += 0
            for x, y in zip(nw, nw[1:]):
                pairs[(x, y)] += f
                where[(x, y)].add(i)
                changed[(x, y)] += 0
            words[i] = nw
        pairs.pop(p, None)
        where.pop(p, None)
        for q in changed:
            if q != p and pairs.get(q, 0) > 0:
                heapq.heappush(heap, (-pairs[q], q))
    return merges


class Bpe:
    def __init__(self, merges):
        self.b2u = bytes_to_unicode()
        self.vocab = {BOS: 0, EOS: 1}
        for b in range(256):
            self.vocab[self.b2u[b]] = N_SPECIAL + b
        for a, b in merges:
            self.vocab[a + b] = len(self.vocab)
        self.rank = {p: i for i, p in enumerate(merges)}
        self.cache = {}

    def word(self, w):
        if w in self.cache:
            return self.cache[w]
        parts = [self.b2u[b] for b in w.encode()]
        while len(parts) > 1:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                r = self.rank.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        ids = [self.vocab[p] for p in parts]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        out = []
        for w in GPT2_SPLIT.findall(text):
            out.extend(self.word(w))
        return out


def write_tokenizer(out_dir, bpe, merges):
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate([BOS, EOS])]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": bpe.vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    template = ("{{ bos_token }}{% for message in messages %}"
                "{% if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}"
                "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n\\n' }}"
                "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}"
                "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS, "pad_token": EOS,
           "unk_token": None, "clean_up_tokenization_spaces": False, "model_max_length": 256,
           "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


# ---------------------------------------------------------------- model


def model_config(a, vocab):
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab,
        "hidden_size": a.hidden,
        "intermediate_size": a.dense_inter,
        "moe_intermediate_size": a.moe_inter,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.heads,
        "n_shared_experts": 1,
        "n_routed_experts": a.experts,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": a.kv_lora,
        "q_lora_rank": a.q_lora,
        "qk_rope_head_dim": a.rope_dim,
        "v_head_dim": a.v_dim,
        "qk_nope_head_dim": a.nope_dim,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 4,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": a.seq,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "num_nextn_predict_layers": 1,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
    }


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def lin(i, o):
    return nn.Linear(i, o, bias=False)


def rope(x, cos, sin):
    """Interleaved pairs (x[2i], x[2i+1]) rotated by position; x [B, T, ..., d], cos/sin [T, d/2]."""
    shape = (1, cos.shape[0]) + (1,) * (x.dim() - 3) + (cos.shape[1],)
    c, s = cos.view(shape), sin.view(shape)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.H, self.nope, self.rd, self.vd, self.kvr = (c["num_attention_heads"], c["qk_nope_head_dim"],
                                                         c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"])
        D, eps = c["hidden_size"], c["rms_norm_eps"]
        self.q_a_proj = lin(D, c["q_lora_rank"])
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], eps)
        self.q_b_proj = lin(c["q_lora_rank"], self.H * (self.nope + self.rd))
        self.kv_a_proj_with_mqa = lin(D, self.kvr + self.rd)
        self.kv_a_layernorm = RMSNorm(self.kvr, eps)
        self.kv_b_proj = lin(self.kvr, self.H * (self.nope + self.vd))
        self.o_proj = lin(self.H * self.vd, D)
        self.scale = (self.nope + self.rd) ** -0.5

    def forward(self, x, cos, sin, mask, probs=None):
        """mask: True where a query may not attend ([T, T], or [B, 1, T, T] per sequence); probs: a
        list that receives the attention probabilities [B, H, T, T] (float32)."""
        B, T, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, self.H, self.nope + self.rd)
        q_nope, q_pe = q[..., :self.nope], rope(q[..., self.nope:], cos, sin)
        kv = self.kv_a_proj_with_mqa(x)
        c = self.kv_a_layernorm(kv[..., :self.kvr])
        k_pe = rope(kv[..., self.kvr:], cos, sin)  # [B, T, rd], shared by the heads
        kvx = self.kv_b_proj(c).view(B, T, self.H, self.nope + self.vd)
        k_nope, v = kvx[..., :self.nope], kvx[..., self.nope:]
        s = torch.einsum("bthd,bshd->bhts", q_nope, k_nope) + torch.einsum("bthd,bsd->bhts", q_pe, k_pe)
        p = (s.float() * self.scale).masked_fill(mask, float("-inf")).softmax(-1)
        if probs is not None:
            probs.append(p)
        o = torch.einsum("bhts,bshd->bthd", p.to(v.dtype), v)
        return self.o_proj(o.reshape(B, T, self.H * self.vd))


class Mlp(nn.Module):
    def __init__(self, D, inter):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = lin(D, inter), lin(D, inter), lin(inter, D)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c["n_routed_experts"], c["hidden_size"]))
        # Not trained by the loss: the balancing rule moves it (see MoE.update_bias).
        self.register_buffer("e_score_correction_bias", torch.zeros(c["n_routed_experts"]))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.E, self.K = c["n_routed_experts"], c["num_experts_per_tok"]
        self.ng, self.tg = c["n_group"], c["topk_group"]
        self.scale = c["routed_scaling_factor"]
        self.gate = Gate(c)
        self.experts = nn.ModuleList(Mlp(c["hidden_size"], c["moe_intermediate_size"]) for _ in range(self.E))
        self.shared_experts = Mlp(c["hidden_size"], c["n_shared_experts"] * c["moe_intermediate_size"])
        self.load = torch.zeros(self.E)

    def route(self, x):
        """x [N, D] -> the sigmoid scores [N, E] and the K experts chosen per row [N, K]."""
        N = x.shape[0]
        # The router in float32 even under bf16 autocast: the routing must be the one inference computes.
        with torch.autocast("cpu", enabled=False):
            scores = torch.sigmoid(x.float() @ self.gate.weight.t())
        with torch.no_grad():
            choice = scores + self.gate.e_score_correction_bias
            g = choice.view(N, self.ng, -1).topk(2, -1).values.sum(-1)
            keep = torch.zeros_like(g, dtype=torch.bool).scatter_(1, g.topk(self.tg, -1).indices, True)
            choice = choice.masked_fill(~keep.repeat_interleave(self.E // self.ng, 1), float("-inf"))
            idx = choice.topk(self.K, -1).indices
        return scores, idx

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        N = x.shape[0]
        scores, idx = self.route(x)
        self.load += torch.bincount(idx.flatten(), minlength=self.E).float()
        w = scores.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * self.scale
        out = self.shared_experts(x).float()
        flat_idx, flat_w = idx.flatten(), w.flatten()
        tok = torch.arange(N).repeat_interleave(self.K)
        order = torch.argsort(flat_idx)
        counts = torch.bincount(flat_idx, minlength=self.E).tolist()
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            sel = order[start:start + n]
            start += n
            t = tok[sel]
            y = self.experts[e](x[t]) * flat_w[sel].unsqueeze(1)
            out = out.index_add(0, t, y.float())
        return out.view(shape)

    @torch.no_grad()
    def update_bias(self, rate):
        """DeepSeek-V3's auxiliary-loss-free balancing: raise the bias of under-loaded experts,
        lower it for over-loaded ones, by a fixed step."""
        self.gate.e_score_correction_bias += rate * torch.sign(self.load.mean() - self.load)
        self.load.zero_()


class Layer(nn.Module):
    def __init__(self, c, moe):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MoE(c) if moe else Mlp(c["hidden_size"], c["intermediate_size"])

    def forward(self, h, cos, sin, mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class MtpLayer(Layer):
    """The MTP module: its decoder layer plus enorm, hnorm, eh_proj and shared_head.norm (the head
    itself is the main lm_head, as DeepSeek-V3 shares it)."""

    def __init__(self, c):
        super().__init__(c, True)
        D, eps = c["hidden_size"], c["rms_norm_eps"]
        self.enorm, self.hnorm = RMSNorm(D, eps), RMSNorm(D, eps)
        self.eh_proj = lin(2 * D, D)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(D, eps)


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        L = c["num_hidden_layers"]
        self.layers = nn.ModuleList([Layer(c, l >= c["first_k_dense_replace"]) for l in range(L)] + [MtpLayer(c)])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.lm_head = lin(c["hidden_size"], c["vocab_size"])
        std = c["initializer_range"]
        for n, p in self.named_parameters():
            if n.endswith("norm.weight"):
                continue
            nn.init.normal_(p, 0.0, std)
            if n.endswith(("o_proj.weight", "down_proj.weight")):
                p.data /= math.sqrt(2 * (c["num_hidden_layers"] + 1))
        d, theta = c["qk_rope_head_dim"], c["rope_theta"]
        self.inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)

    def moes(self):
        return [m for m in self.modules() if isinstance(m, MoE)]

    def forward(self, ids):
        """ids [B, T+1]: main loss on tokens 1..T, MTP loss on tokens 2..T."""
        B, T1 = ids.shape
        T = T1 - 1
        x, y = ids[:, :-1], ids[:, 1:]
        ang = torch.arange(T).float()[:, None] * self.inv[None, :]
        cos, sin = ang.cos(), ang.sin()
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        emb = self.model.embed_tokens
        h = emb(x)
        L = self.c["num_hidden_layers"]
        for l in range(L):
            h = self.model.layers[l](h, cos, sin, mask)
        hn = self.model.norm(h)
        loss = F.cross_entropy(self.lm_head(hn).float().flatten(0, 1), y.flatten())
        # MTP: position i combines the main model's normed h_i with Emb(t_{i+1}) to predict t_{i+2}.
        m = self.model.layers[L]
        hm = m.eh_proj(torch.cat((m.enorm(emb(y[:, :-1])), m.hnorm(hn[:, :-1])), -1))
        hm = Layer.forward(m, hm, cos[:T - 1], sin[:T - 1], mask[:T - 1, :T - 1])
        mtp_loss = F.cross_entropy(self.lm_head(m.shared_head.norm(hm)).float().flatten(0, 1), y[:, 1:].flatten())
        return loss, mtp_loss


# ---------------------------------------------------------------- export


def bf16_bytes(t):
    return t.detach().float().contiguous().to(torch.bfloat16).view(torch.int16).numpy().tobytes()


def write_safetensors(path, tensors, f32=()):
    """tensors: name -> float tensor, stored as BF16 (F32 for the names in f32). Format: u64 header
    length, JSON header, data."""
    hdr, blobs, off = {}, [], 0
    for k in sorted(tensors):
        b = tensors[k].detach().float().contiguous().numpy().tobytes() if k in f32 else bf16_bytes(tensors[k])
        hdr[k] = {"dtype": "F32" if k in f32 else "BF16", "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hdr["__metadata__"] = {"format": "pt"}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """name -> float32 tensor, from a file of BF16 and F32 tensors (what write_safetensors writes)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        if v["dtype"] == "BF16":
            arr = (np.frombuffer(data[a:b], np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif v["dtype"] == "F32":
            arr = np.frombuffer(data[a:b], np.float32)
        else:
            raise ValueError(f"{path}: {k} is {v['dtype']}, not BF16 or F32")
        out[k] = torch.from_numpy(arr.reshape(v["shape"]).copy())
    return out


def export(model, cfg, out_dir, bpe, merges, gen):
    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v for k, v in model.state_dict().items()}
    write_safetensors(os.path.join(out_dir, "model.safetensors"), sd)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    write_tokenizer(out_dir, bpe, merges)


# ---------------------------------------------------------------- training


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="checkpoint folder to write")
    ap.add_argument("--log", help="CSV of the loss curve (default OUT/../train_log.csv)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cache-dir", help="keep the corpus, tokenizer and token streams here between runs")
    ap.add_argument("--corpus-bytes", type=int, default=5_000_000)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--q-lora", type=int, default=128)
    ap.add_argument("--kv-lora", type=int, default=64)
    ap.add_argument("--nope-dim", type=int, default=32)
    ap.add_argument("--rope-dim", type=int, default=16)
    ap.add_argument("--v-dim", type=int, default=32)
    ap.add_argument("--dense-inter", type=int, default=768)
    ap.add_argument("--moe-inter", type=int, default=96)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="auxiliary-loss-free balancing step")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-bf16", dest="bf16", action="store_false", help="float32 matrix products (slow)")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="wall-clock budget of the whole run: the learning-rate schedule follows the elapsed "
                         "fraction of the training time left after tokenizing, and training stops at its end")
    a = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    log_path = a.log or os.path.join(os.path.dirname(os.path.abspath(a.out)), "train_log.csv")

    # The corpus, tokenizer and token streams depend only on these arguments: kept in a cache
    # file so that a second run (after a trial) starts training at once.
    key = f"corpus{a.corpus_bytes}-seed{a.seed}-vocab{a.vocab}"
    cache = os.path.join(a.cache_dir, f"train_mla-{key}.pt") if a.cache_dir else None
    if cache and os.path.exists(cache):
        merges, val, train, n_docs = torch.load(cache)
        print(f"corpus and tokenizer from {cache}", flush=True)
    else:
        docs = build_corpus(a.corpus_bytes, a.seed)
        n_docs = len(docs)
        n_val = max(1, len(docs) // 50)
        t0 = time.time()
        merges = train_bpe(docs[n_val:], a.vocab)
        print(f"corpus: {len(docs)} documents, {sum(map(len, docs))} bytes; BPE {len(merges)} merges in "
              f"{time.time() - t0:.0f} s", flush=True)
        bpe = Bpe(merges)

        def stream(ds):
            out = []
            for d in ds:
                out += [0] + bpe.encode(d) + [1]
            return torch.tensor(out, dtype=torch.long)

        t0 = time.time()
        val, train = stream(docs[:n_val]), stream(docs[n_val:])
        print(f"tokens: train {len(train)}, validation {len(val)} ({sum(map(len, docs[n_val:])) / len(train):.2f} "
              f"bytes/token); encoded in {time.time() - t0:.0f} s", flush=True)
        if cache:
            os.makedirs(a.cache_dir, exist_ok=True)
            torch.save((merges, val, train, n_docs), cache)
    bpe = Bpe(merges)
    vocab = N_SPECIAL + 256 + len(merges)
    print(f"{n_docs} documents; tokens: train {len(train)}, validation {len(val)}", flush=True)

    cfg = model_config(a, vocab)
    model = Model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params} ({n_params - sum(p.numel() for p in model.model.layers[-1].parameters())} "
          f"without MTP)", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(a.seed)

    def batch(data, g):
        i = torch.randint(0, len(data) - a.seq - 2, (a.batch,), generator=g)
        return torch.stack([data[j:j + a.seq + 1] for j in i.tolist()])

    vgen = torch.Generator().manual_seed(a.seed + 1)
    val_batches = [batch(val, vgen) for _ in range(4)]

    def evaluate():
        model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            ls = [model(b) for b in val_batches]
        for m in model.moes():
            m.load.zero_()
        model.train()
        return sum(l[0].item() for l in ls) / len(ls), sum(l[1].item() for l in ls) / len(ls)

    rows = []
    t_train = time.time()
    # With --max-minutes the run ends on time: one minute is kept for the last evaluation and export.
    train_budget = a.max_minutes * 60 - (t_train - t_start) - 60 if a.max_minutes else 0
    if a.max_minutes and train_budget <= 0:
        sys.exit("--max-minutes leaves no time to train")
    step = 0
    for step in range(1, a.steps + 1):
        lr = learning_rate(a, step, t_train, train_budget)
        for g in opt.param_groups:
            g["lr"] = lr
        # Matrix products in bf16 through oneDNN (Debian's torch has only the reference BLAS for
        # float32); weights, optimizer state, norms, softmax and losses stay float32.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            loss, mtp_loss = model(batch(train, gen))
        opt.zero_grad(set_to_none=True)
        (loss + a.mtp_weight * mtp_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loads = [m.load.clone() for m in model.moes()]
        for m in model.moes():
            m.update_bias(a.bias_rate)
        elapsed = time.time() - t_train
        row = {"step": step, "seconds": round(elapsed, 1), "lr": round(lr, 6), "loss": round(loss.item(), 4),
               "mtp_loss": round(mtp_loss.item(), 4),
               "max_load": round(max((l.max() / l.mean()).item() for l in loads), 3)}
        stop = progress >= 1.0 and step < a.steps
        if step % a.eval_every == 0 or step == a.steps or stop:
            row["val_loss"], row["val_mtp_loss"] = (round(v, 4) for v in evaluate())
        rows.append(row)
        if step % 10 == 0 or "val_loss" in row:
            print(json.dumps(row), flush=True)
        if stop:
            print(f"stopping at step {step}: the --max-minutes budget is spent", flush=True)
            break
    fields = ["step", "seconds", "lr", "loss", "mtp_loss", "max_load", "val_loss", "val_mtp_loss"]
    with open(log_path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    export(model, cfg, a.out, bpe, merges, {"bos_token_id": 0, "eos_token_id": 1, "do_sample": True,
                                             "temperature": 0.7, "top_p": 0.9})
    print(f"done: {step} steps in {time.time() - t_train:.0f} s of training, {time.time() - t_start:.0f} s in all; "
          f"wrote {a.out} and {log_path}", flush=True)


if __name__ == "__main__":
    main()
