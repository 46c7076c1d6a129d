"""Crash-safe file writes: a reader sees the old file or the new one, never a part of either."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path | str, data: str | bytes) -> None:
    """Replace ``path`` by ``data`` (str: UTF-8) through a unique temporary file in the same directory, flushed
    to disk before the rename (:func:`write_with`); the parent directory is created if missing. On error the
    temporary file is removed and the ``OSError`` propagates (``path`` is untouched)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())

    write_with(path, write)


def write_json(path: Path | str, obj: object, **dump_kwargs: object) -> None:
    """Replace ``path`` by ``obj`` serialised with ``json.dumps(obj, **dump_kwargs)`` (UTF-8), atomically."""
    write_atomic(path, json.dumps(obj, **dump_kwargs))


def write_with(path: Path | str, writer: Callable[[Path], None]) -> None:
    """Replace ``path`` by what ``writer(tmp)`` writes to a same-directory temporary path (for writers that
    take a path, such as safetensors ``save_file`` or ``torch.save``). On error the temporary file is removed
    and the exception propagates (``path`` is untouched)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        writer(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
