"""The method API's classes and functions: :class:`EvictionMethod`, :class:`QueryAwareMethod`,
:class:`QuestionInput`, :func:`register_method` and the look-ups over the method registry.

Import them from :mod:`kvbench.methods` (``from kvbench.methods import EvictionMethod, register_method``); the
package re-exports them lazily, so importing the package alone (what ``kvbench --help`` does) imports no torch.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from kvbench import allocations
from kvbench.errors import KvbenchError
from kvbench.methods import METHODS
from kvbench.registry import RegistryError, UnknownNameError
from kvbench.selection import Kept

if TYPE_CHECKING:
    from kvbench.engines.base import ParentSession
    from kvbench.models import LoadedModel


@dataclass(frozen=True)
class QuestionInput:
    """What a query-aware method sees of one question: ``token_ids``, exactly the tokens a child is fed after
    the context (the question inside the user turn, the end of the turn, the assistant header and the answer
    prefix), and ``max_new_tokens``, the question's answer budget in tokens. Never the references."""

    token_ids: tuple[int, ...]
    max_new_tokens: int


class EvictionMethod(ABC):
    """Base class of every eviction method.

    Class attributes:
      name: registry name (CLI ``--method``).
      default_allocation: allocation used when the user gives none.
      allocations: allocations this method's scores support (default: every registered allocation).
      fixed_p: if set, the method runs only at this kept fraction (``full`` runs at 1.0).
      extra_passes: True if scoring runs extra model passes (its cost is then part of the report).
      query_window: trailing context positions whose queries the method reads (``parent.queries``).
      fingerprint: the model fingerprint an offline artifact must match; None: the parent's.
      query_aware: True if the method sees each question (:class:`QueryAwareMethod`); the runner then calls
        :meth:`score_question` per question instead of :meth:`score` once per context.
      options: user-settable attributes (``--set METHOD.OPTION=VALUE``), name -> one-line help; the
        class attribute of that name is the default.
      engines: the engine names (``--engine``) the method runs on; None: every engine. The runner checks it
        before any model loads.
      requires: capabilities (:data:`kvbench.engines.CAPABILITIES`) the method needs of its engine; the runner
        refuses an engine that does not declare them, before any model loads.
    """

    name: ClassVar[str] = ""
    default_allocation: ClassVar[str] = "flat"
    allocations: ClassVar[Collection[str]] = allocations.ALLOCATIONS
    fixed_p: ClassVar[float | None] = None
    extra_passes: ClassVar[bool] = False
    query_window: ClassVar[int] = 0
    fingerprint: str | None = None
    query_aware: ClassVar[bool] = False
    options: ClassVar[dict[str, str]] = {}
    engines: ClassVar[tuple[str, ...] | None] = None
    requires: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    @classmethod
    def calibrate(cls, lm: LoadedModel, texts: list[str], *, max_tokens: int, out: Path | None) -> Path:
        """Offline calibration (``kvbench calibrate METHOD``): compute the method's artifact for model ``lm``
        from the documents ``texts`` (at most ``max_tokens`` tokens in all), write it to ``out`` (None: the
        method's default place for that model) and return the path written. The base class has no
        calibration step and raises :class:`KvbenchError`; a method with one overrides this."""
        raise KvbenchError(f"method {cls.name} has no calibration step")

    @classmethod
    def describe_calibration(cls, path: Path) -> str:
        """What the artifact at ``path`` (written by :meth:`calibrate`) was made from, for ``kvbench calibrate`` to
        print after its path (e.g. documents and tokens); empty when the method says nothing."""
        return ""

    @classmethod
    def prepare_offline(
        cls, model: torch.nn.Module, tokenizer: object, workdir: Path, *, seed: int = 0
    ) -> EvictionMethod:
        """An instance that scores ``model`` (a causal LM, with ``tokenizer``) with nothing prepared beforehand:
        how a test or an offline check gets the method with its artifacts. The invariant suite
        (``tests/test_methods_invariants.py``) scores every registered method through this.

        The base returns ``cls(seed=seed)``. A method that scores with an offline artifact (it overrides
        :meth:`artifact_sha256`) overrides this too: it makes a small artifact for ``model`` with its own
        calibration or training code (a few short documents; any file under ``workdir``, an existing directory
        that outlives the instance) and returns an instance scoring with it. Without the override, such a
        method is a :class:`KvbenchError` here, not a method that silently scores without its artifact."""
        if cls.artifact_sha256 is not EvictionMethod.artifact_sha256:
            raise KvbenchError(
                f"method {cls.name or cls.__name__} scores with an offline artifact: override prepare_offline to make "
                "one for a given model, so offline checks can run it"
            )
        return cls(seed=seed)

    @classmethod
    def has_calibration(cls) -> bool:
        """Whether the method overrides :meth:`calibrate` (``kvbench calibrate`` accepts it)."""
        return cls.calibrate.__func__ is not EvictionMethod.calibrate.__func__  # type: ignore[attr-defined]

    def set_options(self, values: Mapping[str, str]) -> None:
        """Set options from their command-line text (``"false"``, ``"3"``, …), converted to the type of
        the default; an unknown option or a value of the wrong type is a :class:`KvbenchError`."""
        for option, text in values.items():
            if option not in self.options:
                known = ", ".join(sorted(self.options)) or "none"
                raise KvbenchError(f"method {self.name} has no option {option!r} (its options: {known})")
            setattr(self, option, _convert(text, getattr(type(self), option), f"{self.name}.{option}"))

    def method_options(self) -> dict[str, bool | int | float | str]:
        """The options that differ from the class defaults (empty for a default instance)."""
        return {o: getattr(self, o) for o in sorted(self.options) if getattr(self, o) != getattr(type(self), o)}

    @property
    def label(self) -> str:
        """``name``, or ``name[OPTION=VALUE,…]`` when an option differs from its default (what rows record)."""
        opts = self.method_options()
        if not opts:
            return self.name
        return f"{self.name}[{','.join(f'{o}={_text(v)}' for o, v in opts.items())}]"

    def artifact_sha256(self, model_fingerprint: str | None) -> str | None:
        """The hex SHA-256 of the offline artifact (calibration statistics, trained estimator) this instance
        scores the model of ``model_fingerprint`` with; None (the default) for a method that uses none.

        A method whose scores depend on a file overrides this: it reads the file here (once, and scores
        with what it read) and returns the digest of those bytes. The runner calls it once per run, before
        anything is written, so a missing or mismatched artifact fails first; rows record the digest as
        ``artifact_sha256``, part of their identity: rows scored with another artifact are never reused.
        """
        return None

    def model_fingerprint(self, parent: ParentSession | None = None) -> str | None:
        """``fingerprint`` if set, else the parent's ``model_fingerprint`` (None when unknown): the model an
        offline artifact (calibration statistics, trained estimator) must have been made for."""
        return self.fingerprint or getattr(parent, "model_fingerprint", None)

    @abstractmethod
    def score(self, parent: ParentSession) -> list[torch.Tensor]:
        """Per attention layer ordinal ``f``, a ``[H_kv, n]`` tensor of scores (higher = keep)."""

    def score_question(self, parent: ParentSession, question: QuestionInput) -> list[torch.Tensor]:
        """Query-aware methods only: the scores of :meth:`score` for one question of the parent's context."""
        raise KvbenchError(f"method {self.name} is query-agnostic: it scores once per context with score()")

    def gate_means(self, parent: ParentSession) -> list[float]:
        """Per-layer weights for an allocation that needs them (``gate``, or any allocation declaring
        ``needs_gate_means``); the parent's measured gate means by default."""
        return parent.gate_means()

    def select(self, parent: ParentSession, scores: Sequence[torch.Tensor], p: float, allocation: str) -> Kept:
        """Kept positions ``kept[f][h]`` at kept fraction ``p`` under ``allocation``: the registered
        :class:`~kvbench.allocations.Allocation` selects, given :meth:`gate_means` when it declares it needs them."""
        chosen = allocations.get_allocation(allocation)
        weights = self.gate_means(parent) if chosen.needs_gate_means else None
        return chosen.select(scores, parent.n, parent.prot, p, weights)


