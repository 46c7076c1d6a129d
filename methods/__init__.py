"""Methods API: every eviction method is a subclass of :class:`EvictionMethod`.

A method scores the attention KV entries of a prefilled parent once, before any question exists::

    from kvbench.methods import EvictionMethod, register_method

    @register_method
    class KeyNorm(EvictionMethod):
        name = "keynorm"
        default_allocation = "flat"

        def score(self, parent):
            # one [H_kv, n] tensor per attention layer; higher = keep
            return [-parent.keys(f).float().norm(dim=-1) for f in range(parent.n_attn_layers)]

The harness turns scores into kept index sets with the chosen allocation (``flat``, ``pyramid``,
``gate`` or ``global``; see :mod:`kvbench.budgets`), always keeping the protected prefix on top of the
budget. Override :meth:`EvictionMethod.select` to choose entries some other way.

Method options: a method lists in ``options`` the attributes a user may change per run (``kvbench run --set
METHOD.OPTION=VALUE``); the class attribute of that name is the default and fixes the type (bool, int, float
or str). A method instance with a non-default option has the :attr:`EvictionMethod.label`
``METHOD[OPTION=VALUE,…]``: its rows carry that label as ``method`` (so they never mix with the default's
rows, in the results store or in reports) and the options in ``method_options``.

A method that scores with an offline artifact (calibration statistics, a trained estimator) overrides
:meth:`EvictionMethod.artifact_sha256`, so its rows record which artifact they were scored with; one that
computes its artifact itself overrides :meth:`EvictionMethod.calibrate` (``kvbench calibrate METHOD``). A
method's own CLI sub-commands are a typer app in the command registry :data:`kvbench.commands.COMMANDS`
(``kvbench <name> …``): the built-ins' through :data:`BUILTIN_COMMANDS` here, a plugin's through the
``kvbench.commands`` entry-point group.

Packages register methods through the ``kvbench.methods`` entry-point group, the key being the method's name
(``keynorm = mypkg.keynorm:KeyNorm``; the class's ``name`` must agree), and commands through ``kvbench.commands``
(``keynorm = mypkg.cli:app``). kvbench's own methods are registered the same way, in its pyproject.toml (no
second list here). A name taken twice is an error naming both sources.

A *query-aware* method (a ceiling, not a query-agnostic competitor) subclasses :class:`QueryAwareMethod` and
implements :meth:`EvictionMethod.score_question`: the runner then scores and forks once per (question, p),
still from the one parent prefill, and its rows carry ``"query_aware": true``.

This package holds the registry, the built-in commands' table and the names the rest of kvbench asks for
(:data:`REFERENCE`, :data:`DEFAULT_METHODS`, :data:`REPORT_DEFAULTS`) only; the classes and functions live in
:mod:`kvbench.methods.base` and are re-exported here on first use, so importing the package imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kvbench.registry import Registry

if TYPE_CHECKING:
    from kvbench.methods.base import EvictionMethod

__all__ = [
    "BUILTIN_COMMANDS",
    "METHODS",
    "EvictionMethod",
    "QueryAwareMethod",
    "QuestionInput",
    "REFERENCE",
    "REPORT_DEFAULTS",
    "DEFAULT_METHODS",
    "declares_no_artifact",
    "get_method",
    "list_methods",
    "method_class",
    "parse_method_options",
    "register_method",
]

#: The built-in methods' CLI sub-commands: name (``kvbench <name> …``) -> "module:typer app", added to the
#: command registry :data:`kvbench.commands.COMMANDS` (which reads this table; importing it imports no app).
#: ``paper`` is ``kvbench paper`` (the GateSight paper's tables and figures: :mod:`kvbench.methods.gatesight.paper`,
#: outside the core, which imports no method, bench or paper module).
BUILTIN_COMMANDS: dict[str, str] = {
    "gatesight": "kvbench.methods.gatesight.cli:app",
    "paper": "kvbench.methods.gatesight.paper.cli:app",
}

#: The no-prune reference, defined here once: ``kvbench run`` adds it to every run (``--no-reference`` leaves it
#: out), and ``kvbench report`` gives every method's drop from it. It keeps every entry at p = 1.0 whatever ``--p``
#: (its ``fixed_p``), so it costs one child per context.
REFERENCE = "full"

#: ``kvbench run``'s methods when ``--method`` is not given: the reference and the random-eviction floor.
DEFAULT_METHODS = (REFERENCE, "random")

#: The methods ``kvbench report`` compares with when the rows have them and the user names none: the reference of
#: the confidence intervals (``--reference``) and the method of the "Every method against" tables (``--compare``).
REPORT_DEFAULTS = ("gatesight", "kvzip")

_BASE = "kvbench.methods.base"  # where the re-exported names live, imported on first use
_REEXPORTED = frozenset(__all__) - {
    "BUILTIN_COMMANDS",
    "METHODS",
    "REFERENCE",
    "REPORT_DEFAULTS",
    "DEFAULT_METHODS",
}


def _check_method(name: str, cls: object) -> None:
    importlib.import_module(_BASE).check_method(name, cls)


#: Every eviction method: ``kvbench.methods`` entry points (the built-ins are kvbench's own, in its pyproject.toml:
#: registered the way a plugin is) and ``register_method`` classes.
METHODS: Registry[type[EvictionMethod]] = Registry(
    "method", "kvbench.methods", {}, check=_check_method, own_entry_points=True
)


def __getattr__(name: str) -> Any:
    """``EvictionMethod``, ``register_method``, … from :mod:`kvbench.methods.base`, imported on first use."""
    if name in _REEXPORTED:
        value = getattr(importlib.import_module(_BASE), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _REEXPORTED)
