#!/usr/bin/env bash
# Fresh-machine setup: a project virtual environment with the CPU torch wheel, kvbench (+ dev tools) and the
# trainer's distribution kvbench-training (training/, for `kvbench train-tiny`).
# torch is pinned here (not in pyproject) so GPU users keep their CUDA build; on this CPU machine
# torch==2.13.0 comes from a local wheel, while an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "[kvbench setup] $*"; }
if [ -x .venv/bin/python ]; then say "using the existing .venv"; else say "creating .venv with $PY"; "$PY" -m venv .venv; fi
say "upgrading pip"
.venv/bin/python -m pip install -q --upgrade pip
say "installing torch==2.13.0 (CPU wheel)"
.venv/bin/python -m pip install -q "torch==2.13.0"
say "installing kvbench (editable) with its dev tools"
# pyproject lists every package and data file, so the build raises no setuptools packaging warning; the one
# filter below drops setuptools' information-only note that every editable install of a project with a
# package-dir mapping prints ("Editable installation. Please be careful with folders ..."), nothing else.
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e ".[dev]"
# the trainer is its own distribution (training/, kept out of the kvbench wheel): it adds `kvbench train-tiny`
say "installing kvbench-training (editable): kvbench train-tiny"
PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q --no-deps -e training/
say "installed:"
.venv/bin/python -c "import kvbench, kvbench_training, torch, transformers; print('kvbench', kvbench.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
