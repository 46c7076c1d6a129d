"""No training row is an evaluation item: the generator seeds the training data code actually passes to
RULER's and SCBench's generators (spied on, for every task a mix may name and every mix of
scripts/train_tiny.sh) stay disjoint from every seed a user evaluates with by default.

RULER items draw from ``Random(f"{seed}:{task}:{item}")`` and generated SCBench rows from
``Random(f"kvbench-scbench:{task}:{seed}:{index}:…")``, so an item is reproduced only at the same seed: a
training seed outside the evaluation seeds cannot generate an evaluation item of any index."""

from __future__ import annotations

import inspect
import re
from functools import lru_cache
from pathlib import Path

import pytest

import kvbench_training as T
from kvbench.tasks.scbench_cli import scbench_generate
from kvbench_training import data as D

ROOT = Path(__file__).resolve().parents[1]
#: Scripts that run evaluations a user gets by default (model cards, README figure, calibration).
EVAL_SCRIPTS = ("card_numbers.sh", "readme_figure.sh", "calibrate_tiny.sh")


@lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ROOT / "kvbench" / "builtin" / "tiny-trained")


def _default(command, name: str) -> int:
    return inspect.signature(command).parameters[name].default.default


def test_default_evaluation_seeds_are_the_declared_ones_and_below_the_training_range():
    from kvbench import cli

    used = {_default(cli.run, "seed"), _default(scbench_generate, "seed")}
    for script in EVAL_SCRIPTS:
        used |= {int(s) for s in re.findall(r"--seed[ =](\d+)", (ROOT / "scripts" / script).read_text())}
    assert used <= set(T.EVAL_SEEDS)
    assert max(T.EVAL_SEEDS) < T.TRAIN_SEED_BASE


def _script_mixes() -> list[str]:
    """Every ``--mix`` of scripts/train_tiny.sh, its shell variables expanded."""
    text = (ROOT / "scripts" / "train_tiny.sh").read_text()
    variables = dict(re.findall(r"^\s*([A-Z0-9_]+)=([a-z_0-9=.,]+)\s*$", text, re.M))
    mixes = re.findall(r'--mix "?([^"\s]+)"?', text)
    expanded = [re.sub(r"\$\{?([A-Z0-9_]+)\}?", lambda m: variables[m.group(1)], mix) for mix in mixes]
    return expanded


def test_every_mix_of_the_training_script_parses():
    mixes = _script_mixes()
    assert len(mixes) >= 10 and any("scbench_kv8" in m for m in mixes)
    for mix in mixes:
        T.parse_mix(mix)  # raises on an unknown task or bad weights


@pytest.fixture
def generator_seeds(monkeypatch):
    """The seeds passed to RULER's and SCBench's generators while the fixture is active, per generator."""
    from kvbench.tasks import scbench_generate
    from kvbench.tasks.ruler import RulerBench

    seen: dict[str, list[int]] = {"ruler": [], "scbench": [], "kv": []}
    contexts, generate_row, kv_row = RulerBench.contexts, scbench_generate.generate_row, scbench_generate.kv_row

    def spy_contexts(self, task, **kw):
        seen["ruler"].append(kw["seed"])
        return contexts(self, task, **kw)

    def spy_generate_row(task, index, **kw):
        seen["scbench"].append(kw["seed"])
        return generate_row(task, index, **kw)

    def spy_kv_row(seed, index, pairs, ask=None):
        seen["kv"].append(seed)
        return kv_row(seed, index, pairs, ask)

    monkeypatch.setattr(RulerBench, "contexts", spy_contexts)
    monkeypatch.setattr(scbench_generate, "generate_row", spy_generate_row)
    monkeypatch.setattr(scbench_generate, "kv_row", spy_kv_row)
    return seen


def test_no_training_row_of_any_task_uses_an_evaluation_seed(generator_seeds):
    """Rows of every task a mix may name, drawn as a training step draws them (seeds and steps of
    scripts/train_tiny.sh's stages); every generator seed used is a training seed."""
    tok = tokenizer()
    stage_seeds = {int(s) for s in re.findall(r"--seed (\d+)", (ROOT / "scripts" / "train_tiny.sh").read_text())}
    assert stage_seeds >= {20, 21, 36}
    lengths = {t: 768 if t == "scbench_kv8" else 512 for t in T.KNOWN_TASKS}
    for task in T.KNOWN_TASKS:
        for seed in sorted(stage_seeds)[:3]:
            T.training_example(T.data.row_rng(seed, 0, 0), lengths[task], tok, ((task, 1.0),))
    for kind in ("ruler", "scbench", "kv"):
        assert generator_seeds[kind], f"no {kind} row was generated: the spy no longer sees the data code's calls"
    _assert_training_seeds(generator_seeds)


def _assert_training_seeds(seen: dict[str, list[int]]) -> None:
    used = {s for seeds in seen.values() for s in seeds}
    assert not used & set(T.EVAL_SEEDS), f"training rows generated at evaluation seed(s) {used & set(T.EVAL_SEEDS)}"
    assert min(used) >= T.TRAIN_SEED_BASE


def test_a_training_row_would_be_caught_at_an_evaluation_seed(generator_seeds, monkeypatch):
    """The check above can fail: with the training seed range moved onto the evaluation seed, the spied
    seeds include it."""
    monkeypatch.setattr(D, "TRAIN_SEED_BASE", T.EVAL_SEED)

    class Fixed:
        """A row generator whose seed draw lands on the evaluation seed."""

        def random(self):
            return 0.0

        def randrange(self, lo, hi):
            return lo

        def randint(self, lo, hi):
            return hi

    T.training_example(Fixed(), 768, tokenizer(), (("scbench_kv8", 1.0),))
    with pytest.raises(AssertionError, match="evaluation seed"):
        _assert_training_seeds(generator_seeds)
