"""Tasks API: benchmarks produce contexts, each with its questions.

A :class:`Bench` yields :class:`Context` objects. A context is split the query-agnostic way:

* ``instruction`` — the task instruction placed before the long body; together with the chat template's
  header it forms the *protected prefix* that every method keeps (at most 256 tokens are protected).
* ``body`` — the long context the methods compress.
* ``questions`` — each appended after the (compressed) context as its own question: ``text`` goes inside
  the user turn, ``answer_prefix`` after the assistant header. Each question carries its own
  ``max_new_tokens``, references and scorer names.

The engine renders these pieces through the model's chat template (``kvbench.prompt``); a bench only
produces text. Benches are registered in :data:`BENCHES`: the built-ins by table, plugins through the
``kvbench.benches`` entry-point group (``mybench = mypkg.bench:MyBench``, the key being the bench's ``name``),
others with :func:`register_bench`; they are looked up by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator

from kvbench.errors import KvbenchError
from kvbench.registry import Registry, RegistryError, UnknownNameError, load_spec
from kvbench.tasks.commands import BUILTIN_COMMANDS, COMMAND_HELP  # the benches' commands (kvbench.commands reads)

if TYPE_CHECKING:
    from kvbench.prompt import Rendered

__all__ = [
    "BENCHES",
    "BUILTIN_BENCHES",
    "BUILTIN_COMMANDS",
    "COMMAND_HELP",
    "DEFAULT_BENCH",
    "Question",
    "Context",
    "Assembly",
    "Bench",
    "PromptLength",
    "register_bench",
    "get_bench",
    "bench_title",
    "context_assembly",
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
        and its answer fit) or the name of an :class:`Assembly` the context's bench declares in its
        ``assemblies`` (SCBench's ``"scbench"``: the chat-templated context prompt encoded in one call, each
        query from its own chat template appended directly, the whole context prompt middle-truncated to the
        model limit less ``reserve_tokens``).
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


#: The assembly :mod:`kvbench.prompt` applies itself; any other ``Context.assembly`` is its bench's.
KVBENCH_ASSEMBLY = "kvbench"


class Assembly(ABC):
    """A bench's own way of turning its contexts into token ids, for the contexts whose ``assembly`` is its
    ``name`` (:mod:`kvbench.prompt` applies ``"kvbench"``'s itself). A bench declares its assemblies in
    :attr:`Bench.assemblies`; :func:`kvbench.prompt.render`, :func:`~kvbench.prompt.prompt_text` and
    :func:`~kvbench.prompt.prompt_length` hand such a context to it."""

    name: ClassVar[str] = ""

    @abstractmethod
    def render(self, tokenizer, context: Context, max_length: int | None = None) -> Rendered:
        """The context's token ids (what :func:`kvbench.prompt.render` returns); ``max_length``: the model limit
        in tokens the context must be cut to, None for no cut."""

    @abstractmethod
    def prompt_text(self, tokenizer, context: Context, j: int = 0) -> str:
        """The whole prompt of question ``j`` as one string (what :func:`kvbench.prompt.prompt_text` returns)."""

    def prompt_length(self, tokenizer, context: Context) -> int:
        """Tokens of the context and its first question as :meth:`render` encodes them, uncut (what a
        generator's :data:`PromptLength` counts)."""
        rendered = self.render(tokenizer, context)
        return len(rendered.context_ids) + (len(rendered.question_ids[0]) if context.questions else 0)


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
    #: the sentence the report adds to a mean-over-tasks figure whose tasks have sub-tasks (:meth:`sub_task`)
    sub_task_caption: str = "Tasks with sub-tasks enter as the mean of their sub-task scores."
    description: str = ""
    #: Where a generated bench may cache its contexts (None: no cache). The runner points it at
    #: ``$KVBENCH_CACHE/<bench name>``; cached items must be re-validated or keyed so they cannot go stale.
    cache_dir: Path | str | None = None
    #: The bench's own prompt assemblies: :class:`Assembly` name -> ``"module:attr"`` of an instance, imported on
    #: first use, for its contexts whose ``assembly`` is not ``"kvbench"`` (e.g. SCBench's ``"scbench"``).
    assemblies: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def sub_task(cls, task: str, scorer: str) -> str:
        """The sub-task of ``task`` that a row scored by ``scorer`` belongs to, ``""`` for none: a mixed task
        scores each sub-task with its own scorer (the report's ``sub`` column; a task with sub-tasks scores the
        mean of theirs). The base: none."""
        return ""

    @abstractmethod
    def tasks(self) -> list[str]:
        """The task names of this bench, in report order."""

    @abstractmethod
    def contexts(
        self, task: str, *, length: int, limit: int, seed: int, prompt_length: PromptLength
    ) -> Iterator[Context]:
        """Yield at most ``limit`` contexts of ``task``, deterministic in ``seed``, each sized so that
        ``prompt_length(context)`` plus the question's ``max_new_tokens`` is at most ``length``."""


class UnknownBenchError(UnknownNameError):
    """No bench is registered under the given name."""


#: The built-in benches: name -> "module:class".
BUILTIN_BENCHES: dict[str, str] = {
    "needle": "kvbench.tasks.needle:NeedleBench",
    "ruler": "kvbench.tasks.ruler:RulerBench",
    "scbench": "kvbench.tasks.scbench:SCBenchBench",
}
#: ``kvbench run``'s bench when ``--bench`` is not given: the small generated one, no data needed.
DEFAULT_BENCH = "needle"


def _check_bench(name: str, cls: object) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Bench)):
        raise RegistryError(f"bench {name!r}: {cls!r} is not a Bench subclass")


