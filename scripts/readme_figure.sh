#!/usr/bin/env bash
# Regenerate the README's report figure: the README's main job (the shipped default model, offline), its
# report, and the mean-over-tasks curve copied to docs/report-default.png. From scratch every time (about
# 80 s), so the figure shows the current calibration artifacts (kvbench run refuses to add rows of a new
# artifact to an --out holding rows of the old one).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf results/default reports/default
.venv/bin/kvbench run --method full,random,snapkv,keydiff,triattention,kvzip,gatesight,oracle --bench ruler \
  --task niah_single_1,niah_multikey_2 --p 0.5,0.1 --limit 5 --out results/default
.venv/bin/kvbench report --results results/default --out reports/default
mkdir -p docs
cp reports/default/figures/averaged-*.png docs/report-default.png
echo "docs/report-default.png <- $(ls reports/default/figures/averaged-*.png)"
