"""Slow: batched answering on the shipped trained models, every built-in method and allocation (issue 32).

The same RULER contexts run twice through the runner, ``--answer-batch 1`` (each child alone) and the default
(every child of a context in one batched decode); in float32 every row's prediction must be the same. Run with
``pytest -m slow tests/test_batched_models.py`` (a few minutes on 2 cores).
"""

from __future__ import annotations

import json

import pytest

from kvbench import allocations
from kvbench.methods import METHODS
from kvbench.models import load_model
from kvbench.run import loop as runner
from kvbench.run.plan import RunConfig

pytestmark = pytest.mark.slow


def _predictions(out) -> dict:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {(r["method"], r["allocation"], r["p"], r["task"], r["item"], r["question"]): r["prediction"] for r in rows}


@pytest.mark.parametrize("model", ["tiny-trained", "tiny-trained-dense"])
def test_every_method_and_allocation_batched_equals_one_at_a_time(tmp_path, model):
    lm = load_model(model)
    configs = [
        # every built-in method at its own allocation (kvzip: global, ragged heads; oracle: query-aware); not
        # list_methods(): other test modules register methods (one raises by design) in the same process
        dict(methods=METHODS.builtin_names(), allocations=None),
        # every allocation, on methods that take any
        dict(methods=["snapkv", "keydiff"], allocations=list(allocations.ALLOCATIONS)),
    ]
    for i, extra in enumerate(configs):
        base = dict(bench="ruler", tasks=["niah_single_1", "vt"], ps=[0.5, 0.1], model=model, limit=1, **extra)
        one, many = tmp_path / f"one{i}", tmp_path / f"many{i}"
        runner.run(RunConfig(**base, out=one, answer_batch=1), lm=lm)
        runner.run(RunConfig(**base, out=many), lm=lm)
        serial, batched = _predictions(one), _predictions(many)
        assert serial.keys() == batched.keys() and serial
        differ = {k: (serial[k], batched[k]) for k in serial if serial[k] != batched[k]}
        assert not differ, differ