class QueryAwareMethod(EvictionMethod):
    """Base class of the methods that see the question (ceilings such as ``oracle``): implement
    :meth:`score_question`; the runner scores, selects and forks per (question, allocation, p)."""

    query_aware: ClassVar[bool] = True

    def score(self, parent: ParentSession) -> list[torch.Tensor]:
        raise KvbenchError(f"method {self.name} is query-aware: it scores per question with score_question()")

    @abstractmethod
    def score_question(self, parent: ParentSession, question: QuestionInput) -> list[torch.Tensor]:
        """Per attention layer ordinal ``f``, a ``[H_kv, n]`` tensor of scores (higher = keep) for ``question``."""


def check_method(name: str, cls: object) -> None:
    """The method registry's check: ``cls`` is an :class:`EvictionMethod` subclass, query-aware exactly when it
    subclasses :class:`QueryAwareMethod`, with known allocations and a default among them; RegistryError if not."""
    if not (isinstance(cls, type) and issubclass(cls, EvictionMethod)):
        raise RegistryError(f"method {name!r}: {cls!r} is not an EvictionMethod subclass")
    if cls.query_aware != issubclass(cls, QueryAwareMethod):
        raise RegistryError(f"{cls.__name__}: a query-aware method subclasses QueryAwareMethod (query_aware = True)")
    unknown = set(cls.allocations) - set(allocations.ALLOCATIONS)
    if unknown or cls.default_allocation not in cls.allocations:
        raise RegistryError(
            f"{cls.__name__}: bad allocations {tuple(cls.allocations)} / default {cls.default_allocation!r} (known "
            f"allocations: {', '.join(allocations.ALLOCATIONS)})"
        )


