"""Scorers: per-item metrics that compare one prediction with its gold references.

A scorer is a function ``fn(prediction: str, references: Sequence[str]) -> float`` returning a score in
**0–100** (percent) for one item. Scorers are registered in :data:`SCORERS`: the built-ins by table, plugins
through the ``kvbench.scorers`` entry-point group (``my_metric = mypkg.metrics:my_metric``), others with
:func:`register_scorer`; they are looked up by name. Aggregation over items (and any rounding) is the
reporter's job, never the scorer's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvbench.registry import Registry, RegistryError, UnknownNameError

__all__ = [
    "BUILTIN_SCORERS",
    "SCORERS",
    "Scorer",
    "UnknownScorerError",
    "get_scorer",
    "list_scorers",
    "register_scorer",
    "score",
]

#: A per-item metric: ``(prediction, references) -> score in 0–100``.
Scorer = Callable[[str, Sequence[str]], float]


class UnknownScorerError(UnknownNameError, KeyError):
    """No scorer is registered under the given name (a KeyError too, as before the registry)."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


# SCBench: scorer key (a task, or <task>_<subtask> for mixed tasks) -> (official, revised) function names in
# kvbench.scorers.scbench, registered as scbench_<key> and scbench_<key>_revised (that module's decorators
# register the same functions, so a mismatch is an error on import).
_SCBENCH_FUNCTIONS: dict[str, tuple[str, str]] = {
    "kv": ("kv_official", "kv_official"),
    "prefix_suffix": ("kv_official", "kv_official"),
    "vt": ("vt_official", "vt_official"),
    "repoqa": ("repoqa_official", "repoqa_official"),
    "qa_eng": ("qa_eng_official", "qa_eng_official"),
    "qa_chn": ("qa_chn_official", "qa_chn_revised"),
    "choice_eng": ("choice_eng_official", "choice_eng_revised"),
    "many_shot": ("many_shot_official", "many_shot_official"),
    "summary": ("summary_official", "summary_official"),
    "mf": ("mf_official", "mf_official"),
    "summary_with_needles_summary": ("summary_official", "summary_official"),
    "summary_with_needles_passkey": ("passkey_official", "passkey_official"),
    "repoqa_and_kv_repoqa": ("repoqa_official", "repoqa_official"),
    "repoqa_and_kv_kv": ("kv_in_repoqa_and_kv_official", "kv_official"),
}

#: The built-in scorers: name -> "module:function".
BUILTIN_SCORERS: dict[str, str] = {
    "string_match_all": "kvbench.scorers.ruler:string_match_all",
    "string_match_part": "kvbench.scorers.ruler:string_match_part",
    **{
        name: f"kvbench.scorers.scbench:{fn}"
        for key, pair in _SCBENCH_FUNCTIONS.items()
        for name, fn in zip((f"scbench_{key}", f"scbench_{key}_revised"), pair, strict=True)
    },
}


def _check_scorer(name: str, fn: object) -> None:
    if not callable(fn):
        raise RegistryError(f"scorer {name!r}: {fn!r} is not callable")


#: Every scorer: built-ins, ``kvbench.scorers`` entry points and :func:`register_scorer` functions.
SCORERS: Registry[Scorer] = Registry("scorer", "kvbench.scorers", BUILTIN_SCORERS, check=_check_scorer)


def register_scorer(name: str) -> Callable[[Scorer], Scorer]:
    """Decorator: make ``fn(prediction, references) -> float (0–100)`` available as ``name``; a name taken by
    another function is a :class:`~kvbench.registry.RegistryError` (a ValueError) naming both."""

    def deco(fn: Scorer) -> Scorer:
        SCORERS.add(name, fn, f"register_scorer({getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')})")
        return fn

    return deco


def list_scorers() -> list[str]:
    """Names of all registered scorers, sorted (nothing imported)."""
    return sorted(SCORERS.names())


def get_scorer(name: str) -> Scorer:
    """The scorer registered under ``name`` (returns 0–100); unknown names list the valid ones."""
    try:
        return SCORERS.get(name)
    except UnknownNameError as exc:
        raise UnknownScorerError(str(exc)) from None


def score(name: str, prediction: str, references: Sequence[str]) -> float:
    """Score one prediction against its references with scorer ``name``; returns 0–100."""
    return get_scorer(name)(prediction, references)
