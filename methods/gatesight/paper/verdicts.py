"""Verdicts on the paper's findings: each finding's rule evaluated over measured values.

A rule is ``{"type": "all" | "count", "for": {axis: [values] | "*"}, "check": {...}}``. The ``for`` axes are
expanded into cases (their product); in each case the ``check``'s specs have ``"{axis}"`` placeholders replaced
(a whole-string placeholder keeps the value's type: ``"{p}"`` -> ``0.1``). ``"*"`` takes every value the measured
keys hold for that axis. The axis ``model`` sets each spec's ``model`` (a role: ``main`` / ``second``).

Checks (``left``, ``right``, ``others``, ``chain`` are specs; numbers in the measured unit):

* ``greater``: left > right;  ``at_least``: left >= right;  ``within_below``: right − left <= ``margin``;
* ``greatest``: left > every one of ``others`` (with ``others_optional``, every measured one: a signal that is
  not measured, e.g. a slow-head row on a model without slow heads, is left out and named in the case);
  ``chain_at_least``: chain[0] >= chain[1] >= …;
* ``at_most``: left <= ``value``;  ``at_least_value``: left >= ``value`` (> with ``strict``);
* ``between``: ``low`` <= left <= ``high``;  ``ratio_above``: left > ``factor`` × right (right must be > 0).

A case whose values are not all measured is *not measured*. ``all``: a failing case decides "did not hold";
otherwise any held case gives "held" (the unmeasured cases are counted in the verdict's note); none measured:
"not measurable". ``count``: "held" when at least ``min`` cases hold, "did not hold" when even the unmeasured
cases could not reach ``min``, else "not measurable".
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from kvbench.methods.gatesight.paper.numbers import spec_key

__all__ = ["HELD", "NOT_HELD", "NOT_MEASURABLE", "Case", "Verdict", "describe_spec", "evaluate", "expand"]

HELD, NOT_HELD, NOT_MEASURABLE = "held", "did not hold", "not measurable at this scale"
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_SPEC_FIELDS = ("left", "right", "others", "chain")


@dataclass
class Case:
    """One expansion of a rule: ``binding`` (axis -> value), ``outcome`` (True / False / None: not measured),
    ``numbers`` (description -> measured value, in the check's order), ``missing`` (descriptions)."""

    binding: dict[str, Any]
    outcome: bool | None
    numbers: list[tuple[str, float]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    """A finding's verdict: ``status`` (:data:`HELD`, :data:`NOT_HELD`, :data:`NOT_MEASURABLE`), ``deciding``
    (one line each: the cases that decide it, with their numbers), ``note`` (what was not measured)."""

    finding: dict
    status: str
    deciding: list[str]
    note: str
    cases: list[Case]


def _fill(value: Any, binding: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        return {k: _fill(v, binding) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, binding) for v in value]
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value)
        if whole and whole.group(1) in binding:
            return binding[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: str(binding.get(m.group(1), m.group(0))), value)
    return value


def _with_model(spec: dict, binding: dict[str, Any]) -> dict:
    spec = _fill(spec, binding)
    if "model" in binding:
        spec = {**spec, "model": binding["model"]}
    return spec


def _axis_values(axis: str, rule: dict, measured: dict[str, float]) -> list[Any]:
    """Every value ``axis`` takes among the measured keys' specs (for ``"*"``), in sorted order."""
    import json

    found = set()
    for key in measured:
        spec = json.loads(key)
        if axis in spec:
            found.add(spec[axis])
    return sorted(found, key=lambda v: (str(type(v)), v))


def expand(rule: dict, measured: dict[str, float]) -> list[dict[str, Any]]:
    """The bindings of ``rule``'s ``for`` axes (product, in order; ``"*"`` from the measured keys)."""
    axes = rule.get("for", {})
    names = list(axes)
    values = [_axis_values(a, rule, measured) if axes[a] == "*" else list(axes[a]) for a in names]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]


def describe_spec(spec: dict, model_names: dict[str, str] | None = None) -> str:
    """A short human description of a measure spec, e.g. ``gatesight [gate] p=0.1, main-ruler, tiny-trained``."""
    model = (model_names or {}).get(spec.get("model"), spec.get("model", "?"))
    kind = spec.get("kind")
    if kind == "accuracy":
        alloc = f" [{spec['allocation']}]" if spec.get("allocation") else ""
        p = spec["p"] if spec["p"] == "mean" else f"p={spec['p']}"
        return f"{spec['method']}{alloc} {p}, {spec['grid']}, {model}"
    if kind == "cost":
        return f"{spec['method']} {spec['stat']} at {spec['length']} tokens, {model}"
    if kind == "predictor":
        layer = f" layer #{spec['layer']}" if "layer" in spec else ""
        return f"{spec['predictor']} {spec['metric']}{layer} (set {spec['set']}, window {spec['window']}), {model}"
    layer = f" attention layer #{spec['layer']}" if "layer" in spec else ""
    return f"{spec.get('metric', '?')}{layer}, {model}"


