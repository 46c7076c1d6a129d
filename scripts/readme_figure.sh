#!/usr/bin/env bash
# Regenerate the README's report figure: the README's main job (the shipped default model, offline), its
# report, and the mean-over-tasks curve copied to docs/report-default.png. Resumes a finished run (rows are
# skipped), so a rerun after a code change of the report only re-renders.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/kvbench run --method full,random,snapkv,keydiff,triattention,kvzip,gatesight,oracle --bench ruler \
  --task niah_single_1,niah_multikey_2 --p 0.5,0.1 --limit 5 --out results/default
.venv/bin/kvbench report --results results/default --out reports/default
mkdir -p docs
cp reports/default/figures/averaged-*.png docs/report-default.png
echo "docs/report-default.png <- $(ls reports/default/figures/averaged-*.png)"
