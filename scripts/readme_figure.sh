#!/usr/bin/env bash
# Regenerate the README's report figure: the README's main job (the two shipped trained models, offline; RULER-4096
# and SCBench's generated tasks), timed, its report, and its RULER across-models figure (a panel per model) copied
# to docs/report-default.png (the one mean-over-tasks curve when the job runs one model). From scratch every time (a few
# minutes), so the figure shows the current calibration artifacts (kvbench run refuses to add rows of a new
# artifact to an --out holding rows of the old one).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf results/default reports/default
start=$(date +%s)
M=full,random,snapkv,keydiff,triattention,kvzip,gatesight,oracle
.venv/bin/kvbench run --model tiny-trained,tiny-trained-dense --method "$M" --bench ruler \
  --task niah_single_1,niah_multikey_2 --p all --limit 5 --out results/default
.venv/bin/kvbench run --model tiny-trained,tiny-trained-dense --method "$M" --bench scbench \
  --task kv,mf,prefix_suffix,vt --p 0.1 --limit 1 --out results/default
.venv/bin/kvbench report --results results/default --out reports/default
echo "the README's main job: $(($(date +%s) - start)) s"
mkdir -p docs
# RULER's across-models figure (one panel per model) when the job runs two or more models, else its one mean curve
shopt -s nullglob
figs=(reports/default/figures/models-*-ruler-*.png)
[ ${#figs[@]} -eq 0 ] && figs=(reports/default/figures/averaged-*-ruler-*.png)
[ ${#figs[@]} -eq 1 ] || { echo "expected one figure to copy, found ${#figs[@]}: ${figs[*]}" >&2; exit 1; }
cp "${figs[0]}" docs/report-default.png
echo "docs/report-default.png <- ${figs[0]}"