#: Every bench: built-ins, ``kvbench.benches`` entry points and :func:`register_bench` classes.
BENCHES: Registry[type[Bench]] = Registry(
    "bench", "kvbench.benches", BUILTIN_BENCHES, plural="benches", check=_check_bench
)


def register_bench(cls: type[Bench]) -> type[Bench]:
    """Class decorator: make a bench available by its ``name``; a name taken by another bench is a
    :class:`~kvbench.registry.RegistryError` naming both."""
    if not cls.name:
        raise RegistryError(f"{cls.__name__} has no name")
    BENCHES.add(cls.name, cls, f"register_bench({cls.__module__}.{cls.__qualname__})")
    return cls


def list_benches() -> list[str]:
    """Every registered bench name, sorted (nothing imported)."""
    return sorted(BENCHES.names())


def bench_title(name: str) -> str:
    """The display name of bench ``name`` (its class's ``title``, e.g. "SCBench"), or ``name`` itself for a
    bench that has none or is not registered here."""
    if name not in BENCHES:
        return name
    return getattr(BENCHES.get(name), "title", "") or name


def get_bench(name: str) -> Bench:
    """Instantiate the bench registered under ``name``; unknown names list the valid ones."""
    try:
        cls = BENCHES.get(name)
    except UnknownNameError as exc:
        raise UnknownBenchError(str(exc)) from None
    return cls()


def context_assembly(context: Context) -> Assembly | None:
    """The :class:`Assembly` that renders ``context``: None for kvbench's own (``"kvbench"``), else the one its
    bench declares under that name in :attr:`Bench.assemblies`; a bench that declares none is an error."""
    if context.assembly == KVBENCH_ASSEMBLY:
        return None
    declared = BENCHES.get(context.bench).assemblies if context.bench in BENCHES else {}
    if context.assembly not in declared:
        raise KvbenchError(
            f"{context.bench}/{context.task} item {context.item}: assembly {context.assembly!r} is not one bench "
            f"{context.bench!r} declares (its assemblies: {', '.join(declared) or 'none'})"
        )
    return load_spec(declared[context.assembly])  # type: ignore[return-value]
