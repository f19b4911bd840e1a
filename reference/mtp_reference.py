"""The numpy reference of the MTP module (DeepSeek-V3 §2.2; src/model/mtp.h), on top of the
shared reference forward pass (../shared/reference/mla_reference.py beside the checkout):

  h_i     = the main model's final-norm output at position i (the input of lm_head)
  h'_i    = eh_proj([enorm(Emb(t_{i+1})); hnorm(h_i)])
  h''_i   = decoder layer num_hidden_layers (MLA absorbed, MoE) at position i
  logits  = head(shared_head.norm(h''_i)), head = shared_head.head or lm_head

For a fixture sequence t_0 .. t_{T-1} it gives the MTP logits of rows 0 .. T-2 (row i predicts
t_{i+2}) and one chained step: row T-1 pairs the argmax of row T-2 with that row's
shared_head.norm output (a second draft token, as the engine chains the module).

Usage:
  python3 reference/mtp_reference.py --write   regenerate reference/golden/mtp-<fixture>.safetensors
  python3 reference/mtp_reference.py --check   recompute and compare with the committed files
Needs numpy (Debian: python3-numpy)."""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "..", "shared", "reference"))

import mla_reference as ref  # noqa: E402
import safetensors_np as st  # noqa: E402

FIXTURES = ["deepseek-v3-tiny", "glm-4.7-flash-tiny"]
SEQ = 1  # the golden's sequence 1: 7 prompt tokens + 8 generated


def mtp_layer(cfg, w, x):
    """The MTP decoder layer and shared_head over eh_proj outputs x [T, hidden] at positions
    0 .. T-1: mla_reference.forward run as a one-layer model whose "embedding rows" are x."""
    L = cfg["num_hidden_layers"]
    pre = f"model.layers.{L}."
    w2 = {k.replace(pre, "model.layers.0."): v for k, v in w.items() if k.startswith(pre)}
    w2["model.embed_tokens.weight"] = x
    w2["model.norm.weight"] = w[pre + "shared_head.norm.weight"]
    w2["lm_head.weight"] = w.get(pre + "shared_head.head.weight", w["lm_head.weight"])
    cfg2 = dict(cfg, num_hidden_layers=1, first_k_dense_replace=0 if L >= cfg["first_k_dense_replace"] else 1)
    logits, hiddens = ref.forward(cfg2, w2, np.arange(len(x)), "absorb")
    return logits, hiddens[-1]  # hiddens[-1]: the shared_head.norm output


def eh_proj(cfg, w, tokens, hidden):
    L, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    pre = f"model.layers.{L}."
    e = ref.rms(w["model.embed_tokens.weight"][tokens], w[pre + "enorm.weight"], eps)
    h = ref.rms(hidden, w[pre + "hnorm.weight"], eps)
    return np.concatenate([e, h], axis=-1) @ w[pre + "eh_proj.weight"].T


def mtp_golden(d, ids):
    cfg, w = ref.load_model(d)
    _, hs = ref.forward(cfg, w, ids, "absorb")
    h = hs[-1]  # the final norm's output
    x = eh_proj(cfg, w, ids[1:], h[:-1])
    logits, hn = mtp_layer(cfg, w, x)
    draft = int(np.argmax(logits[-1]))
    x2 = np.concatenate([x, eh_proj(cfg, w, np.array([draft]), hn[-1:])])
    chain, _ = mtp_layer(cfg, w, x2)
    return {
        "ids": (np.asarray(ids, np.int64), "I64"),
        "logits": (logits.astype(np.float32), "F32"),
        "chain_token": (np.array([draft], np.int64), "I64"),
        "chain_logits": (chain[-1:].astype(np.float32), "F32"),
    }


def golden_path(name):
    return os.path.join(HERE, "golden", f"mtp-{name}.safetensors")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "--check"
    worst = 0.0
    for name in FIXTURES:
        d = os.path.join(ROOT, "..", "shared", "fixtures", "models", name)
        ids = st.load(os.path.join(d, "golden.safetensors"))[f"seq{SEQ}_ids"][0]
        g = mtp_golden(d, ids)
        if mode == "--write":
            st.save(golden_path(name), g)
            print(name, "written:", g["logits"][0].shape)
            continue
        old = st.load(golden_path(name))
        for k, (a, _) in g.items():
            b = old[k][0]
            if a.shape != b.shape:
                print(f"{name} {k}: shape {a.shape} != committed {b.shape}")
                return 1
            if a.dtype.kind == "i":
                if not np.array_equal(a, b):
                    print(f"{name} {k}: {a} != committed {b}")
                    return 1
            else:
                worst = max(worst, float(np.abs(a - b).max()))
    if mode == "--check":
        # float64 recomputed and rounded to float32 as the committed file was: equal up to the
        # last bit of float32 whatever numpy's summation order (1e-6 of logits of order 1).
        print(f"max |recomputed - committed| = {worst:.3e}")
        return 0 if worst <= 1e-6 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
