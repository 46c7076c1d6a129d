#!/usr/bin/env bash
# Measure a built-in trained model's card numbers (issue targets) and its rows of the methods table with
# `kvbench run`, float32, then print the reports and the targets (scripts/card_targets.py):
#   ruler-full:   RULER's own items (official sampling, seed 42) at the model's length (4,096), full cache,
#                 LIMIT_FULL items per task (default 50): the six synthetic tasks, and the essay-haystack tasks
#                 when RULER's essays are present (KVBENCH_DATA_DIR=…/ruler/PaulGrahamEssays.json's parent);
#   ruler-1024:   the same six tasks at 1,024 tokens (the length stages 1-7 were trained at);
#   scbench:      SCBench's offline-generated tasks (kv, mf, prefix_suffix, vt) at the model's length,
#                 LIMIT_SCBENCH contexts x 5 questions (default 20), full cache and random at p = 0.1, at
#                 seed 42 (scbench/) and seed 43 (scbench-seed43/);
#   eviction:     the 7 methods + oracle at p = 0.5 / 0.1 on four RULER tasks, LIMIT_EVICT items (default 10);
#   eviction-scbench: the same on SCBench's four generated tasks, LIMIT_EVICT_SCBENCH contexts x 5 questions
#                 (default 5).
# Resumes where it stopped (rows are kept per setting and artifact).
# Usage: [THREADS=N] [BEFORE_1024=MEAN] bash scripts/card_numbers.sh MODEL [OUT]   (default OUT: results/card-MODEL;
#        BEFORE_1024: the five-task mean at 1,024 tokens before issue 44, see scripts/card_targets.py)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bash scripts/card_numbers.sh MODEL [OUT]}
OUT=${2:-results/card-$MODEL}
kvbench() { .venv/bin/kvbench "$@"; }
run() { kvbench run --model "$MODEL" --dtype float32 ${THREADS:+--threads "$THREADS"} "$@"; }
SIX=niah_single_1,niah_multikey_2,niah_multikey_3,vt,fwe,cwe
run --method full --bench ruler --task "$SIX" --limit "${LIMIT_FULL:-50}" --out "$OUT/ruler-full"
if [ -n "${KVBENCH_DATA_DIR:-}" ] && [ -f "$KVBENCH_DATA_DIR/ruler/PaulGrahamEssays.json" ]; then
  run --method full --bench ruler --task niah_single_2,niah_single_3,niah_multikey_1,niah_multivalue,niah_multiquery \
    --limit "${LIMIT_FULL:-50}" --out "$OUT/ruler-full"
fi
run --method full --bench ruler --task "$SIX" --length 1024 --limit "${LIMIT_FULL:-50}" --out "$OUT/ruler-1024"
run --method full,random --p 0.1 --bench scbench --task kv,mf,prefix_suffix,vt --limit "${LIMIT_SCBENCH:-20}" \
  --out "$OUT/scbench"
# the same at the second declared evaluation seed (kvbench_training.EVAL_SEEDS; no training row uses it)
run --method full,random --p 0.1 --bench scbench --task kv,mf,prefix_suffix,vt --limit "${LIMIT_SCBENCH:-20}" \
  --seed 43 --out "$OUT/scbench-seed43"
run --method full,random --p 0.1 --bench ruler --task niah_single_1 --limit "${LIMIT_FULL:-50}" --out "$OUT/ruler-full"
run --method full,random,snapkv,keydiff,triattention,kvzip,gatesight,oracle --bench ruler \
  --task niah_single_1,niah_multikey_2,vt,fwe --p 0.5,0.1 --limit "${LIMIT_EVICT:-10}" --out "$OUT/eviction"
run --method full,random,snapkv,keydiff,triattention,kvzip,gatesight,oracle --bench scbench \
  --task kv,mf,prefix_suffix,vt --p 0.5,0.1 --limit "${LIMIT_EVICT_SCBENCH:-5}" --out "$OUT/eviction-scbench"
for part in ruler-full ruler-1024 scbench scbench-seed43 eviction eviction-scbench; do
  echo "== $MODEL: $part ($OUT/$part)"
  kvbench report --results "$OUT/$part" --out "$OUT/report-$part"
done
.venv/bin/python scripts/card_targets.py "$OUT" ${BEFORE_1024:+--before-1024 "$BEFORE_1024"}
