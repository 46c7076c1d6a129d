"""Tasks API: benchmarks produce contexts, each with its questions.

A :class:`Bench` yields :class:`Context` objects. A context is split the query-agnostic way:

* ``instruction`` — the task instruction placed before the long body; together with the chat template's
  header it forms the *protected prefix* that every method keeps (at most 256 tokens are protected).
* ``body`` — the long context the methods compress.
* ``questions`` — each appended after the (compressed) context as its own question: ``text`` goes inside
  the user turn, ``answer_prefix`` after the assistant header. Each question carries its own
  ``max_new_tokens``, references and scorer names.

The engine renders these pieces through the model's chat template (``kvbench.prompt``); a bench only
produces text. Benches register with :func:`register_bench` and are looked up by name.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from kvbench.errors import KvbenchError

__all__ = [
    "Question",
    "Context",
    "Bench",
    "PromptLength",
    "register_bench",
    "get_bench",
    "bench_title",
    "list_benches",
    "UnknownBenchError",
]


@dataclass(frozen=True)
class Question:
    """One question about a context.

    qid: stable id within its context (row key component).
    text: question text, placed after the context inside the user turn.
    answer_prefix: text placed after the assistant header, before generation (may be "").
    max_new_tokens: generation length for this question (tokens).
    references: gold answers handed to the scorers.
    scorers: scorer names (``kvbench.scorers``); the first is the bench's primary metric.
    """

    qid: str
    text: str
    answer_prefix: str
    max_new_tokens: int
    references: tuple[str, ...]
    scorers: tuple[str, ...]


@dataclass(frozen=True)
class Context:
    """One long context and every question asked of it.

    bench/task/item: identify the context (``item`` is a stable string id within the task).
    instruction: the task instruction before the body (part of the protected prefix).
    body: the long context text that eviction compresses.
    questions: asked one at a time against the compressed context.
    meta: free-form details recorded with each row (e.g. needle depth).
    glue: the text between instruction and body (RULER's fwe joins them with a space).
    assembly: how :mod:`kvbench.prompt` turns the pieces into token ids: ``"kvbench"`` (the pieces
        tokenized apart, ``"\n"`` before each question, the body middle-truncated so the longest question
        and its answer fit) or ``"scbench"`` (SCBench's own shared-context assembly: the chat-templated
        context prompt encoded in one call, each query from its own chat template appended directly, the
        whole context prompt middle-truncated to the model limit less ``reserve_tokens``).
    reserve_tokens: ``"scbench"`` assembly only: the tokens the official runner subtracts from the model
        limit before it middle-truncates the context prompt.
    source: where the item comes from, when a bench has more than one source (SCBench: ``"hub"`` for the
        dataset's rows, ``"generated"`` for rows kvbench generated offline); None for single-source benches.
        Part of each row's identity.
    """

    bench: str
    task: str
    item: str
    instruction: str
    body: str
    questions: tuple[Question, ...]
    meta: dict = field(default_factory=dict)
    glue: str = "\n"
    assembly: str = "kvbench"
    reserve_tokens: int = 0
    source: str | None = None


#: Callable that returns the total prompt length in tokens (chat template + instruction + body + the
#: first question + its answer prefix) of a context as the evaluated model would see it. Generators use
#: it to size haystacks to a target ``--length``.
PromptLength = Callable[[Context], int]


class Bench(ABC):
    """A benchmark: a set of named tasks, each yielding contexts.

    Subclasses set ``name`` and implement :meth:`tasks` and :meth:`contexts`.
    """

    name: str = ""
    #: display name in reports (default: ``name``)
    title: str = ""
    description: str = ""
    #: Where a generated bench may cache its contexts (None: no cache). The runner points it at
    #: ``$KVBENCH_CACHE/<bench name>``; cached items must be re-validated or keyed so they cannot go stale.
    cache_dir: Path | str | None = None

    @abstractmethod
    def tasks(self) -> list[str]:
        """The task names of this bench, in report order."""

    @abstractmethod
    def contexts(
        self, task: str, *, length: int, limit: int, seed: int, prompt_length: PromptLength
    ) -> Iterator[Context]:
        """Yield at most ``limit`` contexts of ``task``, deterministic in ``seed``, each sized so that
        ``prompt_length(context)`` plus the question's ``max_new_tokens`` is at most ``length``."""


class UnknownBenchError(KvbenchError):
    """No bench is registered under the given name."""


_BENCHES: dict[str, type[Bench]] = {}
_BUILTIN_MODULES = ("kvbench.tasks.needle", "kvbench.tasks.ruler", "kvbench.tasks.scbench")


def register_bench(cls: type[Bench]) -> type[Bench]:
    """Class decorator: make a bench available by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _BENCHES and _BENCHES[cls.name] is not cls:
        raise ValueError(f"bench {cls.name!r} is already registered by {_BENCHES[cls.name].__name__}")
    _BENCHES[cls.name] = cls
    return cls


def _load_builtins() -> None:
    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)


def list_benches() -> list[str]:
    _load_builtins()
    return sorted(_BENCHES)


def bench_title(name: str) -> str:
    """The display name of bench ``name`` (its class's ``title``, e.g. "SCBench"), or ``name`` itself for a
    bench that has none or is not registered here."""
    _load_builtins()
    cls = _BENCHES.get(name)
    return getattr(cls, "title", "") or name


def get_bench(name: str) -> Bench:
    """Instantiate the bench registered under ``name``; unknown names list the valid ones."""
    _load_builtins()
    if name not in _BENCHES:
        raise UnknownBenchError(f"unknown bench {name!r}; valid benches: {', '.join(sorted(_BENCHES))}")
    return _BENCHES[name]()
