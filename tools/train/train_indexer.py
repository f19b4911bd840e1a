#!/usr/bin/env python3
"""Train a DeepSeek Sparse Attention lightning indexer for the small trained model
(models/mla-tiny-en) and export the result as a DeepSeek-V3.2 checkpoint (models/mla-tiny-en-v32).

The main model stays frozen. Each decoder layer (and the MTP module's layer) gets an indexer in
DeepSeek-V3.2's form, the one mla loads (src/model/indexer.h, reference/dsa_reference.py):

  q[t, h] = wq_b(qr[t])            qr: the layer's own q_a_layernorm(q_a_proj(x)), x its normed input
  k[t]    = LayerNorm(wk(x[t]))    (weight and bias, eps 1e-6)
  RoPE on the first qk_rope_head_dim values of q and k (halves / NeoX pairing, the MLA's
  frequencies), then both times the Walsh-Hadamard matrix / sqrt(index_head_dim) (orthogonal: it
  does not change a score; DeepSeek applies it before the FP8 rounding)
  w[t, h] = weights_proj(x[t])[h] * index_n_heads^-0.5 * index_head_dim^-0.5
  I[t, s] = sum_h w[t, h] relu(q[t, h] . k[s]),  s <= t

trained as DeepSeek trained V3.2's indexer in its dense warm-up stage: for each query t the target
p[t, :] is the main attention's probabilities summed over the heads and L1-normalised (the mean of
the heads' distributions), and the loss is KL(p[t, :] || softmax(I[t, :])) over the causal keys,
summed over the queries of a window and averaged over windows and layers. The indexer's inputs are
detached (DeepSeek: "we detach the indexer input from the computational graph"), so only the
indexer learns.

The export writes config.json (model_type deepseek_v32, index_n_heads, index_head_dim,
index_topk), model.safetensors.index.json over two shards (the first a link to the main
checkpoint's model.safetensors, the second the indexer tensors: wq_b, wk, weights_proj in bf16,
k_norm weight and bias in float32 as in DeepSeek's release) and copies of the tokenizer files;
--copy-weights writes one standalone model.safetensors instead.

Run by hand, never by CI. See README.md beside this file. Needs Debian's python3-torch (1.13).
"""
import argparse
import csv
import json
import os
import shutil
import sys
import time

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from corpus import build_corpus  # noqa: E402
from train_mla import N_SPECIAL, Bpe, Model, learning_rate, lin, read_safetensors, write_safetensors  # noqa: E402

# The corpus train_mla.py built for models/mla-tiny-en (its train_stdout.log): documents, bytes,
# training tokens, validation tokens.
TRAINING_CORPUS = (46590, 3953365, 1337843, 30038)

# ---------------------------------------------------------------- data and the frozen model


