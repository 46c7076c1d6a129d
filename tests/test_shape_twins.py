"""Shape twins (``--model shape:<hub id>``): the published widths kept, the cuts named, on the meta device (no
weights are built here; scripts/shape_twins.sh runs them end to end)."""

from __future__ import annotations

import json

import pytest
import torch

from kvbench.checkpoints import shape
from kvbench.engines.hf_adapters import HybridAdapter
from kvbench.errors import ModelError
from kvbench.models import SUPPORTED_MODEL_TYPES

NEXT, DENSE = "Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen/Qwen3.5-27B"
# the published numbers, written out again here from the issue's and the sources' statement of them
WANT = {
    NEXT: dict(hidden=2048, heads=16, kv=2, head_dim=256, rot=0.25, gk=16, gv=32, gdim=128, experts=512, top=10),
    DENSE: dict(hidden=5120, heads=24, kv=4, head_dim=256, rot=0.25, gk=16, gv=48, gdim=128, experts=0, top=0),
}


def _meta_twin(hub_id: str, layers: int):
    from transformers import AutoModelForCausalLM

    config, cuts = shape.twin_config(shape.published_config(hub_id), layers, 384, 256, 258, SUPPORTED_MODEL_TYPES)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model, cuts


@pytest.mark.parametrize("hub_id", [NEXT, DENSE])
@pytest.mark.parametrize("layers", [4, 8])
def test_a_twin_has_the_published_widths_in_its_modules(hub_id, layers):
    want = WANT[hub_id]
    model, cuts = _meta_twin(hub_id, layers)
    adapter = HybridAdapter(model)
    assert len(adapter.attn) == layers // 4 and len(adapter.gdn) == 3 * layers // 4
    attn, gdn = adapter.attn[0], adapter.gdn[0]
    # gated attention: q_proj emits queries and their output gates, 2 x heads x head_dim
    assert tuple(attn.q_proj.weight.shape) == (2 * want["heads"] * want["head_dim"], want["hidden"])
    assert tuple(attn.k_proj.weight.shape) == (want["kv"] * want["head_dim"], want["hidden"])
    rotary = model.model.rotary_emb.inv_freq.shape[0] * 2  # rotated dims of a head
    assert rotary == int(want["head_dim"] * want["rot"]) == 64
    assert (gdn.num_k_heads, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim) == (
        want["gk"], want["gv"], want["gdim"], want["gdim"])  # fmt: skip
    assert model.config.vocab_size == 384 and cuts["vocab_size"][0] in (151936, 248320)
    if want["experts"]:
        mlp = model.model.layers[0].mlp
        kept = 64 if layers == 4 else 32  # 4 GiB of float32 experts: 512 -> 64 over 4 layers, 32 over 8
        assert cuts["num_experts"] == [512, kept] and mlp.experts.gate_up_proj.shape[0] == kept
        assert model.config.num_experts_per_tok == want["top"] and mlp.shared_expert is not None
    else:
        assert "num_experts" not in cuts


def test_the_expert_cut_is_the_budget_and_no_more(monkeypatch):
    monkeypatch.setattr(shape, "EXPERT_BUDGET_BYTES", 2**60)
    _, cuts = _meta_twin(NEXT, 4)
    assert "num_experts" not in cuts  # nothing forces a cut: all 512 kept
    monkeypatch.setattr(shape, "EXPERT_BUDGET_BYTES", 1)
    _, cuts = _meta_twin(NEXT, 4)
    assert cuts["num_experts"] == [512, 16]  # halved while it stays >= the 10 routed: 16, not 8


def test_the_shipped_configs_say_where_their_values_came_from():
    for path in shape.PUBLISHED_DIR.glob("*.json"):
        spec = json.loads(path.read_text())
        assert path.name == spec["hub_id"].replace("/", "--") + ".json"
        assert spec["sources"] and all(isinstance(v, str) and v for v in spec["sources"].values())


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("shape:", "give a hub id"),
        ("shape:Qwen3.5-27B", "give a hub id"),
        (f"shape:{DENSE}@12", "@4 or @8"),
        (f"shape:{DENSE}@x", "@4 or @8"),
    ],  # fmt: skip
)
def test_bad_shape_names_are_refused_with_the_fix(name, fix):
    with pytest.raises(ModelError, match=fix):
        shape.parse(name)


def test_shape_layers_applies_to_shape_models_only():
    assert shape.with_layers(f"tiny-trained,shape:{DENSE},shape:{NEXT}@4", 8) == (
        f"tiny-trained,shape:{DENSE}@8,shape:{NEXT}@4")  # fmt: skip
    assert shape.with_layers("tiny-trained", None) == "tiny-trained"
    with pytest.raises(ModelError, match="4 or 8 layers"):
        shape.with_layers(f"shape:{DENSE}", 6)
    assert shape.parse(f"shape:{DENSE}") == (DENSE, 4) and shape.parse(f"shape:{NEXT}@8") == (NEXT, 8)


def test_an_unknown_hub_id_offline_names_the_shipped_ones(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match=r"not shipped with kvbench \(Qwen/Qwen3-Next-80B-A3B-Instruct, Qwen/Qwen3.5"):
        shape.published_config("nobody/no-such-model")


def test_the_table_reads_each_engine_and_length_with_its_peak_memory(tmp_path):
    """``scripts/shape_twins.py table OUT``: one line per (engine, model, length, method) from the rows in
    OUT/run-ENGINE-LENGTH, medians over allocations, scoring / prefill, and the peak RSS of that run's
    /usr/bin/time file (none: None)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "shape_twins_script", Path(__file__).resolve().parent.parent / "scripts" / "shape_twins.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model = "shape:Qwen/Qwen3.5-27B"

    def row(method, score, fork, answer):
        return {"model": model, "method": method, "prefill_s": 10.0, "score_s": score, "fork_s": fork,
                "answer_s": answer, "n_context": 3907}  # fmt: skip

    for engine, rows in {"torch": [row("kvzip", 20.0, 0.1, 3.0), row("kvzip", 24.0, 0.3, 5.0),
                                   row("kvzip", 22.0, 0.2, 4.0), row("snapkv", 0.05, 0.1, 3.0)],
                         "vllm": [row("snapkv", 0.5, 0.1, 1.0)]}.items():  # fmt: skip
        (tmp_path / f"run-{engine}-4096").mkdir()
        (tmp_path / f"run-{engine}-4096" / "results.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    (tmp_path / "time-torch-shape-Qwen-Qwen3.5-27B-4096.txt").write_text(
        "\tMaximum resident set size (kbytes): 2097152\n"
    )
    lines = {(x["engine"], x["method"]): x for x in script.table(tmp_path)}
    assert set(lines) == {("torch", "kvzip"), ("torch", "snapkv"), ("vllm", "snapkv")}
    kvzip = lines["torch", "kvzip"]
    got = tuple(kvzip[k] for k in ("length", "rows", "score_s", "fork_s", "answer_s"))
    assert got == (4096, 3, 22.0, 0.2, 4.0)
    assert kvzip["score_over_prefill"] == 2.2 and kvzip["peak_rss_mib"] == 2048.0 and kvzip["n_context"] == 3907
    assert lines["vllm", "snapkv"]["peak_rss_mib"] is None and lines["vllm", "snapkv"]["score_s"] == 0.5
