"""User-facing errors. The CLI prints their message (no traceback) and exits non-zero."""


class KvbenchError(Exception):
    """Base class of every error caused by user input or misuse; the message names the fix."""


class ProtocolError(KvbenchError):
    """Misuse of a session: released or unknown session, second live child, context hash mismatch."""


class ModelError(KvbenchError):
    """The model cannot be loaded or is not a supported hybrid."""


class MissingDataError(KvbenchError):
    """A task's external data file is absent; the message names the file and how to supply it."""


class TooShortError(KvbenchError):
    """A generated task's smallest prompt does not fit ``--length``; the message names the length needed."""
