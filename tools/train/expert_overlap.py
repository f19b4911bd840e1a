#!/usr/bin/env python3
"""How often consecutive tokens of the trained model (models/mla-tiny-en) choose the same routed
experts, on the validation text that train_mla.py held out (corpus.py's split, 30,038 tokens, cut
into consecutive windows of the model's context, 128 tokens).

What speculative decoding cares about: a verify pass of 1 + k consecutive tokens reads the union
of their experts, so its routed-expert bytes are that union over one token's K. Per MoE layer:

  shared      of the K experts of token t+1, the share token t chose too
  union n     the distinct experts of n consecutive tokens, over K (n = 2, 3: a verify pass at
              k = 1, 2 draft tokens)

beside the same figures for unrelated tokens (token t paired with a token of another window, as
random ids in a benchmark are), for the random initialisation train_mla.py started from (seed 1:
a random-weight model's routing), and the value for independent uniform choices
(E (1 - (1 - K/E)^n) / K).

    /usr/bin/python3 tools/train/expert_overlap.py [--cache-dir /tmp/idx_cache]

About a minute on one core (float32 forward passes).
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_indexer as ti  # noqa: E402
import train_mla  # noqa: E402


def routes(model, batches, L):
    """The experts each token chose in each MoE layer: {layer: [windows, T, K]}."""
    got = {}
    moes = [(l, m.mlp) for l, m in enumerate(model.model.layers[:L]) if isinstance(m.mlp, train_mla.MoE)]
    for l, moe in moes:
        def wrap(x, moe=moe, l=l):
            scores, idx = train_mla.MoE.route(moe, x)
            got.setdefault(l, []).append(idx)
            return scores, idx
        moe.route = wrap
    with torch.no_grad():
        for b in batches:
            ti.forward(model, b[:, :-1])
    T = batches[0].shape[1] - 1
    return {l: torch.cat([i.view(-1, T, i.shape[-1]) for i in v]) for l, v in got.items()}


def figures(idx, E, unrelated=False):
    """shared, union 2, union 3 for routes [N, T, K]: of tokens t, t+1, t+2, or (unrelated) of
    token t and the tokens at t+1 and t+2 of two other windows."""
    N, T, K = idx.shape
    one = torch.zeros(N, T, E).scatter_(2, idx, 1.0)
    g = torch.Generator().manual_seed(7)
    second = one[torch.randperm(N, generator=g)] if unrelated else one
    third = one[torch.randperm(N, generator=g)] if unrelated else one
    a, b, c = one[:, :-2], second[:, 1:-1], third[:, 2:]
    shared = (a * b).sum(-1).mean().item() / K
    u2 = ((a + b) > 0).float().sum(-1).mean().item() / K
    u3 = ((a + b + c) > 0).float().sum(-1).mean().item() / K
    return shared, u2, u3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/mla-tiny-en")
    ap.add_argument("--cache-dir")
    ap.add_argument("--corpus-bytes", type=int, default=4000000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--windows", type=int, default=0, help="validation windows (0: all)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cfg, trained = ti.load_main(a.model)
    torch.manual_seed(a.seed)
    untrained = train_mla.Model(cfg).eval()  # train_mla.py's initialisation
    E, K, L = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["num_hidden_layers"]
    data = ti.token_streams(a.model, a.corpus_bytes, a.seed, a.cache_dir)
    win = ti.val_windows(data["val"], cfg["max_position_embeddings"])
    if a.windows:
        win = win[:a.windows]
    batches = [win[i:i + 16] for i in range(0, len(win), 16)]
    uniform = [K / E, E * (1 - (1 - K / E) ** 2) / K, E * (1 - (1 - K / E) ** 3) / K]
    print(f"{len(win)} validation windows of {win.shape[1] - 1} tokens; {E} routed experts, top-{K}")
    print("| layer | model | tokens | shared with the previous token | union of 2 / K | union of 3 / K |")
    print("|---|---|---|---:|---:|---:|")
    for name, model in (("trained", trained), ("random init", untrained)):
        r = routes(model, batches, L)
        for l, idx in sorted(r.items()):
            for what, f in (("consecutive", figures(idx, E)), ("unrelated", figures(idx, E, True))):
                print(f"| {l} | {name} | {what} | {f[0]:.3f} | {f[1]:.3f} | {f[2]:.3f} |")
    print(f"| any | independent uniform | | {uniform[0]:.3f} | {uniform[1]:.3f} | {uniform[2]:.3f} |")


if __name__ == "__main__":
    main()
