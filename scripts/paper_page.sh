#!/usr/bin/env bash
# Regenerate the committed tiny-scale page of `kvbench paper` (docs/paper-page/: paper.md, index.html, figures/,
# verdicts.json): run the full tiny grid on both shipped models into a work directory (resumable: rerun this
# script after an interruption and finished stages are skipped), then render the page from its rows and stage
# outputs with `--results`, which computes nothing. Usage: scripts/paper_page.sh [WORK_DIR (default paper-tiny)]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-paper-tiny}
start=$(date +%s)
.venv/bin/kvbench paper --out "$WORK" --threads "${THREADS:-1}"
echo "[paper_page] grid run: $(( $(date +%s) - start )) s wall (into $WORK)"
.venv/bin/kvbench paper --results "$WORK" --out docs/paper-page
echo "[paper_page] page: docs/paper-page/paper.md, docs/paper-page/verdicts.json"
