#!/usr/bin/env bash
# trio_depth.sh: prompt and decode at depth, `mla bench --depth`, mainline llama.cpp's
# `llama-bench -d` and ik_llama.cpp's `llama-bench`, N rounds, on the same random-weight
# DeepSeek-V2-Lite-shaped checkpoint and its GGUF (../shared/peer/llamacpp/make_bench_ggufs.sh
# makes them), same thread count. Run from anywhere; the project root is this script's parent.
#
#   bench/trio_depth.sh [-w bf16|fp8|int8|int4] [-n ROUNDS] [-t THREADS] [-d DEPTHS]
#                       [-m 1 (skip mainline)] [-k 1 (skip ik)] [-g GGUF] [-G IK_GGUF] [-s 1]
#
# -s 1: mla reads the same GGUF file as the peers (`mla bench -m GGUF`, its blocks as stored:
# Q4_K_M, Q8_0, a Q2_K mix ...) instead of its own checkpoint of -w's format. With -g naming a
# K-quant file this is the like-for-like comparison on the same bytes.
#
# Defaults: -w bf16 -n 5 -t 2 -d 0,8192,32768. Per depth D (tokens already in the cache):
#   prompt: a 512-token prompt after D tokens, tokens/s; decode: 64 tokens after D, tokens/s.
#   mla:      bench/trio_mla.sh bench --layers 6 --weights W --depth D1,D2,.. --prompt-tokens 512
#             --decode-tokens 64 --runs 1 --threads T (its depth rows: random latent rows stand in
#             for the D cached tokens; 1 warm-up + 1 timed run)
#   mainline: llama-bench -m GGUF -t T -p 512 -n 64 -d D1,D2,.. -r 1 -o json (it prefills each
#             depth for real, untimed)
#   ik:       its llama-bench has no -d; its llama-sweep-bench measures what -d does: it fills
#             the cache 512 tokens (-ub) at a time up to -c, and at every --sweep-stride-th
#             window times 64 decode steps (-n) after the N_KV tokens there, then the window's
#             512-token prompt at that depth. llama-sweep-bench -m GGUF -t T -c MAXDEPTH+512+64
#             -ub 512 -b 512 -n 64 --sweep-stride GCD(DEPTHS)/512 --output-format jsonl; the
#             rows at N_KV = each depth. Depths must be multiples of 512. (An earlier version
#             took ik's prompt at depth as 512 / (time of a D+512-token prompt - time of a
#             D-token prompt) from llama-bench: on a 2-vCPU VM the difference of two 30-60 s runs
#             was below their spread, and came out negative in 2 of 5 rounds.)
# Each round runs the three engines one after the other, the first of them rotating from round
# to round. weights -> GGUF (in $PEER_DIR/gguf), as bench_trio.sh pairs them:
#   bf16 -> v2lite-6L-bf16.gguf, fp8 -> v2lite-6L-q8_0-bf16io.gguf, int4 -> v2lite-6L-q4exps-bf16.gguf;
#   int8 (mla's INT8 projections, a scale per 32 weights) -> the same Q8_0 file (Q8_0: int8 weights,
#   a scale per 32): the like-for-like 8-bit pairing, where fp8 pairs FP8 blocks of 128 with it.
# -G gives ik its own file (e.g. experts in its IQ4_KS quant, which mainline cannot read).
# How long a round takes: the peers prefill every depth for real, mainline once per depth, ik
# once up to the deepest, after a load that repacks the weights (-rtr).
# -d 0,512 -t 1 took 2.5 minutes a round (mla 46 s, mainline 36 s, ik 64 s) on a 2-vCPU AMD EPYC
# VM beside another benchmark; the default 0,8192,32768 takes tens of minutes a round, most of
# it the peers' 32k prefills (raise TIMEOUT if a run is cut off).
# ik's prompt at depth 0 is its first 512-token window, after its warm-up batch (-wb).
# Env: MLA (default <root>/bench/trio_mla.sh; it runs $MLA_BIN, default <root>/build/mla),
#      MLA_DIR (mla's checkpoint folder, default mla's own <tmp>/mla-bench-v2lite-6L-<W>),
#      ML_BENCH, IK_SWEEP (binaries; IK_SWEEP default $PEER_DIR/ik_llama.cpp/build/bin/
#      llama-sweep-bench: cmake --build $PEER_DIR/ik_llama.cpp/build --target llama-sweep-bench),
#      PEER_DIR (default /tmp/mla-peer),
#      IK_EXTRA (default "-mla 3 -fa 1 -rtr -wb": ik's best CPU setting for these files, llama-bench's
#      "-mla 3 -fa 1 -fmoe 1 -rtr 1" in the common options' spelling, where fused MoE is on by
#      default and -rtr takes no value; -wb runs a 512-token batch before the sweep, as
#      llama-bench and mla warm up: without it ik's first window, the decode at depth 0, ran cold,
#      8.8 tokens/s against 19.6 at depth 8192 in the same run),
#      LL_EXTRA (extra mainline flags), TIMEOUT (seconds per engine per round, default 1800),
#      LOG_DIR (where every run's raw output is kept; default a new folder under $PEER_DIR).
# A failed or timed-out run gives nan in its cells and the script goes on.
# Prints the engines, their commits and the CPU's flags, a line per round and depth, then the
# medians and the ratios mla/ik, mla/mainline, ik/mainline per depth.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEER_DIR=${PEER_DIR:-/tmp/mla-peer}
IK_EXTRA=${IK_EXTRA--mla 3 -fa 1 -rtr -wb}
TIMEOUT=${TIMEOUT:-1800}
WEIGHTS=bf16 ROUNDS=5 THREADS=2 DEPTHS=0,8192,32768 GGUF="" IKGGUF="" LAYERS=6 SKIPML=0 SKIPIK=0 SAME=0
PP=512 TG=64
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while getopts "w:n:t:d:m:k:g:G:s:h" o; do
  case $o in
    w) WEIGHTS=$OPTARG ;; n) ROUNDS=$OPTARG ;; t) THREADS=$OPTARG ;; d) DEPTHS=$OPTARG ;;
    m) SKIPML=$OPTARG ;; k) SKIPIK=$OPTARG ;; g) GGUF=$OPTARG ;; G) IKGGUF=$OPTARG ;; s) SAME=$OPTARG ;;
    h) usage; exit 0 ;; *) usage >&2; exit 2 ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ && $THREADS =~ ^[1-9][0-9]*$ && $TIMEOUT =~ ^[1-9][0-9]*$ ]] ||
  { echo "trio_depth: -n, -t and TIMEOUT take positive integers" >&2; exit 2; }