def load_main(model_dir):
    """The trained DeepSeek-V3 checkpoint as train_mla.Model, frozen, with its config."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    model = Model(cfg)
    sd = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        sys.exit(f"{model_dir}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return cfg, model


def token_streams(model_dir, corpus_bytes, seed, cache_dir=None):
    """The training and validation token streams of train_mla.py, rebuilt from corpus.py and the
    checkpoint's own tokenizer (its BPE merges): validation = the first 2% of the documents."""
    cache = os.path.join(cache_dir, f"streams-corpus{corpus_bytes}-seed{seed}.pt") if cache_dir else None
    if cache and os.path.exists(cache):
        return torch.load(cache)
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    merges = [tuple(m.split(" ")) for m in tok["model"]["merges"]]
    bpe = Bpe(merges)
    if bpe.vocab != tok["model"]["vocab"]:
        sys.exit(f"{model_dir}/tokenizer.json: the rebuilt BPE's vocabulary differs from the file's")
    docs = build_corpus(corpus_bytes, seed)
    n_val = max(1, len(docs) // 50)

    def stream(ds):
        out = []
        for d in ds:
            out += [0] + bpe.encode(d) + [1]
        return torch.tensor(out, dtype=torch.long)

    val, train = stream(docs[:n_val]), stream(docs[n_val:])
    shape = (len(docs), sum(map(len, docs)), len(train), len(val))
    if shape != TRAINING_CORPUS:
        print(f"warning: this machine's corpus (documents, bytes, train and validation tokens) is {shape}, not "
              f"the training run's {TRAINING_CORPUS}: its package lists differ, so the validation text may have "
              f"been trained on", flush=True)
    out = {"train": train, "val": val, "shape": shape, "vocab": N_SPECIAL + 256 + len(merges)}
    if cache:
        os.makedirs(cache_dir, exist_ok=True)
        torch.save(out, cache)
    return out


def val_windows(val, seq):
    """The validation stream cut into consecutive windows of seq + 1 tokens (inputs and their next
    tokens), overlapping by one token: every validation token is predicted once."""
    n = (len(val) - 1) // seq
    return torch.stack([val[i * seq:i * seq + seq + 1] for i in range(n)])


# ---------------------------------------------------------------- the indexer


def rope_halves(x, cos, sin):
    """RoPE in halves pairing (i, i + d/2) (NeoX, rotate_half); x [B, T, ..., d], cos/sin [T, d/2]."""
    shape = (1, cos.shape[0]) + (1,) * (x.dim() - 3) + (cos.shape[1],)
    c, s = cos.view(shape), sin.view(shape)
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)


def hadamard(n):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h * n ** -0.5


class Indexer(nn.Module):
    """DeepSeek-V3.2's lightning indexer (inference/model.py class Indexer, without the FP8 steps)."""

    def __init__(self, c, n_heads, head_dim):
        super().__init__()
        self.Hi, self.D, self.R = n_heads, head_dim, c["qk_rope_head_dim"]
        self.wq_b = lin(c["q_lora_rank"], n_heads * head_dim)
        self.wk = lin(c["hidden_size"], head_dim)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = lin(c["hidden_size"], n_heads)
        self.register_buffer("hadamard", hadamard(head_dim), persistent=False)

    def forward(self, x, qr, cos, sin):
        """Index scores I [B, T, T] (every key, no causal mask) from the normed layer input x and
        the normed q LoRA qr."""
        B, T, _ = x.shape
        R = self.R
        q = self.wq_b(qr).view(B, T, self.Hi, self.D)
        q = torch.cat((rope_halves(q[..., :R], cos, sin), q[..., R:]), -1)
        k = self.k_norm(self.wk(x).float())  # LayerNorm in float32 (CPU autocast leaves it to us)
        k = torch.cat((rope_halves(k[..., :R], cos, sin), k[..., R:]), -1)
        q, k = q @ self.hadamard.to(q.dtype), k @ self.hadamard.to(k.dtype)  # the matrix is symmetric
        w = self.weights_proj(x) * (self.Hi ** -0.5 * self.D ** -0.5)
        s = torch.einsum("bthd,bsd->bths", q, k).relu()
        return torch.einsum("bths,bth->bts", s, w).float()


def make_indexers(cfg, n_heads, head_dim, seed):
    """One indexer per decoder layer and one for the MTP module's layer, initialised as train_mla
    initialises its matrices (normal, std initializer_range; LayerNorm weight 1, bias 0)."""
    g = torch.Generator().manual_seed(seed)
    ix = nn.ModuleList(Indexer(cfg, n_heads, head_dim) for _ in range(cfg["num_hidden_layers"] + 1))
    for n, p in ix.named_parameters():
        if "k_norm" not in n:
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * cfg["initializer_range"])
    return ix


def indexer_tensors(cfg, ix):
    """The checkpoint names of the indexers' tensors."""
    out = {}
    for l, m in enumerate(ix):
        for n, p in m.named_parameters():
            out[f"model.layers.{l}.self_attn.indexer.{n}"] = p.detach().clone()
    return out


# ---------------------------------------------------------------- forward with selections


