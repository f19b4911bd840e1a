#!/usr/bin/env python3
"""`mla quantize` against llama.cpp's Q4_0 / Q8_0 on the trained model (models/mla-tiny-en), on
the validation text that train_mla.py held out (corpus.py's split, 30,038 tokens, cut into
consecutive windows of the model's context, 128 tokens).

Each engine's quantized logits are compared with the same engine's unquantized logits of the
same weights (mla: the bf16 checkpoint; llama.cpp: the F32 GGUF of it, which holds the same
values), so each row measures what quantizing costs in that engine:

  mean KL     KL(unquantized || quantized) of the next-token distribution, nats, averaged over
              every predicted position (what llama.cpp's `llama-perplexity --kl-divergence`
              reports as the mean KLD)
  perplexity  of the next token over the same positions
  top-1       the share of positions whose argmax is the unquantized one's

Equal bits, the same tensors:
  4-bit  routed experts only, the rest as stored: `mla quantize --experts int4` (groups of 32
         along the input, a bf16 scale each: 4.5 bits) against `llama-quantize --tensor-type
         'ffn_(gate|up|down)_exps=q4_0'` with every other tensor F32 (Q4_0: blocks of 32, an f16
         scale each: 4.5 bits).
  8-bit  every matrix but the router: `mla quantize --experts int8 --others int8 --embed int8`
         (groups of 32, 8.5 bits) against llama-quantize's Q8_0 mixture (every 2-D tensor Q8_0,
         token embeddings and output included; the router stays F32 in both).
mla's default scales (`--scales search`) and plain round-to-nearest (`--scales absmax`, what
Q4_0 / Q8_0 do) are both rows.

The engines run as their users run them for logits: `mla logits` (float32 activations, f32
latent cache) and ../shared/peer/llamacpp/dump_logits (the whole window in one batch, F32 KV
cache, flash attention off; llama.cpp multiplies Q4_0 / Q8_0 weights by activations it
quantizes to 8 bits, part of its error). The unquantized runs of the two engines are compared
too (they should agree to about 1e-5).

Needs a built llama.cpp with dump_logits (../shared/peer/llamacpp/setup.sh; default
--peer-dir /tmp/mla-peer) and its converter hf_to_gguf_mla.py. About 10 minutes on 2 cores.
Usage: /usr/bin/python3 tools/train/quant_compare.py --mla build/mla [--cache-dir /tmp/idx_cache]
"""
import argparse
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_indexer as ti  # noqa: E402
from train_mla import read_safetensors  # noqa: E402


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}")
    return r