[[ $DEPTHS =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "trio_depth: -d takes depths like 0,8192,32768" >&2; exit 2; }
IFS=, read -r -a DL <<< "$DEPTHS"
STRIDE=0
for d in "${DL[@]}"; do
  (( d % PP == 0 )) || { echo "trio_depth: depth $d is not a multiple of $PP (ik's sweep measures whole windows of $PP)" >&2; exit 2; }
  a=$STRIDE b=$((d / PP)); while ((b)); do t=$((a % b)); a=$b; b=$t; done; STRIDE=$a  # gcd
done
((STRIDE > 0)) || STRIDE=1
MAXD=$(printf '%s\n' "${DL[@]}" | sort -n | tail -1)
if [[ -z $GGUF ]]; then
  case $WEIGHTS in
    bf16) GGUF=$PEER_DIR/gguf/v2lite-${LAYERS}L-bf16.gguf ;;
    fp8|int8) GGUF=$PEER_DIR/gguf/v2lite-${LAYERS}L-q8_0-bf16io.gguf ;;
    int4) GGUF=$PEER_DIR/gguf/v2lite-${LAYERS}L-q4exps-bf16.gguf ;;
    *) echo "trio_depth: unknown weights $WEIGHTS (bf16, fp8, int8 or int4)" >&2; exit 2 ;;
  esac
fi
[[ -z $IKGGUF ]] && IKGGUF=$GGUF
MLA=${MLA:-$ROOT/bench/trio_mla.sh}
ML=${ML_BENCH:-$PEER_DIR/llama.cpp/build/bin/llama-bench}
IK=${IK_SWEEP:-$PEER_DIR/ik_llama.cpp/build/bin/llama-sweep-bench}
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
if [[ -n ${LOG_DIR:-} ]]; then LOG=$LOG_DIR; mkdir -p "$LOG" || exit 1
else LOG=$(mktemp -d "$PEER_DIR/logs-depth.XXXXXX" 2>/dev/null || mktemp -d "${TMPDIR:-/tmp}/trio_depth.XXXXXX") || exit 1; fi
MLA_ARGS=(bench --threads "$THREADS" --runs 1 --depth "$DEPTHS" --prompt-tokens "$PP" --decode-tokens "$TG")
if [[ $SAME != 0 ]]; then
  MLA_ARGS+=(-m "$GGUF")
  MLA_DIR=$GGUF
else
  MLA_ARGS+=(--layers "$LAYERS" --weights "$WEIGHTS")
  [[ -n ${MLA_DIR:-} ]] && MLA_ARGS+=(--dir "$MLA_DIR")
fi
# ik: one sweep to the deepest depth, a measured window every STRIDE windows of 512.
IK_ARGS=(-m "$IKGGUF" -t "$THREADS" -c $((MAXD + PP + TG)) -ub "$PP" -b "$PP" -n "$TG" --sweep-stride "$STRIDE"
         --output-format jsonl)
