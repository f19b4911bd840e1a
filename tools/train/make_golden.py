#!/usr/bin/env python3
"""Golden logits of the trained checkpoint from the numpy reference forward pass
(../shared/reference/mla_reference.py, float64, absorb path), for the engine's test.

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
    out = {}
    for j, s in enumerate(a.ids):
        ids = [int(x) for x in s.split(",")]
        T = len(ids)
        for _ in range(a.n):
            lg, _ = mr.forward(cfg, w, np.array(ids))
            ids.append(int(np.argmax(lg[-1])))
        lg, _ = mr.forward(cfg, w, np.array(ids), "absorb")
        lx, _ = mr.forward(cfg, w, np.array(ids), "expand")
        print(f"seq{j}: {T} + {a.n} tokens {ids}; |expand - absorb| max {np.abs(lg - lx).max():.2e}")
        out[f"seq{j}_prompt"] = (np.array([T], np.int64), "I64")
        out[f"seq{j}_ids"] = (np.array(ids, np.int64), "I64")
        out[f"seq{j}_logits"] = (lg.astype(np.float32), "F32")
    st.save(a.out, out)


if __name__ == "__main__":
    main()
