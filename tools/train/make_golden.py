#!/usr/bin/env python3
"""Golden logits of the trained checkpoint from the numpy reference forward pass
(../shared/reference/mla_reference.py, float64, absorb path), for the engine's test. A
DeepSeek-V3.2 checkpoint (model_type deepseek_v32: models/mla-tiny-en-v32) runs through
reference/dsa_reference.py instead: the lightning indexer's top-k (index scores in float32) and
attention over the selected keys; the script then prints the smallest gap between the k-th and
(k+1)-th index score of any sparse row relative to the row's largest score (a selection the
engine could break differently where it is tiny) and how far the sparse logits lie from dense
attention's on the same weights.

For each prompt (comma-separated token ids) it appends N greedy tokens chosen by the reference
and stores, as the model fixtures do: seq{j}_prompt int64 [1], seq{j}_ids int64 [T+N],
seq{j}_logits float32 [T+N, vocab] (teacher-forced logits of the whole sequence).
Also prints the largest difference between the expand and absorb paths.

Usage: /usr/bin/python3 make_golden.py MODEL_DIR OUT.safetensors --ids 0,12,34 [--ids ...] [-n 8]
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "shared", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "reference"))
import dsa_reference as dr  # noqa: E402
import mla_reference as mr  # noqa: E402
import safetensors_np as st  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--ids", action="append", required=True)
    ap.add_argument("-n", type=int, default=8)
    a = ap.parse_args()
    cfg, w = mr.load_model(a.model)
    dsa = cfg.get("model_type") == "deepseek_v32"
    if dsa:
        def fwd(ids, path="absorb", stats=None):
            return dr.forward(cfg, w, ids, path, stats=stats)
    else:
        def fwd(ids, path="absorb", stats=None):
            return mr.forward(cfg, w, ids, path)
    out = {}
    for j, s in enumerate(a.ids):
        ids = [int(x) for x in s.split(",")]
        T = len(ids)
        for _ in range(a.n):
            lg, _ = fwd(np.array(ids))
            ids.append(int(np.argmax(lg[-1])))
        stats = {}
        lg, _ = fwd(np.array(ids), "absorb", stats)
        lx, _ = fwd(np.array(ids), "expand")
        print(f"seq{j}: {T} + {a.n} tokens {ids}; |expand - absorb| max {np.abs(lg - lx).max():.2e}")
        if dsa:
            dense, _ = mr.forward(dr.dense_mla_config(cfg), w, np.array(ids), "absorb")
            print(f"  sparse rows {stats.get('sparse_rows', 0)} (of {len(ids)} positions x "
                  f"{cfg['num_hidden_layers']} layers), smallest top-k margin {stats.get('min_margin', float('nan')):.2e}; "
                  f"|sparse - dense| logits max {np.abs(lg - dense).max():.2e}, argmax differs at "
                  f"{int((lg.argmax(-1) != dense.argmax(-1)).sum())} of {len(ids)} positions")
        out[f"seq{j}_prompt"] = (np.array([T], np.int64), "I64")
        out[f"seq{j}_ids"] = (np.array(ids, np.int64), "I64")
        out[f"seq{j}_logits"] = (lg.astype(np.float32), "F32")
    st.save(a.out, out)


if __name__ == "__main__":
    main()
