"""The calibration corpus of the shipped models' own training distribution (kvbench_training.calibration):
its generator seeds are disjoint from every seed kvbench's benches, scripts and tests evaluate with, its mixes
are the final training stages' of scripts/train_tiny.sh, and its documents are what the model reads before its
first answer."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from kvbench_training import calibration as C
from kvbench_training import data as D

ROOT = Path(__file__).resolve().parents[1]
#: Every integer a seed is set to in the sources a user or a test evaluates through: ``seed=N``, ``seed: N``,
#: ``"seed": N``, ``--seed N`` (kvbench, methods, scripts, benchmarks, tests).
_SEED = re.compile(r"""seed["']?\s*[=:]\s*(\d+)|--seed[ ="',]+(\d+)""")


@lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ROOT / "kvbench" / "builtin" / "tiny-trained")


def evaluation_seeds() -> set[int]:
    """Every literal seed of kvbench's sources, scripts, benchmarks and tests, plus the declared evaluation seeds
    and the CLI defaults."""
    from kvbench import cli
    from kvbench.tasks.scbench_cli import scbench_generate

    seeds = set(D.EVAL_SEEDS)
    for command in (cli.run, scbench_generate):
        import inspect

        seeds.add(inspect.signature(command).parameters["seed"].default.default)
    for folder in ("kvbench", "methods", "scripts", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh") and path.is_file():
                for a, b in _SEED.findall(path.read_text(errors="replace")):
                    seeds.add(int(a or b))
    return seeds


def test_the_evaluation_seed_scan_finds_the_known_ones():
    """The scan is not empty-handed: it sees the default seed 42, the second card seed 43 and test seeds."""
    seeds = evaluation_seeds()
    assert {0, 42, 43} <= seeds and len(seeds) > 10


@pytest.fixture
def generator_seeds(monkeypatch):
    """Every seed passed to RULER's and SCBench's generators (and the kv curriculum's) while active."""
    from kvbench.tasks import scbench_generate
    from kvbench.tasks.ruler import RulerBench

    seen: list[int] = []
    contexts, generate_row, kv_row = RulerBench.contexts, scbench_generate.generate_row, scbench_generate.kv_row

    def spy_contexts(self, task, **kw):
        seen.append(kw["seed"])
        return contexts(self, task, **kw)

    def spy_generate_row(task, index, **kw):
        seen.append(kw["seed"])
        return generate_row(task, index, **kw)

    def spy_kv_row(seed, index, pairs, ask=None):
        seen.append(seed)
        return kv_row(seed, index, pairs, ask)

    monkeypatch.setattr(RulerBench, "contexts", spy_contexts)
    monkeypatch.setattr(scbench_generate, "generate_row", spy_generate_row)
    monkeypatch.setattr(scbench_generate, "kv_row", spy_kv_row)
    return seen


def assert_disjoint(seen: list[int], evaluation: set[int]) -> None:
    clash = set(seen) & evaluation
    assert not clash, f"calibration documents generated at evaluation seed(s) {sorted(clash)}"


@pytest.mark.parametrize("model", sorted(C.FINAL_STAGE_MIXES))
def test_shipped_corpus_seeds_are_disjoint_from_every_evaluation_seed(model, generator_seeds, tmp_path):
    """The corpus scripts/calibrate_tiny.sh writes (N_DOCS documents) calls the generators only at seeds that
    no bench, script or test evaluates with, and every family of rows is among them."""
    manifest = C.write_training_corpus(tmp_path, model, tokenizer())
    assert manifest["documents"] == C.N_DOCS
    assert len(generator_seeds) >= C.N_DOCS // 2, "the spy no longer sees the generators' calls"
    assert_disjoint(generator_seeds, evaluation_seeds())
    assert min(generator_seeds) >= D.TRAIN_SEED_BASE
    assert all(manifest["per_family"][f] > 0 for f in C.FAMILIES)


def test_the_disjointness_check_can_fail(generator_seeds, monkeypatch, tmp_path):
    """With the training seed range moved onto 42, a corpus document is generated at an evaluation seed and
    the check above fails."""
    class Lowest(D.random.Random):
        """A document generator whose seed draw lands on the bottom of the (moved) range."""

        def randrange(self, lo, hi):
            return lo

    monkeypatch.setattr(D, "TRAIN_SEED_BASE", 42)
    monkeypatch.setattr(C, "document_rng", lambda model, i: Lowest(i))
    C.write_training_corpus(tmp_path, "tiny-trained", tokenizer(), n_docs=3)
    with pytest.raises(AssertionError, match="evaluation seed"):
        assert_disjoint(generator_seeds, evaluation_seeds())


def _script_mixes() -> dict[str, list[str]]:
    """{stage: [its --mix, expanded with each definition of the variables it names]} of scripts/train_tiny.sh
    (MIX10P has one definition per ARCH)."""
    text = (ROOT / "scripts" / "train_tiny.sh").read_text()
    defs: dict[str, list[str]] = {}
    for name, value in re.findall(r"^\s*([A-Z0-9_]+)=([a-z_0-9=.,]+)\s*$", text, re.M):
        defs.setdefault(name, []).append(value)
    out: dict[str, list[str]] = {}
    for stage, mix in re.findall(r"stage (stage\w+) [^\n]*(?:\n[^\n]*?){0,3}?--mix \"?([^\"\s]+)\"?", text):
        variants = [mix]
        for var in set(re.findall(r"\$\{?([A-Z0-9_]+)\}?", mix)):
            variants = [v.replace(f"${var}", d).replace(f"${{{var}}}", d) for v in variants for d in defs[var]]
        out.setdefault(stage, []).extend(variants)
    return out


def test_final_stage_mixes_are_the_training_scripts():
    script = _script_mixes()
    for model, stages in C.FINAL_STAGE_MIXES.items():
        for stage, mix in stages.items():
            assert stage in script, f"{stage} is not a stage of scripts/train_tiny.sh"
            assert dict(D.parse_mix(mix)) in [dict(D.parse_mix(m)) for m in script[stage]], (model, stage)


def test_documents_are_the_prompt_before_the_first_answer_without_the_template():
    head, tail = [1, 2], [8, 9]
    ids = [1, 2, 5, 6, 8, 9, 7, 3, 4]
    mask = [0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert C.document_ids(ids, mask, head, tail) == [5, 6]  # head dropped, cut at the tail
    assert C.document_ids([5, 6, 7, 3], [0, 0, 0, 1], head, tail) == [5, 6, 7]  # a row without the template
    assert C.document_ids([5, 6], [0, 0], head, tail) == [5, 6]


def test_a_chat_row_document_is_its_user_content():
    """A document decodes to the end of a row's user content, with no template token, at most DOC_TOKENS
    tokens; a RULER row's ends with its question."""
    tok = tokenizer()
    docs = C.training_documents("tiny-trained-dense", tok, n_docs=12)
    assert [d[:3] for d in C.training_documents("tiny-trained-dense", tok, n_docs=3)] == [d[:3] for d in docs[:3]]
    assert {d[0] for d in docs} <= set(C.FAMILIES)
    for fam, _, text, task, stage, n in docs:
        assert "<|im_start|>" not in text and "<|im_end|>" not in text, task
        assert 0 < n <= C.DOC_TOKENS and stage == "stage10p"
        if task.startswith("niah"):
            assert "special magic" in text and fam == "ruler"


def test_an_unknown_model_is_refused_naming_the_known_ones():
    with pytest.raises(KvbenchError, match="tiny-trained"):
        C.final_mixes("nope")


def test_the_alternative_calibration_is_reachable_by_name():
    """``--set gatesight.calibration=generic`` / ``triattention.calibration=generic`` read the shipped generic
    set (kvbench/builtin/calibration/generic/) for the model's fingerprint; the default lookup does not; an
    unknown name is refused naming the shipped ones."""
    from kvbench.artifacts import SHIPPED_CALIBRATION
    from kvbench.methods import get_method

    fp = next(p.name for p in (SHIPPED_CALIBRATION / "generic" / "gatesight").iterdir()) + "0" * 48
    gs, tri = get_method("gatesight"), get_method("triattention")
    assert SHIPPED_CALIBRATION / "generic" not in gs._artifact_path(fp).parents
    gs.set_options({"calibration": "generic"})
    tri.set_options({"calibration": "generic"})
    assert gs._artifact_path(fp) == SHIPPED_CALIBRATION / "generic" / "gatesight" / fp[:16]
    assert tri._stats_path(fp) == SHIPPED_CALIBRATION / "generic" / "triattention" / f"{fp[:16]}.safetensors"
    assert gs._artifact_path(fp).is_dir() and tri._stats_path(fp).is_file()
    assert gs.label == "gatesight[calibration=generic]"
    gs.set_options({"calibration": "nope"})
    with pytest.raises(KvbenchError, match="generic"):
        gs._artifact_path(fp)
