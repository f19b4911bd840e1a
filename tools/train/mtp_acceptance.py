"""MTP draft acceptance of a trained model on held-out text, through `mla run`.

For each of the first --docs validation documents of the training corpus (corpus.py: the 2%
that train_mla.py held out; the script checks that this machine rebuilds the training corpus
byte for byte), the document's first --prompt-chars characters (cut at a space) are the
prompt, and `mla run` generates --tokens greedy tokens three ways: plainly, and with the
model's own MTP module drafting k = 1 and k = 2 tokens per verify pass (every step speculates:
--no-adaptive-speculation; the drafts' head as stored: --draft-head bf16). It prints, per k,
the drafts, the accepted ones, the acceptance rate and the tokens per verify pass, and checks
that speculation left the greedy text unchanged.

    /usr/bin/python3 tools/train/mtp_acceptance.py --mla build/mla --model models/mla-tiny-en

About 3 runs of `mla run` per document (0.2-0.5 s each for the 7M-parameter model).
"""

import argparse
import re
import subprocess
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import build_corpus  # noqa: E402

# The corpus train_mla.py built for models/mla-tiny-en (train_stdout.log's first line).
TRAINING_CORPUS = (46590, 3953365)

SPEC_LINE = re.compile(r"speculative (\d+) verify steps, acceptance [0-9.]+ \((\d+) of (\d+) drafts\)")


def run(mla, model, prompt, tokens, extra):
    cmd = [mla, "run", "-m", model, "-p", prompt, "-n", str(tokens), "--temperature", "0", "--ignore-eos",
           "--threads", "1"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"mla run failed ({r.returncode}): {r.stderr[-2000:]}")
    return r.stdout, r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mla", default="build/mla")
    ap.add_argument("--model", default="models/mla-tiny-en")
    ap.add_argument("--docs", type=int, default=100)
    ap.add_argument("--prompt-chars", type=int, default=120)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--draft-tokens", default="1,2")
    ap.add_argument("--corpus-bytes", type=int, default=4000000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    docs = build_corpus(a.corpus_bytes, a.seed)
    shape = (len(docs), sum(map(len, docs)))
    if shape != TRAINING_CORPUS:
        print(f"warning: this machine's corpus is {shape[0]} documents, {shape[1]} bytes, not the training run's "
              f"{TRAINING_CORPUS}: its package lists differ, so the held-out documents may have been trained on")
    held_out = docs[: max(1, len(docs) // 50)][: a.docs]
    ks = [int(k) for k in a.draft_tokens.split(",")]
    totals = {k: [0, 0, 0] for k in ks}  # verify steps, accepted, drafts
    changed = {k: 0 for k in ks}
    for i, doc in enumerate(held_out):
        prompt = doc[: a.prompt_chars]
        if len(doc) > a.prompt_chars and " " in prompt:
            prompt = prompt[: prompt.rindex(" ")]
        plain, _ = run(a.mla, a.model, prompt, a.tokens, [])
        for k in ks:
            text, err = run(a.mla, a.model, prompt, a.tokens,
                            ["--speculative", "mtp", "--draft-tokens", str(k), "--no-adaptive-speculation",
                             "--draft-head", "bf16"])
            m = SPEC_LINE.search(err)
            if not m:
                sys.exit(f"no speculative line in mla run's statistics:\n{err[-2000:]}")
            for j in range(3):
                totals[k][j] += int(m.group(j + 1))
            changed[k] += text != plain
        if (i + 1) % 25 == 0:
            print(f"  {i + 1} documents", flush=True)
    print(f"{len(held_out)} held-out documents, prompts of up to {a.prompt_chars} characters, {a.tokens} greedy "
          f"tokens each; model {a.model}")
    print("| k | verify passes | drafts | accepted | acceptance | tokens per verify pass | greedy text changed |")
    print("|---|---|---|---|---|---|---|")
    for k in ks:
        steps, acc, drafts = totals[k]
        print(f"| {k} | {steps} | {drafts} | {acc} | {acc / max(drafts, 1):.3f} | "
              f"{(acc + steps) / max(steps, 1):.2f} | {changed[k]} of {len(held_out)} |")
    if any(changed.values()):
        sys.exit("speculation changed the greedy text")


if __name__ == "__main__":
    main()
