"""Offline artifacts of methods (calibration statistics, trained estimators): safetensors files whose
metadata key ``"kvbench"`` holds a JSON object with at least ``format`` and the model ``fingerprint``.

Reading one checks, with an error that names the command producing a valid one: that it exists, that it
is readable, that its format is the expected one, and that it was made for the model being evaluated.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from kvbench.errors import KvbenchError

META_KEY = "kvbench"
#: Calibration artifacts shipped with kvbench for its built-in trained models (same layout as the cache).
SHIPPED_CALIBRATION = Path(__file__).resolve().parent / "builtin" / "calibration"


def find_calibration(cached: Path) -> Path:
    """Where to read a default calibration artifact whose write location is ``cached`` (a path under
    ``$KVBENCH_CACHE/calibration/``): ``cached`` when it exists (the user's own calibration wins), else
    the artifact shipped under ``SHIPPED_CALIBRATION`` at the same relative path when that exists, else
    ``cached`` (so a missing-artifact error names where the producing command writes). Artifacts are keyed
    by model fingerprint, and reading one checks it, so a shipped artifact never serves another model."""
    from kvbench.models import cache_dir

    if cached.exists():
        return cached
    try:
        shipped = SHIPPED_CALIBRATION / cached.relative_to(cache_dir() / "calibration")
    except ValueError:
        return cached
    return shipped if shipped.exists() else cached


def read_artifact(path: Path, *, what: str, fmt: str, fix: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) of the artifact file ``path``. ``what`` names it in errors ("GateSight artifact"),
    ``fmt`` is the expected ``format``, ``fix`` the command that produces one."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise KvbenchError(f"no {what} at {path}; produce one for this model with `{fix}`")
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = json.loads((fh.metadata() or {})[META_KEY])
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as exc:  # unreadable, foreign, truncated
        raise KvbenchError(
            f"{path} is not a readable {what} ({type(exc).__name__}: {exc}); recreate it with `{fix}`"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise KvbenchError(f"{path} has format {got!r}, expected {fmt!r}; recreate it with `{fix}`")
    return meta, tensors


def check_fingerprint(got: str, expected: str | None, *, what: str, fix: str) -> None:
    """Raise unless ``got`` (the artifact's model fingerprint) is ``expected``; None skips the check."""
    if expected is not None and got != expected:
        raise KvbenchError(
            f"the {what} was made for model fingerprint {got[:16]}…, but this model has fingerprint "
            f"{expected[:16]}…; make one for this model with `{fix}`"
        )
