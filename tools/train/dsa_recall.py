#!/usr/bin/env python3
"""How well the trained lightning indexer of models/mla-tiny-en-v32 (train_indexer.py) picks what
the main attention attends, on the validation text that train_mla.py held out (corpus.py's split:
the first 2% of the documents, 30,038 tokens, cut into consecutive windows of the model's context,
128 tokens).

  recall      for each query that sees more than k keys, the share of the dense attention's
              probability mass (the heads' distributions summed and L1-normalised, i.e. their
              mean) that falls on the k keys the indexer ranks highest; averaged over queries,
              windows and layers. Beside the trained indexer: the random-initialised one it
              replaces (train_indexer.py's initialisation with the same seed), the k latest keys
              (a sliding window) and the oracle (the k keys of largest mass: the most any k keys
              can hold).
  perplexity  of the next token with dense attention and with each layer's attention restricted
              to each query's top-k keys by that layer's index score on its own input (as mla
              runs DeepSeek-V3.2: the selections of later layers see the sparse layers before),
              over every position and over the positions 64-127 (a context of 4-8x top-16).
  --mla       the same perplexities from `mla logits` on the exported checkpoint (sparse) and on
              models/mla-tiny-en (dense, the same weights without the indexer), on the first
              --mla-windows windows, in float32; with the indexer's FP8 rounding too.

The model runs in float32 (--bf16: the matrix products in bf16, about 5x faster here).
Usage: /usr/bin/python3 tools/train/dsa_recall.py [--mla build/mla]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_indexer as ti  # noqa: E402
from train_mla import read_safetensors  # noqa: E402


def nll(logits, labels):
    """Negative log-likelihood per position [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none").view(labels.shape)


def ppl(x):
    return math.exp(x.mean().item())


def mla_nll(mla, model_dir, windows, extra):
    """Per-position NLL [N, T] from `mla logits` on each window's inputs."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        ids_path, lg_path = os.path.join(tmp, "ids.txt"), os.path.join(tmp, "logits.safetensors")
        for w in windows:
            with open(ids_path, "w") as f:
                f.write(",".join(str(int(i)) for i in w[:-1]))
            cmd = [mla, "logits", "-m", model_dir, "--ids-file", ids_path, "--out", lg_path, "--threads", "1"] + extra
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
            lg = read_safetensors(lg_path)["logits"]
            out.append(nll(lg[None], w[None, 1:])[0])
    return torch.stack(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/mla-tiny-en", help="the main model (DeepSeek-V3)")
    ap.add_argument("--v32", default="models/mla-tiny-en-v32", help="its DeepSeek-V3.2 export with the indexer")
    ap.add_argument("--topk", default="8,16,32", help="the k of the recall and sparse-perplexity rows")
    ap.add_argument("--seed", type=int, default=1, help="train_indexer.py's --seed (the random indexer)")
    ap.add_argument("--corpus-bytes", type=int, default=4000000)
    ap.add_argument("--cache-dir")
    ap.add_argument("--windows", type=int, default=0, help="validation windows to use (0: all)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--bf16", action="store_true", help="the model's matrix products in bf16")
    ap.add_argument("--mla", help="an mla binary: also the perplexities from `mla logits`")
    ap.add_argument("--mla-windows", type=int, default=0, help="windows for --mla (0: all)")
    ap.add_argument("--json", help="write the figures here as JSON")
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    cfg, model = ti.load_main(a.model)
    vcfg, trained = ti.load_indexers(a.v32)
    random_ix = ti.make_indexers(cfg, vcfg["index_n_heads"], vcfg["index_head_dim"], a.seed)
    K0 = vcfg["index_topk"]
    ks = sorted({int(k) for k in a.topk.split(",")} | {K0})
    T = cfg["max_position_embeddings"]
    L = cfg["num_hidden_layers"]
    data = ti.token_streams(a.model, a.corpus_bytes, a.seed, a.cache_dir)
    win = ti.val_windows(data["val"], T)
    if a.windows:
        win = win[:a.windows]
    print(f"{len(win)} validation windows of {T} tokens ({len(win) * T} predictions); corpus {data['shape']}; "
          f"index_topk {K0}, {vcfg['index_n_heads']} heads x {vcfg['index_head_dim']}", flush=True)
    batches = [win[i:i + a.batch] for i in range(0, len(win), a.batch)]
    def ctx():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16)

    # Recall: one dense pass per batch with both indexers scoring (the MTP layer included).
    names = ["trained", "random", "recent", "oracle"]
    rec = {(n, k, l): [] for n in names for k in ks for l in range(L + 1)}
    with torch.no_grad(), ctx():
        for b in batches:
            _, rs = ti.forward(model, b[:, :-1], scorers=[trained, random_ix], mtp=True)
            for l, r in enumerate(rs):
                p = r["p"]
                Tl = p.shape[-1]
                recent = torch.arange(Tl, dtype=torch.float32).expand(p.shape)
                for k in ks:
                    for n, s in zip(names, (r["I"][0], r["I"][1], recent, p)):
                        rec[(n, k, l)].append(ti.recall(p, s, k))
    R = {key: torch.cat(v).mean().item() for key, v in rec.items()}
    print(f"recall done, {time.time() - t0:.0f} s", flush=True)

    # Perplexity: dense, and sparse by each selection.
    runs = [("dense", None, 0)] + [(f"trained k={k}", trained, k) for k in ks]
    runs += [(f"random k={K0}", random_ix, K0), (f"recent k={K0}", "recent", K0), (f"oracle k={K0}", "oracle", K0)]
    P = {}
    with torch.no_grad(), ctx():
        for name, sel, k in runs:
            x = torch.cat([nll(ti.forward(model, b[:, :-1], select=sel, topk=k)[0], b[:, 1:]) for b in batches])
            P[name] = x
            print(f"  {name}: perplexity {ppl(x):.3f} (positions 64-127: {ppl(x[:, 64:]):.3f}), "
                  f"{time.time() - t0:.0f} s", flush=True)

    print(f"\nRecall of the dense attention's mass on the top-k keys (validation, {len(win)} windows of {T}; "
          f"queries that see more than k keys), mean of layers 0-{L - 1}:")
    print("| k | trained indexer | random indexer | latest k keys | oracle (best k keys) |")
    print("|---:|---:|---:|---:|---:|")
    for k in ks:
        print(f"| {k} | " + " | ".join(f"{sum(R[(n, k, l)] for l in range(L)) / L:.3f}" for n in names) + " |")
    print(f"\nPer layer at k = {K0} (layer {L}: the MTP module's, which mla runs dense):")
    print("| layer | trained indexer | random indexer | latest k keys | oracle |")
    print("|---:|---:|---:|---:|---:|")
    for l in range(L + 1):
        print(f"| {l} | " + " | ".join(f"{R[(n, K0, l)]:.3f}" for n in names) + " |")
    print(f"\nPerplexity at context {T} ({'bf16' if a.bf16 else 'float32'} products):")
    print("| attention | all positions | positions 64-127 | NLL vs dense (nats/token) |")
    print("|---|---:|---:|---:|")
    for name, x in P.items():
        print(f"| {name} | {ppl(x):.3f} | {ppl(x[:, 64:]):.3f} | {(x - P['dense']).mean().item():+.4f} |")
    out = {"windows": len(win), "recall": {f"{n} k={k} layer={l}": v for (n, k, l), v in R.items()},
           "perplexity": {n: [ppl(x), ppl(x[:, 64:])] for n, x in P.items()}}

    if a.mla:
        mw = win[:a.mla_windows] if a.mla_windows else win
        n = len(mw)
        print(f"\nmla logits on {n} windows (float32, f32 latent cache):")
        print("| attention | mla | this script, same windows | largest NLL difference at a position |")
        print("|---|---:|---:|---:|")
        rows = [("dense", a.model, [], P["dense"]), (f"trained k={K0}", a.v32, [], P[f"trained k={K0}"]),
                (f"trained k={K0}, indexer FP8", a.v32, ["--indexer-precision", "fp8"], None)]
        out["mla"] = {}
        for name, d, extra, mine in rows:
            x = mla_nll(a.mla, d, mw, extra)
            out["mla"][name] = ppl(x)
            ours = "| |" if mine is None else f"| {ppl(mine[:n]):.3f} | {(x - mine[:n]).abs().max().item():.1e} |"
            print(f"| {name} | {ppl(x):.3f} {ours}", flush=True)
    print(f"\n{time.time() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