def _get(spec: dict, measured: dict[str, float], names: dict[str, str] | None, case: Case) -> float | None:
    desc = describe_spec(spec, names)
    value = measured.get(spec_key(spec))
    if value is None or (isinstance(value, float) and math.isnan(value)):
        case.missing.append(desc)
        return None
    case.numbers.append((desc, float(value)))
    return float(value)


_CHECKS: dict[str, Callable[[dict, list[float]], bool]] = {
    "greater": lambda c, v: v[0] > v[1],
    "at_least": lambda c, v: v[0] >= v[1] - 1e-9,
    "within_below": lambda c, v: v[1] - v[0] <= c["margin"] + 1e-9,
    "greatest": lambda c, v: all(v[0] > x for x in v[1:]),
    "chain_at_least": lambda c, v: all(a >= b - 1e-9 for a, b in zip(v, v[1:], strict=False)),
    "at_most": lambda c, v: v[0] <= c["value"] + 1e-12,
    "at_least_value": lambda c, v: v[0] > c["value"] if c.get("strict") else v[0] >= c["value"] - 1e-12,
    "between": lambda c, v: c["low"] - 1e-12 <= v[0] <= c["high"] + 1e-12,
    "ratio_above": lambda c, v: v[1] > 0 and v[0] > c["factor"] * v[1],
}


def _specs(check: dict) -> list[dict]:
    out: list[dict] = []
    for name in _SPEC_FIELDS:
        if name in check:
            out.extend(check[name] if isinstance(check[name], list) else [check[name]])
    return out


def _case(check: dict, binding: dict, measured: dict[str, float], names: dict[str, str] | None) -> Case:
    case = Case(binding, None)
    values = [_get(_with_model(s, binding), measured, names, case) for s in _specs(check)]
    if check["op"] == "greatest" and check.get("others_optional") and values[0] is not None:
        values = [values[0], *[v for v in values[1:] if v is not None]]  # unmeasured others stay in case.missing
        if len(values) < 2:
            return case
        case.outcome = _CHECKS["greatest"](check, values)
        return case
    if any(v is None for v in values):
        return case
    if check["op"] == "ratio_above" and values[1] <= 0:
        case.missing.append(f"a positive base ({case.numbers[1][0]} = {values[1]:+.3f})")
        return case
    case.outcome = _CHECKS[check["op"]](check, values)  # type: ignore[arg-type]
    return case


def _line(case: Case) -> str:
    nums = "; ".join(f"{d} = {_fmt(v)}" for d, v in case.numbers)
    mark = {True: "held", False: "failed", None: "not measured"}[case.outcome]
    return f"{mark}: {nums}" if nums else mark


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1 else f"{v:.1f}"


def evaluate(finding: dict, measured: dict[str, float], model_names: dict[str, str] | None = None) -> Verdict:
    """The verdict on one finding over ``measured`` (spec key -> value; see :func:`~.numbers.spec_key`);
    ``model_names`` (role -> this run's model name) only labels the deciding numbers."""
    rule = finding["rule"]
    cases = [_case(rule["check"], b, measured, model_names) for b in expand(rule, measured)]
    held = [c for c in cases if c.outcome is True]
    failed = [c for c in cases if c.outcome is False]
    unmeasured = [c for c in cases if c.outcome is None]
    note = f"{len(unmeasured)} of {len(cases)} cases not measured" if unmeasured and (held or failed) else ""
    if rule["type"] == "count":
        need = int(rule["min"])
        if len(held) >= need:
            status = HELD
        elif len(held) + len(unmeasured) < need:
            status = NOT_HELD
        else:
            status = NOT_MEASURABLE
        deciding = [_line(c) for c in held + failed]
        deciding.insert(0, f"{len(held)} of {len(held) + len(failed)} measured cases hold (the paper: at least {need})")
    elif failed:
        status, deciding = NOT_HELD, [_line(c) for c in failed]
    elif held:
        status, deciding = HELD, [_line(c) for c in held]
    else:
        status, deciding = NOT_MEASURABLE, []
    if status == NOT_MEASURABLE:
        missing = sorted({m for c in unmeasured for m in c.missing})
        note = (
            "not measured: " + "; ".join(missing[:4]) + (f"; and {len(missing) - 4} more" if len(missing) > 4 else "")
        )
    return Verdict(finding, status, deciding, note, cases)
