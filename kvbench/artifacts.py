"""Offline artifacts of methods (calibration statistics, trained estimators): safetensors files whose
metadata key ``"kvbench"`` holds a JSON object with at least ``format`` and the model ``fingerprint``.

Reading one checks, with an error that names the command producing a valid one: that it exists, that it
is readable, that its format is the expected one, and that it was made for the model being evaluated.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import torch

from kvbench.errors import KvbenchError

META_KEY = "kvbench"
T = TypeVar("T")
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


def shipped_alternative(name: str, cached: Path) -> Path:
    """The artifact of the shipped alternative calibration ``name`` (``SHIPPED_CALIBRATION/<name>/``, the same
    layout as the default set beside it) at the relative path ``cached`` has under ``$KVBENCH_CACHE/calibration/``:
    what ``--set gatesight.calibration=NAME`` / ``--set triattention.calibration=NAME`` read. An unknown name is a
    :class:`KvbenchError` listing the shipped ones."""
    from kvbench.models import cache_dir

    rel = cached.relative_to(cache_dir() / "calibration")
    folder = rel.parts[0]  # the method's own folder of the default set; an alternative set mirrors it
    known = (
        sorted(p.name for p in SHIPPED_CALIBRATION.iterdir() if p.is_dir() and (p / folder).is_dir())
        if SHIPPED_CALIBRATION.is_dir()
        else []
    )
    if name not in known:
        raise KvbenchError(
            f"no shipped calibration {name!r}; the shipped alternatives are: {', '.join(known) or 'none'} "
            "(leave calibration unset for the default one)"
        )
    return SHIPPED_CALIBRATION / name / rel


@dataclass(frozen=True)
class Artifact:
    """One artifact file as read: ``meta`` (its ``"kvbench"`` metadata), ``tensors`` and ``sha256``, the hex
    SHA-256 of the very bytes parsed (what rows scored with it record as ``artifact_sha256``)."""

    meta: dict
    tensors: dict[str, torch.Tensor]
    sha256: str


def read_artifact(path: Path, *, what: str, fmt: str, fix: str) -> Artifact:
    """The artifact file ``path``, read once (its digest and its contents come from the same bytes). ``what``
    names it in errors ("GateSight artifact"), ``fmt`` is the expected ``format``, ``fix`` the command that
    produces one."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    if not path.is_file():
        raise KvbenchError(f"no {what} at {path}; produce one for this model with `{fix}`")
    try:
        data = path.read_bytes()
        tensors = load(data)
        (header_len,) = struct.unpack("<Q", data[:8])
        meta = json.loads(json.loads(data[8 : 8 + header_len])["__metadata__"][META_KEY])
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, struct.error) as exc:  # unreadable, foreign, cut
        raise KvbenchError(
            f"{path} is not a readable {what} ({type(exc).__name__}: {exc}); recreate it with `{fix}`"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise KvbenchError(f"{path} has format {got!r}, expected {fmt!r}; recreate it with `{fix}`")
    return Artifact(meta, tensors, hashlib.sha256(data).hexdigest())


def check_fingerprint(got: str, expected: str | None, *, what: str, fix: str) -> None:
    """Raise unless ``got`` (the artifact's model fingerprint) is ``expected``; None skips the check."""
    if expected is not None and got != expected:
        raise KvbenchError(
            f"the {what} was made for model fingerprint {got[:16]}…, but this model has fingerprint "
            f"{expected[:16]}…; make one for this model with `{fix}`"
        )


class ReadOnce(Generic[T]):
    """A method instance's artifact, read once: ``get(path, fingerprint)`` calls ``read(path, fingerprint)`` on
    first use and again only when the path or the expected model fingerprint changes, so an instance scores with
    the very bytes whose digest its rows record (``artifact_sha256``). A failed read leaves it unchanged."""

    def __init__(self, read: Callable[[Path, str | None], T]) -> None:
        self._read = read
        self._key: tuple[str, str | None] | None = None
        self._value: T | None = None

    def get(self, path: Path, fingerprint: str | None) -> T:
        """The artifact at ``path`` for the model of ``fingerprint`` (None: unchecked), read at most once per key."""
        key = (str(path), fingerprint)
        if self._key != key:
            self._value = self._read(path, fingerprint)
            self._key = key
        return self._value  # type: ignore[return-value]
