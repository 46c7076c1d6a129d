"""tests/vllm run with an empty vLLM cache root, so vLLM inspects every model class in its subprocess exactly as on a
fresh machine (a cached inspection from an earlier run hid a failure of that subprocess that CI then met)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="kvbench-vllm-cache-")
atexit.register(shutil.rmtree, os.environ["VLLM_CACHE_ROOT"], ignore_errors=True)
