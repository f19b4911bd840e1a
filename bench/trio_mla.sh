#!/usr/bin/env bash
# `mla bench` as ../shared/peer/ik_llama/bench_trio.sh runs it (MLA=bench/trio_mla.sh), without
# the sections that script does not read: speculative decoding and the 1-against-2-thread
# scaling. Decode, the prompt and their bandwidth and compute-peak probes run as they would
# otherwise, and a round takes about half the time. With bench/trio_depth.sh the arguments carry
# --depth, which runs only the depth rows: the two flags then change nothing.
exec "${MLA_BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/mla}" "$@" --spec-tokens 0 --no-scaling
