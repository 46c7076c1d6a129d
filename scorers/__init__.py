"""Scorers: per-item metrics that compare one prediction with its gold references.

A scorer is a function ``fn(prediction: str, references: Sequence[str]) -> float`` returning a score in
**0–100** (percent) for one item. Scorers register with :func:`register_scorer` and are looked up by
name; aggregation over items (and any rounding) is the reporter's job, never the scorer's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

__all__ = ["Scorer", "UnknownScorerError", "get_scorer", "list_scorers", "register_scorer", "score"]

#: A per-item metric: ``(prediction, references) -> score in 0–100``.
Scorer = Callable[[str, Sequence[str]], float]


class UnknownScorerError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


_SCORERS: dict[str, Scorer] = {}
_BUILTIN_MODULES = ("kvbench.scorers.ruler", "kvbench.scorers.scbench")


def register_scorer(name: str) -> Callable[[Scorer], Scorer]:
    """Decorator: make ``fn(prediction, references) -> float (0–100)`` available as ``name``."""

    def deco(fn: Scorer) -> Scorer:
        if name in _SCORERS and _SCORERS[name] is not fn:
            raise ValueError(f"scorer {name!r} is already registered by {_SCORERS[name].__qualname__}")
        _SCORERS[name] = fn
        return fn

    return deco


def _load_builtins() -> None:
    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)


def list_scorers() -> list[str]:
    """Names of all registered scorers, sorted."""
    _load_builtins()
    return sorted(_SCORERS)


def get_scorer(name: str) -> Scorer:
    """The scorer registered under ``name`` (returns 0–100); unknown names list the valid ones."""
    _load_builtins()
    if name not in _SCORERS:
        raise UnknownScorerError(f"unknown scorer {name!r}; valid scorers: {', '.join(sorted(_SCORERS))}")
    return _SCORERS[name]


def score(name: str, prediction: str, references: Sequence[str]) -> float:
    """Score one prediction against its references with scorer ``name``; returns 0–100."""
    return get_scorer(name)(prediction, references)