def rope_tables(model, T):
    ang = torch.arange(T).float()[:, None] * model.inv[None, :]
    return ang.cos(), ang.sin()


def select_mask(score, topk, causal):
    """[B, 1, T, T], True where a query may not attend: outside its top-k keys by score among the
    visible ones (all of them when at most topk are visible). Ties: the lower position first, as
    mla breaks them."""
    s = score.float().masked_fill(causal, float("-inf"))
    order = torch.sort(s, stable=True, dim=-1, descending=True).indices[..., :topk]
    keep = torch.zeros_like(s, dtype=torch.bool).scatter_(-1, order, True) & ~causal
    return (~keep).unsqueeze(1)


def forward(model, ids, select=None, topk=0, scorers=(), mtp=False):
    """The main model on ids [B, T]. select: None (dense attention), a ModuleList of indexers
    (sparse attention over each query's top-k keys by that layer's index score, as mla runs
    DeepSeek-V3.2), "recent" (the top-k latest keys) or "oracle" (the top-k keys by the dense
    attention's own head-summed probabilities on the same layer input). scorers: ModuleLists of
    indexers whose scores are recorded beside the attention probabilities. mtp: also the MTP
    module's layer (its attention dense, as mla runs it), on positions 0..T-2.
    Returns the logits [B, T, vocab] and per layer {"p": head-mean probabilities [B, T, T],
    "I": [scores per scorer]}."""
    B, T = ids.shape
    cos, sin = rope_tables(model, T)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    emb = model.model.embed_tokens
    L = model.c["num_hidden_layers"]
    records = []

    def layer_pass(l, layer, h, cos, sin, causal, select):
        x = layer.input_layernorm(h)
        at = layer.self_attn
        need_qr = scorers or isinstance(select, nn.ModuleList)
        qr = at.q_a_layernorm(at.q_a_proj(x)).detach() if need_qr else None
        scores = [s[l](x.detach(), qr, cos, sin) for s in scorers]
        mask = causal
        if isinstance(select, nn.ModuleList):
            with torch.no_grad():
                mask = select_mask(select[l](x, qr, cos, sin), topk, causal)
        elif select == "recent":
            mask = select_mask(torch.arange(T, dtype=torch.float32).expand(B, T, T), topk, causal)
        elif select == "oracle":
            probs = []
            at(x, cos, sin, causal, probs)
            mask = select_mask(probs[0].sum(1), topk, causal)
        probs = []
        h = h + at(x, cos, sin, mask, probs)
        records.append({"p": probs[0].mean(1).detach(), "I": scores})
        return h + layer.mlp(layer.post_attention_layernorm(h))

    h = emb(ids)
    for l in range(L):
        h = layer_pass(l, model.model.layers[l], h, cos, sin, causal, select)
    hn = model.model.norm(h)
    logits = model.lm_head(hn).float()
    if mtp:
        m = model.model.layers[L]
        hm = m.eh_proj(torch.cat((m.enorm(emb(ids[:, 1:])), m.hnorm(hn[:, :-1])), -1))
        layer_pass(L, m, hm, cos[:T - 1], sin[:T - 1], causal[:T - 1, :T - 1], None)
    for m in model.moes():
        m.load.zero_()
    return logits, records


def kl_per_query(p, I):
    """KL(p || softmax(I)) over the causal keys, per query: [B, T]. p [B, T, T] sums to 1 over
    each query's visible keys."""
    T = p.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=p.device).triu(1)
    logq = I.float().masked_fill(causal, float("-inf")).log_softmax(-1).masked_fill(causal, 0.0)
    return (p * (p.clamp_min(1e-30).log() - logq)).sum(-1)


def recall(p, score, topk):
    """Share of p's mass on each query's top-k keys by score, for the queries that see more than
    topk keys: a 1-D tensor, one value per such query."""
    T = p.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    keep = ~select_mask(score, topk, causal).squeeze(1)
    r = (p * keep).sum(-1)  # [B, T]
    return r[:, topk:].flatten()


