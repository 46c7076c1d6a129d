#!/usr/bin/env bash
# Shape twins through kvbench on this machine's CPU (docs/cost.md, "At real widths"):
#
#   [ENGINE=torch|vllm] [THREADS=2] [CHECK_LENGTH=4096] bash scripts/shape_twins.sh [OUT] [LENGTHS] [MODELS]
#     OUT      default results/shape-twins
#     LENGTHS  default "4096 16384" ("": the artifacts and the check only)
#     MODELS   default "shape:Qwen/Qwen3-Next-80B-A3B-Instruct shape:Qwen/Qwen3.5-27B"
#
# Per model: TriAttention's calibration and a GateSight estimator made from a small synthetic corpus (once per OUT;
# the weights are random, so both only give the methods something of the right shape to score with), the keep-all
# conformance check (scripts/shape_twins.py check at CHECK_LENGTH tokens; CHECK_LENGTH=0 skips it), then `kvbench
# run` with every method the engine offers and every allocation on one RULER niah_single_1 context per length,
# under /usr/bin/time -v for the peak RSS, into OUT/run-ENGINE-LENGTH. THREADS (default 2): torch threads.
# ENGINE=vllm: the artifacts are made for bfloat16 (the vllm engine's weights, fingerprint and artifacts), the runs
# use .venv-vllm (scripts/setup_vllm.sh) on the first THREADS cores, oracle is left out (it reads W_O from a torch
# model) and so is the check (torch only).
# `python scripts/shape_twins.py table OUT` prints the per-context seconds and memory.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/shape-twins}
LENGTHS=${2-"4096 16384"}
MODELS=${3:-"shape:Qwen/Qwen3-Next-80B-A3B-Instruct shape:Qwen/Qwen3.5-27B"}
THREADS=${THREADS:-2}
ENGINE=${ENGINE:-torch}
export OMP_NUM_THREADS=$THREADS  # the commands without --threads (calibrate) too
CHECK_LENGTH=${CHECK_LENGTH:-4096}
KV=.venv/bin/kvbench
PY=.venv/bin/python
METHODS=full,random,snapkv,keydiff,triattention,kvzip,gatesight,oracle
RUN_KV=$KV
DTYPE=()
case "$ENGINE" in
  torch) ;;
  vllm)
    METHODS=${METHODS%,oracle}
    RUN_KV=.venv-vllm/bin/kvbench
    DTYPE=(--dtype bfloat16)
    CHECK_LENGTH=0
    # shellcheck source=scripts/vllm_env.sh
    VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-$((THREADS - 1))} . scripts/vllm_env.sh
    ;;
  *) echo "shape_twins.sh: ENGINE is torch or vllm, not $ENGINE" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
WORK="$OUT/work"
[ -d "$WORK/corpus" ] || $PY -c "from kvbench.tasks.calibration_corpus import write_calibration_corpus as w; w('$WORK/corpus', n_docs=4, n_chars=3000)"
for M in $MODELS; do
  tag=$(echo "$M" | tr '/:@' '---')
  dtag=$tag${DTYPE[*]:+-bf16}
  echo "== $M ($ENGINE)" >&2
  [ -f "$WORK/calibrated-$dtag" ] || {
    $KV calibrate triattention --model "$M" "${DTYPE[@]}" --corpus "$WORK/corpus" --max-tokens 1024
    touch "$WORK/calibrated-$dtag"
  }
  [ -f "$WORK/labels-$dtag/.done" ] || {
    $KV gatesight label --model "$M" "${DTYPE[@]}" --corpus "$WORK/corpus" --out "$WORK/labels-$dtag" --limit 2 \
      --m 1 --max-new-tokens 8 --max-doc-tokens 256 --no-check --threads "$THREADS"
    touch "$WORK/labels-$dtag/.done"
  }
  [ -f "$WORK/trained-$dtag" ] || {
    $KV gatesight train --labels "$WORK/labels-$dtag" --epochs 1 --threads "$THREADS"
    touch "$WORK/trained-$dtag"
  }
  if [ "$CHECK_LENGTH" -gt 0 ]; then
    /usr/bin/time -v -o "$OUT/time-check-$tag.txt" $PY scripts/shape_twins.py check --model "$M" \
      --length "$CHECK_LENGTH" --threads "$THREADS" --out "$OUT/check-$tag.json"
  fi
  for L in $LENGTHS; do
    /usr/bin/time -v -o "$OUT/time-$ENGINE-$tag-$L.txt" $RUN_KV run --model "$M" --engine "$ENGINE" "${DTYPE[@]}" \
      --method "$METHODS" --allocation flat,pyramid,gate,global --bench ruler --task niah_single_1 --limit 1 \
      --p 0.5 --length "$L" --threads "$THREADS" --out "$OUT/run-$ENGINE-$L"
  done
done
$PY scripts/shape_twins.py table "$OUT"
