#!/usr/bin/env bash
# Produce the calibration artifacts shipped with the built-in trained model (kvbench/builtin/calibration/),
# with the project's own commands, from a corpus of the model's own training distribution (CORPUS=training, the
# default: kvbench_training.calibration.write_training_corpus, rows of its final training stages' mixes, as the
# paper calibrates on its checkpoint's pretraining sample) or from the generic synthetic corpus (CORPUS=generic:
# kvbench.tasks.calibration_corpus.write_calibration_corpus; docs/methods.md compares the two):
#   1. TriAttention query statistics   (kvbench calibrate triattention)
#   2. GateSight utility labels         (kvbench gatesight label: the model's own rollouts)
#   3. GateSight estimator + gate means (kvbench gatesight train)
# Each artifact is keyed by the model fingerprint, which includes the dtype: DTYPES (default
# "float32 bfloat16") lists the dtypes to calibrate for; bfloat16 is what --engine vllm runs. CLEAN=1 (default)
# first drops every shipped artifact that is not of another shipped trained model's current weights (so
# MODEL's older ones go, the other models' stay); CLEAN=0 adds to them (one dtype at a time).
# Every position stays within the length the model was trained for (kvbench_builtin.json's context_length,
# 1,024 for tiny-trained), not the config maximum: TriAttention takes the corpus kinds round-robin, each
# document cut to that length (32 documents of the 3 kinds for its 32,768 tokens); GateSight labels every
# document, cut so that chat prefix + document + suffix + the sampled continuation fit in it (MAX_DOC).
# SHIP=0 leaves kvbench/builtin/calibration/ alone: the artifacts stay in .kvbench_cache/calibrate-tiny/MODEL[-generic]/cache.
# Usage: [CORPUS=training|generic] [SHIP=0] bash scripts/calibrate_tiny.sh [MODEL] [THREADS]   (default: tiny-trained, 2). Deterministic; a cut run
# resumes its GateSight labels. Run it alone: two torch threads on a core another process holds crawl.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-tiny-trained}
THREADS=${2:-2}
# the model is read from its exported directory (kvbench/builtin/MODEL) when there is one: a model just trained
# by scripts/train_tiny.sh calibrates before it is registered in kvbench.models.BUILTIN_MODELS (same weights,
# same fingerprint, same name: the directory's)
SRC=$MODEL
[ -d "kvbench/builtin/$MODEL" ] && SRC=kvbench/builtin/$MODEL
DTYPES=${DTYPES:-float32 bfloat16}
CLEAN=${CLEAN:-1}
CORPUS=${CORPUS:-training}
SHIP=${SHIP:-1}
case "$CORPUS" in
  training) WORK=.kvbench_cache/calibrate-tiny/$MODEL ;;
  generic) WORK=.kvbench_cache/calibrate-tiny/$MODEL-generic ;;
  *) echo "CORPUS=$CORPUS: valid are training, generic" >&2; exit 2 ;;
esac
# a cut run resumes: GateSight label files already written are kept (a labels directory of other weights or
# another recipe is refused by `kvbench gatesight label`); everything else is made again
mkdir -p "$WORK"
find "$WORK" -mindepth 1 -maxdepth 1 ! -name 'labels-*' -exec rm -rf {} +
export KVBENCH_CACHE="$PWD/$WORK/cache"   # the commands write their default locations here, then we copy
LABEL_CORPUS=$WORK/corpus
if [ "$CORPUS" = training ]; then
  # TriAttention reads 32,768 tokens of the whole corpus; GateSight labels its first N_LABEL_DOCS documents
  .venv/bin/python -m kvbench_training.calibration "$SRC" "$(basename "$SRC")" "$WORK/corpus"
  .venv/bin/python -m kvbench_training.calibration "$SRC" "$(basename "$SRC")" "$WORK/label-corpus" labels
  LABEL_CORPUS=$WORK/label-corpus
else
  .venv/bin/python -c "from kvbench.tasks.calibration_corpus import write_calibration_corpus as w; w('$WORK/corpus')"
fi
MAX_NEW=128   # GateSight's continuation length (the label recipe's default)
MAX_DOC=$(.venv/bin/python - "$SRC" "$MAX_NEW" <<'PY'
import sys
from kvbench.models import load_model
from kvbench.prompt import encode, template_parts
lm = load_model(sys.argv[1])
if lm.context_length is None:
    sys.exit(f"model {sys.argv[1]} states no trained context_length (kvbench_builtin.json)")
head, tail = template_parts(lm.tokenizer)
print(lm.context_length - len(encode(lm.tokenizer, head)) - len(encode(lm.tokenizer, tail)) - int(sys.argv[2]))
PY
)
echo "GateSight documents cut to $MAX_DOC tokens"
for DTYPE in $DTYPES; do
  .venv/bin/kvbench calibrate triattention --model "$SRC" --corpus "$WORK/corpus" --dtype "$DTYPE"
  .venv/bin/kvbench gatesight label --model "$SRC" --corpus "$LABEL_CORPUS" --out "$WORK/labels-$DTYPE" \
    --threads "$THREADS" --dtype "$DTYPE" --max-new-tokens "$MAX_NEW" --max-doc-tokens "$MAX_DOC"
  .venv/bin/kvbench gatesight train --labels "$WORK/labels-$DTYPE" --threads "$THREADS"
done
if [ "$SHIP" = 0 ]; then
  echo "SHIP=0: artifacts left in $WORK/cache/calibration"; find "$WORK/cache/calibration" -type f | sort; exit 0
fi
if [ "$CLEAN" = 1 ]; then
  # artifacts are keyed by fingerprint: drop every one that is not of another shipped trained model's current
  # weights (those of MODEL's older weights, and MODEL's own, replaced below)
  .venv/bin/python - "$MODEL" <<'PY'
import shutil, sys
from pathlib import Path
from kvbench.models import BUILTIN_MODELS, load_model
keep = {load_model(name, dtype=dtype).fingerprint[:16] for name, m in BUILTIN_MODELS.items()
        if m.shipped is not None and m.shipped.exists() and name != sys.argv[1] for dtype in ("float32", "bfloat16")}
root = Path("kvbench/builtin/calibration")
# the default set only (gatesight/, triattention/): a shipped alternative calibration (root/<name>/) stays
for path in sorted(p for sub in ("gatesight", "triattention") for p in (root / sub).glob("*")):
    if path.name.split(".")[0] not in keep:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        print(f"dropped {path}")
PY
fi
mkdir -p kvbench/builtin/calibration
cp -r "$WORK/cache/calibration/." kvbench/builtin/calibration/
echo "shipped calibration artifacts:"
find kvbench/builtin/calibration -type f | sort
