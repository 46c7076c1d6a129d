"""The lock of a results file's one writer (:class:`ResultsLock`, an exclusive ``fcntl.flock`` on ``<file>.lock``
holding its owner's pid and command), and the check that such a lock covers the file alone
(:func:`check_results_file`).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import sys
import time
from pathlib import Path

from kvbench.results.keys import ResultsError


def _open_lock_file(path: Path) -> tuple[int, bool]:
    """``(fd, created)``: ``path`` opened for reading and writing, created if absent (``created`` says so). A
    ResultsError naming the fix when it cannot be opened (a directory in its place, another user's read-only
    file, …)."""
    while True:
        try:
            try:
                return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileExistsError:
                return os.open(path, os.O_RDWR), False
        except FileNotFoundError:
            continue  # removed between the two opens: create it
        except OSError as e:
            raise ResultsError(
                f"cannot open the lock file {path} ({e.strerror or e}): remove it or make it a writable file "
                "(when no kvbench run is writing there), or use another --out"
            ) from None


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed or replaced meanwhile)."""
    try:
        st, fst = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


class ResultsLock:
    """An exclusive ``fcntl.flock`` on ``path``, holding ``{"pid", "command"}`` of its owner. ``created``: this
    lock created the file (:meth:`ResultsStore.close` removes such a file when the store wrote nothing)."""

    def __init__(self, path: Path, *, wait: bool) -> None:
        """Take the lock (waiting for it when ``wait``); BlockingIOError when held and not ``wait``, a
        ResultsError naming the fix when the lock file cannot be used. A lock file removed or replaced while
        this waited for it is opened again, so two holders never lock two files of one name."""
        self.path = path
        while True:
            fd, self.created = _open_lock_file(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                raise
            except OSError as e:
                os.close(fd)
                raise ResultsError(f"cannot lock {path} ({e.strerror or e}); use another --out") from None
            if _same_file(fd, path):
                break
            os.close(fd)
        self.fd: int | None = fd
        if not wait:
            try:
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps({"pid": os.getpid(), "command": sys.argv}).encode() + b"\n")
            except OSError:
                pass  # who holds it is for messages only: the lock holds without it

    @staticmethod
    def holder(path: Path) -> str:
        """Who holds the lock at ``path``, as "pid N (command …)"; read without taking it."""
        for _ in range(20):  # the holder writes its pid just after taking the lock
            try:
                info = json.loads(path.read_bytes())
                return f"pid {info['pid']} ({' '.join(map(str, info['command']))})"
            except (OSError, ValueError, KeyError, TypeError):
                time.sleep(0.01)
        return "a process that has not written its pid yet"

    def release(self) -> None:
        """Release the lock (the file stays; it is not a sign of a live writer)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def discard(self) -> None:
        """Release the lock, first removing its file if this lock created it (still held then: a process that
        opened the file meanwhile finds it gone once it gets the lock, and opens the path again)."""
        if self.fd is not None and self.created:
            self.path.unlink(missing_ok=True)
        self.release()


def check_results_file(path: Path) -> None:
    """Refuse (ResultsError) a results file that its writer's lock would not cover alone: a directory, a symbolic
    link, a file with several hard links (a second name would bypass ``<name>.lock``), or not a regular file
    (a device such as ``/dev/null``, a pipe). An absent file passes."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        fix = "fix its permissions or use another --out"
        raise ResultsError(f"cannot read {path} ({e.strerror or e}); {fix}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ResultsError(f"{path} is a directory, not a results file: move it away or use another --out")
    if stat.S_ISLNK(st.st_mode):
        raise ResultsError(
            f"{path} is a symbolic link (to {os.readlink(path)}): its writer's lock covers one name only, so runs "
            "through another name would write it at once; replace the link by a copy of the file, or use another --out"
        )
    if not stat.S_ISREG(st.st_mode):
        raise ResultsError(f"{path} is not a regular file: move it away or use another --out")
    if st.st_nlink > 1:
        raise ResultsError(
            f"{path} has {st.st_nlink} hard links: its writer's lock covers one name only, so runs through another "
            "name would write it at once; replace it by a copy of its own (cp, then mv over it), or use another --out"
        )
