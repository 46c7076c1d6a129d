#!/usr/bin/env bash
# Fresh-machine setup: a project virtual environment with the CPU torch wheel and kvbench (+ dev tools).
# torch is pinned here (not in pyproject) so GPU users keep their CUDA build; on this CPU machine
# torch==2.13.0 comes from a local wheel, while an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
.venv/bin/python -c "import kvbench, torch, transformers; print('kvbench', kvbench.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
