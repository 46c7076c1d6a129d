"""Where kvbench keeps what it builds or fetches once per machine: ``$KVBENCH_CACHE``, default ``~/.cache/kvbench``
(models, calibration artifacts, bench data, the compiled decode-attention kernel)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    return Path(os.environ.get("KVBENCH_CACHE", Path.home() / ".cache" / "kvbench"))
