#!/usr/bin/env bash
# Measure a built-in trained model's card numbers and its rows of the README's methods table with `kvbench run`,
# on RULER's own items (the ruler bench's default `official` sampling, seed 42), float32, at the model's length:
#   full cache: the six RULER tasks that fit 1,024 tokens, LIMIT_FULL items each (default 50);
#   eviction:   the 7 methods + oracle at p = 0.5 / 0.1 on four tasks, LIMIT_EVICT items each (default 10).
# Then prints each run's report tables. Resumes where it stopped (rows are kept per setting and artifact).
# Usage: bash scripts/card_numbers.sh MODEL [OUT]   (default OUT: results/card-MODEL)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bash scripts/card_numbers.sh MODEL [OUT]}
OUT=${2:-results/card-$MODEL}
kvbench() { .venv/bin/kvbench "$@"; }
kvbench run --model "$MODEL" --method full --bench ruler --task niah_single_1,niah_multikey_2,niah_multikey_3,vt,fwe,cwe \
  --limit "${LIMIT_FULL:-50}" --out "$OUT/full"
kvbench run --model "$MODEL" --method full,random,snapkv,keydiff,triattention,kvzip,gatesight,oracle --bench ruler \
  --task niah_single_1,niah_multikey_2,vt,fwe --p 0.5,0.1 --limit "${LIMIT_EVICT:-10}" --out "$OUT/eviction"
for part in full eviction; do
  echo "== $MODEL: $part ($OUT/$part)"
  kvbench report --results "$OUT/$part" --out "$OUT/report-$part"
done
