"""The cache of a bench's generated task data: one file per generation, named by a digest of everything that
made it (generator version, task, length, seed, tokenizer...), so a changed input never reads a stale file.

A bench builds its data once, stores it as text, and on the next run loads it back through its own decoder; a
file that is missing, unreadable or corrupt (truncated, foreign, not the bench's format) loads as ``None`` and
the bench regenerates it. Writes are atomic (:mod:`kvbench.atomic`); one that fails is a warning, not an error,
since the data can always be generated again."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kvbench.atomic import write_atomic

__all__ = ["TaskDataCache"]

T = TypeVar("T")
#: What a decoder may raise on a file that is not what the bench wrote (``UnicodeDecodeError`` and
#: ``json.JSONDecodeError`` are ``ValueError``\ s).
CORRUPT = (ValueError, KeyError, TypeError, AttributeError)


class TaskDataCache:
    """The cache file ``directory/{stem}-{digest}{suffix}`` of one generation, ``digest`` the first 24 hex
    digits of the sha256 of ``key`` as sorted JSON. ``label`` names the bench in the warning a failed write
    gives (``"could not write the {label} cache ..."``)."""

    def __init__(self, directory: Path | str, key: dict, stem: str, suffix: str, label: str) -> None:
        self.key = key
        self.label = label
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        self.path = Path(directory) / f"{stem}-{digest}{suffix}"

    def load(self, decode: Callable[[str], T]) -> T | None:
        """``decode(text)`` of the file (UTF-8), or None where the file is missing, unreadable, or ``decode``
        finds it corrupt (raises one of :data:`CORRUPT`): the caller regenerates."""
        try:
            return decode(self.path.read_text(encoding="utf-8"))
        except (OSError, *CORRUPT):
            return None

    def store(self, text: str) -> None:
        """Replace the file by ``text`` (UTF-8) atomically; a failed write (read-only or full disk) is a
        ``UserWarning`` naming the file, and the file is left as it was."""
        try:
            write_atomic(self.path, text)
        except OSError as exc:
            warnings.warn(f"kvbench: could not write the {self.label} cache {self.path}: {exc}", stacklevel=2)