# ---------------------------------------------------------------- export


def export(out_dir, main_dir, cfg, ix, n_heads, head_dim, topk, copy_weights):
    os.makedirs(out_dir, exist_ok=True)
    c = dict(cfg)
    c["architectures"] = ["DeepseekV32ForCausalLM"]
    c["model_type"] = "deepseek_v32"
    c["index_n_heads"], c["index_head_dim"], c["index_topk"] = n_heads, head_dim, topk
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(main_dir, name), os.path.join(out_dir, name))
    tensors = indexer_tensors(cfg, ix)
    f32 = {n for n in tensors if ".k_norm." in n}  # float32 in DeepSeek's release, as mla reads them
    main_src = os.path.join(main_dir, "model.safetensors")
    shards = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    for name in shards + ("model.safetensors", "model.safetensors.index.json"):
        if os.path.lexists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))
    if copy_weights:
        main = read_safetensors(main_src)
        write_safetensors(os.path.join(out_dir, "model.safetensors"), {**main, **tensors}, f32=f32)
        return
    main_names = list(read_safetensors(main_src))
    os.symlink(os.path.relpath(main_src, out_dir), os.path.join(out_dir, shards[0]))
    write_safetensors(os.path.join(out_dir, shards[1]), tensors, f32=f32)
    weight_map = {n: shards[0] for n in main_names}
    weight_map.update({n: shards[1] for n in tensors})
    size = os.path.getsize(main_src) + os.path.getsize(os.path.join(out_dir, shards[1]))
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)


def load_indexers(v32_dir, cfg_main=None):
    """The indexers of an exported checkpoint (as a ModuleList over layers 0..L) and its config."""
    with open(os.path.join(v32_dir, "config.json")) as f:
        c = json.load(f)
    ix = make_indexers(c, c["index_n_heads"], c["index_head_dim"], 0)
    sd = {}
    for name in sorted(os.listdir(v32_dir)):
        if name.endswith(".safetensors") and name != "golden.safetensors":
            for k, v in read_safetensors(os.path.join(v32_dir, name)).items():
                if ".indexer." in k:
                    l = int(k.split(".")[2])
                    sd[f"{l}.{k.split('.indexer.')[1]}"] = v
    ix.load_state_dict(sd)
    return c, ix


