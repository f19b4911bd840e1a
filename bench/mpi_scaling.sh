#!/usr/bin/env bash
# Expert parallelism on one host: `mla bench` as NP ranks of THREADS / NP threads (mpirun) against
# one process of THREADS threads, alternating for ROUNDS rounds on the same checkpoint (the
# LAYERS-layer bf16 bench checkpoint, written on first use). Prints each round's decode (batch 1)
# and prompt tokens/s of both, the medians, the ratio ranks / one process per round and its
# median, and the ranks' MoE combine share of a decode step and of a prompt.
#
#   bench/mpi_scaling.sh [ROUNDS]      (default 3)
#   env: MLA_BIN (build/mla), LAYERS (6), NP (2), THREADS (2), PROMPT (128 tokens), RUNS (3 timed
#        runs per figure in each bench), BENCH_ARGS (more `mla bench` options for both sides)
#
# Both sides memory-map the weights (--huge-pages off: two ranks copying their halves beside the
# page cache's copy would not fit the development VM), skip the speculative rows, the batched
# rows and the 1-thread scaling, and shrink the read-loop and GEMM probes, which run between the
# timed runs and do not enter the figures compared here.
# Runtime: 2.4-3.4 minutes per round on the development VM (2 cores shared with other work, 23
# GB; the 6-layer checkpoint of 8.3 GB already in the page cache): 7-9 minutes for the default 3
# rounds, 17 for 5.
set -euo pipefail
ROUNDS=${1:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MLA=${MLA_BIN:-$ROOT/build/mla}
LAYERS=${LAYERS:-6}
NP=${NP:-2}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-128}
RUNS=${RUNS:-3}
COMMON=(bench --layers "$LAYERS" --weights bf16 --spec-tokens 0 --batches 0 --no-scaling --huge-pages off
        --bandwidth-mib 512 --gemm-n 1024 ${BENCH_ARGS:-})
ARGS=("${COMMON[@]}" --runs "$RUNS" --decode-tokens 16 --prompt-tokens "$PROMPT")
# OpenMPI refuses root unless told; a rank waiting in a collective yields its core to the other.
export OMPI_MCA_mpi_yield_when_idle=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
MPIRUN=(mpirun --oversubscribe --bind-to none -np "$NP" -H "127.0.0.1:$NP")
OUT=$(mktemp -d /tmp/mla-mpi-scaling.XXXXXX)
echo "mla bench, 1 process x $THREADS threads against $NP ranks x $((THREADS / NP)) thread(s), $ROUNDS rounds; reports in $OUT" >&2
echo "host: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start" >&2
"$MLA" "${COMMON[@]}" --threads "$THREADS" --runs 1 --decode-tokens 1 --prompt-tokens 0 >/dev/null 2>&1 ||
  { echo "the warm-up bench (which writes the checkpoint when missing) failed" >&2; exit 1; }
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r: one process ..." >&2
  "$MLA" "${ARGS[@]}" --threads "$THREADS" >"$OUT/one.$r" 2>"$OUT/one.$r.err"
  echo "round $r: $NP ranks ..." >&2
  "${MPIRUN[@]}" "$MLA" "${ARGS[@]}" --threads "$((THREADS / NP))" >"$OUT/ranks.$r" 2>"$OUT/ranks.$r.err"
done
python3 - "$OUT" "$ROUNDS" "$NP" "$THREADS" <<'EOF'
import re, statistics, sys
out, rounds, np_, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def figures(path):
    text = open(path).read()
    f = {"decode": float(re.search(r"^decode, batch 1, after \d+ tokens: ([\d.]+) tokens/s", text, re.M)[1]),
         "prompt": float(re.search(r"^prompt processing \(\d+ tokens\): ([\d.]+) tokens/s", text, re.M)[1])}
    for what in ("decode step", "prompt of"):
        shares = [float(s) for s in re.findall(r"^  rank \d+ per " + what + r".*\(([\d.]+)%\)$", text, re.M)]
        if shares: f["combine " + what] = shares
    return f
one = [figures(f"{out}/one.{r}") for r in range(1, rounds + 1)]
ranks = [figures(f"{out}/ranks.{r}") for r in range(1, rounds + 1)]
med = statistics.median
print(f"{'round':>5}  {'decode tok/s: 1 proc':>21}  {f'{np_} ranks':>8}  {'ratio':>6}   {'prompt tok/s: 1 proc':>21}  {f'{np_} ranks':>8}  {'ratio':>6}")
for r in range(rounds):
    a, b = one[r], ranks[r]
    print(f"{r + 1:>5}  {a['decode']:>21.2f}  {b['decode']:>8.2f}  {b['decode'] / a['decode']:>6.3f}   "
          f"{a['prompt']:>21.1f}  {b['prompt']:>8.1f}  {b['prompt'] / a['prompt']:>6.3f}")
for what in ("decode", "prompt"):
    a, b = med([x[what] for x in one]), med([x[what] for x in ranks])
    ratios = [y[what] / x[what] for x, y in zip(one, ranks)]
    print(f"{what}: 1 process x {threads} threads {a:.2f} tokens/s, {np_} ranks x {threads // np_} {b:.2f} (medians); "
          f"ratio {b / a:.3f} of the medians, {med(ratios):.3f} median per round (range {min(ratios):.3f}-{max(ratios):.3f})")
for what, name in (("combine decode step", "a decode step"), ("combine prompt of", "a prompt")):
    per_rank = list(zip(*[x[what] for x in ranks]))
    print(f"combine share of {name}, median over rounds, by rank: " +
          ", ".join(f"rank {k} {med(s):.1f}%" for k, s in enumerate(per_rank)))
EOF
