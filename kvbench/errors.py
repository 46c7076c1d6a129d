"""User-facing errors. The CLI prints their message (no traceback) and exits non-zero."""


class KvbenchError(Exception):
    """Base class of every error caused by user input or misuse; the message names the fix."""


class ProtocolError(KvbenchError):
    """Misuse of a session: released or unknown session, second live child, context hash mismatch."""


class ModelError(KvbenchError):
    """The model cannot be loaded or is not a supported hybrid."""


class MissingDataError(KvbenchError):
    """A task's external data file is absent; the message names the file and how to supply it.

    ``reason``: one line saying what is missing for this task (no fix); ``fix``: how to supply it, the same
    text for every task of a bench, so a report over many tasks can print each reason on its own line and
    the fix once. ``str(error)`` is ``reason + ". Fix: " + fix`` (or the message given)."""

    def __init__(self, message: str = "", *, reason: str | None = None, fix: str | None = None) -> None:
        self.reason = reason if reason is not None else message
        self.fix = fix
        super().__init__(message or (f"{reason}. Fix: {fix}" if fix else str(reason)))


class TooShortError(KvbenchError):
    """A generated task's smallest prompt does not fit ``--length``; the message names the length needed."""


def os_error(exc: OSError, fix: str | None = None, path: object = None) -> KvbenchError:
    """One line for ``exc`` naming the path it concerns (``path``, else the error's own file name) and the fix:
    ``fix`` when given, else one chosen by the kind of error (permission, read-only file system, full disk,
    missing path). What the command line prints for an OS error instead of a traceback."""
    import errno

    where = path if path is not None else exc.filename
    reason = " ".join((exc.strerror or str(exc) or type(exc).__name__).split())  # one line, whatever the library wrote
    if fix is None:
        code = exc.errno
        if code in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = "make it writable (or readable) for this user, or choose another path"
        elif code == errno.ENOSPC or code == errno.EDQUOT:
            fix = "free space on that file system, or choose a path on another one"
        elif code in (errno.ENOENT, errno.ENOTDIR):
            fix = "check that the path exists, or create its parent directory"
        elif code == errno.EISDIR:
            fix = "give a file there, not a directory"
        else:
            fix = "check the path, or rerun with --debug for the traceback"
    target = f" {where}" if where is not None else ""
    return KvbenchError(f"cannot use{target} ({reason}); {fix}")