# shellcheck disable=SC2206
IK_ARGS+=(${IK_EXTRA})
# shellcheck disable=SC2206
ML_ARGS=(-m "$GGUF" -t "$THREADS" -p "$PP" -n "$TG" -d "$DEPTHS" -r 1 -o json ${LL_EXTRA:-})

commit() {  # commit of a source folder that is a git checkout of its own, +dirty if modified
  local c top
  # shellcheck disable=SC2015
  top=$(git -C "$1" rev-parse --show-toplevel 2>/dev/null) && [[ $top -ef $1 ]] &&
    c=$(git -C "$1" rev-parse --short HEAD 2>/dev/null) || { echo "unknown (not a git checkout)"; return; }
  [[ -n $(git -C "$1" status --porcelain --untracked-files=no 2>/dev/null) ]] && c+="+dirty"
  echo "$c"
}
ENGINES="mla"
[[ $SKIPML == 0 ]] && ENGINES+=" mainline"
[[ $SKIPIK == 0 ]] && ENGINES+=" ik"
echo "trio_depth: weights=$WEIGHTS depths=$DEPTHS prompt=$PP decode=$TG threads=$THREADS rounds=$ROUNDS TIMEOUT=$TIMEOUT engines: $ENGINES"
echo "  mla:      $MLA ${MLA_ARGS[*]}  (project $(commit "$ROOT"); binary ${MLA_BIN:-$ROOT/build/mla}, built $(date -ur "${MLA_BIN:-$ROOT/build/mla}" '+%F %T UTC' 2>/dev/null || echo '?'); checkpoint ${MLA_DIR:-${TMPDIR:-/tmp}/mla-bench-v2lite-${LAYERS}L-$WEIGHTS})"
[[ $SKIPML == 0 ]] && echo "  mainline: $ML ${ML_ARGS[*]}  (source $(commit "$PEER_DIR/llama.cpp"))"
[[ $SKIPIK == 0 ]] && echo "  ik:       $IK ${IK_ARGS[*]}  (source $(commit "$PEER_DIR/ik_llama.cpp"))"
echo "  cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1), $(nproc) cpus; flags:$(
  grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -xE 'avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx512_fp16|amx_tile|amx_bf16|amx_int8' | sed 's/^/ /' | tr -d '\n')"
echo "  logs: $LOG"

parse() {  # parse ENGINE FILE: a line "DEPTH PROMPT_TPS DECODE_TPS" per depth, nan where absent
  "$PY" - "$1" "$2" "$DEPTHS" "$PP" "$TG" <<'PYEOF'
import json, re, sys
eng, path, depths, pp, tg = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4]), int(sys.argv[5])
res = {d: [float("nan"), float("nan")] for d in depths}
try:
    if eng == "mla":
        # the rows under "at depth: ...": depth, batch, prompt "median (min-max)" or -, decode likewise
        num = r"(-|[0-9.]+ \([0-9.]+-[0-9.]+\))"
        row = re.compile(r"^\s+(\d+)\s+(\d+)\s+" + num + r"\s+" + num + r"\s")
        on = False
        for line in open(path, errors="replace"):
            if line.startswith("at depth:"):
                on = True
                continue
            m = on and row.match(line)
            if m and int(m.group(2)) == 1 and int(m.group(1)) in res:
                f = lambda s: float(s.split()[0]) if s != "-" else float("nan")
                res[int(m.group(1))] = [f(m.group(3)), f(m.group(4))]
    elif eng == "mainline":
        for x in json.load(open(path)):
            d = x.get("n_depth", 0)
            if d not in res: continue
            if x["n_prompt"] == pp and x["n_gen"] == 0: res[d][0] = x["avg_ts"]
            if x["n_prompt"] == 0 and x["n_gen"] == tg: res[d][1] = x["avg_ts"]
    else:  # ik: llama-sweep-bench's jsonl rows, one per measured window, among its log lines
        for line in open(path, errors="replace"):
            line = line.strip()
            if not line.startswith("{"): continue
            x = json.loads(line)
            if x.get("n_kv") in res and x.get("pp") == pp and x.get("tg") == tg:
                res[x["n_kv"]] = [x["speed_pp"], x["speed_tg"]]
except Exception as e:
    import os
    if os.path.exists(path) and os.path.getsize(path) > 0:
        print(f"trio_depth: {eng}: cannot parse {path}: {e}", file=sys.stderr)
for d in depths:
    print(d, *(f"{v:.3f}" if v == v else "nan" for v in res[d]))
PYEOF
}

