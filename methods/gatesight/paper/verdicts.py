"""Verdicts on the paper's findings: each finding's rule evaluated over measured values, with paired intervals.

A rule is ``{"type": "all" | "count", "for": {axis: [values] | "*"}, "check": {...}}``. The ``for`` axes are
expanded into cases (their product); in each case the ``check``'s specs have ``"{axis}"`` placeholders replaced
(a whole-string placeholder keeps the value's type: ``"{p}"`` -> ``0.1``). ``"*"`` takes every value the measured
keys hold for that axis. The axis ``model`` sets each spec's ``model`` (a role: ``main`` / ``second``).

Each case becomes one or more *comparisons*, a difference ``d`` that is positive on the finding's side:

* ``greater`` / ``at_least``: d = left − right (a tie is not resolved either way);
* ``greatest``: d = left − other, for each of ``others`` (every one named; a missing one is missing);
* ``chain_at_least``: d = chain[i] − chain[i+1] for each step;
* ``within_below``: d = left − right + ``margin`` (the margin is the paper's, applied as stated);
* ``at_most``: d = ``value`` − left; ``at_least_value``: d = left − ``value``; ``between``: d = left − ``low``
  and d = ``high`` − left; ``ratio_above``: d = left − ``factor`` × right. These thresholds are the paper's own
  (scale-free) claims.

Where both quantities have recorded units (:mod:`.evidence`: contexts of a run grid, corpora of an evaluation),
d has a paired bootstrap interval (:data:`~.evidence.LEVEL`; against a threshold, the threshold is the other
side); a comparison is **held** when the interval lies
above 0, **contradicted** when it lies below 0, **not resolved** when it spans 0 (a tie lands here). Without units
it is a point comparison (said so): held for d > 0 (d >= 0 against a non-strict threshold), contradicted for
d < 0, not resolved for a tie. A comparison whose other side (the comparator) is at the floor (every row 0) is
never a win: "floor: not evidence", not resolved.

A case is contradicted if one comparison is, held if all are, *missing* if a quantity is not measured (each
named), else not resolved. The finding (rule ``all``): **not measurable** when no case has a measured
comparison, **contradicted** when a case is, **partly measured** when a case or comparator is missing (never
held), **held** when every case is, else **not resolved**. Rule ``count`` (at least ``min`` cases): held when
``min`` cases hold, contradicted when more than ``len(cases) − min`` are contradicted, else partly measured (some
missing) or not resolved.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any

from kvbench.methods.gatesight.paper.evidence import LEVEL, RESAMPLES, Evidence, Interval
from kvbench.methods.gatesight.paper.numbers import spec_key

__all__ = [
    "CONTRADICTED",
    "HELD",
    "NOT_MEASURABLE",
    "NOT_RESOLVED",
    "PARTLY",
    "STATES",
    "Case",
    "Comparison",
    "Verdict",
    "describe_spec",
    "evaluate",
    "expand",
    "rule_text",
]

HELD, CONTRADICTED, NOT_RESOLVED = "held", "contradicted", "not resolved"
PARTLY, NOT_MEASURABLE = "partly measured", "not measurable"
STATES = (HELD, CONTRADICTED, NOT_RESOLVED, PARTLY, NOT_MEASURABLE)
_MISSING = "missing"
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_SPEC_FIELDS = ("left", "right", "others", "chain")


@dataclass
class Comparison:
    """One difference of a case: ``text`` (what minus what), ``d`` (positive on the finding's side),
    ``interval`` (paired bootstrap; None: a point comparison), ``n`` (units behind it), ``paper`` (the paper's
    own value of the same difference, None where it states none), ``floor`` (why it is no evidence, or empty),
    ``state``."""

    text: str
    d: float
    interval: Interval | None
    n: str
    paper: float | None
    floor: str
    state: str

    def to_json(self) -> dict:
        iv = self.interval
        return {
            "comparison": self.text,
            "d": self.d,
            "lo": iv.lo if iv else None,
            "hi": iv.hi if iv else None,
            "width": iv.width if iv else None,
            "level": iv.level if iv else None,
            "units": iv.units if iv else None,
            "unit": iv.unit if iv else None,
            "pairs": iv.pairs if iv else None,
            "n": self.n,
            "paper": self.paper,
            "floor": self.floor,
            "state": self.state,
        }


@dataclass
class Case:
    """One expansion of a rule: ``binding`` (axis -> value), ``state``, ``comparisons``, ``measured`` and
    ``missing`` (descriptions of the quantities it reads)."""

    binding: dict[str, Any]
    state: str = _MISSING
    comparisons: list[Comparison] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> bool | None:
        """True held, False contradicted, None otherwise."""
        return {HELD: True, CONTRADICTED: False}.get(self.state)


@dataclass
class Verdict:
    """A finding's verdict: ``status`` (one of :data:`STATES`), ``rule`` (the rule in words), ``deciding`` (one
    line per deciding comparison), ``note`` (what is missing or at the floor), ``cases``."""

    finding: dict
    status: str
    rule: str
    deciding: list[str]
    note: str
    cases: list[Case]

    @property
    def measured(self) -> list[str]:
        return sorted({m for c in self.cases for m in c.measured})

    @property
    def missing(self) -> list[str]:
        return sorted({m for c in self.cases for m in c.missing})

    def to_json(self) -> dict:
        return {
            "id": self.finding["id"],
            "source": self.finding["source"],
            "text": self.finding["text"],
            "status": self.status,
            "rule": self.rule,
            "note": self.note,
            "comparators_measured": self.measured,
            "comparators_missing": self.missing,
            "cases": [
                {
                    "binding": c.binding,
                    "state": c.state,
                    "comparisons": [x.to_json() for x in c.comparisons],
                    "missing": c.missing,
                }
                for c in self.cases
            ],
        }


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


def _specs(check: dict) -> list[dict]:
    out: list[dict] = []
    for name in _SPEC_FIELDS:
        if name in check:
            out.extend(check[name] if isinstance(check[name], list) else [check[name]])
    return out


def _get(spec: dict, measured: dict[str, float], names: dict[str, str] | None, case: Case) -> float | None:
    desc = describe_spec(spec, names)
    value = measured.get(spec_key(spec))
    if value is None or (isinstance(value, float) and math.isnan(value)):
        case.missing.append(desc)
        return None
    case.measured.append(desc)
    return float(value)


def _fmt(v: float) -> str:
    return f"{v:+.3g}" if abs(v) < 1 else f"{v:+.1f}"


def _paper_value(spec: dict, paper: dict[str, float] | None) -> float | None:
    return None if paper is None else paper.get(spec_key(spec))


def _state(d: float, iv: Interval | None, strict: bool) -> str:
    if iv is not None:
        return HELD if iv.lo > 0 else CONTRADICTED if iv.hi < 0 else NOT_RESOLVED
    if d > 0 or (not strict and d >= 0):
        return HELD
    return CONTRADICTED if d < 0 else NOT_RESOLVED


def _pair(a: dict, b: dict, va: float, vb: float, ev: Evidence | None, names, paper, offset: float = 0.0) -> Comparison:
    """d = a − b + offset, paired where both have units; the comparator ``b`` at the floor is no evidence."""
    iv = ev.paired(a, b) if ev is not None else None
    iv = iv.shifted(offset) if iv is not None else None
    d = iv.diff if iv is not None else va - vb + offset
    text = f"{describe_spec(a, names)} − {describe_spec(b, names)}" + (f" + {offset:g}" if offset else "")
    pa, pb = _paper_value(a, paper), _paper_value(b, paper)
    floor = ""
    if ev is not None and ev.at_floor(b):
        floor = f"floor: {describe_spec(b, names)} scores 0 on every row, not evidence"
    n = f"{iv.units} {iv.unit}, {iv.pairs} pairs" if iv is not None else _point_n(ev, a)
    state = _state(d, iv, strict=True)
    if floor and state == HELD:
        state = NOT_RESOLVED
    return Comparison(text, d, iv, n, None if pa is None or pb is None else pa - pb + offset, floor, state)


def _point_n(ev: Evidence | None, spec: dict) -> str:
    units = ev.units(spec) if ev is not None else ""
    return f"point value{' over ' + units if units else ''}: no resampling unit recorded"


def _threshold(spec: dict, value: float, bound: float, sign: int, strict: bool, ev, names, paper) -> Comparison:
    """d = sign × (value − bound): against a threshold the paper states; with an interval over the units the value
    averages where they are recorded (the threshold as the other side of the paired bootstrap)."""
    iv = ev.against(spec, bound) if ev is not None else None
    if iv is not None and sign < 0:
        iv = Interval(-iv.diff, -iv.hi, -iv.lo, iv.units, iv.pairs, iv.unit, iv.level)
    d = iv.diff if iv is not None else sign * (value - bound)
    rel = (">" if strict else ">=") if sign > 0 else ("<" if strict else "<=")
    pv = _paper_value(spec, paper)
    text = f"{describe_spec(spec, names)} {rel} {bound:g} (the paper's threshold)"
    n = f"{iv.units} {iv.unit}, {iv.pairs} values" if iv is not None else _point_n(ev, spec)
    return Comparison(text, d, iv, n, pv, "", _state(d, iv, strict))


def _comparisons(check: dict, specs: list[dict], values: list[float | None], ev, names, paper) -> list[Comparison]:
    op = check["op"]
    out: list[Comparison] = []
    have = [v is not None for v in values]
    if op in ("greater", "at_least", "within_below"):
        if all(have):
            off = float(check.get("margin", 0.0)) if op == "within_below" else 0.0
            out.append(_pair(specs[0], specs[1], values[0], values[1], ev, names, paper, off))
    elif op == "greatest":
        if have[0]:
            for s, v in zip(specs[1:], values[1:], strict=True):
                if v is not None:
                    out.append(_pair(specs[0], s, values[0], v, ev, names, paper))
    elif op == "chain_at_least":
        for i in range(len(specs) - 1):
            if have[i] and have[i + 1]:
                out.append(_pair(specs[i], specs[i + 1], values[i], values[i + 1], ev, names, paper))
    elif op == "at_most" and have[0]:
        out.append(_threshold(specs[0], values[0], check["value"], -1, False, ev, names, paper))
    elif op == "at_least_value" and have[0]:
        out.append(_threshold(specs[0], values[0], check["value"], 1, bool(check.get("strict")), ev, names, paper))
    elif op == "between" and have[0]:
        out.append(_threshold(specs[0], values[0], check["low"], 1, False, ev, names, paper))
        out.append(_threshold(specs[0], values[0], check["high"], -1, False, ev, names, paper))
    elif op == "ratio_above" and all(have):
        f = float(check["factor"])
        d = values[0] - f * values[1]
        text = f"{describe_spec(specs[0], names)} − {f:g} × {describe_spec(specs[1], names)} (the paper's factor)"
        pa, pb = _paper_value(specs[0], paper), _paper_value(specs[1], paper)
        paper_d = None if pa is None or pb is None else pa - f * pb
        state = _state(d, None, True) if values[1] > 0 else NOT_RESOLVED
        floor = "" if values[1] > 0 else f"no positive base ({_fmt(values[1])})"
        out.append(Comparison(text, d, None, _point_n(ev, specs[0]), paper_d, floor, state))
    return out


def _case(check: dict, binding: dict, measured: dict[str, float], names, ev, paper) -> Case:
    case = Case(binding)
    specs = [_with_model(s, binding) for s in _specs(check)]
    values = [_get(s, measured, names, case) for s in specs]
    case.comparisons = _comparisons(check, specs, values, ev, names, paper)
    states = {c.state for c in case.comparisons}
    if CONTRADICTED in states:
        case.state = CONTRADICTED
    elif case.missing:
        case.state = _MISSING
    elif case.comparisons and states == {HELD}:
        case.state = HELD
    elif case.comparisons:
        case.state = NOT_RESOLVED
    return case


def rule_text(finding: dict, resamples: int = RESAMPLES) -> str:
    """The rule of ``finding`` in words: quantities, operator, cases, level."""
    rule, check = finding["rule"], finding["rule"]["check"]
    op = check["op"]
    what = {
        "greater": "left − right",
        "at_least": "left − right (the paper: left ≥ right; a tie is not resolved)",
        "within_below": f"left − right + {check.get('margin', 0):g} (the paper's margin, a magnitude, as stated)",
        "greatest": "left − each other",
        "chain_at_least": "each step of the chain minus the next",
        "at_most": f"{check.get('value', 0):g} − left (the paper's threshold)",
        "at_least_value": f"left − {check.get('value', 0):g} (the paper's threshold)",
        "between": f"left − {check.get('low', 0):g} and {check.get('high', 0):g} − left (the paper's bounds)",
        "ratio_above": f"left − {check.get('factor', 0):g} × right (the paper's factor)",
    }[op]
    axes = ", ".join(f"{a} in {v if v == '*' else '/'.join(map(str, v))}" for a, v in rule.get("for", {}).items())
    need = "every case" if rule["type"] == "all" else f"at least {rule['min']} cases"
    return (
        f"{need} ({axes}): {what} > 0, judged by its paired bootstrap {LEVEL:.0%} interval ({resamples} resamples "
        "of contexts or corpora; held above 0, contradicted below 0, else not resolved), or as a point value where "
        "no resampling unit is recorded"
    )


def _line(case: Case) -> str:
    parts = []
    for c in case.comparisons:
        iv = c.interval
        got = f"{_fmt(c.d)} [{_fmt(iv.lo)}, {_fmt(iv.hi)}]" if iv else f"{_fmt(c.d)} (point)"
        paper = f"paper {_fmt(c.paper)}; " if c.paper is not None else ""
        parts.append(f"{c.text}: {paper}kvbench {got}{'; ' + c.floor if c.floor else ''}")
    return f"{case.state}: " + " | ".join(parts) if parts else case.state


def evaluate(
    finding: dict,
    measured: dict[str, float],
    model_names: dict[str, str] | None = None,
    evidence: Evidence | None = None,
    paper: dict[str, float] | None = None,
) -> Verdict:
    """The verdict on one finding over ``measured`` (spec key -> value; see :func:`~.numbers.spec_key`);
    ``model_names`` (role -> this run's model name) only labels the numbers; ``evidence`` gives the paired
    intervals and floors (None: point comparisons only); ``paper`` (spec key -> the paper's value) the paper's
    magnitude beside kvbench's."""
    rule = finding["rule"]
    cases = [_case(rule["check"], b, measured, model_names, evidence, paper) for b in expand(rule, measured)]
    by = {s: [c for c in cases if c.state == s] for s in (HELD, CONTRADICTED, NOT_RESOLVED, _MISSING)}
    measured_any = any(c.comparisons for c in cases)
    floors = sorted({x.floor for c in cases for x in c.comparisons if x.floor})
    missing = sorted({m for c in cases for m in c.missing})
    if not measured_any:
        status = NOT_MEASURABLE
    elif rule["type"] == "count":
        need = int(rule["min"])
        if len(by[HELD]) >= need:
            status = HELD
        elif len(by[CONTRADICTED]) > len(cases) - need:
            status = CONTRADICTED
        else:
            status = PARTLY if by[_MISSING] else NOT_RESOLVED
    elif by[CONTRADICTED]:
        status = CONTRADICTED
    elif by[_MISSING]:
        status = PARTLY
    elif len(by[HELD]) == len(cases):
        status = HELD
    else:
        status = NOT_RESOLVED
    notes = []
    if missing:
        shown = "; ".join(missing[:6]) + (f"; and {len(missing) - 6} more" if len(missing) > 6 else "")
        notes.append(f"{len(by[_MISSING])} of {len(cases)} cases not fully measured, missing: {shown}")
    notes += floors
    deciding = [_line(c) for c in cases if c.comparisons]
    if rule["type"] == "count":
        deciding.insert(0, f"{len(by[HELD])} of {len(cases)} cases held (the paper: at least {rule['min']})")
    return Verdict(finding, status, rule_text(finding), deciding, "; ".join(notes), cases)
