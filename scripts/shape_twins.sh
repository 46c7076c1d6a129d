#!/usr/bin/env bash
# Shape twins through kvbench on this machine's CPU (docs/cost.md, "At real widths"):
#
#   bash scripts/shape_twins.sh [OUT] [LENGTHS] [MODELS]
#     OUT      default results/shape-twins
#     LENGTHS  default "4096 16384"
#     MODELS   default "shape:Qwen/Qwen3-Next-80B-A3B-Instruct shape:Qwen/Qwen3.5-27B"
#
# Per model: TriAttention's calibration and a GateSight estimator made from a small synthetic corpus (the weights are
# random, so both only give the methods something of the right shape to score with), the keep-all conformance
# check (scripts/shape_twins.py check), then `kvbench run` with every built-in method and every allocation on one
# RULER niah_single_1 context per length, under /usr/bin/time -v for the peak RSS. THREADS (default 2) torch threads.
# `python scripts/shape_twins.py table OUT` prints the per-context seconds and memory.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/shape-twins}
LENGTHS=${2:-"4096 16384"}
MODELS=${3:-"shape:Qwen/Qwen3-Next-80B-A3B-Instruct shape:Qwen/Qwen3.5-27B"}
THREADS=${THREADS:-2}
KV=.venv/bin/kvbench
PY=.venv/bin/python
METHODS=full,random,snapkv,keydiff,triattention,kvzip,gatesight,oracle
mkdir -p "$OUT"
WORK="$OUT/work"
[ -d "$WORK/corpus" ] || $PY -c "from kvbench.tasks.calibration_corpus import write_calibration_corpus as w; w('$WORK/corpus', n_docs=4, n_chars=3000)"
for M in $MODELS; do
  tag=$(echo "$M" | tr '/:@' '---')
  echo "== $M" >&2
  $KV calibrate triattention --model "$M" --corpus "$WORK/corpus" --max-tokens 1024
  [ -f "$WORK/labels-$tag/.done" ] || {
    $KV gatesight label --model "$M" --corpus "$WORK/corpus" --out "$WORK/labels-$tag" --limit 2 --m 1 \
      --max-new-tokens 8 --max-doc-tokens 256 --no-check --threads "$THREADS"
    touch "$WORK/labels-$tag/.done"
  }
  $KV gatesight train --labels "$WORK/labels-$tag" --epochs 1 --threads "$THREADS"
  $PY scripts/shape_twins.py check --model "$M" --length 4096 --threads "$THREADS" --out "$OUT/check-$tag.json"
  for L in $LENGTHS; do
    /usr/bin/time -v -o "$OUT/time-$tag-$L.txt" $KV run --model "$M" --method "$METHODS" \
      --allocation flat,pyramid,gate,global --bench ruler --task niah_single_1 --limit 1 --p 0.5 --length "$L" \
      --threads "$THREADS" --out "$OUT/run-$L"
  done
done
$PY scripts/shape_twins.py table "$OUT"
