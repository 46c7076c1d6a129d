"""The CPU this process runs on."""

from __future__ import annotations

import os

__all__ = ["local_cores"]


def local_cores() -> int:
    """CPU cores this process may use (its scheduler affinity on Linux, else the machine's count; at least 1)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
