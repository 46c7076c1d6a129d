"""The paper's numbers and findings, transcribed once into ``paper_numbers.json``.

Each value names its table / figure (``source``), row and column, its number and unit, and a ``measure``: the
spec of the quantity kvbench measures for it (see :func:`spec_key`). ``measure.model`` is a role: ``main`` is
the paper's Qwen3.8-27B, ``second`` its Qwen3.8-Flash-Next; a run maps roles to its own models
(:func:`kvbench.methods.gatesight.paper.artifacts.model_roles`).

An in-text number (a sentence of Sections 3-5 or Appendices C-F) also carries ``quote``: the paper's words around
it (a test finds each in the paper's text); one kvbench does not measure has the measure ``{"kind": "text",
"reason": ...}``.

Each finding is a sentence of the paper with a ``rule`` (see :mod:`kvbench.methods.gatesight.paper.verdicts`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError

__all__ = ["KINDS", "PaperNumbers", "load_numbers", "spec_key"]

#: measure kinds and the keys each spec must have besides ``kind`` and ``model``
KINDS: dict[str, tuple[str, ...]] = {
    "accuracy": ("grid", "method", "p"),
    "cost": ("method", "length", "stat"),
    "predictor": ("set", "window", "predictor", "metric"),
    "dynamics": ("metric",),
    "cells": ("metric",),
    "text": ("reason",),  # an in-text number kvbench does not measure, and why
}
_VALUE_KEYS = ("id", "artifact", "source", "row", "column", "value", "unit", "measure")
_FINDING_KEYS = ("id", "artifact", "source", "text", "rule")


def _norm(value: Any) -> Any:
    """Floats rounded to 4 decimals; ints, strings and bools as they are (a layer index stays ``0``)."""
    return round(value, 4) if isinstance(value, float) else value


def spec_key(spec: dict) -> str:
    """A canonical string for a measure spec (floats rounded to 4 decimals, keys sorted), the key of a measured
    value: ``{"kind": "accuracy", "p": 0.1, …}`` and ``{"p": 0.10000001, "kind": "accuracy", …}`` share it. Numbers
    keep their type: a length is the int ``4096`` on both sides, p the float ``1.0``."""
    return json.dumps({k: _norm(v) for k, v in spec.items()}, sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class PaperNumbers:
    """The parsed data file: ``values`` (list of dicts, keys ``_VALUE_KEYS``), ``findings``, ``models`` (role ->
    the paper's model name)."""

    paper: dict
    models: dict[str, str]
    values: list[dict]
    findings: list[dict]

    def for_artifact(self, artifact: str) -> list[dict]:
        """The values of one artifact, in the file's order."""
        return [v for v in self.values if v["artifact"] == artifact]

    def findings_for(self, artifact: str) -> list[dict]:
        return [f for f in self.findings if f["artifact"] == artifact]


def check_numbers(data: dict) -> None:
    """Raise :class:`KvbenchError` naming the first entry of ``data`` that breaks the schema."""
    for key in ("paper", "models", "values", "findings"):
        if key not in data:
            raise KvbenchError(f"paper numbers: missing top-level key {key!r}")
    seen: set[str] = set()
    for v in data["values"]:
        missing = [k for k in _VALUE_KEYS if k not in v]
        if missing:
            raise KvbenchError(f"paper numbers: value {v.get('id', v)} lacks {', '.join(missing)}")
        if v["id"] in seen:
            raise KvbenchError(f"paper numbers: id {v['id']} twice")
        seen.add(v["id"])
        if not isinstance(v["value"], (int, float)) or isinstance(v["value"], bool):
            raise KvbenchError(f"paper numbers: value {v['id']} is not a number")
        m = v["measure"]
        need = KINDS.get(m.get("kind"))
        if need is None or "model" not in m or m["model"] not in data["models"]:
            raise KvbenchError(f"paper numbers: value {v['id']} has a bad measure {m}")
        if any(k not in m for k in need):
            raise KvbenchError(f"paper numbers: value {v['id']}'s measure lacks one of {need}")
    for f in data["findings"]:
        missing = [k for k in _FINDING_KEYS if k not in f]
        if missing:
            raise KvbenchError(f"paper numbers: finding {f.get('id', f)} lacks {', '.join(missing)}")
        if f["rule"].get("type") not in ("all", "count") or "check" not in f["rule"]:
            raise KvbenchError(f"paper numbers: finding {f['id']} has a bad rule")


def load_numbers(path: Path | None = None) -> PaperNumbers:
    """``paper_numbers.json`` (the packaged one unless ``path``), schema-checked."""
    if path is None:
        text = resources.files(__package__).joinpath("paper_numbers.json").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text)
    check_numbers(data)
    return PaperNumbers(data["paper"], data["models"], data["values"], data["findings"])