def register_method(cls: type[EvictionMethod]) -> type[EvictionMethod]:
    """Class decorator: make ``cls`` available as ``--method <cls.name>``. A name already taken by another class
    (a built-in, a plugin's entry point, another registration) is a RegistryError naming both."""
    name = getattr(cls, "name", "")
    if isinstance(cls, type) and not name:
        raise RegistryError(f"{cls.__name__} has no name")
    METHODS.add(name, cls, f"register_method({getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', '?')})")
    return cls


def list_methods() -> list[str]:
    """Every registered method name, sorted (nothing imported)."""
    return sorted(METHODS.names())


def method_class(name: str) -> type[EvictionMethod]:
    """The class registered under ``name``; an unknown name is a KvbenchError listing the valid ones."""
    return METHODS.get(name)


def declares_no_artifact(name: str) -> bool:
    """Whether the method registered under ``name`` (or a row's ``name[OPTION=VALUE,…]`` label) reads no offline
    artifact (it keeps the base class's :meth:`EvictionMethod.artifact_sha256`, which returns None); False for a
    name not registered here."""
    try:
        cls = method_class(name.split("[", 1)[0])
    except UnknownNameError:
        return False
    return cls.artifact_sha256 is EvictionMethod.artifact_sha256


def get_method(name: str, seed: int = 0, options: Mapping[str, str] | None = None) -> EvictionMethod:
    """Instantiate the method registered under ``name``, with ``options`` (option -> text) set."""
    method = method_class(name)(seed=seed)
    method.set_options(options or {})
    return method


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _convert(text: str, default: object, what: str) -> bool | int | float | str:
    """``text`` as the type of ``default`` (bool: true/false/1/0/yes/no/on/off)."""
    low = text.strip().lower()
    if isinstance(default, bool):
        if low in _TRUE + _FALSE:
            return low in _TRUE
        raise KvbenchError(f"--set {what}={text}: expected true or false")
    for kind in (int, float):
        if isinstance(default, kind):
            try:
                return kind(text)
            except ValueError:
                raise KvbenchError(f"--set {what}={text}: expected a number ({kind.__name__})") from None
    if isinstance(default, str):
        return text
    raise KvbenchError(f"--set {what}: this option has no command-line form")


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def parse_method_options(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """``["triattention.zero_freq_bands=false", …]`` -> ``{"triattention": {"zero_freq_bands": "false"}}``.

    Checks the form and that the method exists; option names and values are checked by
    :meth:`EvictionMethod.set_options`. Setting one option twice is an error."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        target, eq, value = item.partition("=")
        method, dot, option = target.strip().rpartition(".")  # an option name has no dot; a method's may
        if not (eq and dot and method and option):
            raise KvbenchError(f"--set {item!r} is not of the form METHOD.OPTION=VALUE (e.g. triattention.mlr=false)")
        method_class(method)
        if option in out.get(method, {}):
            raise KvbenchError(f"--set {method}.{option} is given twice; keep one")
        out.setdefault(method, {})[option] = value.strip()
    return out
