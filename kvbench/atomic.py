"""Crash-safe writes: a reader sees the old file (or folder) or the new one, never a part of either.

This module is the one place in kvbench that renames a temporary path onto its destination; every other
module writes through it (``tests/test_atomic_only.py`` checks). One function per kind of write:

- :func:`write_atomic`: bytes or text already in memory;
- :func:`write_json`: an object as JSON;
- :func:`write_with`: a writer that takes a path (a streaming writer, ``safetensors`` ``save_file``, a
  compiler's ``-o``);
- :func:`write_dir`: a folder filled by a writer (``save_pretrained``, checkpoints);
- :func:`move_into_place`: a temporary file whose life spans more than one call (a resumable download's
  ``.part``), published once it is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["check_writable", "move_into_place", "sha256_of", "write_atomic", "write_dir", "write_json", "write_with"]


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


def write_with(path: Path | str, writer: Callable[[Path], None], mode: int = 0o644) -> None:
    """Replace ``path`` by what ``writer(tmp)`` writes to a same-directory temporary path (for writers that
    take a path, such as safetensors ``save_file``, ``torch.save`` or a compiler's ``-o``); the parent
    directory is created if missing and the file gets permission bits ``mode`` (0o755 for a shared library).
    On error the temporary file is removed and the exception propagates (``path`` is untouched)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        writer(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_dir(path: Path | str, writer: Callable[[Path], None], overwrite: bool = True) -> bool:
    """Make ``path`` the folder ``writer(tmp)`` fills, ``tmp`` being a fresh, empty same-directory folder
    (permission bits 0o755). An existing ``path`` is replaced (``overwrite``: it is moved aside, the new
    folder renamed in, then the old one removed, so ``path`` is always whole) or, with ``overwrite=False``,
    kept and the new folder discarded (for a build that any process may do once; the first one wins).
    On error the temporary folder is removed, ``path`` is as it was and the exception propagates. Returns
    whether ``path`` now holds what ``writer`` wrote."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        writer(tmp)
        os.chmod(tmp, 0o755)
        return _swap_in(tmp, path, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _swap_in(tmp: Path, path: Path, overwrite: bool) -> bool:
    """Rename the folder ``tmp`` onto ``path`` (see :func:`write_dir`); False where ``path`` is kept."""
    if not path.exists():
        try:
            os.replace(tmp, path)
            return True
        except OSError:
            if not path.exists():  # not a lost race against another writer: a real error
                raise
    if not overwrite:
        return False
    old = tmp.with_name(tmp.name.removesuffix(".tmp") + ".old")
    os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return True


def move_into_place(tmp: Path | str, path: Path | str) -> None:
    """Publish the finished file ``tmp`` (a same-directory temporary file that outlives one call, such as a
    resumable download's ``.part``) as ``path`` in one step, after flushing it to disk. For a file written
    in one go, use :func:`write_with` instead."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def put_back(aside: Path | str, path: Path | str) -> None:
    """Put back the directory ``aside`` that :func:`write_dir` moved out of ``path``'s way (its ``.old``
    folder) when a kill stopped the replacement before the new directory was in place."""
    os.replace(aside, path)


def check_writable(path: Path | str, option: str) -> None:
    """Refuse, before any work, a ``path`` (a file or folder an option names, created later with its parents)
    that cannot be written: its nearest existing ancestor is not a folder this user may write into. The
    :class:`~kvbench.errors.KvbenchError` names the option, the path and the fix."""
    from kvbench.errors import KvbenchError

    path = Path(path).expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and existing != path and not existing.is_dir():
        raise KvbenchError(f"{option} {path}: {existing} is a file, not a folder; choose another {option}")
    folder = existing if existing.is_dir() else existing.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise KvbenchError(f"{option} {path}: {folder} is not writable by this user (read-only or permission denied); "
                           f"make it writable or choose another {option}")  # fmt: skip


def sha256_of(path: Path | str) -> str:
    """The sha256 (hex) of the file at ``path`` (how a written or fetched file is checked later)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