run_engine() {  # run_engine ENGINE ROUND: runs it, keeps its output, appends its figures to results.tsv
  local e=$1 r=$2 out t0 rc
  t0=$(date +%s)
  case $e in
    mla)      out=$LOG/mla.$r.txt;  timeout -k 30 "$TIMEOUT" "$MLA" "${MLA_ARGS[@]}" > "$out" 2> "$LOG/mla.$r.err" ;;
    mainline) out=$LOG/ml.$r.json;  timeout -k 30 "$TIMEOUT" "$ML" "${ML_ARGS[@]}" > "$out" 2> "$LOG/ml.$r.err" ;;
    ik)       out=$LOG/ik.$r.txt;   timeout -k 30 "$TIMEOUT" "$IK" "${IK_ARGS[@]}" > "$out" 2>&1 ;;  # its rows go to stderr
  esac
  rc=$?
  SECS[$e]=$(( $(date +%s) - t0 ))
  ((rc == 0)) || echo "trio_depth: round $r: $e exited with status $rc$( ((rc == 124)) && echo " (timed out after ${TIMEOUT}s)"); its output is in $LOG ($e.$r.*)" >&2
  parse "$e" "$out" | while read -r d p g; do printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$e" "$d" "$p" "$g"; done >> "$LOG/results.tsv"
}

: > "$LOG/results.tsv"
ORDER=(mla mainline ik)
declare -A SECS
for ((r = 1; r <= ROUNDS; r++)); do
  SECS=([mla]=- [mainline]=- [ik]=-)
  for ((i = 0; i < 3; i++)); do
    e=${ORDER[$(((r - 1 + i) % 3))]}
    [[ $e == mainline && $SKIPML != 0 ]] && continue
    [[ $e == ik && $SKIPIK != 0 ]] && continue
    run_engine "$e" "$r"
  done
  if ((r == 1)); then  # what the peers' binaries say they were built from
    for f in ml; do
      [[ -s $LOG/$f.1.json ]] && "$PY" - "$LOG/$f.1.json" "$f" <<'PYEOF'
import json, sys
try:
    x = json.load(open(sys.argv[1]))[0]
    print(f"  {'mainline' if sys.argv[2] == 'ml' else 'ik'} llama-bench reports build {x.get('build_commit')} ({x.get('build_number')}), cpu_info {x.get('cpu_info')!r}, backends {x.get('backends', '?')}")
except Exception:
    pass
PYEOF
    done
  fi
  echo "round $r: mla ${SECS[mla]} s, mainline ${SECS[mainline]} s, ik ${SECS[ik]} s"
  "$PY" - "$LOG/results.tsv" "$r" <<'PYEOF'
import sys
v = {}
for line in open(sys.argv[1]):
    r, e, d, p, g = line.split()
    if r == sys.argv[2]: v[(e, int(d))] = (p, g)
print("  %6s  %9s %9s %9s  %9s %9s %9s   (tokens/s)" % ("depth", "mla_pp", "ml_pp", "ik_pp", "mla_tg", "ml_tg", "ik_tg"))
for d in sorted({d for _, d in v}):
    c = lambda e, i: v.get((e, d), ("nan", "nan"))[i]
    print("  %6d  %9s %9s %9s  %9s %9s %9s" % (d, c("mla", 0), c("mainline", 0), c("ik", 0), c("mla", 1), c("mainline", 1), c("ik", 1)))
PYEOF
done

"$PY" - "$LOG/results.tsv" "$ROUNDS" "$PP" "$TG" <<'PYEOF'
import statistics, sys
vals = {}
for line in open(sys.argv[1]):
    r, e, d, p, g = line.split()
    for k, x in ((0, p), (1, g)):
        vals.setdefault((e, int(d), k), [])
        if x != "nan": vals[(e, int(d), k)].append(float(x))
med = lambda e, d, k: statistics.median(vals.get((e, d, k)) or [float("nan")])
ratio = lambda a, b: a / b if a == a and b == b and b else float("nan")
depths = sorted({d for _, d, _ in vals})
for k, what in ((0, f"prompt ({sys.argv[3]} tokens after DEPTH)"), (1, f"decode ({sys.argv[4]} tokens after DEPTH, batch 1)")):
    print(f"median of {sys.argv[2]} round(s), {what}, tokens/s:")
    print("  %6s  %9s %9s %9s  %7s %13s %12s" % ("depth", "mla", "mainline", "ik", "mla/ik", "mla/mainline", "ik/mainline"))
    for d in depths:
        m, l, i = med("mla", d, k), med("mainline", d, k), med("ik", d, k)
        print("  %6d  %9.2f %9.2f %9.2f  %7.2f %13.2f %12.2f" % (d, m, l, i, ratio(m, i), ratio(m, l), ratio(i, l)))
PYEOF
echo "logs: $LOG"
