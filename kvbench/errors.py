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
