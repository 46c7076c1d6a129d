"""The one schema of a result row: every field a line of a results file holds, its type, whether it is part of
the row's identity, and how a line written before the field existed reads.

:class:`RowKey` declares the identity (everything that changes an answer), :class:`Row` adds what was
measured. A row's JSON object is its fields in declaration order (:meth:`RowKey.to_dict`); the runner builds
rows here (:meth:`Row.of`), the results store takes its key fields and upgrade rules from here
(:mod:`kvbench.results`), and the report its column names and kinds (:mod:`kvbench.report.data`).

How an older line lacking a field reads is the field's :class:`Absent` rule (``absent`` in its metadata):

* ``model, engine, method, allocation, p, bench, task, item, question``: every row ever written has them;
* ``length, seed, context_sha256, model_fingerprint``: rows without them are *legacy* rows (readers leave them
  out, writers refuse their file);
* ``artifact_sha256``: legacy as well, but ``kvbench results upgrade`` sets it to null in a row that lacks
  nothing else and whose method reads no calibration artifact;
* ``source``, ``query_aware``, ``default_allocation``, ``method_options``: read as their default.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Literal, Self

__all__ = [
    "IDENTITY",
    "P_DECIMALS",
    "Absent",
    "Row",
    "RowKey",
    "column_kind",
    "defaults",
    "identity_fields",
    "normal_key",
]

#: Decimals of ``p`` in a row's identity (``kvbench run`` refuses a p with more: two would share rows).
P_DECIMALS = 4


class Absent(enum.Enum):
    """How a results line that lacks the field reads (it was written before the field existed)."""

    #: every row kvbench ever wrote has it: a line without it is not a row
    NEVER = "never"
    #: an identity field added later: a line without it is a legacy row, which could stand for other settings
    LEGACY = "legacy"
    #: like LEGACY, but ``kvbench results upgrade`` sets it to null in a row that lacks nothing else, when the
    #: row's method declares no calibration artifact (exactly what kvbench records for such a method today)
    UPGRADE_TO_NULL = "upgrade to null"
    #: reads as the field's default
    DEFAULT = "default"


def _field(absent: Absent = Absent.NEVER, default: Any = MISSING, omit_empty: bool = False) -> Any:
    """A Row field with its :class:`Absent` rule; ``omit_empty``: left out of the JSON object when empty."""
    meta = {"absent": absent, "omit_empty": omit_empty}
    if default is MISSING:
        return field(metadata=meta)
    if isinstance(default, (dict, list)):
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class RowKey:
    """A row's identity: the fields that change its answer, so a row of other settings is never reused.

    ``method`` is the method's label (``name[OPTION=VALUE,…]`` with non-default options); ``p`` the kept
    fraction in (0, 1]; ``item`` the context's id within its task and ``question`` the question's; ``length``
    the resolved prompt length (tokens); ``context_sha256`` the SHA-256 of the context's token ids;
    ``model_fingerprint`` the weights' (dtype included) fingerprint of :func:`kvbench.models.fingerprint`;
    ``artifact_sha256`` the SHA-256 of the offline artifact the method scored with
    (:meth:`kvbench.methods.EvictionMethod.artifact_sha256`; None for a method without one); ``source`` tells a
    bench's generated items from its dataset's (SCBench: ``"generated"`` / ``"hub"``; None for one source)."""

    model: str = _field()
    engine: str = _field()
    method: str = _field()
    allocation: str = _field()
    p: float = _field()
    bench: str = _field()
    task: str = _field()
    item: str = _field()
    question: str = _field()
    length: int = _field(Absent.LEGACY)
    seed: int = _field(Absent.LEGACY)
    context_sha256: str = _field(Absent.LEGACY)
    model_fingerprint: str = _field(Absent.LEGACY)
    artifact_sha256: str | None = _field(Absent.UPGRADE_TO_NULL)
    source: str | None = _field(Absent.DEFAULT, None)

    def identity(self) -> tuple:
        """The identity tuple (:func:`normal_key`), equal to :func:`kvbench.results.row_key` of the row."""
        return normal_key([getattr(self, name) for name in IDENTITY])

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of a results line: every field in declaration order (a field marked ``omit_empty``
        only when non-empty). Values are the row's own objects, not copies."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) or not f.metadata["omit_empty"]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The row of a results line's JSON object, read as kvbench reads files today: a field the line lacks
        takes its default where its :class:`Absent` rule says so (``source``: null, ...). ValueError naming the
        fields when the line lacks others (a legacy row: upgrade it first) or holds fields no row has."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"fields {unknown} are not fields of a result row")
        lacking = [f.name for f in fields(cls) if f.name not in data and f.metadata["absent"] is not Absent.DEFAULT]
        if lacking:
            raise ValueError(f"the row lacks {', '.join(lacking)}")
        return cls(**data)


@dataclass(frozen=True, kw_only=True)
class Row(RowKey):
    """One finished question: its identity (:class:`RowKey`) and what was measured.

    ``prediction`` the answer's text, ``references`` the gold answers, ``scores`` every scorer's 0–100 score
    (``score`` the primary ``scorer``'s); ``real_fork`` the engine's check that the child stores exactly the kept
    entries (reports leave other rows out); ``query_aware`` / ``default_allocation`` what the method declares;
    ``kept_entries`` / ``full_entries`` (layer, KV head, token) entries of the child / parent, protected prefix
    included; ``stored_bytes`` / ``full_bytes`` their K/V storage; ``padded`` whether the child pads heads;
    ``n_context`` / ``prot`` the context's and its protected prefix's tokens; ``truncated_from`` the context's
    tokens before middle truncation (None if not truncated); ``prefill_s``, ``score_s``, ``fork_s``, ``answer_s``
    wall seconds of the context's prefill, the method's scoring, the fork and the answer (an answer decoded in a
    batch of ``answer_batch`` answers (children x questions, of every context answered together): the batch's wall
    time divided by ``answer_batch``, so a batch's rows add up to it; rows written before batching read
    ``answer_batch`` 1); ``new_tokens`` answer
    tokens, ``stopped`` whether a stop token ended it; ``random_weights`` the model's weights are random;
    ``meta`` the context's free-form details; ``method_options`` the options differing from the method's
    defaults (absent when there are none)."""

    prediction: str = _field()
    references: list[str] = _field()
    score: float = _field()
    scorer: str = _field()
    scores: dict[str, float] = _field()
    real_fork: bool = _field()
    query_aware: bool = _field(Absent.DEFAULT, False)
    default_allocation: str | None = _field(Absent.DEFAULT, None)
    kept_entries: int = _field()
    full_entries: int = _field()
    stored_bytes: int = _field()
    full_bytes: int = _field()
    padded: bool = _field()
    n_context: int = _field()
    prot: int = _field()
    truncated_from: int | None = _field()
    prefill_s: float = _field()
    score_s: float = _field()
    fork_s: float = _field()
    answer_s: float = _field()
    answer_batch: int = _field(Absent.DEFAULT, 1)
    new_tokens: int = _field()
    stopped: bool = _field()
    random_weights: bool = _field()
    meta: dict[str, Any] = _field()
    method_options: dict[str, bool | int | float | str] = _field(Absent.DEFAULT, {}, omit_empty=True)

    @classmethod
    def of(cls, key: RowKey, **measured: Any) -> Row:
        """The row of identity ``key`` with the measured fields ``measured`` (every :class:`Row` field that is
        not a :class:`RowKey` one, except those with a default)."""
        return cls(**{f.name: getattr(key, f.name) for f in fields(RowKey)}, **measured)


#: A row's identity fields, in the order of its JSON object (the identity tuple's order).
IDENTITY: tuple[str, ...] = tuple(f.name for f in fields(RowKey))
_P = IDENTITY.index("p")


def identity_fields(*absent: Absent) -> tuple[str, ...]:
    """The identity fields whose :class:`Absent` rule is one of ``absent``, in :data:`IDENTITY` order."""
    return tuple(f.name for f in fields(RowKey) if f.metadata["absent"] in absent)


def defaults(names: Iterable[str]) -> dict[str, Any]:
    """``{name: default}`` for the fields of ``names`` whose :class:`Absent` rule is DEFAULT (how a line lacking
    them reads; a fresh dict or list for each call)."""
    wanted = set(names)
    return {f.name: _default(f) for f in fields(Row) if f.name in wanted and f.metadata["absent"] is Absent.DEFAULT}


def _default(f: Field) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def normal_key(values: Sequence[Any]) -> tuple:
    """The identity tuple of :data:`IDENTITY`-ordered ``values``: ``p`` as a float rounded to
    :data:`P_DECIMALS` decimals, every other value as its ``str`` (``"None"`` for null). ValueError or TypeError
    when ``p`` is not a number."""
    out: list[Any] = list(map(str, values))
    out[_P] = round(float(values[_P]), P_DECIMALS)
    return tuple(out)


_HINTS = typing.get_type_hints(Row)


def column_kind(name: str) -> Literal["str", "float", "bool"] | None:
    """The kind of a report column holding field ``name``: identity fields as their identity-tuple value
    (``"float"`` for ``p``, ``"str"`` for the others), other fields by their type (``int`` and ``float``, null
    allowed, are ``"float"``; ``str`` is ``"str"``; ``bool`` is ``"bool"``); None for a list or dict field.
    KeyError for a name that is not a field."""
    hint = _HINTS[name]
    if name in IDENTITY:
        return "float" if name == "p" else "str"
    args = set(typing.get_args(hint)) - {type(None)} if isinstance(hint, types.UnionType) else {hint}
    if args == {bool}:
        return "bool"
    if args <= {int, float}:
        return "float"
    return "str" if args == {str} else None
