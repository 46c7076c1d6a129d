"""GateSight end to end: ``label -> train -> eval`` through the sub-app, then the method in a run.

The default test exercises the mechanics on a handful of short documents; the ``slow`` one labels twelve
generated documents (three corpora drawn from one generator, so a held-out corpus shares the vocabulary)
with the full four continuations and shows that the trained estimator beats ``random`` on overlap@10 of
held-out documents, then runs ``gatesight`` through the runner. The model has random weights: what is
learnable is how its attention uses token identity, which the GDN signals of the window encode.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from typer.testing import CliRunner

from kvbench.engines.torch_engine import TorchEngine
from kvbench.methods import get_method
from kvbench.methods.gatesight.cli import app
from kvbench.methods.gatesight.estimator import default_artifact_dir, load_artifact
from kvbench.methods.gatesight.labels import load_labels
from kvbench.models import load_model

WORDS = "alpha beta gamma delta kappa omega sigma theta zeta lambda".split()


def write_corpora(root, n_docs: int, length: int, corpora=("a", "b", "c")) -> None:
    """Assignment-list documents (``word = 42;`` …), one generator for every corpus."""
    for c, name in enumerate(corpora):
        rng = random.Random(c)
        (root / name).mkdir(parents=True)
        for i in range(n_docs):
            parts = []
            while len(" ".join(parts)) < length:
                parts.append(f"{rng.choice(WORDS)} = {rng.randint(10, 99)};")
            (root / name / f"doc{i}.txt").write_text(" ".join(parts)[:length])


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KVBENCH_GATESIGHT_ARTIFACT", raising=False)
    return tmp_path / "cache"


@pytest.mark.parametrize("model_name", ["tiny-random", "tiny-random-qwen3_5"])
def test_label_train_eval_run_mechanics(tmp_path, cache, model_name):
    write_corpora(tmp_path / "corpus", n_docs=2, length=48, corpora=("a", "b"))
    labels = tmp_path / "labels"
    common = ["--model", model_name, "--corpus", str(tmp_path / "corpus"), "--out", str(labels), "--threads", "1"]
    r = invoke("label", *common, "--m", "2", "--max-new-tokens", "4")
    assert r.exit_code == 0, r.output
    label_set = load_labels(labels)
    assert label_set.corpora == ["a", "b"] and len(label_set.docs) == 4
    doc = label_set.docs[0]
    t = doc.load()
    assert t["utility"].shape == (3, 2, doc.n) and t["beta"].shape == (9, doc.n, 4)
    assert doc.meta["checks"]["closed_form_max_err"] <= 1.4e-5 and doc.meta["checks"]["covered"]
    assert doc.prot == 6  # the chat head "<|im_start|>user\n" (a special token + 5 bytes) is protected
    # resumable, and a different recipe into the same directory is refused
    r = invoke("label", *common, "--m", "2", "--max-new-tokens", "4")
    assert r.exit_code == 0 and "4 already there" in r.output
    r = invoke("label", *common, "--m", "3", "--max-new-tokens", "4")
    assert r.exit_code == 2 and "different recipe" in r.output

    r = invoke("train", "--labels", str(labels), "--epochs", "2", "--batch-size", "16", "--threads", "1")
    assert r.exit_code == 0, r.output
    lm = load_model(model_name)
    art = default_artifact_dir(lm.fingerprint)
    meta = json.loads((art / "gatesight.json").read_text())
    assert meta["fingerprint"] == lm.fingerprint and meta["window"] == 6 and meta["in_dims"] == [39, 75, 75]
    assert meta["training"]["config"]["epochs"] == 2 and meta["training"]["n_documents"] == 4
    est = load_artifact(art, lm.fingerprint)
    assert all(0 < g < 1 for g in est.gate_means.tolist())

    r = invoke("eval", "--labels", str(labels), "--out", str(tmp_path / "report"), "--epochs", "1", "--threads", "1")
    assert r.exit_code == 0, r.output
    result = json.loads((tmp_path / "report" / "gatesight_eval.json").read_text())
    assert result["split"] == "leave-one-corpus-out" and result["n_documents"] == 4
    names = set(result["predictors"])
    assert {"random", "age (older first)", "slow-head β‖v‖", "ridge regression", "GateSight (per-head MLP)"} <= names
    for p in result["predictors"].values():
        assert len(p["per_layer"]) == 3 and set(p["per_corpus"]) == {"a", "b"}
        assert 0 <= p["layer_mean"]["ov@10"] <= 1 and -1 <= p["layer_mean"]["rho"] <= 1
    md = (tmp_path / "report" / "gatesight_eval.md").read_text()
    assert "| GateSight (per-head MLP) |" in md and "Ov@10" in md
    r = invoke("eval", "--labels", str(labels), "--artifact", str(art), "--threads", "1")
    assert r.exit_code == 0 and "GateSight (artifact)" in r.output

    # the method in the protocol: prefill, score once, gate allocation from the artifact, fork, answer
    engine = TorchEngine(lm.model, lm.tokenizer, fingerprint=lm.fingerprint)
    ids = lm.tokenizer("<|im_start|>user\nalpha = 12; beta = 34; gamma = 56; delta = 78;")["input_ids"]
    parent = engine.prefill(ids, prot=6)
    try:
        method = get_method("gatesight")
        scores = method.score(parent)
        assert [tuple(s.shape) for s in scores] == [(2, parent.n)] * 3
        assert method.gate_means(parent) == pytest.approx(est.gate_means.tolist())
        child = parent.fork(method.select(parent, scores, 0.3, "gate"))
        ans = child.answer(lm.tokenizer("\nwhat?")["input_ids"], max_new_tokens=3, context_sha256=parent.sha256)
        assert len(ans.token_ids) <= 3 and child.stats.kept_entries < child.stats.full_entries
        child.release()
    finally:
        parent.release()


def test_cli_user_errors(tmp_path, cache):
    r = invoke("train", "--labels", str(tmp_path / "nowhere"))
    assert r.exit_code == 2 and "kvbench gatesight label" in r.output
    r = invoke("label", "--model", "tiny-random", "--corpus", str(tmp_path / "none"), "--out", str(tmp_path / "o"))
    assert r.exit_code == 2 and "does not exist" in r.output


@pytest.mark.slow
def test_trained_estimator_beats_random_on_held_out_corpora(tmp_path, cache):
    write_corpora(tmp_path / "corpus", n_docs=4, length=200)
    labels = tmp_path / "labels"
    r = invoke(
        "label",
        "--model",
        "tiny-random",
        "--corpus",
        str(tmp_path / "corpus"),
        "--out",
        str(labels),
        "--m",
        "4",
        "--max-new-tokens",
        "24",
        "--threads",
        "1",
    )
    assert r.exit_code == 0, r.output
    r = invoke(
        "eval", "--labels", str(labels), "--out", str(tmp_path / "report"), "--batch-size", "32", "--threads", "1"
    )
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "report" / "gatesight_eval.json").read_text())["predictors"]
    mlp, rnd = res["GateSight (per-head MLP)"]["layer_mean"], res["random"]["layer_mean"]
    assert mlp["ov@10"] > rnd["ov@10"] + 0.03, (mlp, rnd)
    assert mlp["rho"] > 0.1 and mlp["cov@10"] > rnd["cov@10"]

    # train on everything, then run the method through the runner (needle, one item, p = 0.5)
    r = invoke("train", "--labels", str(labels), "--batch-size", "32", "--threads", "1")
    assert r.exit_code == 0, r.output
    from kvbench.run.loop import run
    from kvbench.run.plan import RunConfig

    torch.manual_seed(0)
    summary = run(
        RunConfig(
            methods=["gatesight"],
            bench="needle",
            ps=[0.5],
            out=tmp_path / "run",
            limit=1,
            length=900,
            threads=1,
            model="tiny-random",
        )
    )
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert summary.rows_written == 1 and rows[0]["method"] == "gatesight" and rows[0]["allocation"] == "gate"
    assert rows[0]["real_fork"] and rows[0]["kept_entries"] < rows[0]["full_entries"]