def log_softmax64(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def mla_logits(mla, model_dir, window, tmp, threads):
    ids, out = os.path.join(tmp, "ids.txt"), os.path.join(tmp, "logits.safetensors")
    with open(ids, "w") as f:
        f.write(",".join(str(int(i)) for i in window))
    run([mla, "logits", "-m", model_dir, "--ids-file", ids, "--out", out, "--threads", str(threads)])
    return read_safetensors(out)["logits"].numpy().reshape(len(window), -1)


def llama_logits(dump, gguf, window, tmp, threads, vocab):
    ids, out = os.path.join(tmp, "ids.bin"), os.path.join(tmp, "logits.bin")
    np.asarray(window, np.int32).tofile(ids)
    run([dump, gguf, ids, out, "--threads", str(threads), "--kv", "f32", "--fa", "off"])
    return np.fromfile(out, np.float32).reshape(len(window), vocab)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/mla-tiny-en")
    ap.add_argument("--mla", default="build/mla")
    ap.add_argument("--peer-dir", default=os.environ.get("PEER_DIR", "/tmp/mla-peer"))
    ap.add_argument("--converter", default=os.path.join(HERE, "../../../shared/peer/llamacpp/hf_to_gguf_mla.py"))
    ap.add_argument("--work", default="/tmp/mla-quant-compare", help="quantized checkpoints and GGUFs go here")
    ap.add_argument("--cache-dir", help="train_indexer.py's token-stream cache")
    ap.add_argument("--corpus-bytes", type=int, default=4000000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--windows", type=int, default=0, help="validation windows (0: all)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    t0 = time.time()
    ll = os.path.join(a.peer_dir, "llama.cpp")
    dump = os.path.join(a.peer_dir, "bin", "dump_logits")
    quantize = os.path.join(ll, "build", "bin", "llama-quantize")
    for p in (dump, quantize, a.converter, a.mla):
        if not os.path.exists(p):
            sys.exit(f"missing {p}: build llama.cpp and dump_logits with ../shared/peer/llamacpp/setup.sh, "
                     "and mla with the README's build command")
    os.makedirs(a.work, exist_ok=True)
    W = lambda *p: os.path.join(a.work, *p)  # noqa: E731

    # The quantized checkpoints of both engines, from the same weights.
    mla_rows = {
        "int4 experts, search scales": ["--experts", "int4", "--others", "bf16", "--embed", "bf16", "--scales", "search"],
        "int4 experts, absmax (RTN)": ["--experts", "int4", "--others", "bf16", "--embed", "bf16", "--scales", "absmax"],
        "int8 all, search scales": ["--experts", "int8", "--others", "int8", "--embed", "int8", "--scales", "search"],
        "int8 all, absmax (RTN)": ["--experts", "int8", "--others", "int8", "--embed", "int8", "--scales", "absmax"],
    }
    mla_dirs = {}
    for i, (name, opts) in enumerate(mla_rows.items()):
        mla_dirs[name] = W(f"mla-{i}")
        run([a.mla, "quantize", "-m", a.model, "-o", mla_dirs[name], "--quiet", "--threads", str(a.threads)] + opts)
    env = dict(os.environ, PYTHONPATH=os.path.join(ll, "gguf-py"))
    run([sys.executable, a.converter, a.model, W("f32.gguf"), "--outtype", "f32"], env=env)
    run([quantize, W("f32.gguf"), W("q8_0.gguf"), "Q8_0"])
    run([quantize, "--tensor-type", "ffn_(gate|up|down)_exps=q4_0", "--tensor-type", ".*=f32",
         "--token-embedding-type", "f32", "--output-tensor-type", "f32", W("f32.gguf"), W("q4exps.gguf"), "Q4_0"])
    llama_rows = {"Q4_0 experts": W("q4exps.gguf"), "Q8_0 (all 2-D)": W("q8_0.gguf")}
    print(f"checkpoints written, {time.time() - t0:.0f} s", flush=True)

    data = ti.token_streams(a.model, a.corpus_bytes, a.seed, a.cache_dir)
    T = int(ti.load_main(a.model)[0]["max_position_embeddings"])
    win = ti.val_windows(data["val"], T)
    if a.windows:
        win = win[:a.windows]
    vocab = None

    # Per row: summed KL, NLL, top-1 matches; positions.
    acc = {}
    def add(key, ref_lp, lp, labels):
        s = acc.setdefault(key, [0.0, 0.0, 0, 0])
        p = np.exp(ref_lp)
        s[0] += float((p * (ref_lp - lp)).sum())
        s[1] += float(-lp[np.arange(len(labels)), labels].sum())
        s[2] += int((lp.argmax(-1) == ref_lp.argmax(-1)).sum())
        s[3] += len(labels)
    cross = 0.0
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for n, w in enumerate(win):
            inp, labels = w[:-1].tolist(), w[1:].numpy()
            base = mla_logits(a.mla, a.model, inp, tmp, a.threads)
            vocab = base.shape[1]
            ref = log_softmax64(base)
            add(("mla", "unquantized (bf16 weights)"), ref, ref, labels)
            for name, d in mla_dirs.items():
                add(("mla", name), ref, log_softmax64(mla_logits(a.mla, d, inp, tmp, a.threads)), labels)
            lbase = llama_logits(dump, W("f32.gguf"), inp, tmp, a.threads, vocab)
            cross = max(cross, float(np.abs(lbase - base).max()))
            lref = log_softmax64(lbase)
            add(("llama.cpp", "unquantized (F32 GGUF)"), lref, lref, labels)
            for name, g in llama_rows.items():
                add(("llama.cpp", name), lref, log_softmax64(llama_logits(dump, g, inp, tmp, a.threads, vocab)), labels)
            if n % 20 == 0:
                print(f"  window {n + 1}/{len(win)}, {time.time() - t0:.0f} s", flush=True)

    P = len(win) * (T)
    print(f"\n{len(win)} validation windows of {T} tokens ({P} predictions), {time.time() - t0:.0f} s; "
          f"the two engines' unquantized logits differ by at most {cross:.2e}")
    print("| engine | weights | mean KL vs unquantized | perplexity | top-1 agreement |")
    print("|---|---|---:|---:|---:|")
    for (eng, name), (kl, nl, top, n) in acc.items():
        print(f"| {eng} | {name} | {kl / n:.5f} | {math.exp(nl / n):.3f} | {top / n:.4f} |")


if __name__ == "__main__":
    main()