# ---------------------------------------------------------------- training


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/mla-tiny-en", help="the trained DeepSeek-V3 checkpoint (frozen)")
    ap.add_argument("--out", required=True, help="the DeepSeek-V3.2 checkpoint folder to write")
    ap.add_argument("--log", help="CSV of the loss curve (default OUT/../train_indexer_log.csv)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus-bytes", type=int, default=4000000, help="as train_mla.py was run")
    ap.add_argument("--cache-dir", help="keep the token streams here between runs")
    ap.add_argument("--index-heads", type=int, default=4)
    ap.add_argument("--index-head-dim", type=int, default=32)
    ap.add_argument("--index-topk", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-bf16", dest="bf16", action="store_false", help="float32 matrix products (slow)")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--max-minutes", type=float, default=0,
                    help="wall-clock budget: the learning-rate schedule follows the elapsed fraction of it")
    ap.add_argument("--copy-weights", action="store_true", help="one standalone model.safetensors, no link")
    a = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    log_path = a.log or os.path.join(os.path.dirname(os.path.abspath(a.out)), "train_indexer_log.csv")

    cfg, model = load_main(a.model)
    if a.seq > cfg["max_position_embeddings"]:
        sys.exit(f"--seq {a.seq} is past the model's context {cfg['max_position_embeddings']}")
    data = token_streams(a.model, a.corpus_bytes, a.seed, a.cache_dir)
    train, val = data["train"], data["val"]
    print(f"corpus {data['shape']} (documents, bytes, train tokens, validation tokens); "
          f"{time.time() - t_start:.0f} s", flush=True)
    ix = make_indexers(cfg, a.index_heads, a.index_head_dim, a.seed)
    L = cfg["num_hidden_layers"]
    print(f"indexers: {L} layers + MTP, {a.index_heads} heads x {a.index_head_dim}, index_topk {a.index_topk}; "
          f"{sum(p.numel() for p in ix.parameters())} parameters", flush=True)
    decay = [p for p in ix.parameters() if p.dim() == 2]
    no_decay = [p for p in ix.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(a.seed)

    def batch(data, g):
        i = torch.randint(0, len(data) - a.seq - 1, (a.batch,), generator=g)
        return torch.stack([data[j:j + a.seq] for j in i.tolist()])

    vgen = torch.Generator().manual_seed(a.seed + 1)
    val_batches = [batch(val, vgen) for _ in range(4)]

    def losses(ids):
        _, rec = forward(model, ids, scorers=[ix], mtp=True)
        kls = [kl_per_query(r["p"], r["I"][0]).mean() for r in rec]
        rc = [recall(r["p"], r["I"][0].detach(), a.index_topk).mean().item() for r in rec]
        return kls, rc

    def evaluate():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            out = [losses(b) for b in val_batches]
        kl = [sum(o[0][l].item() for o in out) / len(out) for l in range(L + 1)]
        rc = [sum(o[1][l] for o in out) / len(out) for l in range(L + 1)]
        return kl, rc

    rows = []
    t_train = time.time()
    train_budget = a.max_minutes * 60 - (t_train - t_start) - 60 if a.max_minutes else 0
    if a.max_minutes and train_budget <= 0:
        sys.exit("--max-minutes leaves no time to train")
    kl0, rc0 = evaluate()
    rows.append({"step": 0, "seconds": 0.0, "val_kl": round(sum(kl0[:L]) / L, 4),
                 "val_recall": round(sum(rc0[:L]) / L, 4), "val_kl_mtp": round(kl0[L], 4),
                 "val_recall_mtp": round(rc0[L], 4)})
    print(json.dumps(rows[-1]), flush=True)
    step = 0
    for step in range(1, a.steps + 1):
        lr = learning_rate(a, step, t_train, train_budget)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            kls, rc = losses(batch(train, gen))
        loss = sum(kls) / len(kls)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ix.parameters(), 1.0)
        opt.step()
        row = {"step": step, "seconds": round(time.time() - t_train, 1), "lr": round(lr, 6),
               "kl": round(sum(k.item() for k in kls[:L]) / L, 4), "kl_mtp": round(kls[L].item(), 4),
               "recall": round(sum(rc[:L]) / L, 4)}
        stop = progress >= 1.0 and step < a.steps
        if step % a.eval_every == 0 or step == a.steps or stop:
            kl, rcv = evaluate()
            row.update({"val_kl": round(sum(kl[:L]) / L, 4), "val_recall": round(sum(rcv[:L]) / L, 4),
                        "val_kl_mtp": round(kl[L], 4), "val_recall_mtp": round(rcv[L], 4),
                        "val_kl_layers": " ".join(f"{k:.3f}" for k in kl[:L]),
                        "val_recall_layers": " ".join(f"{r:.3f}" for r in rcv[:L])})
        rows.append(row)
        if step % 10 == 0 or "val_kl" in row:
            print(json.dumps(row), flush=True)
        if stop:
            print(f"stopping at step {step}: the --max-minutes budget is spent", flush=True)
            break
    fields = ["step", "seconds", "lr", "kl", "kl_mtp", "recall", "val_kl", "val_recall", "val_kl_mtp",
              "val_recall_mtp", "val_kl_layers", "val_recall_layers"]
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    export(a.out, a.model, cfg, ix, a.index_heads, a.index_head_dim, a.index_topk, a.copy_weights)
    print(f"done: {step} steps in {time.time() - t_train:.0f} s of training, {time.time() - t_start:.0f} s in all; "
          f"wrote {a.out} and {log_path}", flush=True)


if __name__ == "__main__":
    main()
